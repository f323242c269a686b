"""At what shape an LN is priced: the cost table the options name (`decide.costs`), at the number of
tokens the LN runs at where that is known (docs/DESIGN.md section 4.1).

The tokens of an LN over [..., d] are the product of its input's dims but the last, read from:

1. the graph, where every one of those dims is a size (a one-token decoder step exported with fixed
   shapes, a graph of 35 atoms): "the graph's static shape";
2. else the shapes the model is run at, where the caller gave them (the verification inputs,
   `--inputs` / `--input-shape`: `ShapeTable.concrete`): "the given inputs";
3. else, where only the leading (batch) dim is not a size and the graph fixes the others (an image
   model's patches, an audio encoder's frames: [batch, 1500, 384]), one item of the batch: "the
   graph's static shape per item";
4. else the table's default (8x1024 for the built-in one: the top of the measured range, where
   per-element costs decide): "the default".

A count outside the table's measured range is priced at its nearest end (the fit is not
extrapolated); the reason says both.
"""

from __future__ import annotations

import math

import onnx_ir as ir

from onnx_lnfold.decide.costs import CostTable, Pricing
from onnx_lnfold.forms import LnCandidate
from onnx_lnfold.shapes.table import ShapeTable

STATIC, GIVEN, DEFAULT = "the graph's static shape", "the given inputs", "the default"
PER_ITEM = "the graph's static shape per item, the batch dynamic"


def ln_tokens(cand: LnCandidate, shapes: ShapeTable) -> tuple[int, str] | None:
    """(tokens, where they came from) of `cand`'s input, or None where neither the graph nor the
    given input shapes fix them."""
    found = shapes.concrete(cand.x) if cand.x is not None else None
    if found is None:
        return None
    dims, bound = found
    if len(dims) < 2:
        return None
    if all(d is not None for d in dims[:-1]):
        return math.prod(dims[:-1]), (GIVEN if bound else STATIC)  # type: ignore[arg-type]
    if len(dims) >= 3 and dims[0] is None and all(d is not None for d in dims[1:-1]) and not bound:
        return math.prod(dims[1:-1]), PER_ITEM  # type: ignore[arg-type]
    return None


def pricing_for(cand: LnCandidate, shapes: ShapeTable, table: CostTable) -> Pricing:
    """The pricing of `cand`'s fold: `table` at the tokens the LN runs at, where known."""
    known = ln_tokens(cand, shapes)
    layout = shapes.ort_layouts.get(cand.name)  # how ONNX Runtime runs it, where known (`ort_fusions.session_layout`)
    if known is None:
        return Pricing(table, table.default_tokens, DEFAULT, layout)
    tokens, source = known
    return Pricing(table, tokens, source, layout)


def centering_kind(value: ir.Value, axis: int | None, shapes: ShapeTable) -> str:
    """The cost kind of `value - ReduceMean(value, axis)` written at `value` (`decide.costs`), as
    ONNX Runtime runs it: "StridedCentering" where it reduces over an axis with a dim after it that
    is not 1 (or not known), else "Centering". Written on a Transpose's output, it runs on that
    Transpose's input: the session's transpose optimizer pushes the Transpose down through the
    ReduceMean and the Sub (`analysis.edits.centering_site` writes it past the next Add of a
    constant where it can, which the optimizer does not push through). Where a session was seen
    moving it all the same (the shape table's `moved_centerings`, by the tensor written), it is strided."""
    if value.name in shapes.moved_centerings:
        return "StridedCentering"
    producer = value.producer()
    if producer is not None and producer.op_type == "Transpose" and axis is not None:
        attr = producer.attributes.get("perm")
        perm = list(attr.as_ints()) if attr is not None else []
        if perm and producer.inputs[0] is not None:
            value, axis = producer.inputs[0], perm[axis % len(perm)]
    shape = shapes.shape(value)
    if shape is None or axis is None:
        return "Centering"
    rank = len(shape)
    axis = axis % rank if rank else 0
    return "StridedCentering" if any(d != 1 for d in shape[axis + 1 :]) else "Centering"
