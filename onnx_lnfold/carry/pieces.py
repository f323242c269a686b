"""Carry rules of ops that cut or join a tensor: Slice, Split, Concat, Tile, Gather and GatherND
along other axes (each piece holds its own positions of them), and Split or Concat along the axis
in pieces of whole blocks (docs/DESIGN.md sections 2.2 and 2.4)."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from onnx_lnfold.carry.layout import LayoutRule, shapes_around, unknown_around
from onnx_lnfold.carry.rule import In, Link, Out, Rule, fed, from_input
from onnx_lnfold.core.blocked import Blocked
from onnx_lnfold.core.ir import (
    attr_or_input_ints,
    const_ints,
    const_tensor,
    node_label,
    normalize_axis,
)
from onnx_lnfold.shapes.parts import Part


def piece_of(part: Part, offset: int, length: int, total, *, exact: bool = False) -> Part | None | Blocked:
    """A part of a whole axis of length `total` seen in its piece [offset, offset + length) (a
    Split's output, a Concat's input): None when the piece holds none of its blocks.

    A shift of the whole is, in a piece, a shift of the piece's blocks, or of the whole piece when
    it lies inside one block; it is followed only where the piece, with that part, is one
    `whole_of` can ask for the other way (so that backward and forward agree). `exact` asks for
    the converse, a requirement on a piece whose centering shifts the whole as `part` says: the
    piece must then be whole blocks."""
    found = seen_in_piece(part, offset, length, exact)
    if found is None or isinstance(found, Blocked) or exact:
        return found
    if isinstance(whole_of(found, offset, length, total), Blocked):
        return Blocked("axis-not-kept", f"a piece at {offset} of length {length} is not made of whole blocks")
    return found


def seen_in_piece(part: Part, offset: int, length: int, exact: bool) -> Part | None | Blocked:
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


def whole_of(part: Part, offset: int, length: int, total) -> Part | Blocked:
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


def piece_offsets(lengths: list) -> list[int] | None:
    if not all(isinstance(n, int) for n in lengths):
        return None
    return [sum(lengths[:k]) for k in range(len(lengths))]


class SliceRule(LayoutRule):
    """Slice keeps every axis it does not cut (a slice that keeps an axis's length keeps it too)."""

    def map_shapes(self, node, in_shape, out_shape):
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


class SplitRule(LayoutRule):
    """Split along another axis: every piece keeps the tracked axis whole, and holds its own
    positions of the split one; along the tracked axis: pieces of whole blocks (one head each)."""

    def _along(self, node, shapes) -> tuple[int, list[int] | None] | Blocked:
        """The split axis and each piece's offset (None when their lengths are unknown)."""
        around = shapes_around(node, shapes)
        if isinstance(around, Blocked):
            return around
        along = normalize_axis(node.attributes.get_int("axis", 0), len(around[0]))
        lengths = [(shapes.shape(out) or (None,) * (along + 1))[along] for out in node.outputs]
        return along, piece_offsets(lengths)

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
                return piece_of(end.part, offsets[k], length, total)
            return whole_of(end.part, offsets[k], length, total)
        return positions_of_pieces(end.part, along, offsets[k] if offsets else None, length, isinstance(end, In))


def positions_of_pieces(part: Part, along: int, offset: int | None, length, into_piece: bool) -> Part | None:
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


class TileRule(LayoutRule):
    """Tile(input, repeats): an axis repeated once stays whole and in place, so a Tile along other
    axes (TimeSformer's class token repeated over frames) carries the mean along the normalized
    axis. Along the normalized axis itself it is refused (DESIGN.md section 2.2): exact for a
    uniform shift, but the axis changes length under the per-channel weights and scales that are
    indexed by position along it."""

    non_data = "as repeats"

    def axis_map(self, node, shapes):
        rank = shapes.rank(node.inputs[0])
        if rank is None:
            return unknown_around(node)
        # Tile-1 (opsets 1-5) took a count and an axis as inputs; ONNX Runtime has no kernel for
        # it (its CPU Tile starts at opset 6), so only `repeats` (one count per axis) is read.
        repeats = const_ints(node.inputs[1]) if len(node.inputs) == 2 else None
        if repeats is None or len(repeats) != rank:
            return Blocked("axes-not-constant", f"{node_label(node)} repeats by counts that are not constants")
        return {a: a for a in range(rank) if repeats[a] == 1}

    def refusal(self, node, end):
        return Blocked("axis-not-kept", f"{node_label(node)} repeats along the normalized axis")


class GatherRule(LayoutRule):
    """Gather(data, indices) along axis g: data axes before g stay, those after g move past the
    indices' axes; axis g itself is replaced by the indices. Constant indices pick positions of g:
    a part limited to others is void here (Persimmon's fused q/k/v: the gather of v sees nothing
    of a centering of q and k)."""

    non_data = "as indices"
    roles: ClassVar[dict[int, str]] = {0: "embedding table"}

    def axis_map(self, node, shapes):
        data_shape, indices_rank = shapes.shape(node.inputs[0]), shapes.rank(node.inputs[1])
        if data_shape is None or indices_rank is None:
            return unknown_around(node)
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
        tensor = const_tensor(node.inputs[1]) if not node.inputs[1].is_graph_input() else None
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


class GatherNDRule(LayoutRule):
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
            return unknown_around(node)
        first = node.attributes.get_int("batch_dims", 0) + indices_shape[-1]
        return {a: len(indices_shape) - 1 + a - first for a in range(first, data_rank)}

    def refusal(self, node, end):
        if isinstance(end, In):
            return Blocked("axis-not-kept", f"{node_label(node)} indexes along the normalized axis")
        return Blocked("axis-not-kept", f"the normalized axis of {node_label(node)} comes from its indices")


class ConcatRule(Rule):
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
            around = shapes_around(node, shapes)
            if isinstance(around, Blocked):
                return around
            rank = len(around[1])
            if end.index != 0:
                return []
        along = normalize_axis(node.attributes.get_int("axis", 0), rank)
        offsets = piece_offsets([p[along] if p is not None else None for p in pieces])
        total = (shapes.shape(node.outputs[0]) or (None,) * rank)[along]
        if end.axis == along and (offsets is None or (isinstance(end, Out) and end.part.uniform and len(pieces) > 1)):
            # Centering the pieces one by one shifts each its own way: not a whole-axis shift.
            if isinstance(end, In):
                return Blocked("axis-not-kept", f"{fed(node)}, which joins along the shifted axis")
            return Blocked("axis-not-kept", f"{node_label(node)} splits or joins along the normalized axis")
        if isinstance(end, In):
            length = pieces[end.index][along]  # type: ignore[index]
            if end.axis == along:
                part = whole_of(end.part, offsets[end.index], length, total)  # type: ignore[index]
                return (
                    from_input(node, part)
                    if isinstance(part, Blocked)
                    else [Link(end.index, end.axis, 0, end.axis, part=part)]
                )
            offset = offsets[end.index] if offsets else None
            part = positions_of_pieces(end.part, along, offset, length, into_piece=False)
            return [Link(end.index, end.axis, 0, end.axis, part=part)]
        links = []
        for i, piece in enumerate(pieces):
            length = piece[along] if piece is not None else None
            if end.axis == along:
                part = piece_of(end.part, offsets[i], length, total, exact=True)  # type: ignore[index,arg-type]
            else:
                part = positions_of_pieces(end.part, along, offsets[i] if offsets else None, length, into_piece=True)
            if isinstance(part, Blocked):
                return part
            if part is not None:
                links.append(Link(i, end.axis, 0, end.axis, part=part))
        return links
