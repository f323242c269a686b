"""The verdict: `Verification` (passed, failed, unverified or skipped, with the figures per
output, `OutputDiff`) and the tolerances it is judged by. Its wording is what the report, the
command line and the API say: `verdict()` for the summary line, `format_lines()` for the
detail, `refusal()` for why nothing was written and what the user can do."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, Literal

import onnx

from onnx_lnfold.core.ways_out import WAY_OUT

# Tolerances on max|diff| / max|ref|, by the output's element type: far above the rounding noise
# of an exact fold in that type (docs/DESIGN.md section 6), far below any real error.
DEFAULT_RTOL = {"float32": 1e-4, "float16": 1e-2}


LOW_PRECISION = {onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16}


# The exact twin of a fold vs the original's, both in float64: float64 rounding, amplified by the
# network, measured at most 3.6e-15 over the committed models and 300 fuzz graphs, 2.9e-14 on
# Whisper tiny.en's encoder (trained weights, 1500 frames); the fold as written, its weights
# rounded to float32 once, is 1e-8 to 9e-6 from the original (docs/DESIGN.md section 6).
EXACT_RTOL = 1e-9


# The fold in ONNX Runtime may be this many times further from the float64 reference than the
# original is, beyond rtol: rounding noise varies from one computation to another.
ORT_NOISE_FACTOR = 10.0
# A float64 evaluation this many times rtol (or more) from ONNX Runtime's run of the original does
# not compute what ONNX Runtime computes (an op the reference evaluates otherwise): no verdict rests
# on it. fp32 originals are 1e-7 to 4e-5 from it on the models measured.
TWIN_DISAGREES_FACTOR = 30.0


# Without a float64 reference, the fold may differ from the original by rtol plus this many times
# the original's sensitivity to one rounding step of its weights: the original's own float32 error
# measured 0.13 to 1.3 times that sensitivity on the committed models, 0.8 to 3.1 times on Whisper
# tiny.en's encoder (docs/DESIGN.md section 6).
SENSITIVITY_FACTOR = 10.0


# What a verification comes to: "unverified" where the check could not run, "skipped" where it was
# not asked for or nothing was folded.
Status = Literal["passed", "failed", "unverified", "skipped"]
# What the user can do about an unverified check: give inputs, install onnxruntime, or decline the check.
WayOut = Literal["inputs", "install", "decline"]


# What a verdict rests on (`Verification.judgment`): the judge of `verify.judges` that gave it.
Judgment = Literal["float64 reference", "fp32 sensitivity", "rtol alone"]
# The judges, from the strongest to the weakest.
FLOAT64: Judgment = "float64 reference"
SENSITIVITY: Judgment = "fp32 sensitivity"
RTOL_ONLY: Judgment = "rtol alone"  # neither a float64 run nor the original's sensitivity could be had


@dataclass(frozen=True)
class JudgmentWords:
    """How the report says a verdict rests on one judgment: `rests_on` begins the summary line's
    figure ("in float64, "); `heading` ends the report's "Verification (passed, ...)" line;
    `lines` follow it, with `{why}` (the judgment's reason: why no stronger judge judged),
    `{inputs}` and `{rtol}` filled in; `exact` the judgment also holds the fold to `EXACT_RTOL`."""

    rests_on: str
    heading: str
    lines: tuple[str, ...]
    exact: bool = False


# Each judgment's words, in one place: a new judge adds its entry here.
JUDGMENT_WORDS: dict[str, JudgmentWords] = {
    FLOAT64: JudgmentWords(
        "in float64, ",
        "judged in float64",
        ("inputs {inputs}", f"tolerance: exact {EXACT_RTOL:g}, as written {{rtol}}"),
        exact=True,
    ),
    SENSITIVITY: JudgmentWords(
        "without float64, ",
        "judged without float64",
        (
            "no float64 reference: {why}",
            "inputs {inputs}",
            f"tolerance: {{rtol}} + {SENSITIVITY_FACTOR:g} x the original's sensitivity (how much its outputs "
            "move when its weights move by one rounding step)",
        ),
    ),
    RTOL_ONLY: JudgmentWords(
        "by rtol alone, ",
        "judged by rtol alone",
        ("no float64 reference and no sensitivity: {why}", "inputs {inputs}", "tolerance: {rtol}"),
    ),
}


def rtol_for(elem_type: int | None) -> float:
    return DEFAULT_RTOL["float16"] if elem_type in LOW_PRECISION else DEFAULT_RTOL["float32"]


def _max(a: float | None, b: float | None) -> float | None:
    if a is None or b is None:
        return a if b is None else b
    return a if not b > a else b  # NaN stays


@dataclass
class OutputDiff:
    """One output's figures, the worst over every input set. `max_abs_diff` / `rel_diff`: the fold
    vs the original in ONNX Runtime. The float64 figures, relative to max |reference| (the
    original's float64 twin), are None when no float64 reference ran: `exact` the fold's exact
    twin, `written` the fold as written, `original_error` / `fold_error` ONNX Runtime's original /
    fold. `sensitivity`: the fallback's measure of the original's own float32 noise."""

    name: str
    shape: tuple[int, ...]
    max_abs_diff: float
    max_abs_ref: float
    rtol: float | None = None
    exact: float | None = None
    written: float | None = None
    original_error: float | None = None
    fold_error: float | None = None
    sensitivity: float | None = None

    @property
    def rel_diff(self) -> float:
        if self.max_abs_diff == 0.0:
            return 0.0
        return self.max_abs_diff / self.max_abs_ref if self.max_abs_ref > 0 else float("inf")

    def merge(self, other: OutputDiff) -> None:
        """Keep the worst of each figure (`other` is the same output on another input set)."""
        if not other.rel_diff <= self.rel_diff:
            self.max_abs_diff, self.max_abs_ref = other.max_abs_diff, other.max_abs_ref
        for name in ("exact", "written", "original_error", "fold_error", "sensitivity"):
            setattr(self, name, _max(getattr(self, name), getattr(other, name)))

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "shape": list(self.shape),
            "max_abs_diff": self.max_abs_diff,
            "max_abs_ref": self.max_abs_ref,
            "rel_diff": self.rel_diff,
            "rtol": self.rtol,
            "float64_exact": self.exact,
            "float64_written": self.written,
            "original_vs_float64": self.original_error,
            "fold_vs_float64": self.fold_error,
            "sensitivity": self.sensitivity,
        }

    def format_lines(self, own_rtol: str = "") -> list[str]:
        """The output's figures for the report, one or two lines (unindented)."""
        ort = f"fold vs original {self.rel_diff:.3g} (max|diff| {self.max_abs_diff:.3g})"
        if self.written is not None:
            exact = f"exact {self.exact:.2g}, " if self.exact is not None else ""
            return [
                f"{self.name}: float64: {exact}as written {self.written:.3g}{own_rtol}",
                f"  onnxruntime: {ort}, vs float64: original {self.original_error:.3g}, fold {self.fold_error:.3g}",
            ]
        if self.sensitivity is not None:
            return [f"{self.name}: onnxruntime: {ort}{own_rtol}, the original's sensitivity {self.sensitivity:.3g}"]
        return [f"{self.name}: max|diff| {self.max_abs_diff:.3g}, relative {self.rel_diff:.3g}{own_rtol}"]


@dataclass
class Verification:
    status: Status
    reason: str = ""
    rtol: float | None = None  # the largest tolerance applied (each output has its own)
    input_shapes: dict[str, list[int]] = field(default_factory=dict)  # of the first input set
    outputs: list[OutputDiff] = field(default_factory=list)
    input_sets: list[str] = field(default_factory=list)
    shadow: str = ""  # how the models were widened to run on CPU, if they were
    notes: list[str] = field(default_factory=list)
    way_out: WayOut | Literal[""] = ""  # what the user can do about an unverified check
    judgment: Judgment | Literal[""] = ""  # the judge that decided; "" when nothing was compared
    judgment_reason: str = ""  # why the fallback was used
    # The plan's changes read back from the folded file and found as planned (`verify.readback`): centered
    # weights, biases with beta, rewritten and inserted nodes; every other tensor and node was found as it was.
    edits_checked: int = 0
    # Both models at ORT_ENABLE_ALL (`verify.deployed.DeployedCheck`), where that check ran.
    deployed: Any = None

    def __repr__(self) -> str:
        """One line; the figures per output are `.outputs`, the report's lines `format_lines()`."""
        if self.status == "passed":
            rtol = f" <= rtol {self.rtol:g}" if self.rtol is not None else ""
            sets, outputs = len(self.input_sets), len(self.outputs)
            where = JUDGMENT_WORDS[self.judgment].rests_on if self.judgment in (FLOAT64, SENSITIVITY) else ""
            text = (
                f"{where}worst relative diff {self.decisive_rel_diff:.2g}{rtol}, {outputs} output{'s' * (outputs != 1)}"
            )
            text += f" x {sets} input set{'s' * (sets != 1)}"
        else:
            text = self.reason if len(self.reason) <= 100 else self.reason[:97] + "..."
        return f"<Verification {self.status}: {text}>" if text else f"<Verification {self.status}>"

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    @property
    def max_rel_diff(self) -> float:
        """The fold vs the original in ONNX Runtime, worst output."""
        return max((o.rel_diff for o in self.outputs), default=0.0)

    @property
    def decisive_rel_diff(self) -> float:
        """The figure the tolerance judged: the fold as written vs the float64 reference, or
        (without one) the fold vs the original in ONNX Runtime."""
        if self.judgment == FLOAT64:
            return max((o.written for o in self.outputs if o.written is not None), default=0.0)
        return self.max_rel_diff

    def verdict(self, diff: str = "worst relative diff") -> str:
        """A few words for the report's summary line: the verdict and the figure it rests on (`diff`
        names that figure); a skipped check says why, as the detail does."""
        if self.status == "passed":
            where = JUDGMENT_WORDS[self.judgment].rests_on if self.judgment else ""
            if self.judgment != FLOAT64 and self.edits_checked:
                where += f"{self.edits_checked} edits read back, "
            return f"verified ({where}{diff} {self.decisive_rel_diff:.2g})"
        if self.status == "failed":
            if self.judgment == FLOAT64 and self.reason.startswith("the fold is not exact"):
                worst = max(o.exact for o in self.outputs if o.exact is not None)
                return f"verification FAILED (not exact: {worst:.2g} relative in float64 > {EXACT_RTOL:g})"
            if self.outputs and self.rtol:
                return f"verification FAILED ({diff} {self.decisive_rel_diff:.2g} > rtol {self.rtol:g})"
            return "verification FAILED"
        if self.status == "skipped":  # "nothing was folded: the model is unchanged" -> "nothing was folded"
            return f"verification skipped ({self.reason.split(':')[0]})" if self.reason else "verification skipped"
        return "not verified (the check could not run)"

    def refusal(self, surface: str = "api") -> str:
        """One line: why nothing was written, and what the user can do."""
        if self.status == "failed":
            return f"verification failed: {self.reason}"
        way_out = WAY_OUT[surface].get(self.way_out, "")
        return f"not verified: {self.reason}" + (f"; {way_out}" if way_out else "")

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "reason": self.reason,
            "judgment": self.judgment or None,
            "judgment_reason": self.judgment_reason,
            "edits_checked": self.edits_checked,
            "rtol": self.rtol,
            "exact_rtol": EXACT_RTOL if self.judgment and JUDGMENT_WORDS[self.judgment].exact else None,
            "max_rel_diff": self.max_rel_diff if self.outputs else None,
            "input_shapes": self.input_shapes,
            "input_sets": self.input_sets,
            "shadow": self.shadow,
            "notes": self.notes,
            "outputs": [o.to_dict() for o in self.outputs],
            "deployed": self.deployed.to_dict() if self.deployed is not None else None,
        }

    def format_lines(self) -> list[str]:
        if self.status == "skipped":
            return [f"Verification: skipped ({self.reason})"]
        if self.status == "unverified" and not self.input_sets:
            return [f"Verification: not run ({self.reason})"]
        version = getattr(sys.modules.get("onnxruntime"), "__version__", None)  # the one that ran the check
        engine = f"onnxruntime {version}" if version else "onnxruntime"
        how = f"{engine} CPU{', ' + self.shadow if self.shadow else ''}, optimizations off"
        rtols = {o.rtol for o in self.outputs if o.rtol is not None}
        rtol = f"rtol {self.rtol:g}" if self.rtol is not None and len(rtols) <= 1 else "rtol per output"
        if not self.judgment:
            rtol = f", {rtol}" if self.rtol is not None and len(rtols) <= 1 else ""
            lines = [f"Verification ({self.status}, {how}, inputs {'; '.join(self.input_sets)}{rtol}):"]
        else:
            words = JUDGMENT_WORDS[self.judgment]
            fill = {"why": self.judgment_reason, "inputs": "; ".join(self.input_sets), "rtol": rtol}
            lines = [f"Verification ({self.status}, {words.heading}; {how}):"]
            lines += [f"  {line.format(**fill)}" for line in words.lines]
        for o in self.outputs:
            own = f" (rtol {o.rtol:g})" if len(rtols) > 1 and o.rtol is not None else ""
            lines.extend(f"  {line}" for line in o.format_lines(own))
        if self.deployed is not None:
            lines.append(f"  {self.deployed.line()}")
        lines.extend(f"  {note}" for note in self.notes)
        if self.reason:
            lines.append(f"  {self.reason}")
        return lines
