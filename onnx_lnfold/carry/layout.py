"""Carry rules of layout ops that keep the axis whole, possibly moving it: Reshape, Flatten,
Squeeze, Unsqueeze (an axis split into heads seen in blocks, section 2.4), Transpose, Expand, and
ReduceMean/ReduceSum over other axes."""

from __future__ import annotations

import onnx_ir as ir

from onnx_lnfold.carry.rule import End, In, Link, Out, Rule, fed, from_input
from onnx_lnfold.core.blocked import Blocked
from onnx_lnfold.core.ir import (
    attr_or_input_ints,
    node_label,
    normalize_axis,
)
from onnx_lnfold.shapes.parts import Part
from onnx_lnfold.shapes.reshape import blocked_axis
from onnx_lnfold.shapes.table import Shape, ShapeTable


class LayoutRule(Rule):
    """An op that moves the axes of input 0 to its output(s), keeping some whole. `axis_map` holds
    the map (input axis -> output axis) once, by default `map_shapes` of the shapes around the node;
    `refusal` says why an axis is not in it."""

    non_data = "as a shape or axes input"

    def axis_map(self, node: ir.Node, shapes: ShapeTable) -> dict[int, int] | Blocked:
        """The map, from the shapes around the node (`map_shapes`); refused where either is unknown."""
        around = shapes_around(node, shapes)
        if isinstance(around, Blocked):
            return around
        return self.map_shapes(node, *around)

    def map_shapes(self, node: ir.Node, in_shape: Shape, out_shape: Shape) -> dict[int, int] | Blocked:
        raise NotImplementedError

    def refusal(self, node: ir.Node, end: End) -> Blocked:
        """Why the axis at `end` is not kept whole."""
        return Blocked("axis-not-kept", f"{node_label(node)} does not keep the normalized axis whole")

    def broadcast(self, node: ir.Node, shapes: ShapeTable, in_axis: int) -> bool:
        return False

    def outputs(self, node: ir.Node) -> range:
        return range(1)

    def mapped(self, node: ir.Node, shapes: ShapeTable, end: End) -> int | None | Blocked:
        """`end`'s axis on the other side, or None when the op does not keep it whole."""
        mapping = self.axis_map(node, shapes)
        if isinstance(mapping, Blocked):
            return mapping
        if isinstance(end, In):
            return mapping.get(end.axis)
        return next((i for i, o in mapping.items() if o == end.axis), None)

    def carried(self, node: ir.Node, shapes: ShapeTable, end: End, other: int, k: int) -> Part | None | Blocked:
        """The part at the far end (output `k` from an input end, input 0 from an output end),
        along `other`; None when that output holds nothing of the part. By default the same
        blocks (the axis keeps its length and order) and no `where` (a widening)."""
        return end.part.without_where()

    def links(self, node, shapes, end):
        if isinstance(end, In) and end.index != 0:
            return Blocked("non-data-input", f"{fed(node)} {self.non_data}")
        if isinstance(end, Out) and end.index not in self.outputs(node):
            return []
        other = self.mapped(node, shapes, end)
        if other is None:
            other = self.refusal(node, end)
        if isinstance(other, Blocked):
            return from_input(node, other) if isinstance(end, In) else other
        if isinstance(end, In):
            links = []
            for k in self.outputs(node):
                part = self.carried(node, shapes, end, other, k)
                if isinstance(part, Blocked):
                    return from_input(node, part)
                if part is not None:
                    links.append(Link(0, end.axis, k, other, part=part))
            return links
        part = self.carried(node, shapes, end, other, end.index)
        if isinstance(part, Blocked):
            return part
        assert part is not None  # the only input holds all of any output
        return [Link(0, other, end.index, end.axis, self.broadcast(node, shapes, other), part=part)]


def unknown_around(node: ir.Node) -> Blocked:
    reason = f"the shape around {node_label(node)} is unknown, so the axis cannot be followed"
    return Blocked("unknown-shape", reason)


def shapes_around(node: ir.Node, shapes: ShapeTable) -> tuple[Shape, Shape] | Blocked:
    in_shape, out_shape = shapes.shape(node.inputs[0]), shapes.shape(node.outputs[0])
    if in_shape is None or out_shape is None:
        return unknown_around(node)
    return in_shape, out_shape


class ReshapeRule(LayoutRule):
    """Reshape, Flatten, Squeeze, Unsqueeze: which axis stays whole, or which axis holds this one
    in blocks (a split into heads, seen from either side), is `shapes.reshape.blocked_axis`'s to say."""

    def links(self, node, shapes, end):
        if isinstance(end, In) and end.index != 0:
            return Blocked("non-data-input", f"{fed(node)} {self.non_data}")
        if isinstance(end, Out) and end.index != 0:
            return []
        found = blocked_axis(node, shapes, end.axis, end.part, forward=isinstance(end, In))
        if found is None:
            refusal = self.refusal(node, end)
            return from_input(node, refusal) if isinstance(end, In) else refusal
        other, part = found
        if isinstance(end, In):
            return [Link(0, end.axis, 0, other, part=part)]
        return [Link(0, other, 0, end.axis, part=part)]


class TransposeRule(LayoutRule):
    def map_shapes(self, node, in_shape, out_shape):
        perm = list(node.attributes.get_ints("perm", reversed(range(len(in_shape)))))
        return {src: dst for dst, src in enumerate(perm)}

    def carried(self, node, shapes, end, other, k):
        mapping = self.axis_map(node, shapes)
        assert not isinstance(mapping, Blocked)  # `mapped` read it already
        return end.part.moved(mapping if isinstance(end, In) else {o: i for i, o in mapping.items()})


class ExpandRule(LayoutRule):
    """Expand broadcasts input 0 to the output shape: the input's axes are the output's last ones."""

    def map_shapes(self, node, in_shape, out_shape):
        offset = len(out_shape) - len(in_shape)
        return {b: b + offset for b in range(len(in_shape))}

    def refusal(self, node, end):
        return Blocked("axis-not-kept", f"{node_label(node)} broadcasts along the axis")

    def broadcast(self, node, shapes, in_axis):
        return shapes.shape(node.inputs[0])[in_axis] == 1  # type: ignore[index]


def reduced_axes(node: ir.Node, rank: int) -> list[int] | Blocked:
    axes = attr_or_input_ints(node, "axes", 1)
    if axes is None:
        return Blocked("axes-not-constant", f"{node_label(node)} reduces over axes that are not constant")
    if not axes:
        if node.attributes.get_int("noop_with_empty_axes", 0):
            return []
        return list(range(rank))
    return sorted(normalize_axis(a, rank) for a in axes)


class ReduceRule(LayoutRule):
    """ReduceMean, ReduceSum over other axes (pooling) keep the remaining axes whole."""

    def map_shapes(self, node, in_shape, out_shape):
        rank = len(in_shape)
        reduced = reduced_axes(node, rank)
        if isinstance(reduced, Blocked):
            return reduced
        kept = [a for a in range(rank) if a not in reduced]
        keepdims = node.attributes.get_int("keepdims", 1)
        return {a: a if keepdims else j for j, a in enumerate(kept)}

    def refusal(self, node, end):
        return Blocked("axis-not-kept", f"{node_label(node)} reduces over the normalized axis")
