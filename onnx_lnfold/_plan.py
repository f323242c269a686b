"""The plan: what the analysis decided, as plain data.

`--dry-run` prints it, the report serializes it, tests assert on it. The private fields (an edit's
`_value`/`_uses`, a folded decision's `_rewrite`) bind the plan to the IR objects of the model it
was computed on; `apply_plan` uses them and nothing else reads them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import onnx_ir as ir

from onnx_lnfold._blocked import Blocked

if TYPE_CHECKING:
    from onnx_lnfold._targets import Rewrite

FOLDED: Literal["folded"] = "folded"
KEPT: Literal["kept"] = "kept"


@dataclass
class CenteringEdit:
    """One constant to center, and which of its uses read the centered version."""

    tensor: str  # name of the initializer (or Constant output) as it is in the input model
    axis: int | None  # axis the mean is removed along; None: the tensor becomes exactly zero
    role: str  # e.g. "MatMul weight", "Gather table", "Add operand"
    uses: tuple[str, ...]  # "node_name:input_index" that will read the centered version
    untie: bool  # other uses keep the original, so the centered one is a copy
    new_name: str | None  # name of the centered copy when untied
    copy_bytes: int  # bytes the copy adds to the model (0 when edited in place)
    required_by: tuple[str, ...]  # the LN nodes this edit serves
    # Per-channel weights w of an affine chain: `tensor * w` is centered, not `tensor`.
    weights: tuple[float, ...] | None = field(repr=False, default=None)
    note: str | None = None  # why an untied copy was chosen over an explicit centering, if it was
    _value: ir.Value = field(repr=False, compare=False, default=None)  # type: ignore[assignment]
    _uses: tuple[tuple[ir.Node, int], ...] = field(repr=False, compare=False, default=())

    def to_dict(self) -> dict[str, Any]:
        return {
            "tensor": self.tensor,
            "axis": self.axis,
            "weighted": self.weights is not None,
            "role": self.role,
            "uses": list(self.uses),
            "untie": self.untie,
            "new_name": self.new_name,
            "copy_bytes": self.copy_bytes,
            "required_by": list(self.required_by),
            "note": self.note,
        }


@dataclass
class AuxCentering:
    """An explicit `x - ReduceMean(x)` inserted where no weight edit can center a stream."""

    tensor: str  # the root tensor (an LN or activation output, say)
    axis: int  # the axis its mean is removed along
    uses: tuple[str, ...]  # "node_name:input_index" that read the centered tensor instead
    new_name: str  # name of the centered tensor
    required_by: tuple[str, ...]  # the LN nodes it unlocks
    # Set when this centers a Gather's output in place of an untied, centered copy of its table
    # (tied embeddings): the table's name and the bytes that copy would have added.
    instead_of_untie: str | None = None
    saved_bytes: int = 0
    _value: ir.Value = field(repr=False, compare=False, default=None)  # type: ignore[assignment]
    _uses: tuple[tuple[ir.Node, int], ...] = field(repr=False, compare=False, default=())

    @property
    def cost(self) -> str:
        return "1 ReduceMean + 1 Sub"

    def to_dict(self) -> dict[str, Any]:
        return {
            "tensor": self.tensor,
            "axis": self.axis,
            "uses": list(self.uses),
            "new_name": self.new_name,
            "required_by": list(self.required_by),
            "cost": self.cost,
            "instead_of_untie": self.instead_of_untie,
            "saved_bytes": self.saved_bytes,
        }


@dataclass
class LnDecision:
    """What happens to one LayerNorm node, and why: a kept LN carries the `Blocked` that kept it
    (`code`, `reason`, `blocking_tensor` read from it), a folded one its proof in one line."""

    node: str
    op_type: str
    status: Literal["folded", "kept"]
    axis: int | None
    epsilon: float
    blocked: Blocked | None = None  # kept: why
    proof: str | None = None  # folded: what made its input zero-mean
    rewrite: str | None = None  # op emitted for a folded LN
    beta: Literal["none", "add", "consumers"] | None = None  # where a folded LN's beta went
    # With beta "consumers": each linear consumer and where its share went ("'k_proj': dropped, the
    # Softmax over the keys removes it").
    beta_sites: tuple[str, ...] = ()
    residual_add: str | None = None  # the Add fused into a SkipSimplifiedLayerNormalization
    # Folded: how, bound to the IR of the model the plan was made on (`apply_plan` reads it).
    _rewrite: Rewrite | None = field(repr=False, compare=False, default=None)

    @property
    def folded(self) -> bool:
        return self.status == FOLDED

    @property
    def reason(self) -> str:
        """Kept: what blocked it; folded: what made its input zero-mean."""
        return self.blocked.reason if self.blocked is not None else self.proof or ""

    @property
    def stage(self) -> str | None:
        """The step that kept it (a key of `onnx_lnfold._blocked.STAGES`); None if folded."""
        return self.blocked.stage if self.blocked is not None else None

    @property
    def code(self) -> str | None:
        """The stable code of what kept it (a key of `onnx_lnfold._blocked.CODES`); None if folded."""
        return self.blocked.code if self.blocked is not None else None

    @property
    def blocking_tensor(self) -> str | None:
        """The tensor the reason names, when there is one."""
        return self.blocked.source if self.blocked is not None else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "op_type": self.op_type,
            "status": self.status,
            "stage": self.stage,
            "code": self.code,
            "reason": self.reason,
            "axis": self.axis,
            "epsilon": self.epsilon,
            "rewrite": self.rewrite,
            "beta": self.beta,
            "beta_sites": list(self.beta_sites),
            "blocking_tensor": self.blocking_tensor,
            "residual_add": self.residual_add,
        }


@dataclass
class CenteringPlan:
    """Every LN's decision and every constant edit needed to carry out the folded ones."""

    decisions: list[LnDecision]
    edits: list[CenteringEdit]
    centerings: list[AuxCentering] = field(default_factory=list)
    target: str = "ort"
    advice: list[str] = field(default_factory=list)  # pipeline advice (which order to run the ORT optimizer in)

    @property
    def folded(self) -> list[LnDecision]:
        return [d for d in self.decisions if d.folded]

    @property
    def kept(self) -> list[LnDecision]:
        return [d for d in self.decisions if not d.folded]

    @property
    def untied_bytes(self) -> int:
        return sum(e.copy_bytes for e in self.edits)

    def decision(self, node: str) -> LnDecision:
        for d in self.decisions:
            if d.node == node:
                return d
        raise KeyError(node)

    def to_dict(self) -> dict[str, Any]:
        return {
            "layer_norms": len(self.decisions),
            "folded": len(self.folded),
            "kept": len(self.kept),
            "decisions": [d.to_dict() for d in self.decisions],
            "target": self.target,
            "edits": [e.to_dict() for e in self.edits],
            "untied_bytes": self.untied_bytes,
            "centerings": [c.to_dict() for c in self.centerings],
            "advice": list(self.advice),
        }
