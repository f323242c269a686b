"""`LnFoldPass`: the fold as an onnx-ir pass, to compose with other passes in a PassManager."""

from __future__ import annotations

import logging

import onnx_ir as ir

from onnx_lnfold._pipeline import analyze
from onnx_lnfold.analysis.plan import CenteringPlan
from onnx_lnfold.apply.apply_plan import apply_plan
from onnx_lnfold.core.errors import LnFoldError
from onnx_lnfold.core.options import (
    OPTION_NAMES,
    FoldOptions,
    check_preconditions,
    keywords_to_options,
    takes_option_keywords,
)

logger = logging.getLogger(__name__)


class LnFoldPass(ir.passes.InPlacePass):
    """Replace every exactly-foldable LayerNormalization with SimplifiedLayerNormalization.

    In place, no verification (run `onnx_lnfold.fold` for that); the analysis is `analyze()`'s, so
    it keeps the LNs whose fold would cost an ONNX Runtime fusion, as `fold()` does (checked with
    ONNX Runtime on weightless copies; `keep_ort_fusions=False` skips it). Takes what `fold()` takes as
    options: `FoldOptions`' fields as keywords, or `options=FoldOptions(...)`. A model the options
    do not fit (`target="onnx"` below opset 23) fails `requires()` with a `PreconditionError`. The
    plan of the last call is kept on `self.plan` so a pipeline can report why LNs were kept.
    """

    @takes_option_keywords
    def __init__(self, *, options: FoldOptions | None = None, **option_keywords) -> None:
        super().__init__()
        self.options = keywords_to_options(options, option_keywords, "LnFoldPass")
        self.plan: CenteringPlan | None = None

    def __repr__(self) -> str:
        """`<LnFoldPass target=ort ...; last run: 5/5 LNs folded>`; the plan itself is `.plan`."""
        options = " ".join(f"{name}={getattr(self.options, name)}" for name in OPTION_NAMES)
        if self.plan is None:
            return f"<LnFoldPass {options}; not run yet>"
        plan = self.plan
        kept = f", {len(plan.kept)} kept" if plan.kept else ""
        return f"<LnFoldPass {options}; last run: {len(plan.folded)}/{len(plan.decisions)} LNs folded{kept}>"

    def requires(self, model: ir.Model) -> None:
        try:
            check_preconditions(model, self.options)
        except LnFoldError as e:
            raise ir.passes.PreconditionError(str(e)) from e

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        self.plan = analyze(model, self.options)
        apply_plan(model, self.plan)
        for decision in self.plan.kept:
            logger.info("kept %s: %s", decision.node, decision.reason)
        return ir.passes.PassResult(model, modified=bool(self.plan.folded))
