"""`LnFoldPass`: the fold as an onnx-ir pass, to compose with other passes in a PassManager."""

from __future__ import annotations

import logging

import onnx_ir as ir

from onnx_lnfold._analyze import analyze
from onnx_lnfold._apply import apply_plan
from onnx_lnfold._plan import CenteringPlan

logger = logging.getLogger(__name__)


class LnFoldPass(ir.passes.InPlacePass):
    """Replace every exactly-foldable LayerNormalization with SimplifiedLayerNormalization.

    In place, no verification (run `onnx_lnfold.fold` for that). The plan of the last call is kept
    on `self.plan` so a pipeline can report why LNs were kept.
    """

    def __init__(
        self, target: str = "ort", auxiliary_centering: bool = True, fuse_residual: str = "auto", tied_weights: str = "auto"
    ) -> None:
        super().__init__()
        self.target = target
        self.auxiliary_centering = auxiliary_centering
        self.fuse_residual = fuse_residual
        self.tied_weights = tied_weights
        self.plan: CenteringPlan | None = None

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        self.plan = analyze(
            model,
            target=self.target,
            auxiliary_centering=self.auxiliary_centering,
            fuse_residual=self.fuse_residual,
            tied_weights=self.tied_weights,
        )
        apply_plan(model, self.plan)
        for decision in self.plan.kept:
            logger.info("kept %s: %s", decision.node, decision.reason)
        return ir.passes.PassResult(model, modified=bool(self.plan.folded))
