"""The check as a fold runs it, in two phases around the rewrite (docs/DESIGN.md section 6).

`Check.before_apply` keeps what the check needs of the model as it was, before `apply_plan`
removes the IR objects the plan names: the original as ONNX Runtime reads it (its file, else a copy
taken now) and what the plan changes (`verify.readback.planned_changes`). `after_apply` checks the
folded model: it takes the constants the fold computed, unrounded (writing rounds them), has the
fold written where the caller writes it, and runs `verify.check.check_equivalence` on the file
written, else on the model in memory. `close` removes the copy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import onnx_ir as ir

from onnx_lnfold.analysis.bound import BoundPlan
from onnx_lnfold.core.options import CheckSettings, RunShapes
from onnx_lnfold.verify.check import check_equivalence
from onnx_lnfold.verify.oracle.reference import exact_tensors
from onnx_lnfold.verify.original_ahead import OriginalAhead
from onnx_lnfold.verify.readback import planned_changes
from onnx_lnfold.verify.request import VerifyRequest
from onnx_lnfold.verify.sessions import OrtSource
from onnx_lnfold.verify.verdict import Verification


class Check:
    """One fold's check: `before_apply`, then `after_apply` once, then `close` (or `with`)."""

    def __init__(self, request: VerifyRequest, original: Path | OrtSource):
        self._request, self._original = request, original

    @classmethod
    def before_apply(
        cls,
        settings: CheckSettings,
        shapes: RunShapes,
        original: ir.Model | Path,
        model: ir.Model,
        bound: BoundPlan,
        *,
        progress: Callable[[str], None] | None = None,
        original_ahead: OriginalAhead | None = None,
    ) -> Check:
        """The check of `bound`'s fold of `model` (the model as analyzed: `original` itself, or its
        conversion to the target's opset) against `original`: the file it was read from, else the
        model in memory, copied now for ONNX Runtime. `original_ahead`: the original's session
        and float64 twin, where the fold made them ahead."""
        folder = original.parent if isinstance(original, Path) else None
        kept = original if isinstance(original, Path) else OrtSource(original)
        try:
            # What the plan changes, read before the rewrite removes the IR objects it names.
            planned = planned_changes(model, bound) if bound.plan.folded else None
        except BaseException:
            if isinstance(kept, OrtSource):
                kept.close()
            raise
        request = VerifyRequest(
            enabled=settings.verify,
            disabled_because=settings.disabled_because,
            rtol=settings.rtol,
            input_shapes=dict(shapes.input_shapes or {}),
            inputs=dict(shapes.inputs) if shapes.inputs is not None else None,
            float64_budget=settings.float64_budget,
            deployed_check=settings.deployed_check,
            progress=progress,
            original_ahead=original_ahead,
            plan=bound.plan,
            planned=planned,
            folder=folder,
        )
        return cls(request, kept)

    def after_apply(
        self, folded: ir.Model, written: Callable[[], Path | None], fold_seconds: Callable[[], float]
    ) -> Verification:
        """Check `folded` (the model `apply_plan` rewrote). `written` writes it where the caller
        writes it and returns that file (None: nothing written, the model in memory is checked);
        it is called once the constants the fold computed are taken, unrounded. `fold_seconds`
        says what the fold took, once written: the float64 allowance scales with it."""
        computed = exact_tensors(folded)
        path = written()
        request = dataclasses.replace(self._request, computed=computed, fold_seconds=fold_seconds())
        original = self._original if isinstance(self._original, Path) else self._original.source
        folded_src = OrtSource(folded) if path is None else None
        try:
            checked = path if path is not None else folded_src.source  # type: ignore[union-attr]
            return check_equivalence(original, checked, folded, request)
        finally:
            if folded_src is not None:
                folded_src.close()

    def close(self) -> None:
        if isinstance(self._original, OrtSource):
            self._original.close()

    def __enter__(self) -> Check:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

