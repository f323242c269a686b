"""`com.microsoft::SkipLayerNormalization` (written by ONNX Runtime's transformers optimizer): it
normalizes `input + skip (+ bias)` and exposes that sum as its output 3. Its fold is
`SkipSimplifiedLayerNormalization` with the same inputs."""

from __future__ import annotations

import onnx_ir as ir

from onnx_lnfold.carry.engine import Requirement
from onnx_lnfold.core.blocked import Blocked
from onnx_lnfold.core.ir import node_label
from onnx_lnfold.core.ops import MS_DOMAIN, NORM_OPS, SKIP_LAYER_NORM
from onnx_lnfold.forms.base import LnCandidate, LnForm, LnKind, RewriteSite, check_float, used
from onnx_lnfold.shapes.table import ShapeTable

# ONNX Runtime's default for the Skip ops (the rewrite writes epsilon explicitly anyway).
SKIP_LN_DEFAULT_EPSILON = 1e-12

# Ops whose output 3 is the residual sum `input + skip (+ bias)`: a carry, not a normalization.
# (The RMS one is what a fold writes: a folded model folded again reads it.)
SKIP_NORMALIZATIONS = frozenset(op.op_type for op in NORM_OPS if op.skip)


def is_residual_sum(value: ir.Value) -> bool:
    """Output 3 of a Skip*Normalization: the residual sum input + skip (+ bias), a carry."""
    node = value.producer()
    return node is not None and node.domain == MS_DOMAIN and node.op_type in SKIP_NORMALIZATIONS and value.index() == 3


def sum_terms(node: ir.Node, shapes: ShapeTable, axis: int) -> list[Requirement] | None:
    """What must be zero-mean for a Skip*Normalization's sum (output 3) to be: all its addends."""
    bias_index = 4 if node.op_type == SKIP_LAYER_NORM.op_type else 3
    skip_rank = shapes.rank(node.inputs[1])
    if skip_rank is None:
        return None
    terms = [Requirement(0, axis), Requirement(1, skip_rank - 1)]
    if len(node.inputs) > bias_index and node.inputs[bias_index] is not None:
        terms.append(Requirement(bias_index, 0))
    return terms


class SkipLayerNormForm(LnForm):
    kind = LnKind.SKIP_LAYER_NORM
    op_type = SKIP_LAYER_NORM.op_type
    has_skip = True
    roles = {4: "SkipLayerNormalization bias"}

    def match(self, node: ir.Node, name: str, shapes: ShapeTable) -> LnCandidate | None:
        if not (node.domain == MS_DOMAIN and node.op_type == SKIP_LAYER_NORM.op_type):
            return None
        inputs = list(node.inputs) + [None] * (5 - len(node.inputs))
        epsilon = node.attributes.get_float("epsilon", SKIP_LN_DEFAULT_EPSILON)
        cand = LnCandidate(self, node, name, node.outputs[0], inputs[2], inputs[3], None, epsilon)
        cand.nodes = (node,)
        rank, skip_rank = shapes.rank(inputs[0]), shapes.rank(inputs[1])
        if rank is None or skip_rank is None:
            cand.form_problem = Blocked(
                "unknown-shape", "the ranks of its input and skip are unknown, so the normalized axis is unknown"
            )
            return cand
        cand.axis = rank - 1
        terms = [Requirement(0, rank - 1), Requirement(1, skip_rank - 1)]
        if inputs[4] is not None:
            terms.append(Requirement(4, 0))
        cand.terms = tuple(terms)
        cand.form_problem = check_float(cand, shapes)
        for i in (1, 2):
            if i < len(node.outputs) and used(node.outputs[i]):
                cand.form_problem = Blocked(
                    "stats-output-used", f"its {'mean' if i == 1 else 'inv_std_var'} output is used"
                )
                return cand
        cand.sink_uses = tuple((node, t.index) for t in terms)
        return cand

    def absorbs(self, cand, node, index, axis, shapes):
        if node is not cand.node:
            return None
        if index not in (0, 1, 4):
            return Blocked("normalization-parameter", f"it is the gamma or beta of {node_label(node)}")
        rank = shapes.rank(node.inputs[index])
        if rank is None or axis != rank - 1:
            return Blocked(
                "normalizes-other-axis", f"{node_label(node)} normalizes over the last axis, not the shifted one"
            )
        outs = node.outputs
        if any(i < len(outs) and used(outs[i]) for i in (1, 2)):
            return Blocked("stats-output-used", f"{node_label(node)} exposes its Mean/InvStdDev outputs")
        if len(outs) > 3 and outs[3] is not None:  # the sum carries the shift on
            return {3: shapes.rank(outs[3]) - 1} if shapes.rank(outs[3]) else {3: axis}
        return {}

    def site(self, cand: LnCandidate) -> RewriteSite:
        node = cand.node
        bias = (node, 4) if len(node.inputs) > 4 and node.inputs[4] is not None else None
        old_sum = node.outputs[3] if len(node.outputs) > 3 else None
        return RewriteSite(((node, 0), (node, 1)), bias, old_sum, node)
