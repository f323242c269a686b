"""Verification: decide whether the folded model computes what the original computes, before
anything is written (docs/DESIGN.md section 6).

Both models run in ONNX Runtime (graph optimizations off, so that its fusions can neither hide nor
cause a difference) on every input set (`_inputs`): the fold must load and run there, and the figures
users see come from there. But a float32 run is one rounding of the truth, and a deep model's own
float32 error can exceed the tolerance while the fold is exact (or the fold can be wrong by less
than that error). So the decision is taken in float64 (`_reference`), against three twins:

1. the original's twin vs the fold's twin with every constant the fold computed at its unrounded
   float64 value (`_centering`'s `exact_float64`): an exact transformation differs by float64
   rounding alone, so any wrong fold, however small, is over `EXACT_RTOL`;
2. the fold as written (its centered weights rounded to their type) vs the original's twin: the
   fold's own error against the truth, held to the tolerance of the output's type (`rtol`);
3. the fold in ONNX Runtime vs the original's twin, within `rtol` plus `ORT_NOISE_FACTOR` times
   the original's own error there: what runs is ONNX Runtime's kernels, not the twin's.

Where no float64 run fits (an op `onnx.reference` cannot evaluate, an estimated time over the
budget), the original's own float32 sensitivity on the same inputs is measured instead (its float
weights moved by up to one rounding step) and the fold is accepted when it differs from the original
in ONNX Runtime by at most `rtol` plus `SENSITIVITY_FACTOR` times that; the report says which
judgment was used and why.

A fold is written only when this check *passed*. When it cannot run (no onnxruntime, the original
does not run on the inputs, no inputs can be made), the status is "unverified" and the fold is
refused like a failed one, with the way out named (`refusal`).

bfloat16 models run in ONNX Runtime through float32 shadows (`_shadow`). `check_equivalence` is the
step as the pipeline runs it: inputs synthesized from the graph (`_inputs`), both models handed to
ONNX Runtime as bytes or, when large, as files (`OrtSource`).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir

from onnx_lnfold.analysis.plan import CenteringPlan
from onnx_lnfold.core.options import FLOAT64_BUDGET_S
from onnx_lnfold.save.staged import save_with_external_data, uses_external_data, weight_bytes
from onnx_lnfold.verify.inputs import InputsUnavailable, verification_input_sets
from onnx_lnfold.verify.reference import Float64Model, Float64Unavailable, exact_tensors, exact_values
from onnx_lnfold.verify.shadow import bfloat16_rounding, float32_shadow, has_bfloat16, widen_feeds

logger = logging.getLogger(__name__)

# Tolerances on max|diff| / max|ref|, by the output's element type: far above the rounding noise
# of an exact fold in that type (docs/DESIGN.md section 6), far below any real error.
DEFAULT_RTOL = {"float32": 1e-4, "float16": 1e-2}
_LOW_PRECISION = {onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16}
# The exact twin of a fold vs the original's, both in float64: float64 rounding, amplified by the
# network, measured at most 3.6e-15 over the committed models and 300 fuzz graphs, 2.9e-14 on
# Whisper tiny.en's encoder (trained weights, 1500 frames); the fold as written, its weights
# rounded to float32 once, is 1e-8 to 9e-6 from the original (docs/DESIGN.md section 6).
EXACT_RTOL = 1e-9
# The fold in ONNX Runtime may be this many times further from the float64 reference than the
# original is, beyond rtol: rounding noise varies from one computation to another.
ORT_NOISE_FACTOR = 10.0
# Without a float64 reference, the fold may differ from the original by rtol plus this many times
# the original's sensitivity to one rounding step of its weights: the original's own float32 error
# measured 0.13 to 1.3 times that sensitivity on the committed models, 0.8 to 3.1 times on Whisper
# tiny.en's encoder (docs/DESIGN.md section 6).
SENSITIVITY_FACTOR = 10.0
# How long the float64 evaluation may take (FLOAT64_BUDGET_S, three twins on every input set) is
# estimated from ONNX Runtime's time for the original times FLOAT64_COST (onnx.reference in
# float64 over ONNX Runtime in float32, one run each, wall clock: 12 to 13 on Whisper tiny.en's
# encoder), then again from the first float64 run.
FLOAT64_COST = 15.0

ModelBytesOrPath = Union[bytes, str, Path]

# What the user can do when the check could not run, per surface.
_WAY_OUT = {
    "cli": {
        "inputs": "give inputs with --inputs FILE.npz or shapes with --input-shape NAME:D1,D2,..., "
        "or accept an unverified model with --no-verify",
        "install": "pip install 'onnx_lnfold[ort]', or accept an unverified model with --no-verify",
        "decline": "accept an unverified model with --no-verify",
    },
    "api": {
        "inputs": "pass inputs={name: array} or input_shapes={name: shape}, or verify=False to accept an unverified model",
        "install": "pip install 'onnx_lnfold[ort]', or pass verify=False to accept an unverified model",
        "decline": "pass verify=False to accept an unverified model",
    },
}

FLOAT64 = "float64 reference"
SENSITIVITY = "fp32 sensitivity"


def rtol_for(elem_type: int | None) -> float:
    return DEFAULT_RTOL["float16"] if elem_type in _LOW_PRECISION else DEFAULT_RTOL["float32"]


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
    status: str  # "passed", "failed", "unverified" (could not run) or "skipped" (not asked / nothing folded)
    reason: str = ""
    rtol: float | None = None  # the largest tolerance applied (each output has its own)
    input_shapes: dict[str, list[int]] = field(default_factory=dict)  # of the first input set
    outputs: list[OutputDiff] = field(default_factory=list)
    input_sets: list[str] = field(default_factory=list)
    shadow: str = ""  # how the models were widened to run on CPU, if they were
    notes: list[str] = field(default_factory=list)
    way_out: str = ""  # "inputs", "install" or "decline": what the user can do about an unverified check
    judgment: str = ""  # FLOAT64 or SENSITIVITY: what decided; "" when nothing was compared
    judgment_reason: str = ""  # why the fallback was used

    def __repr__(self) -> str:
        """One line; the figures per output are `.outputs`, the report's lines `format_lines()`."""
        if self.status == "passed":
            rtol = f" <= rtol {self.rtol:g}" if self.rtol is not None else ""
            sets, outputs = len(self.input_sets), len(self.outputs)
            where = {FLOAT64: "in float64, ", SENSITIVITY: "without float64, "}.get(self.judgment, "")
            text = f"{where}worst relative diff {self.decisive_rel_diff:.2g}{rtol}, {outputs} output{'s' * (outputs != 1)}"
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
            where = {FLOAT64: "in float64, ", SENSITIVITY: "without float64, "}.get(self.judgment, "")
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
        way_out = _WAY_OUT[surface].get(self.way_out, "")
        return f"not verified: {self.reason}" + (f"; {way_out}" if way_out else "")

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "reason": self.reason,
            "judgment": self.judgment or None,
            "judgment_reason": self.judgment_reason,
            "rtol": self.rtol,
            "exact_rtol": EXACT_RTOL if self.judgment == FLOAT64 else None,
            "max_rel_diff": self.max_rel_diff if self.outputs else None,
            "input_shapes": self.input_shapes,
            "input_sets": self.input_sets,
            "shadow": self.shadow,
            "notes": self.notes,
            "outputs": [o.to_dict() for o in self.outputs],
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
        elif self.judgment == FLOAT64:
            lines = [
                f"Verification ({self.status}, judged in float64; {how}):",
                f"  inputs {'; '.join(self.input_sets)}",
                f"  tolerance: exact {EXACT_RTOL:g}, as written {rtol}",
            ]
        else:
            lines = [
                f"Verification ({self.status}, judged without float64; {how}):",
                f"  no float64 reference: {self.judgment_reason}",
                f"  inputs {'; '.join(self.input_sets)}",
                f"  tolerance: {rtol} + {SENSITIVITY_FACTOR:g} x the original's sensitivity (how much its outputs "
                "move when its weights move by one rounding step)",
            ]
        for o in self.outputs:
            own = f" (rtol {o.rtol:g})" if len(rtols) > 1 and o.rtol is not None else ""
            lines.extend(f"  {line}" for line in o.format_lines(own))
        lines.extend(f"  {note}" for note in self.notes)
        if self.reason:
            lines.append(f"  {self.reason}")
        return lines


def onnxruntime_missing() -> str | None:
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return "onnxruntime is not installed"
    return None


def _session(model: ModelBytesOrPath):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    # Fatal only: a model that fails to run raises, and its message is what the report shows;
    # ONNX Runtime's own (colored) log line would repeat it on stderr.
    options.log_severity_level = 4
    options.log_verbosity_level = 0
    source = model if isinstance(model, bytes) else str(model)
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


def _run(session, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    run_options = ort.RunOptions()
    run_options.log_severity_level = 4
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds, run_options)))


def run_model(model: ModelBytesOrPath, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return _run(_session(model), feeds)


def compare(reference: dict[str, np.ndarray], candidate: dict[str, np.ndarray]) -> list[OutputDiff]:
    diffs = []
    for name, ref in reference.items():
        got = candidate[name]
        if ref.dtype.kind not in "fc" and ref.dtype.name != "bfloat16":
            same = ref.shape == got.shape and np.array_equal(ref, got)
            diffs.append(OutputDiff(name, ref.shape, 0.0 if same else float("inf"), 1.0))
            continue
        r = ref.astype(np.float64)
        g = got.astype(np.float64)
        if r.shape != g.shape:
            diffs.append(OutputDiff(name, r.shape, float("inf"), 1.0))
            continue
        both_nan = np.isnan(r) & np.isnan(g)
        diff = np.where(both_nan, 0.0, np.abs(r - g))
        diff = np.where(np.isnan(diff), np.inf, diff)
        finite_ref = np.abs(r[np.isfinite(r)])
        diffs.append(
            OutputDiff(
                name,
                r.shape,
                float(diff.max()) if diff.size else 0.0,
                float(finite_ref.max()) if finite_ref.size else 0.0,
            )
        )
    return diffs


def _first_line(e: BaseException, limit: int = 240) -> str:
    text = (str(e).strip().splitlines() or [type(e).__name__])[0]
    # ONNX Runtime's status prefix and source location say nothing to a user.
    text = re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", text)
    text = re.sub(r"\S*onnxruntime_src/\S+ ", "", text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --------------------------------------------------------------------------- what the model holds
def output_types(model: ir.Model) -> dict[str, int]:
    """The element type each graph output is computed in: its tolerance follows it. An fp32 output
    is held to the fp32 tolerance even when some weights are fp16; but an output that is only a
    widening Cast of an fp16/bf16 tensor (an fp16 model converted with `keep_io_types`) carries
    fp16 rounding, and gets the fp16 tolerance."""
    types = {}
    for v in model.graph.outputs:
        if not v.name or v.dtype is None:
            continue
        computed, dtype = v, v.dtype
        while computed.producer() is not None and computed.producer().op_type in ("Cast", "Identity"):
            source = computed.producer().inputs[0]
            if source is None:
                break
            computed, dtype = source, _elem_type(source)
        types[v.name] = int(dtype if dtype in _LOW_PRECISION else v.dtype)
    return types


def _elem_type(value: ir.Value, depth: int = 0) -> int | None:
    """`value`'s element type, declared or, where intermediate types were not written, read off
    its producer: a Cast's `to`, else the type of the producer's first typed input."""
    if value.dtype is not None:
        return int(value.dtype)
    node = value.producer()
    if node is None or depth > 16:
        return None
    if node.op_type == "Cast" and "to" in node.attributes:
        return node.attributes.get_int("to")
    for inp in node.inputs:
        if inp is not None and (found := _elem_type(inp, depth + 1)) is not None:
            return found
    return None


# --------------------------------------------------------------------------- the check
@dataclass
class _Compared:
    """One input set as ONNX Runtime ran it: the feeds the original accepted (as given, and as
    ONNX Runtime took them: widened for float32 shadows) and both models' outputs."""

    feeds: dict[str, np.ndarray]
    ort_feeds: dict[str, np.ndarray]
    original: dict[str, np.ndarray]
    fold: dict[str, np.ndarray]


def _relative(reference: np.ndarray, candidate: np.ndarray) -> float:
    return compare({"": reference}, {"": candidate})[0].rel_diff


def verify(
    original: ModelBytesOrPath,
    folded: ModelBytesOrPath,
    input_sets: list,
    rtol: float | None,
    output_types: dict[str, int] | None = None,
    shadow: bool = False,
    exact: Callable[[], dict[str, np.ndarray]] | None = None,
    float64_budget: float = FLOAT64_BUDGET_S,
) -> Verification:
    """Compare the two models on every input set (`_inputs.InputSet`s).

    `rtol` applies to every output when given; else each output gets the tolerance of its
    element type in `output_types` (the original's). `shadow`: run float32 shadows in ONNX
    Runtime. `exact`: gives the float64 values of the constants the fold computed (by name), for
    the exact twin; without it that check is not made. `float64_budget`: seconds the float64
    evaluation may take (0: none, judge by the sensitivity). 'failed' when a check fails or the
    folded model does not run; 'unverified' when the check cannot run at all.
    """
    output_types = output_types or {}
    labels = [s.label for s in input_sets]
    dropped: list[int] = []
    notes: list[str] = []
    how = "float32 shadows (bfloat16 widened)" if shadow else ""

    def result(status, reason="", outputs=(), way_out="", judgment="", judgment_reason=""):
        used = [o.rtol for o in outputs if o.rtol is not None]
        top = rtol if rtol is not None else (max(used) if used else None)
        first = {k: list(v.shape) for k, v in input_sets[0].feeds.items()} if input_sets else {}
        run = [label for i, label in enumerate(labels) if i not in dropped]
        return Verification(
            status, reason, top, first, list(outputs), run, how, list(notes), way_out, judgment, judgment_reason
        )

    missing = onnxruntime_missing()
    if missing:
        return Verification("unverified", missing, rtol, way_out="install")
    try:
        original_model = float32_shadow(original) if shadow else original
        folded_model = float32_shadow(folded) if shadow else folded
    except Exception as e:  # noqa: BLE001 - e.g. a shadow over 2 GB
        return result("unverified", f"cannot build the float32 shadows: {_first_line(e)}", way_out="decline")
    try:
        reference_session = _session(original_model)
    except Exception as e:  # noqa: BLE001
        return result("unverified", f"the original model does not load in onnxruntime: {_first_line(e)}", way_out="decline")
    try:
        folded_session = _session(folded_model)
    except Exception as e:  # noqa: BLE001
        return result("failed", f"the folded model does not load in onnxruntime: {_first_line(e)}")
    worst: dict[str, OutputDiff] = {}
    compared: list[_Compared] = []
    original_seconds = 0.0
    for number, input_set in enumerate(input_sets, 1):
        where = f"input set {number} of {len(input_sets)} ({input_set.label})"
        error: Exception | None = None
        for candidate_feeds in (input_set.feeds, *input_set.alternatives):
            feeds = widen_feeds(candidate_feeds) if shadow else candidate_feeds
            try:
                started = time.perf_counter()
                reference = _run(reference_session, feeds)
                original_seconds += time.perf_counter() - started
            except Exception as e:  # noqa: BLE001 - another reading of the shapes may run
                error = error or e
                continue
            input_set.feeds, input_set.alternatives = candidate_feeds, []
            labels[number - 1] = input_set.label
            break
        else:  # nothing to compare against
            reason = f"the original model does not run in onnxruntime on {where}: {_first_line(error)}"  # type: ignore[arg-type]
            if input_set.required:
                return result("unverified", reason, worst.values(), way_out="inputs")
            dropped.append(number - 1)
            notes.append(f"left out: {reason}")
            continue
        try:
            candidate = _run(folded_session, feeds)
        except Exception as e:  # noqa: BLE001
            reason = f"the folded model does not run in onnxruntime on {where}: {_first_line(e)}"
            return result("failed", reason, worst.values())
        compared.append(_Compared(input_set.feeds, feeds, reference, candidate))
        for diff in compare(reference, candidate):
            diff.rtol = rtol if rtol is not None else rtol_for(output_types.get(diff.name))
            if diff.name in worst:
                worst[diff.name].merge(diff)
            else:
                worst[diff.name] = diff
    del reference_session, folded_session
    estimate = 3 * FLOAT64_COST * original_seconds
    reason64 = ""
    if float64_budget <= 0:
        reason64 = "none asked for (a float64 budget of 0 s)"
    elif estimate > float64_budget:
        reason64 = _over_budget(estimate, float64_budget)
    else:
        try:
            _float64_figures(original, folded, compared, worst, exact, float64_budget)
        except Float64Unavailable as e:
            reason64 = str(e)
    outputs = list(worst.values())
    if not reason64:
        return _judge_float64(outputs, result)
    try:
        _sensitivity(original_model, compared, worst)
    except Exception as e:  # noqa: BLE001 - the perturbed original does not run: rtol alone
        notes.append(f"the original's sensitivity could not be measured: {_first_line(e)}")
    return _judge_sensitivity(outputs, result, reason64)


def _float64_figures(
    original: ModelBytesOrPath,
    folded: ModelBytesOrPath,
    compared: list[_Compared],
    worst: dict[str, OutputDiff],
    exact: Callable[[], dict[str, np.ndarray]] | None,
    budget: float,
) -> None:
    """Run the float64 twins on every input set ONNX Runtime ran, and add their figures to
    `worst`. Raises `Float64Unavailable` when they cannot run (nothing added then), or when the
    first run shows they would take more than `budget` seconds."""
    try:
        twins = [Float64Model(original), Float64Model(folded)]
        if exact is not None:
            twins.append(Float64Model(folded, exact()))
        figures: list[dict[str, OutputDiff]] = []
        for number, run in enumerate(compared):
            started = time.perf_counter()
            truth = twins[0].run(run.feeds)
            if number == 0:
                estimate = (time.perf_counter() - started) * len(twins) * len(compared)
                if estimate > budget:
                    raise Float64Unavailable(_over_budget(estimate, budget))
            written, *exactly = (twin.run(run.feeds) for twin in twins[1:])
            per_output = {}
            for name, ref in truth.items():
                if name not in run.original or run.original[name].shape != ref.shape:
                    raise Float64Unavailable(
                        f"the float64 twin's output '{name}' has another shape than in onnxruntime"
                    )
                diff = OutputDiff(name, ref.shape, 0.0, 1.0)
                diff.written = _relative(ref, written[name])
                diff.exact = _relative(ref, exactly[0][name]) if exactly else None
                diff.original_error = _relative(ref, run.original[name])
                diff.fold_error = _relative(ref, run.fold[name])
                per_output[name] = diff
            figures.append(per_output)
    except Float64Unavailable:
        raise
    except Exception as e:  # noqa: BLE001 - e.g. an op the reference implements but not for these inputs
        raise Float64Unavailable(f"the float64 evaluation failed: {_first_line(e)}") from None
    for per_output in figures:
        for name, diff in per_output.items():
            worst[name].merge(diff)


def _over_budget(estimate: float, budget: float) -> str:
    return f"a float64 evaluation would take about {estimate:.0f} s, over the budget of {budget:g} s"


def _judge_float64(outputs: list[OutputDiff], result) -> Verification:
    not_exact = [o for o in outputs if o.exact is not None and not o.exact <= EXACT_RTOL]
    if not_exact:
        o = max(not_exact, key=lambda o: o.exact)  # type: ignore[arg-type, return-value]
        reason = (
            f"the fold is not exact: in float64, output '{o.name}' differs from the original by {o.exact:.2g} "
            f"relative (tolerance {EXACT_RTOL:g})"
        )
        return result("failed", reason, outputs, judgment=FLOAT64)
    over = [o for o in outputs if not o.written <= o.rtol]  # type: ignore[operator]
    if over:
        o = max(over, key=lambda o: o.written / o.rtol)  # type: ignore[operator]
        reason = (
            f"output '{o.name}' differs: in float64, the fold as written (its weights rounded to their type) is "
            f"{o.written:.3g} relative from the original > rtol {o.rtol:g}"
        )
        return result("failed", reason, outputs, judgment=FLOAT64)
    def allowed(o: OutputDiff) -> float:
        return o.rtol + ORT_NOISE_FACTOR * o.original_error  # type: ignore[operator]

    noisy = [o for o in outputs if not o.fold_error <= allowed(o)]  # type: ignore[operator]
    if noisy:
        o = max(noisy, key=lambda o: o.fold_error / allowed(o))  # type: ignore[operator]
        reason = (
            f"output '{o.name}' differs: in onnxruntime, the fold is {o.fold_error:.3g} relative from the float64 "
            f"reference, the original {o.original_error:.3g} > rtol {o.rtol:g} + {ORT_NOISE_FACTOR:g} x the original's"
        )
        return result("failed", reason, outputs, judgment=FLOAT64)
    return result("passed", "", outputs, judgment=FLOAT64)


def _perturbed(model: ModelBytesOrPath) -> bytes:
    """`model` with its float weights moved by up to one rounding step: w * (1 + u * eps), u
    uniform in [-1, 1], rounded back to w's type. Scalars stay (a mask's lowest value, a scale
    compared with another: they are the graph's logic, not its weights)."""
    proto = onnx.load_from_string(model) if isinstance(model, bytes) else onnx.load(str(model))
    rng = np.random.default_rng(0)
    floats = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE)

    def move(tensor: onnx.TensorProto) -> None:
        if tensor.data_type not in floats or int(np.prod(tensor.dims)) < 2:
            return
        values = onnx.numpy_helper.to_array(tensor)
        eps = float(ml_dtypes.finfo(values.dtype).eps)
        wide = values.astype(np.float64) * (1.0 + eps * rng.uniform(-1.0, 1.0, values.shape))
        tensor.CopyFrom(onnx.numpy_helper.from_array(wide.astype(values.dtype), tensor.name))

    def graph(g: onnx.GraphProto) -> None:
        for tensor in g.initializer:
            move(tensor)
        for node in g.node:
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.TENSOR and node.op_type == "Constant":
                    move(attr.t)
                elif attr.type == onnx.AttributeProto.GRAPH:
                    graph(attr.g)
                elif attr.type == onnx.AttributeProto.GRAPHS:
                    for sub in attr.graphs:
                        graph(sub)

    graph(proto.graph)
    return proto.SerializeToString()


def _sensitivity(original: ModelBytesOrPath, compared: list[_Compared], worst: dict[str, OutputDiff]) -> None:
    """The original's own change, on each input set, when its weights move by one rounding step."""
    session = _session(_perturbed(original))
    for run in compared:
        moved = _run(session, run.ort_feeds)
        for name, ref in run.original.items():
            diff = OutputDiff(name, ref.shape, 0.0, 1.0)
            diff.sensitivity = _relative(ref, moved[name])
            worst[name].merge(diff)


def _judge_sensitivity(outputs: list[OutputDiff], result, why: str) -> Verification:
    def allowed(o: OutputDiff) -> float:
        return o.rtol + SENSITIVITY_FACTOR * (o.sensitivity or 0.0)  # type: ignore[operator]

    over = [o for o in outputs if not o.rel_diff <= allowed(o)]
    if over:
        o = max(over, key=lambda o: o.rel_diff / allowed(o))
        sensitivity = (
            f" + {SENSITIVITY_FACTOR:g} x the original's sensitivity {o.sensitivity:.3g}" if o.sensitivity else ""
        )
        reason = (
            f"output '{o.name}' differs: max|diff| {o.max_abs_diff:.3g}, relative {o.rel_diff:.3g} > rtol {o.rtol:g}"
            f"{sensitivity} (no float64 reference: {why})"
        )
        return result("failed", reason, outputs, judgment=SENSITIVITY, judgment_reason=why)
    return result("passed", "", outputs, judgment=SENSITIVITY, judgment_reason=why)


# --------------------------------------------------------------------------- the models to compare
# Above this many weight bytes, onnxruntime reads a model for verification from a temporary file.
_IN_MEMORY_LIMIT = 64 << 20


class OrtSource:
    """A model as ONNX Runtime can read it: bytes for small models, else a temporary file with
    external data. Serializing to bytes holds the weights twice more (the proto and its bytes);
    the file is written tensor by tensor, untouched external tensors copied by the kernel
    (`copy_file_range`), never read into memory."""

    def __init__(self, model: ir.Model):
        self._dir: str | None = None
        if uses_external_data(model) or weight_bytes(model) > _IN_MEMORY_LIMIT:
            self._dir = tempfile.mkdtemp(prefix="lnfold-verify-")
            path = os.path.join(self._dir, "model.onnx")
            try:
                save_with_external_data(model, path, "model.onnx.data")
            except BaseException:
                self.close()
                raise
            self.source: ModelBytesOrPath = path
        else:
            self.source = ir.to_proto(model).SerializeToString()

    def close(self) -> None:
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)


def check_equivalence(
    original: ModelBytesOrPath,
    folded: ModelBytesOrPath,
    spec_model: ir.Model,
    *,
    rtol: float | None = None,
    input_shapes: dict[str, tuple[int, ...]] | None = None,
    inputs: dict[str, np.ndarray] | None = None,
    plan: CenteringPlan | None = None,
    float64_budget: float = FLOAT64_BUDGET_S,
    computed: dict[str, Any] | None = None,
) -> Verification:
    """Run both models on the verification inputs; never raises for a check that cannot run
    (the status is then "unverified", with the reason and the way out). `spec_model` is the
    folded model in memory: its inputs are synthesized from it. `computed`: the constants the
    fold computed (`_reference.exact_tensors`, taken before the model was written), which give
    the exact twin their unrounded values; by default those `spec_model` still holds."""
    computed = exact_tensors(spec_model) if computed is None else computed
    try:
        input_sets = verification_input_sets(spec_model, input_shapes, inputs)
    except InputsUnavailable as e:
        return Verification("unverified", f"cannot synthesize verification inputs: {e}", rtol, way_out="inputs")
    shadow = has_bfloat16(spec_model)
    verification = verify(
        original,
        folded,
        input_sets,
        rtol,
        output_types(spec_model),
        shadow=shadow,
        exact=lambda: exact_values(computed),
        float64_budget=float64_budget,
    )
    if shadow and plan is not None and verification.status == "passed":
        verification.notes.extend(bfloat16_rounding(spec_model, plan))
    return verification
