"""The carry table: one rule per op, read by `_carry.backward` and `_carry.forward` alike.

A rule holds one op's axis bookkeeping once (broadcast alignment, the axis map of a layout op,
which input of a producer is its weight and along which axis) and answers in `Link`s: input `i`
along axis `b` moves output `k` along axis `a`. Asked from an output end (`Out`) it returns the
links into that output axis: the inputs that must be zero-mean (docs/DESIGN.md section 2). Asked
from an input end (`In`) it returns the links out of that input axis: the outputs a shift there
changes (section 3). Both directions read the same links, so they agree by construction;
tests/test_carry_agreement.py checks it on random nodes of every op here.

A refusal is a `Blocked`. Asked from an input end, its reason starts with "it feeds <node>", as
the side-effect rule words what a changed tensor reaches.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import onnx_ir as ir

from onnx_lnfold.core.blocked import Blocked
from onnx_lnfold.core.ir import (
    FLOAT_TYPES,
    NARROW_FLOAT_TYPES,
    attr_or_input_ints,
    const_ints,
    const_scalar,
    node_label,
    normalize_axis,
)
from onnx_lnfold.shapes.parts import WHOLE, Part
from onnx_lnfold.shapes.reshape import blocked_axis
from onnx_lnfold.shapes.table import Shape, ShapeTable


@dataclass(frozen=True)
class Out:
    """Output `index` of a node, along `axis` (the `part` of it, `_parts`): backward's question
    starts here."""

    index: int
    axis: int
    part: Part = WHOLE


@dataclass(frozen=True)
class In:
    """Input `index` of a node, along `axis` (the `part` of it): forward's question starts here."""

    index: int
    axis: int
    part: Part = WHOLE


End = Out | In


@dataclass(frozen=True)
class Link:
    """Input `input` along `in_axis` moves output `output` along `out_axis`."""

    input: int
    in_axis: int | None  # None: the input lacks the axis (broadcast from a lower rank)
    output: int
    out_axis: int
    # The input is constant along `out_axis` (missing, or size 1 broadcast to more): its part of
    # the output has to be exactly zero, not zero-mean.
    broadcast: bool = False
    # A constant input that scales this one per channel (a layer scale): then `input * factor`
    # must be zero-mean (an affine chain).
    factor: int | None = None
    # The part at the far end from the one asked about; None: the same blocks, no `where` (the
    # axis keeps its length and order, and the rule does not follow positions of other axes).
    part: Part | None = None

    def starts_at(self, end: End) -> bool:
        if isinstance(end, Out):
            return (self.output, self.out_axis) == (end.index, end.axis)
        return (self.input, self.in_axis) == (end.index, end.axis)


def fed(node: ir.Node) -> str:
    """How a refusal asked from an input end begins."""
    return f"it feeds {node_label(node)}"


def _from_input(node: ir.Node, blocked: Blocked) -> Blocked:
    return blocked.reworded(f"{fed(node)}: {blocked.reason}")


class Rule:
    """How one op (or op family) carries a mean. Subclasses implement `links`."""

    # Several inputs may change at once: the op adds up its changed inputs linearly.
    jointly_linear = False
    # What the plan calls a constant centered at an input: {input index: role}.
    roles: ClassVar[dict[int, str]] = {}

    def links(self, node: ir.Node, shapes: ShapeTable, end: End) -> list[Link] | Blocked:
        """Every link through `end` (an empty list: none, the end is not on the stream)."""
        raise NotImplementedError


def axis_vector(node: ir.Node, index: int, out_rank: int, axis: int, shapes: ShapeTable) -> np.ndarray | None:
    """Input `index` of `node` as a 1-D vector along output `axis`, if it is a constant that varies
    along that axis only (a per-channel scale); else None."""
    value = node.inputs[index]
    if value is None or value.is_graph_input():
        return None
    tensor = ir.convenience.get_const_tensor(value)
    if tensor is None:
        return None
    shape = tuple(tensor.shape.dims)
    in_axis = axis - (out_rank - len(shape))
    if in_axis < 0 or shape[in_axis] == 1:
        return None
    if any(d != 1 for i, d in enumerate(shape) if i != in_axis):
        return None  # checked before reading: a weight matrix is never loaded just to say no
    return np.asarray(tensor.numpy()).astype(np.float64).reshape(-1)


# --- unary ops: input 0 axis a is output 0 axis a -------------------------------------------------


def _unary_check(node: ir.Node, shapes: ShapeTable) -> Blocked | None:
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


class _Unary(Rule):
    """Neg, Identity, Dropout in inference mode (which ignores its ratio), Cast between floats."""

    def links(self, node, shapes, end):
        blocked = _unary_check(node, shapes)
        if blocked is not None:
            return _from_input(node, blocked) if isinstance(end, In) else blocked
        link = Link(0, end.axis, 0, end.axis, part=end.part)
        return [link] if link.starts_at(end) else []


# --- elementwise ops: numpy broadcasting ----------------------------------------------------------


def _constant_along(in_shape: Shape | None, out_shape: Shape | None, out_rank: int, out_axis: int) -> bool:
    """Whether an input of `in_shape` is constant along output `out_axis` of a broadcast: it lacks
    the axis, or has size 1 there broadcast to more. False when its shape is unknown."""
    if in_shape is None:
        return False
    in_axis = out_axis - (out_rank - len(in_shape))
    if in_axis < 0:
        return True
    return in_shape[in_axis] == 1 and (out_shape is None or out_shape[out_axis] != 1)


def _broadcast_link(node: ir.Node, shapes: ShapeTable, index: int, in_rank: int, out_rank: int, out_axis: int) -> Link:
    """The link between input `index` (of rank `in_rank`) and output 0 along `out_axis`."""
    in_axis = out_axis - (out_rank - in_rank)
    shape = shapes.shape(node.inputs[index])
    broadcast = _constant_along(shape, shapes.shape(node.outputs[0]), out_rank, out_axis) if in_axis >= 0 else True
    return Link(index, in_axis if in_axis >= 0 else None, 0, out_axis, broadcast)


def _out_rank(node: ir.Node, shapes: ShapeTable) -> int | None:
    rank = shapes.rank(node.outputs[0])
    if rank is None:
        ranks = [shapes.rank(v) for v in node.inputs if v is not None]
        if ranks and all(r is not None for r in ranks):
            rank = max(ranks)  # type: ignore[type-var]
    return rank


class _Broadcast(Rule):
    """Add, Sub, Sum: every operand is a term of the output."""

    jointly_linear = True

    def links(self, node, shapes, end):
        out_rank = _out_rank(node, shapes)
        if isinstance(end, In):
            in_rank = shapes.rank(node.inputs[end.index])
            if out_rank is None or in_rank is None:
                return Blocked("unknown-shape", f"{fed(node)}, whose shapes are unknown")
            link = _broadcast_link(node, shapes, end.index, in_rank, out_rank, end.axis + out_rank - in_rank)
            return self.combine_from_input(node, shapes, link)
        in_shapes = [shapes.shape(v) for v in node.inputs]
        if out_rank is None or any(s is None for s in in_shapes):
            return Blocked("unknown-shape", f"the shapes around {node_label(node)} are unknown")
        if end.index != 0:
            return []
        links = [
            _broadcast_link(node, shapes, i, len(s), out_rank, end.axis)  # type: ignore[arg-type]
            for i, s in enumerate(in_shapes)
        ]
        return self.combine_into_output(node, shapes, links, out_rank)

    def combine_into_output(self, node, shapes, links: list[Link], out_rank: int) -> list[Link] | Blocked:
        return links

    def combine_from_input(self, node, shapes, link: Link) -> list[Link] | Blocked:
        return [link]


class _Mul(_Broadcast):
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
                return [dataclasses.replace(links[1 - scale], factor=scale)]
        return Blocked(
            "varying-factor",
            f"{node_label(node)} multiplies by a tensor that varies along the normalized axis "
            "and is not a constant per-channel scale",
        )

    def combine_from_input(self, node, shapes, link):
        other = node.inputs[1 - link.input]
        out_rank = _out_rank(node, shapes) or 0
        if _constant_along(shapes.shape(other), shapes.shape(node.outputs[0]), out_rank, link.out_axis):
            return [link]
        if self.scales_per_channel and axis_vector(node, 1 - link.input, out_rank, link.out_axis, shapes) is not None:
            return [link]  # a per-channel scale: the caller rescales the shift
        return Blocked("varying-factor", f"{fed(node)}, which multiplies it by a tensor that varies along the axis")


class _Div(_Mul):
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


# --- producers: a constant weight whose centering centers the output ------------------------------


class _Producer(Rule):
    """An op whose output axis `produced_axis` comes from one axis of a constant weight (and bias):
    centering those makes the output zero-mean whatever the data input. A shift anywhere else
    mixes into every output."""

    jointly_linear = True

    def check(self, node: ir.Node) -> Blocked | None:
        return None

    def produced_axis(self, node: ir.Node, shapes: ShapeTable) -> int | None | Blocked:
        raise NotImplementedError

    def wrong_axis(self, node: ir.Node) -> Blocked:
        raise NotImplementedError

    def weights(self, node: ir.Node, shapes: ShapeTable, axis: int, end: End) -> list[Link] | Blocked:
        """The links from the weight (and bias) to output `axis`."""
        raise NotImplementedError

    def _links(self, node, shapes, end):
        blocked = self.check(node)
        if blocked is not None:
            return blocked
        axis = self.produced_axis(node, shapes)
        if isinstance(axis, Blocked):
            return axis
        if axis is None or (isinstance(end, Out) and end.axis != axis):
            return self.wrong_axis(node)
        return self.weights(node, shapes, axis, end)

    def links(self, node, shapes, end):
        links = self._links(node, shapes, end)
        if isinstance(end, Out):
            return links if isinstance(links, Blocked) else [link for link in links if link.starts_at(end)]
        mine = [] if isinstance(links, Blocked) else [link for link in links if link.starts_at(end)]
        return mine or Blocked("mixes-shift", f"{fed(node)}, which mixes the shift into every output")


class _MatMul(_Producer):
    """MatMul(X, W): the last output axis is W's columns."""

    jointly_linear = False  # X and W changing at once change the product bilinearly
    roles: ClassVar[dict[int, str]] = {1: "MatMul weight"}

    def produced_axis(self, node, shapes):
        out_rank, w_rank = shapes.rank(node.outputs[0]), shapes.rank(node.inputs[1])
        if out_rank is None or w_rank is None:
            return Blocked("unknown-shape", f"the shapes around {node_label(node)} are unknown")
        return out_rank - 1 if w_rank >= 2 else None

    def wrong_axis(self, node):
        return Blocked(
            "wrong-axis", f"{node_label(node)} does not produce the normalized axis from its weight's columns"
        )

    def weights(self, node, shapes, axis, end):
        return [Link(1, shapes.rank(node.inputs[1]) - 1, 0, axis)]  # type: ignore[operator]


class _Gemm(_Producer):
    """Gemm(A, B, C): output columns (axis 1) are B's columns (its rows with transB), plus C."""

    roles: ClassVar[dict[int, str]] = {1: "Gemm weight", 2: "Gemm bias"}

    def produced_axis(self, node, shapes):
        return 1

    def wrong_axis(self, node):
        return Blocked("wrong-axis", f"{node_label(node)} is normalized along its rows, not its output columns")

    def weights(self, node, shapes, axis, end):
        links = [Link(1, 0 if node.attributes.get_int("transB", 0) else 1, 0, axis)]
        if len(node.inputs) > 2 and node.inputs[2] is not None:
            if isinstance(end, Out) and shapes.shape(node.inputs[2]) is None:
                return Blocked("unknown-shape", f"the shape of the bias of {node_label(node)} is unknown")
            c_rank = shapes.rank(node.inputs[2])
            if c_rank is not None:
                links.append(_broadcast_link(node, shapes, 2, c_rank, 2, axis))
        return links


class _Conv(_Producer):
    """Conv(X, W, B) with group 1: output channels (axis 1) are W's and B's axis 0."""

    roles: ClassVar[dict[int, str]] = {1: "Conv weight", 2: "Conv bias"}

    def check(self, node):
        group = node.attributes.get_int("group", 1)
        if group != 1:
            return Blocked(
                "grouped-conv",
                f"{node_label(node)} is a grouped Conv (group={group}): "
                "its output channels cannot be centered by editing weights",
            )
        return None

    def produced_axis(self, node, shapes):
        return 1

    def wrong_axis(self, node):
        return Blocked("wrong-axis", f"{node_label(node)} is normalized along an axis other than its channels")

    def weights(self, node, shapes, axis, end):
        biased = len(node.inputs) > 2 and node.inputs[2] is not None
        return [Link(1, 0, 0, axis)] + ([Link(2, 0, 0, axis)] if biased else [])


# --- layout ops: a partial map between the axes of input 0 and those of the outputs ---------------


class _Layout(Rule):
    """An op that moves the axes of input 0 to its output(s), keeping some whole. `axis_map` holds
    the map (input axis -> output axis) once; `refusal` says why an axis is not in it."""

    non_data = "as a shape or axes input"

    def axis_map(self, node: ir.Node, shapes: ShapeTable) -> dict[int, int] | Blocked:
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
            return _from_input(node, other) if isinstance(end, In) else other
        if isinstance(end, In):
            links = []
            for k in self.outputs(node):
                part = self.carried(node, shapes, end, other, k)
                if isinstance(part, Blocked):
                    return _from_input(node, part)
                if part is not None:
                    links.append(Link(0, end.axis, k, other, part=part))
            return links
        part = self.carried(node, shapes, end, other, end.index)
        if isinstance(part, Blocked):
            return part
        assert part is not None  # the only input holds all of any output
        return [Link(0, other, end.index, end.axis, self.broadcast(node, shapes, other), part=part)]


def _unknown_around(node: ir.Node) -> Blocked:
    reason = f"the shape around {node_label(node)} is unknown, so the axis cannot be followed"
    return Blocked("unknown-shape", reason)


def _shapes_around(node: ir.Node, shapes: ShapeTable) -> tuple[Shape, Shape] | Blocked:
    in_shape, out_shape = shapes.shape(node.inputs[0]), shapes.shape(node.outputs[0])
    if in_shape is None or out_shape is None:
        return _unknown_around(node)
    return in_shape, out_shape


class _Reshape(_Layout):
    """Reshape, Flatten, Squeeze, Unsqueeze: which axis stays whole, or which axis holds this one
    in blocks (a split into heads, seen from either side), is `_reshape.blocked_axis`'s to say."""

    def links(self, node, shapes, end):
        if isinstance(end, In) and end.index != 0:
            return Blocked("non-data-input", f"{fed(node)} {self.non_data}")
        if isinstance(end, Out) and end.index != 0:
            return []
        found = blocked_axis(node, shapes, end.axis, end.part, forward=isinstance(end, In))
        if found is None:
            refusal = self.refusal(node, end)
            return _from_input(node, refusal) if isinstance(end, In) else refusal
        other, part = found
        if isinstance(end, In):
            return [Link(0, end.axis, 0, other, part=part)]
        return [Link(0, other, 0, end.axis, part=part)]


class _Transpose(_Layout):
    def axis_map(self, node, shapes):
        around = _shapes_around(node, shapes)
        if isinstance(around, Blocked):
            return around
        perm = list(node.attributes.get_ints("perm", reversed(range(len(around[0])))))
        return {src: dst for dst, src in enumerate(perm)}

    def carried(self, node, shapes, end, other, k):
        mapping = self.axis_map(node, shapes)
        assert not isinstance(mapping, Blocked)  # `mapped` read it already
        return end.part.moved(mapping if isinstance(end, In) else {o: i for i, o in mapping.items()})


class _Expand(_Layout):
    """Expand broadcasts input 0 to the output shape: the input's axes are the output's last ones."""

    def axis_map(self, node, shapes):
        around = _shapes_around(node, shapes)
        if isinstance(around, Blocked):
            return around
        in_shape, out_shape = around
        offset = len(out_shape) - len(in_shape)
        return {b: b + offset for b in range(len(in_shape))}

    def refusal(self, node, end):
        return Blocked("axis-not-kept", f"{node_label(node)} broadcasts along the axis")

    def broadcast(self, node, shapes, in_axis):
        return shapes.shape(node.inputs[0])[in_axis] == 1  # type: ignore[index]


def _reduced_axes(node: ir.Node, rank: int) -> list[int] | Blocked:
    axes = attr_or_input_ints(node, "axes", 1)
    if axes is None:
        return Blocked("axes-not-constant", f"{node_label(node)} reduces over axes that are not constant")
    if not axes:
        if node.attributes.get_int("noop_with_empty_axes", 0):
            return []
        return list(range(rank))
    return sorted(normalize_axis(a, rank) for a in axes)


class _Reduce(_Layout):
    """ReduceMean, ReduceSum over other axes (pooling) keep the remaining axes whole."""

    def axis_map(self, node, shapes):
        around = _shapes_around(node, shapes)
        if isinstance(around, Blocked):
            return around
        rank = len(around[0])
        reduced = _reduced_axes(node, rank)
        if isinstance(reduced, Blocked):
            return reduced
        kept = [a for a in range(rank) if a not in reduced]
        keepdims = node.attributes.get_int("keepdims", 1)
        return {a: a if keepdims else j for j, a in enumerate(kept)}

    def refusal(self, node, end):
        return Blocked("axis-not-kept", f"{node_label(node)} reduces over the normalized axis")


def _piece_of(part: Part, offset: int, length: int, total, *, exact: bool = False) -> Part | None | Blocked:
    """A part of a whole axis of length `total` seen in its piece [offset, offset + length) (a
    Split's output, a Concat's input): None when the piece holds none of its blocks.

    A shift of the whole is, in a piece, a shift of the piece's blocks, or of the whole piece when
    it lies inside one block; it is followed only where the piece, with that part, is one
    `_whole_of` can ask for the other way (so that backward and forward agree). `exact` asks for
    the converse, a requirement on a piece whose centering shifts the whole as `part` says: the
    piece must then be whole blocks."""
    found = _seen_in_piece(part, offset, length, exact)
    if found is None or isinstance(found, Blocked) or exact:
        return found
    if isinstance(_whole_of(found, offset, length, total), Blocked):
        return Blocked("axis-not-kept", f"a piece at {offset} of length {length} is not made of whole blocks")
    return found


def _seen_in_piece(part: Part, offset: int, length: int, exact: bool) -> Part | None | Blocked:
    block = part.block
    if block is None:
        if exact:
            return Blocked("axis-not-kept", "a piece of the axis cannot be centered as part of the whole")
        return Part()  # a whole-axis shift is a whole-piece shift
    first, last = offset // block, (offset + length - 1) // block
    if part.blocks is not None and not any(b in part.blocks for b in range(first, last + 1)):
        return None  # none of its blocks in this piece
    if first == last and not exact:  # inside one block: a shift constant along the piece
        return Part()
    if offset % block or length % block:
        return Blocked("axis-not-kept", f"its pieces cut blocks of {block}")
    inside = range(first, first + length // block)
    chosen = [b - first for b in inside if part.blocks is None or b in part.blocks]
    if length == block:
        return Part()
    return Part(block, None if len(chosen) == len(inside) else frozenset(chosen))


def _whole_of(part: Part, offset: int, length: int, total) -> Part | Blocked:
    """A part of a piece [offset, offset + length) of an axis of length `total` seen on the whole
    axis: the piece's blocks (the piece itself, for a whole-piece part) among the whole axis's."""
    block = part.block or length
    if offset % block or length % block or not isinstance(total, int) or total % block:
        return Blocked("axis-not-kept", f"a piece at {offset} of length {length} is not made of blocks of {block}")
    inside = part.blocks if part.blocks is not None else range(length // block)
    chosen = frozenset(offset // block + b for b in inside)
    if block == total:
        return Part()
    return Part(block, None if len(chosen) == total // block else chosen)


def _offsets(lengths: list) -> list[int] | None:
    if not all(isinstance(n, int) for n in lengths):
        return None
    return [sum(lengths[:k]) for k in range(len(lengths))]


class _Slice(_Layout):
    """Slice keeps every axis it does not cut (a slice that keeps an axis's length keeps it too)."""

    def axis_map(self, node, shapes):
        around = _shapes_around(node, shapes)
        if isinstance(around, Blocked):
            return around
        in_shape, out_shape = around
        sliced = attr_or_input_ints(node, "axes", 3)
        if sliced is None:
            return Blocked("axes-not-constant", f"{node_label(node)} slices axes that are not constant")
        if not sliced:
            starts = attr_or_input_ints(node, "starts", 1) or []
            sliced = list(range(len(starts)))
        cut = {normalize_axis(a, len(in_shape)) for a in sliced}
        cut = {a for a in cut if in_shape[a] is None or in_shape[a] != out_shape[a]}
        return {a: a for a in range(len(in_shape)) if a not in cut}

    def refusal(self, node, end):
        return Blocked("axis-not-kept", f"{node_label(node)} slices the normalized axis")

    def carried(self, node, shapes, end, other, k):
        rank = shapes.rank(node.inputs[0]) or 0
        axis = end.axis if isinstance(end, In) else other
        sliced = {normalize_axis(a, rank) for a in attr_or_input_ints(node, "axes", 3) or range(rank)}
        if end.part.block is not None and axis in sliced:  # a negative step would reverse the blocks
            return Blocked("axis-not-kept", f"{node_label(node)} slices an axis zero-mean in blocks")
        return end.part.without_where()


class _Split(_Layout):
    """Split along another axis: every piece keeps the tracked axis whole, and holds its own
    positions of the split one; along the tracked axis: pieces of whole blocks (one head each)."""

    def _along(self, node, shapes) -> tuple[int, list[int] | None] | Blocked:
        """The split axis and each piece's offset (None when their lengths are unknown)."""
        around = _shapes_around(node, shapes)
        if isinstance(around, Blocked):
            return around
        along = normalize_axis(node.attributes.get_int("axis", 0), len(around[0]))
        lengths = [(shapes.shape(out) or (None,) * (along + 1))[along] for out in node.outputs]
        return along, _offsets(lengths)

    def axis_map(self, node, shapes):
        split = self._along(node, shapes)
        if isinstance(split, Blocked):
            return split
        along, offsets = split
        rank = shapes.rank(node.inputs[0]) or 0
        return {a: a for a in range(rank) if a != along or offsets is not None}

    def refusal(self, node, end):
        return Blocked("axis-not-kept", f"{node_label(node)} splits or joins along the normalized axis")

    def outputs(self, node):
        return range(len(node.outputs))

    def carried(self, node, shapes, end, other, k):
        along, offsets = self._along(node, shapes)  # type: ignore[misc]
        total = (shapes.shape(node.inputs[0]) or ())[along]
        length = (shapes.shape(node.outputs[k]) or (None,) * (along + 1))[along]
        if end.axis == along:
            assert offsets is not None and isinstance(length, int)
            if isinstance(end, In):
                return _piece_of(end.part, offsets[k], length, total)
            return _whole_of(end.part, offsets[k], length, total)
        return _positions_of_pieces(end.part, along, offsets[k] if offsets else None, length, isinstance(end, In))


def _positions_of_pieces(part: Part, along: int, offset: int | None, length, into_piece: bool) -> Part | None:
    """A part whose other axis `along` is cut into pieces, seen in the piece [offset, offset +
    length) (`into_piece`) or from it on the whole: positions of `along` move by the offset; None
    when the piece holds none of them."""
    where = dict(part.where)
    positions = where.pop(along, None)
    if offset is None or not isinstance(length, int):
        return part.with_where(where)  # unknown: the positions of `along` are dropped (a widening)
    if into_piece:
        if positions is not None:
            inside = frozenset(p - offset for p in positions if offset <= p < offset + length)
            if not inside:
                return None
            where[along] = inside
    else:
        where[along] = frozenset(offset + p for p in (positions if positions is not None else range(length)))
    return part.with_where(where)


class _Tile(_Layout):
    """Tile(input, repeats): an axis repeated once stays whole and in place, so a Tile along other
    axes (TimeSformer's class token repeated over frames) carries the mean along the normalized
    axis. Along the normalized axis itself it is refused (DESIGN.md section 2.2): exact for a
    uniform shift, but the axis changes length under the per-channel weights and scales that are
    indexed by position along it."""

    non_data = "as repeats"

    def axis_map(self, node, shapes):
        rank = shapes.rank(node.inputs[0])
        if rank is None:
            return _unknown_around(node)
        # Tile-1 (opsets 1-5) took a count and an axis as inputs; ONNX Runtime has no kernel for
        # it (its CPU Tile starts at opset 6), so only `repeats` (one count per axis) is read.
        repeats = const_ints(node.inputs[1]) if len(node.inputs) == 2 else None
        if repeats is None or len(repeats) != rank:
            return Blocked("axes-not-constant", f"{node_label(node)} repeats by counts that are not constants")
        return {a: a for a in range(rank) if repeats[a] == 1}

    def refusal(self, node, end):
        return Blocked("axis-not-kept", f"{node_label(node)} repeats along the normalized axis")


class _Gather(_Layout):
    """Gather(data, indices) along axis g: data axes before g stay, those after g move past the
    indices' axes; axis g itself is replaced by the indices. Constant indices pick positions of g:
    a part limited to others is void here (Persimmon's fused q/k/v: the gather of v sees nothing
    of a centering of q and k)."""

    non_data = "as indices"
    roles: ClassVar[dict[int, str]] = {0: "embedding table"}

    def axis_map(self, node, shapes):
        data_shape, indices_rank = shapes.shape(node.inputs[0]), shapes.rank(node.inputs[1])
        if data_shape is None or indices_rank is None:
            return _unknown_around(node)
        g = normalize_axis(node.attributes.get_int("axis", 0), len(data_shape))
        return {a: a if a < g else a + indices_rank - 1 for a in range(len(data_shape)) if a != g}

    def refusal(self, node, end):
        if isinstance(end, In):
            return Blocked("axis-not-kept", f"{node_label(node)} gathers along the normalized axis")
        return Blocked("axis-not-kept", f"the normalized axis of {node_label(node)} comes from its indices")

    def carried(self, node, shapes, end, other, k):
        mapping = self.axis_map(node, shapes)
        assert not isinstance(mapping, Blocked)
        rank = shapes.rank(node.inputs[0]) or 0
        g = normalize_axis(node.attributes.get_int("axis", 0), rank)
        tensor = ir.convenience.get_const_tensor(node.inputs[1]) if not node.inputs[1].is_graph_input() else None
        indices = None if tensor is None else np.asarray(tensor.numpy()).astype(np.int64).reshape(-1)
        if indices is not None and (indices < 0).any():
            size = (shapes.shape(node.inputs[0]) or (None,) * rank)[g]
            indices = indices + size * (indices < 0) if isinstance(size, int) else None
        if isinstance(end, In):
            part = end.part.moved(mapping)
            picked = end.part.positions(g)
            if picked is None or indices is None:
                return part
            hit = [j for j, i in enumerate(indices) if int(i) in picked]
            if not hit:
                return None
            if shapes.rank(node.inputs[1]) == 1:  # the output's axis g is the indices' axis
                where = dict(part.where)
                where[g] = frozenset(hit)
                return part.with_where(where)
            return part
        part = end.part.moved({o: i for i, o in mapping.items()})
        if indices is None:
            return part
        chosen = end.part.positions(g) if shapes.rank(node.inputs[1]) == 1 else None
        picked = {int(indices[j]) for j in (chosen if chosen is not None else range(len(indices))) if j < len(indices)}
        where = dict(part.where)
        where[g] = frozenset(picked)
        return part.with_where(where)


class _GatherND(_Layout):
    """GatherND(data, indices, batch_dims b): each index tuple (the indices' last axis, k long)
    selects a slice of data's axes from b + k on, which move whole behind the indices' other
    axes; the axes it indexes (and the batch axes, indexed per batch) are not kept. The dynamo
    exporter writes `table[position_ids]` this way (Whisper's decoder positions): a constant
    table whose rows are selected is centered like Gather's."""

    non_data = "as indices"
    roles: ClassVar[dict[int, str]] = {0: "embedding table"}

    def axis_map(self, node, shapes):
        data_rank, indices_shape = shapes.rank(node.inputs[0]), shapes.shape(node.inputs[1])
        if data_rank is None or not indices_shape or not isinstance(indices_shape[-1], int):
            return _unknown_around(node)
        first = node.attributes.get_int("batch_dims", 0) + indices_shape[-1]
        return {a: len(indices_shape) - 1 + a - first for a in range(first, data_rank)}

    def refusal(self, node, end):
        if isinstance(end, In):
            return Blocked("axis-not-kept", f"{node_label(node)} indexes along the normalized axis")
        return Blocked("axis-not-kept", f"the normalized axis of {node_label(node)} comes from its indices")


class _Concat(Rule):
    """Concat along another axis: every piece keeps the tracked axis whole (ViT's class token)
    and holds its own positions of the joined one; along the tracked axis: pieces of whole blocks."""

    jointly_linear = True

    def links(self, node, shapes, end):
        pieces = [shapes.shape(v) for v in node.inputs]
        if isinstance(end, In):
            rank = shapes.rank(node.inputs[end.index])
            if rank is None:
                return Blocked("unknown-shape", f"{fed(node)}, whose shapes are unknown")
        else:
            around = _shapes_around(node, shapes)
            if isinstance(around, Blocked):
                return around
            rank = len(around[1])
            if end.index != 0:
                return []
        along = normalize_axis(node.attributes.get_int("axis", 0), rank)
        offsets = _offsets([p[along] if p is not None else None for p in pieces])
        total = (shapes.shape(node.outputs[0]) or (None,) * rank)[along]
        if end.axis == along and (offsets is None or (isinstance(end, Out) and end.part.uniform and len(pieces) > 1)):
            # Centering the pieces one by one shifts each its own way: not a whole-axis shift.
            if isinstance(end, In):
                return Blocked("axis-not-kept", f"{fed(node)}, which joins along the shifted axis")
            return Blocked("axis-not-kept", f"{node_label(node)} splits or joins along the normalized axis")
        if isinstance(end, In):
            length = pieces[end.index][along]  # type: ignore[index]
            if end.axis == along:
                part = _whole_of(end.part, offsets[end.index], length, total)  # type: ignore[index]
                return _from_input(node, part) if isinstance(part, Blocked) else [Link(end.index, end.axis, 0, end.axis, part=part)]
            offset = offsets[end.index] if offsets else None
            part = _positions_of_pieces(end.part, along, offset, length, into_piece=False)
            return [Link(end.index, end.axis, 0, end.axis, part=part)]
        links = []
        for i, piece in enumerate(pieces):
            length = piece[along] if piece is not None else None
            if end.axis == along:
                part = _piece_of(end.part, offsets[i], length, total, exact=True)  # type: ignore[index,arg-type]
            else:
                part = _positions_of_pieces(end.part, along, offsets[i] if offsets else None, length, into_piece=True)
            if isinstance(part, Blocked):
                return part
            if part is not None:
                links.append(Link(i, end.axis, 0, end.axis, part=part))
        return links


# --- sequences: SplitToSequence's pieces, read back by SequenceAt or put back together ----------


def _sequence_split(node: ir.Node, shapes: ShapeTable) -> tuple[ir.Node, int, list[int] | None, list, bool] | Blocked:
    """For a node reading a sequence (its input 0): the SplitToSequence that made it, the split
    axis, each piece's offset and length along it (None: unknown), and whether the pieces keep
    that axis. A sequence is tracked in the coordinates of the tensor it was split from."""
    seq = node.inputs[0]
    split = seq.producer() if seq is not None else None
    if split is None or split.op_type != "SplitToSequence" or split.domain not in ("", "ai.onnx"):
        return Blocked("not-carried", f"{node_label(node)} reads a sequence not made by SplitToSequence")
    shape = shapes.shape(split.inputs[0])
    if shape is None:
        return _unknown_around(split)
    along = normalize_axis(split.attributes.get_int("axis", 0), len(shape))
    total = shape[along]
    sizes = split.inputs[1] if len(split.inputs) > 1 else None
    if sizes is None:  # pieces of 1, the axis kept or not
        keeps = bool(split.attributes.get_int("keepdims", 1))
        if not isinstance(total, int):
            return split, along, None, [], keeps
        return split, along, list(range(total)), [1] * total, keeps
    given = const_ints(sizes)
    if given is None or not isinstance(total, int):
        return split, along, None, [], True
    if shapes.rank(sizes) == 0:  # pieces of `given`, the last one shorter
        lengths = [min(given[0], total - start) for start in range(0, total, given[0])]
    else:
        lengths = list(given)
    return split, along, _offsets(lengths), lengths, True


class _SplitToSequence(Rule):
    """The sequence holds the pieces of its input: tracked in the input's own coordinates."""

    def links(self, node, shapes, end):
        if isinstance(end, In) and end.index != 0:
            return Blocked("non-data-input", f"{fed(node)} as its split lengths")
        return [Link(0, end.axis, 0, end.axis, part=end.part)] if end.index == 0 else []


class _SequenceAt(Rule):
    """SequenceAt(SplitToSequence(x), p): piece p of x (a Split's output p, read another way)."""

    def links(self, node, shapes, end):
        if isinstance(end, In) and end.index != 0:
            return Blocked("non-data-input", f"{fed(node)} as its position")
        found = _sequence_split(node, shapes)
        if isinstance(found, Blocked):
            return _from_input(node, found) if isinstance(end, In) else found
        split, along, offsets, lengths, keeps_axis = found
        position = const_scalar(node.inputs[1])
        if position is None or offsets is None:
            return Blocked("unknown-shape", f"which piece {node_label(node)} reads, and where it lies, is unknown")
        p = int(position) + (len(offsets) if position < 0 else 0)
        offset, length = offsets[p], lengths[p]
        # piece axes <-> split input axes
        rank = shapes.rank(split.inputs[0]) or 0
        to_piece = {a: a if keeps_axis else a - (a > along) for a in range(rank) if keeps_axis or a != along}
        if isinstance(end, In):
            if end.axis == along:
                if not keeps_axis:
                    return _from_input(node, Blocked("axis-not-kept", "each piece is one position of the shifted axis"))
                part = _piece_of(end.part, offset, length, sum(lengths))
            else:
                part = _positions_of_pieces(end.part, along, offset, length, into_piece=True)
                if part is not None:
                    part = part.moved({a: b for a, b in to_piece.items() if keeps_axis or a != along})
            if isinstance(part, Blocked):
                return _from_input(node, part)
            return [] if part is None else [Link(0, end.axis, 0, to_piece[end.axis], part=part)]
        from_piece = {b: a for a, b in to_piece.items()}
        axis = from_piece[end.axis]
        if axis == along:
            total = sum(lengths)
            part = _whole_of(end.part, offset, length, total)
        else:
            part = _positions_of_pieces(end.part.moved(from_piece), along, offset, length, into_piece=False)
        return part if isinstance(part, Blocked) else [Link(0, axis, 0, end.axis, part=part)]


class _ConcatFromSequence(Rule):
    """ConcatFromSequence of a SplitToSequence's own sequence, joined back along the axis it was
    split on (or stacked back where pieces dropped it): the split input again."""

    def links(self, node, shapes, end):
        found = _sequence_split(node, shapes)
        if isinstance(found, Blocked):
            return _from_input(node, found) if isinstance(end, In) else found
        _, along, _, _, keeps_axis = found
        rank = shapes.rank(node.outputs[0])
        axis = node.attributes.get_int("axis", 0)
        stacked = bool(node.attributes.get_int("new_axis", 0))
        if rank is None or normalize_axis(axis, rank) != along or stacked == keeps_axis:
            refusal = Blocked("axis-not-kept", f"{node_label(node)} does not put the pieces back as they were")
            return _from_input(node, refusal) if isinstance(end, In) else refusal
        return [Link(0, end.axis, 0, end.axis, part=end.part)] if end.index == 0 else []


# The table. A new carry op or producer is one entry here (and, if no rule fits, one `Rule`).
RULES: dict[str, Rule] = {
    **dict.fromkeys(("Neg", "Identity", "Dropout", "Cast"), _Unary()),
    **dict.fromkeys(("Add", "Sub", "Sum"), _Broadcast()),
    "Mul": _Mul(),
    "Div": _Div(),
    "MatMul": _MatMul(),
    "Gemm": _Gemm(),
    "Conv": _Conv(),
    **dict.fromkeys(("Reshape", "Flatten", "Squeeze", "Unsqueeze"), _Reshape()),
    "Transpose": _Transpose(),
    "Expand": _Expand(),
    **dict.fromkeys(("ReduceMean", "ReduceSum"), _Reduce()),
    "Slice": _Slice(),
    "Split": _Split(),
    "Tile": _Tile(),
    "Concat": _Concat(),
    "Gather": _Gather(),
    "SplitToSequence": _SplitToSequence(),
    "SequenceAt": _SequenceAt(),
    "ConcatFromSequence": _ConcatFromSequence(),
    "GatherND": _GatherND(),
}
