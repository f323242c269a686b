"""Keras' `LayerNormalization` as tf2onnx writes it, its affine folded into the normalization:

    m = mean(x)                  ReduceMean over the axis, or GlobalAveragePool (a rank-3 input's last axis)
    v = mean((x - m) * (x - m))  the same reduction of Mul(d, d) (or Pow(d, 2)), d = Sub(x, m)
    r = 1 / sqrt(v + eps)        Add(epsilon), Sqrt, Reciprocal
    g = r * gamma                (r alone without a scale)
    y = x * g + (beta - m * g)   Mul(x, g), Mul(m, g), Sub(beta, ...), Add

(tf.nn.batch_normalization after tf.nn.moments; tf2onnx turns a ReduceMean over the last axes of a
rank-3 tensor into GlobalAveragePool). Anchored at its first reduction. On a zero-mean x, m is 0
and y = x * r * gamma + beta: RMSNorm(x) * gamma + beta. A shift of x moves m, x * g and m * g
together and leaves y: the reads of x at the mean, at d and at x * g remove it.
"""

from __future__ import annotations

import onnx_ir as ir

from onnx_lnfold.carry.engine import Requirement
from onnx_lnfold.core.blocked import Blocked
from onnx_lnfold.core.ir import is_standard
from onnx_lnfold.forms.base import (
    LnCandidate,
    LnForm,
    absorbs_own_reads,
    along_axis_constant,
    centered_square,
    check_unrolled,
    epsilon_added,
    first_use,
    only_use,
    other_input,
    reduce_axis,
    shared_intermediate,
)
from onnx_lnfold.shapes.table import ShapeTable

# What each intermediate holds, in pattern order (for reasons).
_INTERMEDIATES = (
    "the mean",
    "the centered input",
    "the squared deviations",
    "the variance",
    "the variance plus epsilon",
    "the standard deviation",
    "1/std",
    "gamma/std",
    "mean * gamma/std",
    "beta - mean * gamma/std",
    "x * gamma/std",
)


def _mean_axis(node: ir.Node, rank: int | None) -> int | None:
    """The axis a mean of the pattern averages over: a ReduceMean over one axis (kept), or a
    GlobalAveragePool of a rank-3 tensor (its last axis)."""
    if not is_standard(node):
        return None
    if node.op_type == "ReduceMean":
        return reduce_axis(node, rank)
    if node.op_type == "GlobalAveragePool" and rank == 3:
        return 2
    return None


def _product(value: ir.Value, factor: ir.Value) -> tuple[ir.Node, int] | None:
    """A Mul of `value` by `factor`, either way round."""
    return first_use(value, lambda n, i: n.op_type == "Mul" and other_input(n, n.inputs[i]) is factor)


class KerasLayerNormForm(LnForm):
    kind = "LayerNorm as tf2onnx writes Keras'"
    is_pattern = True

    def match(self, mean: ir.Node, name: str, shapes: ShapeTable) -> LnCandidate | None:
        if mean.op_type not in ("ReduceMean", "GlobalAveragePool"):
            return None  # what `_mean_axis` refuses, before the shape of the input is looked up
        x = mean.inputs[0] if mean.inputs else None
        rank = shapes.rank(x) if x is not None else None
        axis = _mean_axis(mean, rank)
        if x is None or axis is None:
            return None
        m = mean.outputs[0]
        found = centered_square(x, m)
        if found is None:
            return None
        sub, square = found
        variance = first_use(square.outputs[0], lambda n, i: n.op_type == mean.op_type and _mean_axis(n, rank) == axis)
        if variance is None:
            return None
        plus = epsilon_added(variance[0].outputs[0])
        if plus is None:
            return None
        plus_node, epsilon = plus
        sqrt = first_use(plus_node.outputs[0], lambda n, i: n.op_type == "Sqrt")
        recip = first_use(sqrt[0].outputs[0], lambda n, i: n.op_type == "Reciprocal") if sqrt else None
        if recip is None:
            return None
        chain = [mean, sub, square, variance[0], plus_node, sqrt[0], recip[0]]
        g, scale = recip[0].outputs[0], None
        if rank is not None:  # r * gamma, where the scale is not folded away
            with_scale = first_use(
                g, lambda n, i: n.op_type == "Mul" and along_axis_constant(other_input(n, n.inputs[i]), rank, axis, shapes)
            )
            if with_scale is not None:
                scale = other_input(with_scale[0], g)
                chain.append(with_scale[0])
                g = with_scale[0].outputs[0]
        mg, xg = _product(m, g), _product(x, g)
        if mg is None or xg is None:
            return None
        shifted = only_use(mg[0].outputs[0])
        if shifted is None or shifted[0].op_type != "Sub" or shifted[1] != 1:
            return None
        beta = shifted[0].inputs[0]
        out = only_use(xg[0].outputs[0])
        if out is None or out[0].op_type != "Add" or other_input(out[0], xg[0].outputs[0]) is not shifted[0].outputs[0]:
            return None
        chain += [mg[0], shifted[0], xg[0], out[0]]
        cand = LnCandidate(self, mean, name, out[0].outputs[0], scale, beta, axis, epsilon)
        cand.nodes = tuple(chain)
        if rank is None or not along_axis_constant(beta, rank, axis, shapes):
            cand.form_problem = Blocked("unknown-shape", f"the rank of input '{x.name}' or the shape of its beta is unknown")
            return cand
        cand.terms = (Requirement(0, axis),)
        shared = shared_intermediate(chain, _INTERMEDIATES)
        if shared is not None:
            node, what, how = shared
            cand.form_problem = Blocked(
                "intermediate-read", f"its intermediate '{node.outputs[0].name}' ({what}) {how}; RMSNorm does not compute it"
            )
        cand.sink_uses = ((mean, 0), (sub, 0), xg)
        check_unrolled(cand, shapes, x, axis, rank, scale, f"axis {axis}")
        return cand

    def absorbs(self, cand, node, index, axis, shapes):
        return absorbs_own_reads(cand, node, index, axis)
