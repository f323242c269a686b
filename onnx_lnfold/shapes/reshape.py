"""Which axis a Reshape keeps whole: from the shapes around it, or from how its target was built.

(Flatten, Squeeze and Unsqueeze move axes by index arithmetic alone: `_moved_axis`.)

Exporters build a Reshape's target from the input's own shape: TorchScript's `flatten(2)` is
`Reshape(x, Concat(Slice(Shape(x), 0, 2), [-1]))`, GPT-2's Conv1D is `Reshape(x, [-1, Shape(x)[-1]])`.
With dynamic dims, shape inference cannot name the flattened dim (`unk__N`), so comparing the
shapes around the Reshape fails; yet the target says exactly which dims are copied from the input.
A row-major reshape keeps axis `a` whole (every element keeps its index along it) when the dims
before it, or the dims from it to the end, are copied unchanged: then the product of the dims after
it is the same on both sides (a reshape keeps the element count).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

import numpy as np
import onnx_ir as ir

from onnx_lnfold.core.ir import attr_or_input_ints, const_ints, normalize_axis
from onnx_lnfold.shapes.parts import Part, flat, unflat
from onnx_lnfold.shapes.table import Shape, ShapeTable, dims_equal, match_reshaped_axis, product

_MAX_DEPTH = 16


@dataclass(frozen=True)
class DimOf:
    """Dim `index` of `tensor`, read by a Shape node."""

    tensor: ir.Value
    index: int


# One element of a shape tensor: an integer, a dim of some tensor, or unknown.
Entry = Union[int, DimOf, None]


def shape_entries(value: ir.Value | None, shapes: ShapeTable, depth: int = 0) -> list[Entry] | None:
    """The elements of a 0-D or 1-D integer tensor built by a shape subgraph (Shape, Gather, Slice,
    Concat, Unsqueeze, Squeeze, Cast, Identity, constants), or None when it is not one."""
    if value is None or depth > _MAX_DEPTH:
        return None
    ints = const_ints(value)
    if ints is not None:
        return list(ints)
    node = value.producer()
    if node is None or node.domain not in ("", "ai.onnx"):
        return None
    op = node.op_type
    if op == "Shape":
        rank = shapes.rank(node.inputs[0])
        if rank is None:
            return None
        start, end = node.attributes.get_int("start", 0), node.attributes.get_int("end", rank)
        return [DimOf(node.inputs[0], i) for i in range(rank)][slice(start, end)]
    if op in ("Unsqueeze", "Squeeze"):  # 0-D <-> [1] keeps the elements; nothing else does
        ranks = {shapes.rank(node.inputs[0]), shapes.rank(node.outputs[0])}
        return shape_entries(node.inputs[0], shapes, depth + 1) if ranks == {0, 1} else None
    if op == "Identity" or (op == "Cast" and node.attributes.get_int("to", 0) in (6, 7)):  # to int32/int64
        return shape_entries(node.inputs[0], shapes, depth + 1)
    if op == "Concat":
        out: list[Entry] = []
        for piece in node.inputs:
            entries = shape_entries(piece, shapes, depth + 1)
            if entries is None:
                shape = shapes.shape(piece)
                if shape is None or len(shape) != 1 or not isinstance(shape[0], int):
                    return None
                entries = [None] * shape[0]  # computed elsewhere: known length, unknown values
            out += entries
        return out
    if op == "Gather":
        data, indices = shape_entries(node.inputs[0], shapes, depth + 1), const_ints(node.inputs[1])
        if data is None or indices is None or (shapes.rank(node.inputs[1]) or 0) > 1:
            return None
        if not all(-len(data) <= i < len(data) for i in indices):
            return None
        return [data[i] for i in indices]
    if op == "Slice":
        data = shape_entries(node.inputs[0], shapes, depth + 1)
        starts, ends = const_ints(node.inputs[1]), const_ints(node.inputs[2])
        axes = const_ints(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3] is not None else [0]
        steps = const_ints(node.inputs[4]) if len(node.inputs) > 4 and node.inputs[4] is not None else [1]
        if data is None or not starts or not ends or axes not in ([0], [-1]) or steps != [1]:
            return None
        return data[slice(starts[0], ends[0])]  # Python clamps as ONNX does for step 1
    return None


def _copies(entry: Entry, j: int, src: ir.Value, i: int, shapes: ShapeTable, allowzero: bool) -> bool:
    """Whether target entry `j` is dim `i` of `src`, whatever the input's size."""
    if isinstance(entry, DimOf) and entry.tensor is src:
        return entry.index == i
    if entry == 0 and not allowzero:
        return i == j  # 0 copies the input's dim at the same position
    mine = shapes.shape(src)
    if mine is None:
        return False
    if isinstance(entry, DimOf):  # a dim of another tensor, known to be the same size
        other = shapes.shape(entry.tensor)
        return other is not None and dims_equal(other[entry.index], mine[i])
    return isinstance(entry, int) and entry > 0 and mine[i] == entry


def _structural_axis(node: ir.Node, shapes: ShapeTable, axis: int, forward: bool) -> int | None:
    src = node.inputs[0]
    rank = shapes.rank(src)
    entries = shape_entries(node.inputs[1], shapes) if len(node.inputs) > 1 else None
    if rank is None or entries is None:
        return None
    allowzero = bool(node.attributes.get_int("allowzero", 0))
    n = len(entries)

    def copied(j: int, i: int) -> bool:
        return _copies(entries[j], j, src, i, shapes, allowzero)

    if forward:  # input axis -> output axis
        if axis < n and all(copied(j, j) for j in range(axis + 1)):
            return axis  # the dims up to it are copied
        tail = rank - axis
        if n >= tail and all(copied(n - tail + t, axis + t) for t in range(tail)):
            return n - tail  # the dims from it to the end are copied
        return None
    if axis < rank and all(copied(j, j) for j in range(axis + 1)):
        return axis
    tail = n - axis
    if rank >= tail and all(copied(axis + t, rank - tail + t) for t in range(tail)):
        return rank - tail
    return None


def _moved_axis(node: ir.Node, shapes: ShapeTable, axis: int, forward: bool) -> int | None:
    """Flatten, Squeeze and Unsqueeze move axes by index arithmetic, whatever the dims' sizes."""
    rank = shapes.rank(node.inputs[0])
    if rank is None:
        return None
    if node.op_type == "Flatten":  # [d0 .. d(k-1)] x [dk ..]: the first or last axis can stay whole
        k = normalize_axis(node.attributes.get_int("axis", 1), rank)
        pairs = ([(0, 0)] if k == 1 else []) + ([(rank - 1, 1)] if k == rank - 1 else [])
    else:
        axes = attr_or_input_ints(node, "axes", 1)  # an attribute before opset 13, an input after
        if not axes:
            return None  # Squeeze without axes drops the dims that are 1: that needs their sizes
        out_rank = rank + len(axes) if node.op_type == "Unsqueeze" else rank - len(axes)
        if node.op_type == "Unsqueeze":
            added = {a + out_rank if a < 0 else a for a in axes}
            kept_out = [j for j in range(out_rank) if j not in added]
            pairs = list(enumerate(kept_out))
        else:
            removed = {a + rank if a < 0 else a for a in axes}
            kept_in = [i for i in range(rank) if i not in removed]
            pairs = [(i, j) for j, i in enumerate(kept_in)]
    mapping = dict(pairs) if forward else {j: i for i, j in pairs}
    return mapping.get(axis)


def reshaped_axis(node: ir.Node, shapes: ShapeTable, axis: int, *, forward: bool) -> int | None:
    """The axis a Reshape/Flatten/Squeeze/Unsqueeze maps `axis` to (input -> output when
    `forward`, else output -> input), if it keeps it whole; None if it does not or cannot tell."""
    src, dst = (node.inputs[0], node.outputs[0]) if forward else (node.outputs[0], node.inputs[0])
    src_shape, dst_shape = shapes.shape(src), shapes.shape(dst)
    if src_shape is not None and dst_shape is not None and axis < len(src_shape):
        mapped = match_reshaped_axis(src_shape, axis, dst_shape)
        if mapped is not None:
            return mapped
    if node.op_type == "Reshape":
        return _structural_axis(node, shapes, axis, forward)
    return _moved_axis(node, shapes, axis, forward)


def _inner_part(big: Shape, axis: int, small: Shape) -> tuple[int, list[int]] | None:
    """(j, outer) when `small[j]` is the innermost part of `big[axis]`, split row-major: both
    have the same product of dims after them, `big[axis]` is a multiple of `small[j]`, and the
    dims `outer` just before `small[j]` make up the rest."""
    whole = big[axis]
    if not isinstance(whole, int):
        return None
    suffix = product(big[axis + 1 :])
    if suffix is None:
        return None
    for j, d in enumerate(small):
        if not (isinstance(d, int) and 1 < d < whole and whole % d == 0 and product(small[j + 1 :]) == suffix):
            continue
        rest, i, outer = whole // d, j - 1, []
        while rest > 1 and i >= 0 and isinstance(small[i], int) and small[i] > 0 and rest % small[i] == 0:
            outer.insert(0, small[i])
            rest //= small[i]
            i -= 1
        if rest == 1:
            return j, outer
    return None


def blocked_axis(node: ir.Node, shapes: ShapeTable, axis: int, part: Part, *, forward: bool) -> tuple[int, Part] | None:
    """Where a Reshape/Flatten/Squeeze/Unsqueeze takes `axis` and its `part` (input -> output
    when `forward`, else output -> input), or None when no part says it.

    Kept whole, the part stays (its `where` follows the axes kept whole too). Otherwise, when the
    axis is the innermost part of an axis on the other side (a split seen from its short axis, or
    a merge seen from its inner axis), that axis is zero-mean or shifted in blocks of the short
    axis's length, the blocks picked by the `where` on the axes split off; and the other way, an
    axis in blocks becomes its innermost part on the other side, whole when a block covers it.

    Backward, the part returned is one whose centering shifts this side within `part`: a merge
    seen from the merged axis needs blocks no longer than the inner axis (a whole-axis zero mean
    of [.., H*Dh] is not made by centering each head, which shifts each head its own way)."""
    kept = reshaped_axis(node, shapes, axis, forward=forward)
    if kept is not None:
        mapped = {a: reshaped_axis(node, shapes, a, forward=forward) for a, _ in part.where}
        return kept, part.moved({a: m for a, m in mapped.items() if m is not None})
    src, dst = (node.inputs[0], node.outputs[0]) if forward else (node.outputs[0], node.inputs[0])
    src_shape, dst_shape = shapes.shape(src), shapes.shape(dst)
    if src_shape is None or dst_shape is None:
        return None
    for j in range(len(dst_shape)):  # the axis is the innermost part of dst[j]
        inner = _inner_part(dst_shape, j, src_shape)
        if inner is None or inner[0] != axis:
            continue
        outer = inner[1]
        d = src_shape[axis]
        block = part.block or d
        if d % block:
            return None
        first = axis - len(outer)
        heads = flat(outer, {i: part.positions(first + i) for i in range(len(outer))})
        if heads is None and part.blocks is None:
            return j, Part(block)
        within = sorted(part.blocks) if part.blocks is not None else range(d // block)
        rows = sorted(heads) if heads is not None else range(int(np.prod(outer, dtype=np.int64)))
        return j, Part(block, frozenset(h * (d // block) + s for h in rows for s in within))
    inner = _inner_part(src_shape, axis, dst_shape)  # the axis holds dst[j] as its innermost part
    if inner is None:
        return None
    j, outer = inner
    d, block = dst_shape[j], part.block or src_shape[axis]
    first = j - len(outer)
    if not forward and block != d and d % block:
        # Backward through a merge: centering the inner axis shifts the merged one in blocks of
        # its length, which this part must hold (`blocks of d`, or finer ones).
        return None
    if block % d == 0:  # a block covers whole rows of dst[j]: a shift constant along it
        k = block // d
        rows = None if part.blocks is None else frozenset(b * k + r for b in part.blocks for r in range(k))
        return j, Part().with_where({first + i: p for i, p in unflat(rows, outer).items()})
    if d % block == 0:  # rows of dst[j] hold several blocks
        k = d // block
        rows = None if part.blocks is None else frozenset(b // k for b in part.blocks)
        within = None if part.blocks is None else frozenset(b % k for b in part.blocks)
        if within is not None and len(within) == k:
            within = None
        return j, Part(block, within).with_where({first + i: p for i, p in unflat(rows, outer).items()})
    return None
