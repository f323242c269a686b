"""What a check is asked to do: one `VerifyRequest`, made by the caller (whether to check, the
tolerance, the inputs or their shapes, the float64 budget) and completed by the fold with what it
hands the check (`for_fold`)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from onnx_lnfold.analysis.plan import CenteringPlan
from onnx_lnfold.core.errors import InvalidInput
from onnx_lnfold.core.options import FLOAT64_BUDGET_S
from onnx_lnfold.verify.readback import PlannedChanges


class InvalidSetting(InvalidInput):
    """A check setting outside its range: the keyword (`rtol`) or the flag (`--rtol`) as each
    surface spells it, what it must be, and the value given."""

    def __init__(self, keyword: str, must_be: str, value: object):
        self.keyword, self.must_be, self.value = keyword, must_be, value
        super().__init__(self.said("api"))

    def said(self, surface: str) -> str:
        name = "--" + self.keyword.replace("_", "-") if surface == "cli" else self.keyword
        return f"{name} must be {self.must_be}, not {self.value!r}"


@dataclass(frozen=True)
class VerifyRequest:
    """Whether and how to check the fold in ONNX Runtime; `inputs`, when given, must match the
    graph inputs even when the check is off (they were asked for, so a mismatch is an error).
    The fields after `float64_budget` are the fold's, set by `for_fold`."""

    enabled: bool = True
    disabled_because: str = "disabled by the caller"  # the report's reason when not enabled
    rtol: float | None = None  # every output's tolerance; None: each output's by its element type
    input_shapes: dict[str, tuple[int, ...]] | None = None
    inputs: dict[str, np.ndarray] | None = None
    float64_budget: float | None = FLOAT64_BUDGET_S  # seconds the float64 reference may take (0: none; None: scaled)
    plan: CenteringPlan | None = None  # a bfloat16 fold's rounding of its centered weights is reported from it
    planned: PlannedChanges | None = None  # taken before the rewrite: the fold is read back against it
    computed: dict[str, Any] | None = None  # the constants the fold computed, unrounded (None: those the model holds)
    fold_seconds: float | None = None  # what the fold took: the float64 allowance scales with it
    folder: Path | None = None  # where the model was read from: a genai_config.json there describes its KV cache
    progress: Callable[[str], None] | None = None  # the caller's progress line, told which block the check is on

    def __post_init__(self):
        # Checked here, for every surface: a negative rtol would run the whole fold and then fail it.
        if self.rtol is not None and not (math.isfinite(self.rtol) and self.rtol > 0):
            raise InvalidSetting("rtol", "a positive number", self.rtol)
        if self.float64_budget is not None and not self.float64_budget >= 0:
            raise InvalidSetting("float64_budget", "a number of seconds, 0 or more", self.float64_budget)

    @property
    def run_shapes(self) -> dict[str, tuple[int, ...]]:
        """The input shapes given (the inputs', else `input_shapes`): the cost rule prices each LN at
        the tokens they make it run at (`decide.pricing`), whether or not the check runs."""
        if self.inputs is not None:
            return {name: tuple(np.shape(array)) for name, array in self.inputs.items()}
        return dict(self.input_shapes or {})

    def for_fold(
        self,
        plan: CenteringPlan | None,
        planned: PlannedChanges | None,
        computed: dict[str, Any] | None,
        fold_seconds: float | None,
        folder: Path | None,
    ) -> VerifyRequest:
        """This request with what the fold hands the check."""
        return dataclasses.replace(
            self, plan=plan, planned=planned, computed=computed, fold_seconds=fold_seconds, folder=folder
        )
