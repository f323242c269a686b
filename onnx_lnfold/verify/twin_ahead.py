"""The original's float64 twin, made before the check asks for it (docs/DESIGN.md section 6).

The twin of the model as read from its file depends on nothing the fold decides, and making it is
Python work the size of the graph. The fold has a moment to spare before its check: while ONNX
Runtime makes a session of the fusion check's folded copy (`FusionCheck.start`'s `meanwhile`), the
interpreter is free. `OriginalTwin.make` is handed there; the check then `take`s the twin it made,
for the same file only, or makes its own as before.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from onnx_lnfold.core.ahead import Outcome
from onnx_lnfold.core.options import CheckSettings
from onnx_lnfold.verify.oracle.reference import Float64Model
from onnx_lnfold.verify.passes import made_ahead


class OriginalTwin:
    """The float64 twin of the model file `source`, made once by `make` (its failure kept, raised
    by `take`)."""

    def __init__(self, source: Path, progress: Callable[[str], None] | None = None):
        self.source = source
        self._progress = progress
        self._made: Outcome | None = None

    @classmethod
    def for_check(
        cls, settings: CheckSettings, source: Path | None, weights: int, progress: Callable[[str], None] | None = None
    ) -> OriginalTwin | None:
        """The twin to make ahead for a check of `source` (a model of `weights` bytes), where the
        check will want one and makes its passes ahead (`verify.passes.made_ahead`); else None."""
        if not settings.verify or source is None or settings.float64_budget == 0 or not made_ahead(weights):
            return None
        return cls(source, progress)

    def make(self) -> None:
        if self._made is None:
            self._made = Outcome(lambda: Float64Model(self.source, progress=self._progress))

    def take(self, source: object) -> Float64Model | None:
        """The twin made, for a check of `source` (this one's file), once; None where none was
        made or `source` is another; raises what making it raised."""
        made, self._made = self._made, None
        if made is None or source != self.source:
            return None
        return made.get()
