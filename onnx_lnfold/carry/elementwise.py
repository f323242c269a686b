"""Carry rules of element-wise ops: unary ops (Neg, Identity, Dropout, Cast), broadcasting sums
(Add, Sub, Sum), and Mul and Div by a factor that does not vary along the axis or, for a layer
scale, by a constant per-channel one (an affine chain, docs/DESIGN.md section 2.1)."""

from __future__ import annotations

import onnx_ir as ir

from onnx_lnfold.carry.rule import In, Link, Rule, axis_vector, fed, from_input
from onnx_lnfold.core.blocked import Blocked
from onnx_lnfold.core.ir import (
    FLOAT_TYPES,
    NARROW_FLOAT_TYPES,
    const_scalar,
    node_label,
)
from onnx_lnfold.shapes.table import Shape, ShapeTable


def unary_check(node: ir.Node, shapes: ShapeTable) -> Blocked | None:
    if node.op_type == "Cast":
        to = ir.DataType(node.attributes.get_int("to", 0))
        if to not in FLOAT_TYPES:
            return Blocked("not-float-cast", f"{node_label(node)} casts to {to.name}, not a float type")
        if to in NARROW_FLOAT_TYPES and shapes.dtype(node.inputs[0]) != to:
            # Rounding to fewer bits is not linear: the centered tensor rounds differently, and
            # the difference is no longer a shift the LN removes.
            return Blocked("narrowing-cast", f"{node_label(node)} narrows to {to.name}, whose rounding does not commute with centering")
    if node.op_type == "Dropout" and len(node.inputs) > 2 and node.inputs[2] is not None:
        mode = const_scalar(node.inputs[2])  # training_mode: only a constant False is inference
        if mode is None or mode:
            return Blocked("training-dropout", f"{node_label(node)} may run in training mode")
    return None


class UnaryRule(Rule):
    """Neg, Identity, Dropout in inference mode (which ignores its ratio), Cast between floats."""

    def links(self, node, shapes, end):
        blocked = unary_check(node, shapes)
        if blocked is not None:
            return from_input(node, blocked) if isinstance(end, In) else blocked
        link = Link(0, end.axis, 0, end.axis, part=end.part)
        return [link] if link.starts_at(end) else []


def constant_along(in_shape: Shape | None, out_shape: Shape | None, out_rank: int, out_axis: int) -> bool:
    """Whether an input of `in_shape` is constant along output `out_axis` of a broadcast: it lacks
    the axis, or has size 1 there broadcast to more. False when its shape is unknown."""
    if in_shape is None:
        return False
    in_axis = out_axis - (out_rank - len(in_shape))
    if in_axis < 0:
        return True
    return in_shape[in_axis] == 1 and (out_shape is None or out_shape[out_axis] != 1)


def broadcast_link(node: ir.Node, shapes: ShapeTable, index: int, in_rank: int, out_rank: int, out_axis: int) -> Link:
    """The link between input `index` (of rank `in_rank`) and output 0 along `out_axis`."""
    in_axis = out_axis - (out_rank - in_rank)
    shape = shapes.shape(node.inputs[index])
    broadcast = constant_along(shape, shapes.shape(node.outputs[0]), out_rank, out_axis) if in_axis >= 0 else True
    return Link(index, in_axis if in_axis >= 0 else None, 0, out_axis, broadcast)


def output_rank(node: ir.Node, shapes: ShapeTable) -> int | None:
    rank = shapes.rank(node.outputs[0])
    if rank is None:
        ranks = [shapes.rank(v) for v in node.inputs if v is not None]
        if ranks and all(r is not None for r in ranks):
            rank = max(ranks)  # type: ignore[type-var]
    return rank


class BroadcastRule(Rule):
    """Add, Sub, Sum: every operand is a term of the output."""

    jointly_linear = True

    def links(self, node, shapes, end):
        out_rank = output_rank(node, shapes)
        if isinstance(end, In):
            in_rank = shapes.rank(node.inputs[end.index])
            if out_rank is None or in_rank is None:
                return Blocked("unknown-shape", f"{fed(node)}, whose shapes are unknown")
            link = broadcast_link(node, shapes, end.index, in_rank, out_rank, end.axis + out_rank - in_rank)
            return self.combine_from_input(node, shapes, link)
        in_shapes = [shapes.shape(v) for v in node.inputs]
        if out_rank is None or any(s is None for s in in_shapes):
            return Blocked("unknown-shape", f"the shapes around {node_label(node)} are unknown")
        if end.index != 0:
            return []
        links = [
            broadcast_link(node, shapes, i, len(s), out_rank, end.axis)  # type: ignore[arg-type]
            for i, s in enumerate(in_shapes)
        ]
        return self.combine_into_output(node, shapes, links, out_rank)

    def combine_into_output(self, node, shapes, links: list[Link], out_rank: int) -> list[Link] | Blocked:
        return links

    def combine_from_input(self, node, shapes, link: Link) -> list[Link] | Blocked:
        return [link]


class MulRule(BroadcastRule):
    """Mul: one operand carries the mean, the other is a factor constant along the axis (a scalar,
    a temperature) or a constant per-channel scale (an affine chain)."""

    jointly_linear = False
    scales_per_channel = True  # a constant per-channel factor makes an affine chain

    def combine_into_output(self, node, shapes, links, out_rank):
        first, second = links
        if first.broadcast != second.broadcast:
            return [second if first.broadcast else first]
        if first.broadcast:
            return Blocked(
                "constant-along-axis",
                f"{node_label(node)} multiplies two tensors that are constant along the normalized axis",
            )
        for scale in (1, 0):
            if axis_vector(node, scale, out_rank, first.out_axis, shapes) is not None:
                return [links[1 - scale]._replace(factor=scale)]
        if gated_activation(node) is not None:
            return Blocked("varying-factor", f"{_activation_label(node)} is nonlinear: its output's mean depends on the data")
        return Blocked(
            "varying-factor",
            f"{node_label(node)} multiplies by a tensor that varies along the normalized axis "
            "and is not a constant per-channel scale",
        )

    def combine_from_input(self, node, shapes, link):
        other = node.inputs[1 - link.input]
        out_rank = output_rank(node, shapes) or 0
        if constant_along(shapes.shape(other), shapes.shape(node.outputs[0]), out_rank, link.out_axis):
            return [link]
        if self.scales_per_channel and axis_vector(node, 1 - link.input, out_rank, link.out_axis, shapes) is not None:
            return [link]  # a per-channel scale: the caller rescales the shift
        if gated_activation(node) is not None:
            return Blocked("varying-factor", f"it feeds {_activation_label(node)}, which is nonlinear")
        return Blocked("varying-factor", f"{fed(node)}, which multiplies it by a tensor that varies along the axis")


# The activations written as `x * f(x)` (a decomposed GELU, SiLU), named by the op inside f.
_GATES = {"Erf": "GELU", "Tanh": "GELU (tanh approximation)", "Sigmoid": "SiLU"}
_GATE_DEPTH = 5  # how far back each factor is followed to the input both read


def gated_activation(node: ir.Node) -> str | None:
    """`GELU` where the Mul `node` is `x * f(x)` with an Erf (Tanh, Sigmoid) in f: the activation
    an exporter wrote out op by op; else None."""
    if node.op_type != "Mul" or len(node.inputs) != 2:
        return None
    sides = [_ancestry(v) for v in node.inputs]
    if not (sides[0][0] & sides[1][0]):  # the two factors read no tensor in common
        return None
    ops = sides[0][1] | sides[1][1]
    return next((name for op, name in _GATES.items() if op in ops), None)


def _ancestry(value: ir.Value | None) -> tuple[set[ir.Value], set[str]]:
    """The tensors `value` is computed from within `_GATE_DEPTH` nodes (itself included), and the
    op types on the way."""
    values, ops, frontier = set(), set(), [value] if value is not None else []
    for _ in range(_GATE_DEPTH):
        nxt = []
        for v in frontier:
            values.add(v)
            producer = v.producer()
            if producer is not None and producer.op_type != "Constant":
                ops.add(producer.op_type)
                nxt += [i for i in producer.inputs if i is not None and not i.is_initializer()]
        frontier = nxt
    return values, ops


def _activation_label(node: ir.Node) -> str:
    """`the GELU written out op by op, ending in Mul 'node_gelu_2' (x * f(x))`."""
    return f"the {gated_activation(node)} written out op by op, ending in {node_label(node)} (x * f(x))"


class DivRule(MulRule):
    """Div: the stream is the dividend; the divisor is constant along the axis."""

    scales_per_channel = False

    def combine_into_output(self, node, shapes, links, out_rank):
        dividend, divisor = links
        if not divisor.broadcast:
            return Blocked(
                "varying-factor", f"{node_label(node)} divides by a tensor that varies along the normalized axis"
            )
        return [dividend]

    def combine_from_input(self, node, shapes, link):
        if link.input == 1:
            return Blocked("non-data-input", f"{fed(node)} as the divisor")
        return super().combine_from_input(node, shapes, link)
