"""What one check is asked to do: one `VerifyRequest`, made by `verify.fold_check.Check` from the
caller's settings (`core.options.CheckSettings`: whether to check, the tolerance, the float64
budget; `RunShapes`: the inputs or their shapes, validated where the request was made) and what the
fold hands the check."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from onnx_lnfold.analysis.plan import CenteringPlan
from onnx_lnfold.core.options import FLOAT64_BUDGET_S
from onnx_lnfold.verify.readback import PlannedChanges

if TYPE_CHECKING:
    from onnx_lnfold.verify.original_ahead import OriginalAhead


@dataclass(frozen=True)
class VerifyRequest:
    """The check of one fold: the caller's settings (`enabled` to `deployed_check`, as
    `CheckSettings` and `RunShapes` validated them), what the fold hands the check (`plan` to
    `folder`), and where the check says which block it is on (`progress`)."""

    enabled: bool = True
    disabled_because: str = "disabled by the caller"  # the report's reason when not enabled
    rtol: float | None = None  # every output's tolerance; None: each output's by its element type
    input_shapes: dict[str, tuple[int, ...]] | None = None
    inputs: dict[str, np.ndarray] | None = None
    float64_budget: float | None = FLOAT64_BUDGET_S  # seconds the float64 reference may take (0: none; None: scaled)
    deployed_check: str = "auto"  # also at ORT_ENABLE_ALL: "auto" (quantized models), "always", "never"
    plan: CenteringPlan | None = None  # a bfloat16 fold's rounding of its centered weights is reported from it
    planned: PlannedChanges | None = None  # taken before the rewrite: the fold is read back against it
    computed: dict[str, Any] | None = None  # the constants the fold computed, unrounded (None: those the model holds)
    fold_seconds: float | None = None  # what the fold took: the float64 allowance scales with it
    folder: Path | None = None  # where the model was read from: a genai_config.json there describes its KV cache
    progress: Callable[[str], None] | None = None  # the caller's progress line, told which block the check is on
    original_ahead: OriginalAhead | None = None  # the original's session and twin, made ahead (`verify.original_ahead`)
