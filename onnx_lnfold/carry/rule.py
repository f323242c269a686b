"""What a carry rule answers in: the ends of a question (`Out`: an output axis, backward; `In`:
an input axis, forward), the `Link`s between them, and the `Rule` base class every op family's
rule derives from (docs/DESIGN.md section 2.2)."""

from __future__ import annotations

from typing import ClassVar, NamedTuple

import numpy as np
import onnx_ir as ir

from onnx_lnfold.core.blocked import Blocked
from onnx_lnfold.core.ir import (
    const_tensor,
    node_label,
)
from onnx_lnfold.shapes.parts import WHOLE, Part
from onnx_lnfold.shapes.table import ShapeTable

# The ends and links are tuples (`NamedTuple`), not frozen dataclasses: the analysis makes several
# per node of every chain it follows, and a frozen dataclass's fields are each set through
# `object.__setattr__`, which on a graph of 200,000 nodes took about a second.


class Out(NamedTuple):
    """Output `index` of a node, along `axis` (the `part` of it, `shapes.parts`): backward's question
    starts here."""

    index: int
    axis: int
    part: Part = WHOLE


class In(NamedTuple):
    """Input `index` of a node, along `axis` (the `part` of it): forward's question starts here."""

    index: int
    axis: int
    part: Part = WHOLE


End = Out | In


class Link(NamedTuple):
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


def from_input(node: ir.Node, blocked: Blocked) -> Blocked:
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
    tensor = const_tensor(value)
    if tensor is None:
        return None
    shape = tuple(tensor.shape.dims)
    in_axis = axis - (out_rank - len(shape))
    if in_axis < 0 or shape[in_axis] == 1:
        return None
    if any(d != 1 for i, d in enumerate(shape) if i != in_axis):
        return None  # checked before reading: a weight matrix is never loaded just to say no
    return np.asarray(tensor.numpy()).astype(np.float64).reshape(-1)
