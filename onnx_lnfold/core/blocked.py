"""`Blocked`: why a LayerNorm stays one, as data (docs/DESIGN.md section 9).

Every step that can refuse (recognizing an LN form, following a mean through an op, the
side-effect check, the fusion-cost rule) returns a `Blocked` instead of raising or returning a
string: a stable `code` that programs and tests match on, the `reason` sentence people read, and
the tensor or node that reason names (`source`). The step that decides an LN with it sets its
`stage`: one carry rule answers both directions, so "not-carried" may mean the LN's input comes
through a Relu (stage "proof") or that a centered tensor feeds one (stage "side-effect"). A kept
`LnDecision` carries the one that decided it. Wording may improve from release to release; codes
and stages do not change meaning.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

# Every code, with what it means. A new refusal either reuses one or adds it here.
CODES: dict[str, str] = {
    # the LN itself (recognizing its form)
    "unknown-shape": "a rank or shape the decision needs could not be inferred",
    "several-axes": "the LN normalizes over more than one axis",
    "not-last-axis": "the LN normalizes over an axis other than the last (RMSNorm ops normalize trailing axes)",
    "not-float": "the LN's input is not a float tensor",
    "stats-output-used": "the LN's Mean/InvStdDev outputs are read, and RMSNorm has none",
    "no-scale": "the LN has no scale input",
    "intermediate-read": "an intermediate of an LN written as ops (decomposed, E[x^2]-E[x]^2) is read elsewhere or is a graph output",
    "no-rms-form": "the op has no RMSNorm counterpart (EmbedLayerNormalization)",
    "no-target-form": "the target cannot write this LN's RMSNorm exactly (--target primitive: an fp16/bf16 LN)",
    "in-function": "the LN is inside a model-local function",
    "fusion-cost": "ONNX Runtime's transformers optimizer fuses the LN into an op with no RMS form (EmbedLayerNormalization)",
    "fusion-lost": "folding would cost a fusion an ONNX Runtime session makes on the original graph",
    "costs-more": "its fold would run nodes that cost ONNX Runtime more than the LN (measured kernel costs)",
    "centering-costs-more": "its fold needs an explicit centering that costs ONNX Runtime more than the LNs it would unlock save (measured kernel costs)",
    "cost-unresolved": "its cost table cannot tell its fold from the LN within the spread of its figures: never-slower keeps it",
    # proving the input zero-mean (backward, through producers and carry ops)
    "not-carried": "an op on the way does not carry a zero mean",
    "quantized": "the LN's input comes through a quantized unit, which the fold leaves whole: fold the float model before quantizing",
    "axes-not-constant": "an op's axes are not constants",
    "axis-not-kept": "a layout op does not keep the normalized axis whole",
    "wrong-axis": "a producer's centered axis is not the normalized one",
    "grouped-conv": "a grouped Conv's output channels cannot be centered by editing weights",
    "varying-factor": "a factor varies along the normalized axis and is not a constant per-channel scale",
    "constant-along-axis": "a computed tensor is constant along the normalized axis (its mean is itself)",
    "zero-scale-entry": "a per-channel scale has a zero entry",
    "not-float-cast": "a Cast to a non-float type",
    "narrowing-cast": "a Cast to fp16/bf16, whose rounding does not commute with centering",
    "training-dropout": "a Dropout that may run in training mode",
    "graph-input": "the stream comes from a graph input (data), whose mean no weight edit removes",
    "weight-is-input": "a weight is listed as a graph input: it can be overridden at run time",
    "constant-on-stream": "a constant sits on the stream itself",
    "normalization-output": "the stream comes from a normalization's output (gamma*n+beta: a data-dependent mean)",
    "integer-constant": "an integer constant cannot hold its centered values",
    "widened-narrow-constant": "an fp16/bf16 constant widened by a Cast: centered in its type, it leaves a mean above the wide type's noise",
    "scaled-broadcast": "a constant broadcast along an axis a per-channel scale weighs",
    "scaled-slice": "a Slice of a stream scaled per channel",
    "centered-explicitly": "the stream sum is centered explicitly instead (internal to the analysis)",
    # side effects (forward, from each centered constant)
    "graph-output": "a tensor the centering changes is a graph output",
    "mixes-shift": "a changed tensor feeds an op that mixes the shift into every output",
    "non-data-input": "a changed tensor is an op's divisor, indices or shape input",
    "incompatible-changes": "a tensor would change in two incompatible ways",
    "several-inputs-change": "several inputs of an op that is not jointly linear would change at once",
    "non-uniform-change": "a change scaled per channel, or by blocks of its axis, reaches a normalization, which removes uniform shifts only",
    "normalizes-other-axis": "a changed tensor reaches a normalization over another axis",
    "normalization-parameter": "a changed tensor is a normalization's gamma or beta",
    "internal": "the analysis could not follow a shift it created (refused, never guessed)",
}


# The step that refused, with what it means for the LN.
STAGES: dict[str, str] = {
    "form": "the LN's own form rules it out, whatever its upstream",
    "proof": "its input cannot be proven zero-mean by centering constants",
    "side-effect": "centering what it needs would change a tensor read where the change matters",
    "cost": "folding it would cost more than it saves",
}


@dataclass(frozen=True)
class Blocked:
    """Why something cannot fold: a stable `code` (a key of `CODES`), the `reason` sentence, and
    the tensor or node it names (`source`), if any. Plain data (names, never IR objects): a kept
    `LnDecision` carries it in the plan, which outlives the model it was made on."""

    code: str
    reason: str
    source: str | None = None
    stage: str | None = None  # a key of STAGES, set by the step that decides an LN with it
    # What the report says of this LN under the heading of its stage and code (the tensor, the op
    # or the figures that are this LN's own); None: the whole reason.
    detail: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.code not in CODES:
            raise ValueError(f"unknown Blocked code {self.code!r}: add it to onnx_lnfold.core.blocked.CODES")
        if self.stage is not None and self.stage not in STAGES:
            raise ValueError(f"unknown Blocked stage {self.stage!r}: one of {', '.join(STAGES)}")

    def reworded(self, reason: str, source: str | None = None, detail: str | None = None) -> Blocked:
        """The same refusal told from further out: same code, a sentence that wraps this one."""
        return Blocked(self.code, reason, source if source is not None else self.source, self.stage, detail)

    def at_stage(self, stage: str) -> Blocked:
        """This refusal, as the step `stage` decides an LN with it."""
        return dataclasses.replace(self, stage=stage)

    def to_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "code": self.code, "reason": self.reason, "source": self.source}
