"""The plan: what the analysis decided, as plain data. Each object's repr is one line; the detail
is in its fields (`plan.decisions`, `plan.edits`, `decision.reason`) and `to_dict()`.

`--dry-run` prints it, the report serializes it, tests assert on it. It holds names, axes, codes
and figures only; the IR objects that carry it out on the model it was made on are in
`analysis.bound.BoundPlan`, which the analysis hands to the steps that act on that model.
"""

from __future__ import annotations

import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

from onnx_lnfold.core.blocked import Blocked

FOLDED: Literal["folded"] = "folded"
KEPT: Literal["kept"] = "kept"


def _plural(n: int, one: str) -> str:
    return f"{n} {one}" + ("" if n == 1 else "s")


def _lns(nodes: tuple[str, ...]) -> str:
    """`ln_1`, or `3 LNs` (the names are on the object)."""
    return nodes[0] if len(nodes) == 1 else _plural(len(nodes), "LN")


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
    # Centered in blocks of this many entries along `axis`, each block on its own (per-head q/k
    # LNs; docs/DESIGN.md section 2.4); None: the axis whole.
    block: int | None = None
    blocks: tuple[int, ...] | None = None  # which blocks (None: all)
    block_count: int | None = None  # how many blocks the axis holds
    # An untied copy written as `tensor - row means` (a tied embedding table): a Sub of two
    # constants that ONNX Runtime folds into the centered table at session start, so the file
    # holds the means, not a second table (docs/DESIGN.md section 3.1). `copy_bytes` is then the
    # means' bytes.
    means_name: str | None = None  # the row means' initializer

    @property
    def centered_along(self) -> str:
        """'axis 1', 'axis 1 in blocks of 64', 'axis 1 in blocks of 16 (0, 3, 6, 9 of 12)', 'zeroed'."""
        if self.axis is None:
            return "zeroed"
        text = f"axis {self.axis}" + ("*w" if self.weights else "")
        if self.block is not None:
            text += f" in blocks of {self.block}"
            if self.blocks is not None:
                text += f" ({', '.join(map(str, self.blocks))} of {self.block_count})"
        return text

    def __repr__(self) -> str:
        copy = f", untied -> {self.new_name} (+{self.copy_bytes:,} B)" if self.untie else ""
        if self.means_name:
            copy = f", derived at load -> {self.new_name} (+{self.copy_bytes:,} B of row means)"
        return f"<CenteringEdit {self.tensor}: {self.centered_along}, {self.role}{copy}; for {_lns(self.required_by)}>"

    def to_dict(self) -> dict[str, Any]:
        return {
            "tensor": self.tensor,
            "axis": self.axis,
            "block": self.block,
            "blocks": list(self.blocks) if self.blocks is not None else None,
            "block_count": self.block_count,
            "weighted": self.weights is not None,
            "role": self.role,
            "uses": list(self.uses),
            "untie": self.untie,
            "new_name": self.new_name,
            "copy_bytes": self.copy_bytes,
            "required_by": list(self.required_by),
            "note": self.note,
            "means_name": self.means_name,
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

    @property
    def cost(self) -> str:
        return "1 ReduceMean + 1 Sub"

    def __repr__(self) -> str:
        instead = f", instead of untying {self.instead_of_untie} (-{self.saved_bytes:,} B)" if self.instead_of_untie else ""
        return (
            f"<AuxCentering {self.tensor} - ReduceMean(axis {self.axis}) -> {self.new_name}{instead}; "
            f"for {_lns(self.required_by)}>"
        )

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
    # Folded with its beta as an Add over the stream: why that runs (what it costs against the LN).
    cost_note: str | None = None
    # The shape its fold was priced at by the cost rule ("at 1500 tokens (the given inputs)"); None
    # where it was not priced (kept before the cost rule: its form, a fusion).
    priced_at: str | None = None
    # The same as data: the token count it was priced at, and whether that is the table's default
    # (nothing fixed the LN's shape: `--input-shape` / `--inputs` would).
    priced_tokens: int | None = None
    priced_by_default: bool | None = None

    def __repr__(self) -> str:
        if self.folded:
            return f"<LnDecision {self.node}: folded -> {self.rewrite}>"
        reason = self.reason if len(self.reason) <= 80 else self.reason[:77] + "..."
        return f"<LnDecision {self.node}: kept, {self.stage}/{self.code}: {reason}>"

    @property
    def folded(self) -> bool:
        return self.status == FOLDED

    @property
    def reason(self) -> str:
        """Kept: what blocked it; folded: what made its input zero-mean."""
        return self.blocked.reason if self.blocked is not None else self.proof or ""

    @property
    def stage(self) -> str | None:
        """The step that kept it (a key of `onnx_lnfold.core.blocked.STAGES`); None if folded."""
        return self.blocked.stage if self.blocked is not None else None

    @property
    def code(self) -> str | None:
        """The stable code of what kept it (a key of `onnx_lnfold.core.blocked.CODES`); None if folded."""
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
            "cost_note": self.cost_note,
            "priced_at": self.priced_at,
            "priced_tokens": self.priced_tokens,
            "priced_by_default": self.priced_by_default,
        }


@dataclass
class CenteringPlan:
    """Every LN's decision and every constant edit needed to carry out the folded ones."""

    decisions: list[LnDecision]
    edits: list[CenteringEdit]
    centerings: list[AuxCentering] = field(default_factory=list)
    target: str = "ort"
    advice: list[str] = field(default_factory=list)  # pipeline advice (which order to run the ORT optimizer in)
    # Where the fold folds more LNs of ONNX Runtime's transformers optimizer's output than of this
    # graph: both counts, the optimizer's settings and the advice, as the JSON gives them
    # (`ort_fusions.order.optimizer_first_facts`); else None.
    optimizer_first: dict[str, Any] | None = None
    # Where the graph is quantized: what the fold folds of the float model recovered from it, against
    # this graph, or why none was recovered (`ort_fusions.float_first.float_first_facts`); else None.
    float_first: dict[str, Any] | None = None
    costs: str | None = None  # the cost table the rule decided by: its file, provider and unit
    # The default opset the model had when the target's op needed a newer one and the plan was made
    # on the model converted (onnx.version_converter; docs/DESIGN.md section 4); None: not converted.
    converted_from: int | None = None
    converted_to: int | None = None
    # What the cost rule counted for the whole plan, as ONNX Runtime op types and their counts:
    # {"original": the ops the folds replace, "emitted": the ops they run instead, explicit
    # centerings included} (`decide.set_price`).
    priced_ops: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def folded(self) -> list[LnDecision]:
        return [d for d in self.decisions if d.folded]

    @property
    def kept(self) -> list[LnDecision]:
        return [d for d in self.decisions if not d.folded]

    @property
    def untied_bytes(self) -> int:
        return sum(e.copy_bytes for e in self.edits)

    def decision_for(self, node: str) -> LnDecision:
        """The decision on the LN node named `node` (KeyError if there is none)."""
        for d in self.decisions:
            if d.node == node:
                return d
        raise KeyError(node)

    def decision(self, node: str) -> LnDecision:
        """Deprecated alias of `decision_for()` (it read like an attribute); removed in 0.2."""
        warnings.warn(
            "CenteringPlan.decision() is deprecated; use CenteringPlan.decision_for(node)", DeprecationWarning, stacklevel=2
        )
        return self.decision_for(node)

    def __repr__(self) -> str:
        """`<CenteringPlan: 5 LNs, 5 fold, 0 kept; ...>`; the detail is `.decisions`, `.edits`."""
        kept = self.kept
        codes = Counter(d.code for d in kept)
        why = " (" + ", ".join(f"{code} {n}" for code, n in codes.most_common()) + ")" if kept else ""
        text = f"{_plural(len(self.decisions), 'LN')}, {len(self.folded)} fold, {len(kept)} kept{why}"
        if self.edits:
            copies = sum(e.untie and not e.means_name for e in self.edits)
            derived = sum(bool(e.untie and e.means_name) for e in self.edits)
            text += f"; {_plural(len(self.edits), 'constant')} centered"
            if copies or derived:
                kinds = [f"{copies} untied"] * bool(copies) + [f"{derived} derived at load"] * bool(derived)
                text += f", {', '.join(kinds)} (+{self.untied_bytes:,} B)"
        if self.centerings:
            text += f"; {_plural(len(self.centerings), 'explicit centering')}"
        if self.target != "ort":
            text += f"; target {self.target}"
        if self.converted_from is not None:
            text += f", opset {self.converted_from} -> {self.converted_to}"
        return f"<CenteringPlan: {text}>"

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
            "optimizer_first": None if self.optimizer_first is None else dict(self.optimizer_first),
            "float_first": None if self.float_first is None else dict(self.float_first),
            "costs": self.costs,
            "opset_converted": None
            if self.converted_from is None
            else {"from": self.converted_from, "to": self.converted_to, "by": "onnx.version_converter"},
            "priced_ops": {side: dict(ops) for side, ops in self.priced_ops.items()},
        }
