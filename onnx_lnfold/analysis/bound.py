"""The plan bound to the model it was made on: the public `CenteringPlan` (plain data) and, for
each of its edits, explicit centerings and folded LNs, the IR objects that carry it out.

The analysis returns a `BoundPlan` to the orchestration, which hands it to the steps that act on
that very model: `apply.apply_plan` (what to change), `ort_fusions` (what a fold touches),
`report.trace` (the proof walk) and the check's `verify.readback.planned_changes` (what is to
change, read before the rewrite removes it). Callers of the library get `BoundPlan.plan` alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import onnx_ir as ir

from onnx_lnfold.analysis.plan import AuxCentering, CenteringEdit, CenteringPlan, LnDecision
from onnx_lnfold.analysis.rebind import counterparts, rebound

if TYPE_CHECKING:
    from onnx_lnfold.decide.targets import Rewrite

Use = tuple[ir.Node, int]  # a node and the index of the input it reads


@dataclass(frozen=True)
class BoundEdit:
    """A `CenteringEdit` and the constant it centers, with the uses that read the centered version."""

    edit: CenteringEdit
    value: ir.Value
    uses: tuple[Use, ...]


@dataclass(frozen=True)
class BoundCentering:
    """An `AuxCentering`, the tensor it centers and the uses that read the centered tensor."""

    centering: AuxCentering
    value: ir.Value
    uses: tuple[Use, ...]


@dataclass(frozen=True)
class BoundFold:
    """A folded LN's decision and how it is rewritten."""

    decision: LnDecision
    rewrite: Rewrite


@dataclass
class BoundPlan:
    """`plan` and its IR objects, in the plan's own order (`edits[i].edit is plan.edits[i]`)."""

    plan: CenteringPlan
    edits: list[BoundEdit]
    centerings: list[BoundCentering]
    folds: list[BoundFold]

    def rewrite_for(self, node: str) -> Rewrite:
        """The rewrite of the folded LN named `node` (KeyError if it is not folded)."""
        for fold in self.folds:
            if fold.decision.node == node:
                return fold.rewrite
        raise KeyError(node)

    def on_clone(self, model: ir.Model, clone: ir.Model) -> BoundPlan:
        """This plan, made on `model`, bound to `clone`, a structural copy of it (`analysis.rebind`)."""
        return rebound(self, counterparts(model, clone))  # type: ignore[return-value]
