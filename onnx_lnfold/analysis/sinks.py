"""Which uses of a tensor remove a shift of it (docs/DESIGN.md section 3): the inputs of the
model's LayerNorms, as each form says (`LnForm.absorbs`), and reads of nothing but its shape."""

from __future__ import annotations

import onnx_ir as ir

from onnx_lnfold.core.blocked import Blocked
from onnx_lnfold.core.ir import reads_only_shape
from onnx_lnfold.forms import LnCandidate
from onnx_lnfold.shapes.table import ShapeTable


class Sinks:
    """The candidates, indexed by the nodes whose inputs they answer for."""

    def __init__(self, candidates: list[LnCandidate]):
        self._owner: dict[ir.Node, LnCandidate] = {}
        for cand in candidates:
            for node in (cand.node, *(node for node, _ in cand.sink_uses)):
                self._owner.setdefault(node, cand)
        # (node, input index) through which an LN of known axis removes a shift of its input.
        self.uses = frozenset(use for cand in candidates if cand.axis is not None for use in cand.sink_uses)

    def adds_inputs(self, node: ir.Node) -> bool:
        """An LN whose changed inputs add up (SkipLayerNormalization: input + skip + bias)."""
        cand = self._owner.get(node)
        return cand is not None and cand.form.has_skip

    def absorbs(self, node: ir.Node, index: int, axis: int, shapes: ShapeTable) -> dict[int, int] | Blocked | None:
        """What `node` does with a shift along `axis` arriving at input `index`: {outputs still
        carrying it} ({} when removed; SkipLayerNorm's sum carries it on), why it cannot remove
        it, or None when `node` is no sink (the carry rules answer then)."""
        if reads_only_shape(node):
            return {}  # reads only the shape, which a shift leaves alone
        cand = self._owner.get(node)
        return None if cand is None else cand.form.absorbs(cand, node, index, axis, shapes)
