"""`LnFoldPass`: the fold as an onnx-ir pass, to compose with other passes in a PassManager."""

from __future__ import annotations

import logging

import onnx_ir as ir

from onnx_lnfold._pipeline import Prepared, analyze, prepare
from onnx_lnfold.analysis.plan import CenteringPlan
from onnx_lnfold.apply.apply_plan import apply_plan
from onnx_lnfold.core.errors import LnFoldError
from onnx_lnfold.core.options import OPTION_NAMES, FoldOptions, keywords_to_options, takes_option_keywords
from onnx_lnfold.load.opset import default_opset

logger = logging.getLogger(__name__)


class LnFoldPass(ir.passes.InPlacePass):
    """Replace every exactly-foldable LayerNormalization with SimplifiedLayerNormalization.

    In place, no verification (run `onnx_lnfold.fold` for that); the analysis is `analyze()`'s, so
    it keeps the LNs whose fold would cost an ONNX Runtime fusion, as `fold()` does (checked with
    ONNX Runtime on weightless copies; `keep_ort_fusions=False` skips it). Takes what `fold()` takes as
    options: `FoldOptions`' fields as keywords, or `options=FoldOptions(...)`. With `target="onnx"`
    a model below opset 23 is converted to it in place (its graph replaced by the converted one,
    `onnx.version_converter`, unverified like the rest of the pass); one the converter cannot
    convert fails `requires()` with a `PreconditionError` naming the op. The plan of the last call
    is kept on `self.plan` so a pipeline can report why LNs were kept.
    """

    @takes_option_keywords
    def __init__(self, *, options: FoldOptions | None = None, **option_keywords) -> None:
        super().__init__()
        self.options = keywords_to_options(options, option_keywords, "LnFoldPass")
        self.plan: CenteringPlan | None = None
        self._prepared: tuple[ir.Model, Prepared] | None = None  # requires()'s work, for call()

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
            self._prepared = (model, prepare(model, self.options))
        except LnFoldError as e:
            raise ir.passes.PreconditionError(str(e)) from e

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        done, self._prepared = self._prepared, None
        prepared = done[1] if done is not None and done[0] is model else prepare(model, self.options)
        converted = prepared.model
        bound = analyze(converted, self.options, prepared.shapes)
        plan = bound.plan
        if plan.folded and converted is not model:  # in place: the converted graph becomes the model's
            model.graph, model.ir_version = converted.graph, converted.ir_version
            model.functions.clear()
            model.functions.update(converted.functions)
            plan.converted_from, plan.converted_to = prepared.converted_from, default_opset(model)
        self.plan = plan
        apply_plan(model, bound)
        for decision in self.plan.kept:
            logger.info("kept %s: %s", decision.node, decision.reason)
        return ir.passes.PassResult(model, modified=bool(self.plan.folded))
