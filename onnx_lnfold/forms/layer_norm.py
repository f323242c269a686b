"""`LayerNormalization` (opset 17 and later): one op, normalizing over its trailing axes."""

from __future__ import annotations

import onnx_ir as ir

from onnx_lnfold.carry.engine import Requirement
from onnx_lnfold.core.blocked import Blocked
from onnx_lnfold.core.ir import is_standard, node_label, normalize_axis
from onnx_lnfold.core.ops import LAYER_NORM
from onnx_lnfold.forms.base import LnCandidate, LnForm, LnKind, check_float, used
from onnx_lnfold.shapes.table import ShapeTable

# The ONNX spec's default. SkipSimplifiedLayerNormalization's differs (1e-12), which is why the
# rewrite always writes epsilon explicitly.
LN_DEFAULT_EPSILON = 1e-5


class LayerNormForm(LnForm):
    kind = LnKind.LAYER_NORM
    op_type = LAYER_NORM.op_type

    def match(self, node: ir.Node, name: str, shapes: ShapeTable) -> LnCandidate | None:
        if not (is_standard(node) and node.op_type == LAYER_NORM.op_type):
            return None
        inputs = list(node.inputs) + [None] * (3 - len(node.inputs))
        epsilon = node.attributes.get_float("epsilon", LN_DEFAULT_EPSILON)
        cand = LnCandidate(self, node, name, node.outputs[0], inputs[1], inputs[2], None, epsilon)
        cand.nodes = (node,)
        rank = shapes.rank(cand.x)
        if rank is None:
            cand.form_problem = Blocked(
                "unknown-shape", f"the rank of input '{cand.x.name}' is unknown, so the normalized axis is unknown"
            )
            return cand
        first = normalize_axis(node.attributes.get_int("axis", -1), rank)
        if first != rank - 1:
            cand.form_problem = Blocked(
                "several-axes",
                f"it normalizes over {rank - first} axes ({first}..{rank - 1}); RMSNorm folding needs one axis",
            )
            return cand
        cand.axis = first
        cand.terms = (Requirement(0, first),)
        cand.form_problem = check_float(cand, shapes)
        for i, out in enumerate(node.outputs[1:], start=1):
            if used(out):
                what = "Mean" if i == 1 else "InvStdDev"
                cand.form_problem = Blocked(
                    "stats-output-used", f"its {what} output '{out.name}' is used, and RMSNorm has no such output"
                )
                return cand  # and it does not absorb a shift of its input either: not a sink
        cand.sink_uses = ((node, 0),)
        if cand.scale is None:
            cand.form_problem = Blocked("no-scale", f"{node_label(node)} has no scale input")
        return cand

    def absorbs(self, cand, node, index, axis, shapes):
        if node is not cand.node:
            return None
        if index != 0:
            return Blocked("normalization-parameter", f"it is the scale or bias of {node_label(node)}")
        rank = shapes.rank(node.inputs[0])
        if rank is None:
            return Blocked("unknown-shape", f"the rank of the input of {node_label(node)} is unknown")
        first = normalize_axis(node.attributes.get_int("axis", -1), rank)
        if first != axis or axis != rank - 1:
            return Blocked("normalizes-other-axis", f"{node_label(node)} normalizes over other axes than the shifted one")
        if any(used(out) for out in node.outputs[1:]):
            return Blocked("stats-output-used", f"{node_label(node)} exposes its Mean/InvStdDev outputs")
        return {}
