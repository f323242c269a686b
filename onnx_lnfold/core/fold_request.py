"""What one fold is asked to do: `FoldRequest`, made by each entry point from its own spelling (the
command line's arguments, `fold()`'s keywords, the pass's, the Olive config) and validated here,
once, for every surface.

- `FoldOptions` (`core.options`): how to fold;
- `RunShapes`: the shapes the model runs at (inputs given, or their shapes): the cost rule prices
  each LN there and the check runs there;
- `CheckSettings`: whether and how the fold is checked in ONNX Runtime;
- the run itself: where the output goes, a dry run, the proof per LN.

Each part is frozen and checks its values in `__post_init__`; what a value must be is said with the
keyword (`rtol`) or the flag (`--rtol`) as each surface spells it (`InvalidSetting.said`). Imports
nothing heavy: the command line builds its request before numpy, onnx and onnx_ir are imported.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from onnx_lnfold.core.errors import InvalidInput
from onnx_lnfold.core.options import CheckSettings, FoldOptions, InvalidSetting, RunShapes


@dataclass(frozen=True)
class FoldRequest:
    """One fold, as asked: the options, the shapes it runs at, its check, and the run: `output`,
    where the fold is staged for the caller to commit (None: kept in memory; a dry run writes
    nothing), `in_place` allowing `output` to be the input file, `dry_run` (analyze and rewrite,
    check and write nothing), `proof` (the per-LN proof in the report)."""

    options: FoldOptions = field(default_factory=FoldOptions)
    shapes: RunShapes = field(default_factory=RunShapes)
    check: CheckSettings = field(default_factory=CheckSettings)
    output: Path | None = None
    in_place: bool = False
    dry_run: bool = False
    proof: bool = False

    def __post_init__(self) -> None:
        for name, kind in (("options", FoldOptions), ("shapes", RunShapes), ("check", CheckSettings)):
            if not isinstance(getattr(self, name), kind):
                raise InvalidInput(f"{name} must be a {kind.__name__}, not {type(getattr(self, name)).__name__}")
        if self.output is not None:
            if not isinstance(self.output, (str, os.PathLike)) or not os.fspath(self.output):
                raise InvalidSetting("output", "the path of the model to write", self.output, "-o")
            object.__setattr__(self, "output", Path(self.output))
        if self.dry_run and self.output is not None:
            raise InvalidInput("a dry run writes nothing: give no output")

    @property
    def verifying(self) -> bool:
        """Whether the fold is checked: asked for, and not a dry run."""
        return self.check.verify and not self.dry_run


__all__ = ["FoldRequest"]
