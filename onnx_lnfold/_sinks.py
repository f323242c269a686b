"""Which uses of a tensor remove a shift of it: the inputs of the LayerNorms themselves (docs/DESIGN.md section 3)."""

from __future__ import annotations

import onnx_ir as ir

from onnx_lnfold import _carry
from onnx_lnfold._blocked import Blocked
from onnx_lnfold._ir import node_label
from onnx_lnfold._shapes import ShapeTable


def absorbs_shift(node: ir.Node, index: int, axis: int, shapes: ShapeTable, sinks) -> dict[int, int] | Blocked | None:
    """What a normalization does with a shift arriving at input `index`: {outputs still carrying it}
    ({} when fully absorbed; SkipLayerNorm's sum carries it on), a reason it cannot, or None when
    `node` is not a normalization. Decomposed LNs are known by their `sinks` uses."""
    moved = _carry.absorbs(node, index, axis, shapes)
    if moved is None and (node, index) in sinks:
        if sinks[(node, index)] != axis:
            return Blocked("normalizes-other-axis", f"it feeds {node_label(node)}, a LayerNorm over another axis")
        return {}
    return moved
