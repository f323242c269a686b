"""At what shape an LN is priced: the cost table the options name (`emit.costs`), at the number of
tokens the LN runs at where that is known (docs/DESIGN.md section 4.1)."""

from __future__ import annotations

from onnx_lnfold.emit.costs import CostTable, Pricing
from onnx_lnfold.forms import LnCandidate
from onnx_lnfold.shapes.table import ShapeTable


def pricing_for(cand: LnCandidate, shapes: ShapeTable, table: CostTable) -> Pricing:
    """The pricing of `cand`'s fold: `table` at the table's default token count."""
    return Pricing(table, table.default_tokens)
