"""Recognize LayerNorm nodes and normalize what the analysis needs to know about each one."""

from __future__ import annotations

from dataclasses import dataclass

import onnx_ir as ir

from onnx_lnfold._carry import node_label
from onnx_lnfold._shapes import ShapeTable

# LayerNormalization's epsilon default (ONNX spec). SkipSimplifiedLayerNormalization's default
# differs (1e-12), which is why the rewrite always writes epsilon explicitly.
LN_DEFAULT_EPSILON = 1e-5


@dataclass(eq=False)  # identity semantics: one candidate per node
class LnCandidate:
    """One LayerNorm in the graph, with the facts the analysis and the rewrite share."""

    node: ir.Node
    name: str  # display name, unique in the graph
    x: ir.Value
    scale: ir.Value | None
    bias: ir.Value | None
    axis: int | None  # non-negative normalized axis, None if the rank is unknown
    epsilon: float
    # Why it cannot be folded whatever its upstream looks like; None if it may be.
    form_problem: str | None = None


def find_layer_norms(graph: ir.Graph, shapes: ShapeTable, names: dict[ir.Node, str]) -> list[LnCandidate]:
    """Every `LayerNormalization` in the main graph, in graph order."""
    found = []
    for node in graph:
        if node.op_type != "LayerNormalization" or node.domain not in ("", "ai.onnx"):
            continue
        inputs = list(node.inputs) + [None] * (3 - len(node.inputs))
        eps_attr = node.attributes.get("epsilon")
        cand = LnCandidate(
            node=node,
            name=names[node],
            x=inputs[0],
            scale=inputs[1],
            bias=inputs[2],
            axis=None,
            epsilon=eps_attr.as_float() if eps_attr is not None else LN_DEFAULT_EPSILON,
        )
        cand.form_problem = _form_problem(cand, shapes)
        found.append(cand)
    return found


def _form_problem(cand: LnCandidate, shapes: ShapeTable) -> str | None:
    node = cand.node
    rank = shapes.rank(cand.x)
    if rank is None:
        return f"the rank of input '{cand.x.name}' is unknown, so the normalized axis is unknown"
    axis_attr = node.attributes.get("axis")
    first = axis_attr.as_int() if axis_attr is not None else -1
    first = first + rank if first < 0 else first
    if first != rank - 1:
        return f"it normalizes over {rank - first} axes ({first}..{rank - 1}); RMSNorm folding needs one axis"
    cand.axis = first
    if cand.x.dtype is not None and cand.x.dtype not in (
        ir.DataType.FLOAT,
        ir.DataType.FLOAT16,
        ir.DataType.BFLOAT16,
        ir.DataType.DOUBLE,
    ):
        return f"its input is {cand.x.dtype.name}, not a float type"
    for i, out in enumerate(node.outputs[1:], start=1):
        if out is not None and (out.uses() or out.is_graph_output()):
            what = "Mean" if i == 1 else "InvStdDev"
            return f"its {what} output '{out.name}' is used, and RMSNorm has no such output"
    if cand.scale is None:
        return f"{node_label(node)} has no scale input"
    return None
