"""At what shape an LN is priced: the cost table the options name (`emit.costs`), at the number of
tokens the LN runs at where that is known (docs/DESIGN.md section 4.1).

The tokens of an LN over [..., d] are the product of its input's dims but the last, read from:

1. the graph, where every one of those dims is a size (a one-token decoder step exported with fixed
   shapes, a graph of 35 atoms): "the graph's static shape";
2. else the shapes the model is run at, where the caller gave them (the verification inputs,
   `--inputs` / `--input-shape`: `ShapeTable.concrete`): "the given inputs";
3. else the table's default (8x1024 for the built-in one: the top of the measured range, where
   per-element costs decide): "the default".

A count outside the table's measured range is priced at its nearest end (the fit is not
extrapolated); the reason says both.
"""

from __future__ import annotations

import math

from onnx_lnfold.emit.costs import CostTable, Pricing
from onnx_lnfold.forms import LnCandidate
from onnx_lnfold.shapes.table import ShapeTable

STATIC, GIVEN, DEFAULT = "the graph's static shape", "the given inputs", "the default"


def ln_tokens(cand: LnCandidate, shapes: ShapeTable) -> tuple[int, str] | None:
    """(tokens, where they came from) of `cand`'s input, or None where neither the graph nor the
    given input shapes fix them."""
    found = shapes.concrete(cand.x) if cand.x is not None else None
    if found is None:
        return None
    dims, bound = found
    if len(dims) < 2 or any(d is None for d in dims[:-1]):
        return None
    return math.prod(dims[:-1]), (GIVEN if bound else STATIC)  # type: ignore[arg-type]


def pricing_for(cand: LnCandidate, shapes: ShapeTable, table: CostTable) -> Pricing:
    """The pricing of `cand`'s fold: `table` at the tokens the LN runs at, where known."""
    known = ln_tokens(cand, shapes)
    if known is None:
        return Pricing(table, table.default_tokens, DEFAULT)
    tokens, source = known
    return Pricing(table, tokens, source)
