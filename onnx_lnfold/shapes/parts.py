"""Which part of a tensor a zero-mean requirement, or a shift, covers (docs/DESIGN.md section 2.4).

The analysis follows one axis of a tensor. Most requirements cover that axis whole, at every
position of the other axes: the tensor must be zero-mean along it everywhere. A per-head q/k
LayerNorm asks for less and allows less: behind `Reshape([B, T, H*Dh] -> [B, T, H, Dh])`, an LN
over Dh needs each head's block of Dh columns of the projection zero-mean, not its whole row, and
centering the whole row would not do. A `Part` says:

- `block`: the axis is cut into consecutive blocks of this many entries, each zero-mean on its
  own (a shift: constant within each block, block to block it may differ); None: one block, the
  whole axis;
- `blocks`: which blocks (None: all); a requirement on the others is void, a change leaves them
  alone;
- `where`: the positions of other axes a requirement or a change is limited to (Persimmon's fused
  q/k/v reshaped to [B, T, H, 3, Dh]: q is position 0 of axis 3).

Widening a part (dropping a `where`, taking every block) asks more of a requirement and claims
more of a change, so a rule that cannot follow a `where` drops it: always safe. A block cannot be
dropped: a zero mean over the whole axis does not make each block zero-mean.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

# positions of other axes: ((axis, positions), ...) sorted by axis
Where = tuple[tuple[int, frozenset[int]], ...]

_MAX_POSITIONS = 1 << 16  # a `where` or a block set larger than this is widened to everything


@dataclass(frozen=True)
class Part:
    block: int | None = None
    blocks: frozenset[int] | None = None
    where: Where = ()

    def __post_init__(self) -> None:
        assert self.block is None or self.block > 0
        assert self.block is not None or self.blocks is None, "a whole axis is one block"

    @property
    def uniform(self) -> bool:
        """Zero-mean (or shifted by a constant) along the whole axis."""
        return self.block is None

    def positions(self, axis: int) -> frozenset[int] | None:
        """The positions of `axis` it covers; None: all."""
        return dict(self.where).get(axis)

    def without_where(self) -> Part:
        return Part(self.block, self.blocks) if self.where else self

    def with_where(self, where: dict[int, frozenset[int] | None]) -> Part:
        """This part with `where` in place of its own (None entries, and large sets, dropped)."""
        kept = tuple(sorted((a, frozenset(p)) for a, p in where.items() if p is not None and len(p) <= _MAX_POSITIONS))
        return Part(self.block, self.blocks, kept)

    def moved(self, axis_map: dict[int, int]) -> Part:
        """`where` through an axis map (this side's axis -> the other side's); unmapped axes dropped."""
        return self.with_where({axis_map[a]: p for a, p in self.where if a in axis_map})

    def union(self, other: Part) -> Part | None:
        """What two changes of the same tensor cover together (their sum is a shift of that
        shape), or None when they are by blocks of different lengths (or one by blocks, one
        whole)."""
        if self == other:
            return self
        if self.block != other.block:
            # Blocks of another length, or a whole-axis change beside one by blocks: two edits
            # of one tensor asked two ways, which one tensor cannot hold.
            return None
        block = self.block
        blocks = None if self.blocks is None or other.blocks is None else self.blocks | other.blocks
        mine, theirs = dict(self.where), dict(other.where)
        where = {a: mine[a] | theirs[a] for a in mine.keys() & theirs.keys()}
        return Part(block, blocks).with_where(where)


WHOLE = Part()


def flat(dims: list[int], where: dict[int, frozenset[int] | None]) -> frozenset[int] | None:
    """The row-major flat indices over `dims` of the positions `where` allows (keyed by index in
    `dims`; missing or None: every position); None when that is every index."""
    if all(where.get(i) is None for i in range(len(dims))):
        return None
    ranges = [sorted(p for p in where[i] if 0 <= p < d) if where.get(i) is not None else range(d) for i, d in enumerate(dims)]
    if int(np.prod([len(r) for r in ranges], dtype=np.int64)) > _MAX_POSITIONS:
        return None
    strides = [int(np.prod(dims[i + 1 :], dtype=np.int64)) for i in range(len(dims))]
    return frozenset(sum(p * s for p, s in zip(combo, strides)) for combo in itertools.product(*ranges))


def unflat(indices: frozenset[int] | None, dims: list[int]) -> dict[int, frozenset[int] | None]:
    """Per-axis positions (keyed by index in `dims`) whose product covers the flat `indices`:
    exactly them when they are a product, else more (a widening)."""
    if indices is None:
        return {}
    out: dict[int, frozenset[int] | None] = {}
    strides = [int(np.prod(dims[i + 1 :], dtype=np.int64)) for i in range(len(dims))]
    for i, (d, s) in enumerate(zip(dims, strides)):
        seen = frozenset((k // s) % d for k in indices)
        out[i] = None if len(seen) == d else seen
    return out
