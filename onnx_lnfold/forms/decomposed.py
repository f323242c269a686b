"""The decomposed LayerNorm older exporters write (TorchScript before opset 17, Keras, hand-built):
`ReduceMean -> Sub -> Pow|Mul -> ReduceMean -> Add(eps) -> Sqrt -> Div | Reciprocal+Mul ->
[Mul(gamma)] -> [Add(beta)]`, anchored at its first ReduceMean. The rewrite replaces every node of
the pattern; a shift of the input is removed by the first ReduceMean and the Sub together."""

from __future__ import annotations

import onnx_ir as ir

from onnx_lnfold.carry.engine import Requirement
from onnx_lnfold.core.blocked import Blocked
from onnx_lnfold.core.ir import is_standard
from onnx_lnfold.forms.base import (
    LnCandidate,
    LnForm,
    LnKind,
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


class DecomposedForm(LnForm):
    kind = LnKind.DECOMPOSED
    is_pattern = True

    def match(self, mean: ir.Node, name: str, shapes: ShapeTable) -> LnCandidate | None:
        """Match the decomposed pattern anchored at its first ReduceMean; None if it is not one.

        Intermediates may have readers outside the pattern (or be graph outputs): the pattern is
        still an LN, reported and kept, since folding removes the nodes that compute them."""
        if not (is_standard(mean) and mean.op_type == "ReduceMean"):
            return None
        x = mean.inputs[0]
        rank = shapes.rank(x)
        axis = reduce_axis(mean, rank)
        if x is None or axis is None:
            return None
        found = centered_square(x, mean.outputs[0])
        if found is None:
            return None
        sub, square = found
        d = sub.outputs[0]
        chain = [mean, sub, square]
        step = first_use(
            square.outputs[0], lambda n, i: n.op_type == "ReduceMean" and i == 0 and reduce_axis(n, rank) == axis
        )
        if step is None:
            return None
        chain.append(step[0])
        plus = epsilon_added(step[0].outputs[0])
        if plus is None:
            return None
        plus_node, epsilon = plus
        chain.append(plus_node)
        step = first_use(plus_node.outputs[0], lambda n, i: n.op_type == "Sqrt")
        if step is None:
            return None
        chain.append(step[0])
        root = step[0].outputs[0]
        norm = first_use(d, lambda n, i: n.op_type == "Div" and i == 0 and n.inputs[1] is root)
        if norm is None:
            recip = first_use(root, lambda n, i: n.op_type == "Reciprocal")
            if recip is None:
                return None
            r = recip[0].outputs[0]
            norm = first_use(d, lambda n, i: n.op_type == "Mul" and i == 0 and n.inputs[1] is r)
            if norm is None:
                return None
            chain.append(recip[0])
        norm = norm[0]
        chain.append(norm)
        out = norm.outputs[0]
        scale = beta = None
        step = only_use(out)
        if rank is None:  # recognized, and reported, but not folded: the axis is unknown
            cand = LnCandidate(self, mean, name, out, None, None, None, epsilon)
            cand.nodes = tuple(chain)
            cand.form_problem = Blocked("unknown-shape", f"the rank of input '{x.name}' is unknown, so the normalized axis is unknown")
            return cand
        if step is not None and step[0].op_type == "Mul" and along_axis_constant(other_input(step[0], out), rank, axis, shapes):
            scale = other_input(step[0], out)
            chain.append(step[0])
            out = step[0].outputs[0]
            step = only_use(out)
        if step is not None and step[0].op_type == "Add" and along_axis_constant(other_input(step[0], out), rank, axis, shapes):
            beta = other_input(step[0], out)
            chain.append(step[0])
            out = step[0].outputs[0]
        cand = LnCandidate(self, mean, name, out, scale, beta, axis, epsilon)
        cand.nodes = tuple(chain)
        cand.terms = (Requirement(0, axis),)
        shared = shared_intermediate(chain, _INTERMEDIATES)
        if shared is not None:
            node, what, how = shared
            if node is mean:
                # The mean moves with a shift of the input: this pattern does not remove one.
                cand.form_problem = Blocked("intermediate-read", f"its mean '{mean.outputs[0].name}' {how}, and centering the input would change it")
                return cand
            cand.form_problem = Blocked(
                "intermediate-read", f"its intermediate '{node.outputs[0].name}' ({what}) {how}; RMSNorm does not compute it"
            )
        # The pattern removes a shift of x whatever else reads its shift-free intermediates.
        cand.sink_uses = ((mean, 0), (sub, 0))
        check_unrolled(cand, shapes, x, axis, rank, scale, f"axis {axis}")
        return cand

    def absorbs(self, cand, node, index, axis, shapes):
        return absorbs_own_reads(cand, node, index, axis)


# What each intermediate of a decomposed LN holds, in pattern order (for reasons).
_INTERMEDIATES = (
    "the mean",
    "the centered input",
    "the squared deviations",
    "the variance",
    "the variance plus epsilon",
    "the standard deviation",
    "1/std",
)
