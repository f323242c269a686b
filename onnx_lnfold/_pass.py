"""`LnFoldPass`: the fold as an onnx-ir pass, to compose with other passes in a PassManager."""

from __future__ import annotations

import logging

import numpy as np
import onnx_ir as ir

from onnx_lnfold._pipeline import run_pipeline
from onnx_lnfold.analysis.plan import CenteringPlan
from onnx_lnfold.core.errors import LnFoldError
from onnx_lnfold.core.fold_request import FoldRequest
from onnx_lnfold.core.options import (
    OPTION_NAMES,
    CheckSettings,
    FoldOptions,
    RunShapes,
    keywords_to_options,
    takes_option_keywords,
)

logger = logging.getLogger(__name__)


class LnFoldPass(ir.passes.InPlacePass):
    """Replace every exactly-foldable LayerNormalization with SimplifiedLayerNormalization.

    In place, no verification (run `onnx_lnfold.fold` for that); otherwise the run is `fold()`'s
    (`_pipeline.run_pipeline`), so the pass decides as `fold()` decides on the same model: it keeps
    the LNs whose fold would cost an ONNX Runtime fusion (`keep_ort_fusions=False` skips that check)
    and prices each LN at the shapes `input_shapes` or `inputs` give, as `fold()` takes them. Takes
    `FoldOptions`' fields as keywords, or `options=FoldOptions(...)`. With `target="onnx"` a model
    below opset 23 is converted to it in place (its graph replaced by the converted one,
    `onnx.version_converter`, unverified like the rest of the pass). A model the fold cannot take
    (an op the converter cannot convert, inputs that do not match the graph) raises
    `PreconditionError` with the one-line reason, the model unchanged. The plan of the last call is
    kept on `self.plan` so a pipeline can report why LNs were kept.
    """

    @takes_option_keywords
    def __init__(
        self,
        *,
        input_shapes: dict[str, tuple[int, ...]] | None = None,
        inputs: dict[str, np.ndarray] | None = None,
        options: FoldOptions | None = None,
        **option_keywords,
    ) -> None:
        super().__init__()
        self.request = FoldRequest(
            options=keywords_to_options(options, option_keywords, "LnFoldPass"),
            shapes=RunShapes(input_shapes=input_shapes, inputs=inputs),
            check=CheckSettings(verify=False),
        )
        self.plan: CenteringPlan | None = None

    def __repr__(self) -> str:
        """`<LnFoldPass target=ort ...; last run: 5/5 LNs folded>`; the plan itself is `.plan`."""
        options = " ".join(f"{name}={getattr(self.request.options, name)}" for name in OPTION_NAMES)
        if self.plan is None:
            return f"<LnFoldPass {options}; not run yet>"
        plan = self.plan
        kept = f", {len(plan.kept)} kept" if plan.kept else ""
        return f"<LnFoldPass {options}; last run: {len(plan.folded)}/{len(plan.decisions)} LNs folded{kept}>"

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        try:
            run = run_pipeline(model, None, self.request)
        except LnFoldError as e:  # raised before the rewrite: the model is as it was given
            raise ir.passes.PreconditionError(str(e)) from e
        if run.model is not model:  # converted to the target's opset: the converted graph becomes the model's
            model.graph, model.ir_version = run.model.graph, run.model.ir_version
            model.functions.clear()
            model.functions.update(run.model.functions)
        self.plan = run.report.plan
        for decision in self.plan.kept:
            logger.info("kept %s: %s", decision.node, decision.reason)
        return ir.passes.PassResult(model, modified=bool(self.plan.folded))
