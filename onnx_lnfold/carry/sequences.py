"""Carry rules of sequences: SplitToSequence (a sequence is tracked in the coordinates of the
tensor it split), SequenceAt with a constant position, ConcatFromSequence putting the pieces
back along the axis they were split on."""

from __future__ import annotations

import onnx_ir as ir

from onnx_lnfold.carry.layout import unknown_around
from onnx_lnfold.carry.pieces import piece_of, piece_offsets, positions_of_pieces, whole_of
from onnx_lnfold.carry.rule import In, Link, Rule, fed, from_input
from onnx_lnfold.core.blocked import Blocked
from onnx_lnfold.core.ir import (
    const_ints,
    const_scalar,
    node_label,
    normalize_axis,
)
from onnx_lnfold.shapes.table import ShapeTable


def sequence_split(node: ir.Node, shapes: ShapeTable) -> tuple[ir.Node, int, list[int] | None, list, bool] | Blocked:
    """For a node reading a sequence (its input 0): the SplitToSequence that made it, the split
    axis, each piece's offset and length along it (None: unknown), and whether the pieces keep
    that axis. A sequence is tracked in the coordinates of the tensor it was split from."""
    seq = node.inputs[0]
    split = seq.producer() if seq is not None else None
    if split is None or split.op_type != "SplitToSequence" or split.domain not in ("", "ai.onnx"):
        return Blocked("not-carried", f"{node_label(node)} reads a sequence not made by SplitToSequence")
    shape = shapes.shape(split.inputs[0])
    if shape is None:
        return unknown_around(split)
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
    return split, along, piece_offsets(lengths), lengths, True


class SplitToSequenceRule(Rule):
    """The sequence holds the pieces of its input: tracked in the input's own coordinates."""

    def links(self, node, shapes, end):
        if isinstance(end, In) and end.index != 0:
            return Blocked("non-data-input", f"{fed(node)} as its split lengths")
        return [Link(0, end.axis, 0, end.axis, part=end.part)] if end.index == 0 else []


class SequenceAtRule(Rule):
    """SequenceAt(SplitToSequence(x), p): piece p of x (a Split's output p, read another way)."""

    def links(self, node, shapes, end):
        if isinstance(end, In) and end.index != 0:
            return Blocked("non-data-input", f"{fed(node)} as its position")
        found = sequence_split(node, shapes)
        if isinstance(found, Blocked):
            return from_input(node, found) if isinstance(end, In) else found
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
                    return from_input(node, Blocked("axis-not-kept", "each piece is one position of the shifted axis"))
                part = piece_of(end.part, offset, length, sum(lengths))
            else:
                part = positions_of_pieces(end.part, along, offset, length, into_piece=True)
                if part is not None:
                    part = part.moved({a: b for a, b in to_piece.items() if keeps_axis or a != along})
            if isinstance(part, Blocked):
                return from_input(node, part)
            return [] if part is None else [Link(0, end.axis, 0, to_piece[end.axis], part=part)]
        from_piece = {b: a for a, b in to_piece.items()}
        axis = from_piece[end.axis]
        if axis == along:
            total = sum(lengths)
            part = whole_of(end.part, offset, length, total)
        else:
            part = positions_of_pieces(end.part.moved(from_piece), along, offset, length, into_piece=False)
        return part if isinstance(part, Blocked) else [Link(0, axis, 0, end.axis, part=part)]


class ConcatFromSequenceRule(Rule):
    """ConcatFromSequence of a SplitToSequence's own sequence, joined back along the axis it was
    split on (or stacked back where pieces dropped it): the split input again."""

    def links(self, node, shapes, end):
        found = sequence_split(node, shapes)
        if isinstance(found, Blocked):
            return from_input(node, found) if isinstance(end, In) else found
        _, along, _, _, keeps_axis = found
        rank = shapes.rank(node.outputs[0])
        axis = node.attributes.get_int("axis", 0)
        stacked = bool(node.attributes.get_int("new_axis", 0))
        if rank is None or normalize_axis(axis, rank) != along or stacked == keeps_axis:
            refusal = Blocked("axis-not-kept", f"{node_label(node)} does not put the pieces back as they were")
            return from_input(node, refusal) if isinstance(end, In) else refusal
        return [Link(0, end.axis, 0, end.axis, part=end.part)] if end.index == 0 else []
