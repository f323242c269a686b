"""The session fusions a fold loses (`FusionCheck.session_fusion_costs`): the fused nodes of ONNX
Runtime's optimized graph of the original that its optimized graph of the folded copy lacks
(`lost_fusions`), and the LNs whose fold is to blame for each (`attribute`), by what each folded
LN's rewrite touches (`footprints`, read before the plan is applied). The fold's own changes are
discounted: LayerNormalization and SkipLayerNormalization becoming the RMS ops.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx
import onnx_ir as ir

from onnx_lnfold.analysis.bound import BoundPlan
from onnx_lnfold.analysis.plan import CenteringPlan
from onnx_lnfold.core.ops import NORM_OPS

# Ops of ONNX Runtime's optimized graph that are not fusions to keep: the normalizations the fold
# replaces on purpose, and layout or copy nodes.
_NOT_FUSIONS = frozenset(
    {op.op_type for op in NORM_OPS if not op.embed}
    | {"ReorderInput", "ReorderOutput", "MemcpyToHost", "MemcpyFromHost"}
)
_STANDARD = ("", "ai.onnx")


def _fused_nodes(graph: onnx.GraphProto, made_by: dict[str, str]) -> list[onnx.NodeProto]:
    """Nodes ONNX Runtime's fusions made: contrib ops, and Gemms the input graph did not have
    (`made_by`: output name -> op type in the graph ONNX Runtime was given)."""
    fused = []
    for node in graph.node:
        if node.op_type in _NOT_FUSIONS:
            continue
        if node.domain not in _STANDARD or (node.op_type == "Gemm" and made_by.get(node.output[0]) != "Gemm"):
            fused.append(node)
    return fused


@dataclass(frozen=True)
class LostFusion:
    """A fused node of the original's optimized graph that the folded one lacks."""

    op_type: str
    at: str  # the node of the input graph whose output it produces (display name), or ORT's name
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


def lost_fusions(
    original: onnx.GraphProto, folded: onnx.GraphProto, made_by: dict[str, str], at: dict[str, str]
) -> list[LostFusion]:
    """Fused nodes of `original` (ORT's optimized graph of the original) whose outputs no fused
    node of `folded` makes: a fusion that became another (Gelu into BiasGelu with the fold's beta
    Add) is not lost. `at`: output name -> display name of its producer in the input graph."""
    folded_outputs = {name for node in _fused_nodes(folded, made_by) for name in node.output if name}
    folded_by_inputs = {(node.op_type, tuple(node.input)) for node in _fused_nodes(folded, made_by)}
    lost = []
    for node in _fused_nodes(original, made_by):
        outputs = tuple(name for name in node.output if name)
        if any(name in folded_outputs for name in outputs):
            continue  # ORT names what it writes after what it fused: the same name is the same fusion
        known = [name for name in outputs if name in made_by]
        if not known and (node.op_type, tuple(node.input)) in folded_by_inputs:
            continue
        place = next((at[name] for name in known if name in at), outputs[0] if outputs else node.name)
        lost.append(LostFusion(node.op_type, place, tuple(node.input), outputs))
    return lost


def _region(graph: ir.Graph, fusion: LostFusion, limit: int = 128) -> tuple[set[ir.Node], set[str]]:
    """The nodes of the input graph the fused node stands for (from its outputs back to its
    inputs) and the names of the tensors they read and write."""
    by_name = {v.name: v for node in graph for v in node.outputs if v is not None and v.name}
    stop = set(fusion.inputs)
    stack = [by_name[name] for name in fusion.outputs if name in by_name]
    nodes: set[ir.Node] = set()
    while stack and len(nodes) < limit:
        node = stack.pop().producer()
        if node is None or node in nodes:
            continue
        nodes.add(node)
        for inp in node.inputs:
            if inp is not None and inp.name not in stop and inp.producer() is not None:
                stack.append(inp)
    tensors = {v.name for node in nodes for v in (*node.inputs, *node.outputs) if v is not None and v.name}
    return nodes, tensors | stop | set(fusion.outputs)


def _use_nodes(uses: tuple[str, ...]) -> set[str]:
    return {use.rsplit(":", 1)[0] for use in uses}


@dataclass(frozen=True)
class Footprint:
    """What one folded LN's rewrite touches, by name (read before the plan is applied: the rewrite
    renames and removes these)."""

    output: str  # the LN's output tensor
    anchor: str  # the node that normalizes (the LN op, a decomposed LN's first ReduceMean)
    own: frozenset[str]  # the LN's own nodes (a decomposed LN's gamma Mul and beta Add among them)
    touched: frozenset[str]  # its own nodes, a residual Add it takes in, the consumers its beta goes into


def footprints(bound: BoundPlan, names: dict[ir.Node, str]) -> dict[str, Footprint]:
    """The footprint of each folded LN of the plan, on the model it was made for (`names`)."""
    out = {}
    for fold in bound.folds:
        rewrite = fold.rewrite
        cand = rewrite.cand
        out[fold.decision.node] = Footprint(
            cand.out.name or "",
            names.get(cand.node, ""),
            frozenset(names[n] for n in cand.nodes if n in names),
            frozenset(names[n] for n in (*rewrite.replaced, *(site.node for site in rewrite.beta.sites)) if n in names),
        )
    return out


def attribute(
    fusion: LostFusion,
    graph: ir.Graph,
    plan: CenteringPlan,
    names: dict[ir.Node, str],
    folds: dict[str, Footprint],
) -> dict[str, str] | None:
    """The LNs whose fold touches the lost fusion's pattern (`graph`: the original), with how:
    an explicit centering that reads a tensor of it, a centered constant it reads, or the LN's
    own nodes and output (`folds`). None when the fused node had taken in a folded LN's gamma
    Mul or beta Add and not its normalization: the RMS op (or the rewrite's beta) does that work
    now, so nothing is lost (a scalar gamma that MatMulScaleFusion had made a FusedMatMul's alpha)."""
    nodes, tensors = _region(graph, fusion)
    node_names = {names[n] for n in nodes if n in names}
    for footprint in folds.values():
        if footprint.own & node_names and footprint.anchor not in node_names:
            return None
    why: dict[str, str] = {}
    for centering in plan.centerings:
        if centering.tensor in tensors:
            for ln in centering.required_by:
                why.setdefault(ln, f"its explicit centering reads '{centering.tensor}', inside the fused pattern")
    for edit in plan.edits:
        if _use_nodes(edit.uses) & node_names:
            for ln in edit.required_by:
                why.setdefault(ln, f"it centers '{edit.tensor}', which the fused pattern reads")
    for ln, footprint in folds.items():
        if footprint.output in tensors or footprint.touched & node_names:
            why.setdefault(ln, "the fused pattern reads its output")
    return why


__all__ = ["Footprint", "LostFusion", "attribute", "footprints", "lost_fusions"]
