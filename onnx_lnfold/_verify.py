"""Verification: run the original and the folded model in ONNX Runtime and compare every output.

Graph optimizations are disabled for the comparison so that ONNX Runtime's own fusions cannot hide
(or cause) a difference. The figures are max |diff| and max |diff| / max |ref| per output, the worst
over every input set (two sizes, each bool input at both values).

A fold is written only when this check *passed*. When it cannot run (no onnxruntime, the original
does not run on the inputs, no inputs can be made), the status is "unverified" and the fold is
refused like a failed one, with the way out named (`refusal`).

bfloat16 models are compared through float32 shadows (`_shadow`). `check_equivalence` is the
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

import numpy as np
import onnx
import onnx_ir as ir

from onnx_lnfold._inputs import InputsUnavailable, verification_input_sets
from onnx_lnfold._plan import CenteringPlan
from onnx_lnfold._save import save_with_external_data, uses_external_data, weight_bytes
from onnx_lnfold._shadow import bfloat16_rounding, float32_shadow, has_bfloat16, widen_feeds

logger = logging.getLogger(__name__)

# Tolerances on max|diff| / max|ref|, by the output's element type: far above the rounding noise
# of an exact fold in that type (docs/DESIGN.md section 6), far below any real error.
DEFAULT_RTOL = {"float32": 1e-4, "float16": 1e-2}
_LOW_PRECISION = {onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16}

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


def rtol_for(elem_type: int | None) -> float:
    return DEFAULT_RTOL["float16"] if elem_type in _LOW_PRECISION else DEFAULT_RTOL["float32"]


@dataclass
class OutputDiff:
    name: str
    shape: tuple[int, ...]
    max_abs_diff: float
    max_abs_ref: float
    rtol: float | None = None

    @property
    def rel_diff(self) -> float:
        if self.max_abs_diff == 0.0:
            return 0.0
        return self.max_abs_diff / self.max_abs_ref if self.max_abs_ref > 0 else float("inf")

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "shape": list(self.shape),
            "max_abs_diff": self.max_abs_diff,
            "max_abs_ref": self.max_abs_ref,
            "rel_diff": self.rel_diff,
            "rtol": self.rtol,
        }


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

    def __repr__(self) -> str:
        """One line; the figures per output are `.outputs`, the report's lines `format_lines()`."""
        if self.status == "passed":
            rtol = f" <= rtol {self.rtol:g}" if self.rtol is not None else ""
            sets, outputs = len(self.input_sets), len(self.outputs)
            text = f"worst relative diff {self.max_rel_diff:.2g}{rtol}, {outputs} output{'s' * (outputs != 1)}"
            text += f" x {sets} input set{'s' * (sets != 1)}"
        else:
            text = self.reason if len(self.reason) <= 100 else self.reason[:97] + "..."
        return f"<Verification {self.status}: {text}>" if text else f"<Verification {self.status}>"

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    @property
    def max_rel_diff(self) -> float:
        return max((o.rel_diff for o in self.outputs), default=0.0)

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
            "rtol": self.rtol,
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
        sets = "; ".join(self.input_sets)
        version = getattr(sys.modules.get("onnxruntime"), "__version__", None)  # the one that ran the check
        engine = f"onnxruntime {version}" if version else "onnxruntime"
        how = f"{engine} CPU{', ' + self.shadow if self.shadow else ''}, optimizations off"
        rtols = {o.rtol for o in self.outputs if o.rtol is not None}
        rtol = f", rtol {self.rtol:g}" if self.rtol is not None and len(rtols) <= 1 else ""
        lines = [f"Verification ({self.status}, {how}, inputs {sets}{rtol}):"]
        for o in self.outputs:
            own = f" (rtol {o.rtol:g})" if len(rtols) > 1 and o.rtol is not None else ""
            lines.append(f"  {o.name}: max|diff| {o.max_abs_diff:.3g}, relative {o.rel_diff:.3g}{own}")
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
def verify(
    original: ModelBytesOrPath,
    folded: ModelBytesOrPath,
    input_sets: list,
    rtol: float | None,
    output_types: dict[str, int] | None = None,
    shadow: bool = False,
) -> Verification:
    """Compare the two models on every input set (`_inputs.InputSet`s).

    `rtol` applies to every output when given; else each output gets the tolerance of its
    element type in `output_types` (the original's). `shadow`: compare float32 shadows.
    'failed' when an output exceeds its tolerance or the folded model does not run;
    'unverified' when the check cannot run at all.
    """
    output_types = output_types or {}
    labels = [s.label for s in input_sets]
    dropped: list[int] = []
    notes: list[str] = []
    how = "float32 shadows (bfloat16 widened)" if shadow else ""

    def result(status, reason="", outputs=(), way_out=""):
        used = [o.rtol for o in outputs if o.rtol is not None]
        top = rtol if rtol is not None else (max(used) if used else None)
        first = {k: list(v.shape) for k, v in input_sets[0].feeds.items()} if input_sets else {}
        run = [label for i, label in enumerate(labels) if i not in dropped]
        return Verification(status, reason, top, first, list(outputs), run, how, list(notes), way_out)

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
    for number, input_set in enumerate(input_sets, 1):
        where = f"input set {number} of {len(input_sets)} ({input_set.label})"
        error: Exception | None = None
        for candidate_feeds in (input_set.feeds, *input_set.alternatives):
            feeds = widen_feeds(candidate_feeds) if shadow else candidate_feeds
            try:
                reference = _run(reference_session, feeds)
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
        for diff in compare(reference, candidate):
            diff.rtol = rtol if rtol is not None else rtol_for(output_types.get(diff.name))
            if diff.name not in worst or not diff.rel_diff <= worst[diff.name].rel_diff:
                worst[diff.name] = diff
    outputs = list(worst.values())
    over = [o for o in outputs if not o.rel_diff <= o.rtol]
    if over:
        o = max(over, key=lambda o: o.rel_diff / o.rtol)
        reason = f"output '{o.name}' differs: max|diff| {o.max_abs_diff:.3g}, relative {o.rel_diff:.3g} > rtol {o.rtol:g}"
        return result("failed", reason, outputs)
    return result("passed", "", outputs)


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
) -> Verification:
    """Run both models on the verification inputs; never raises for a check that cannot run
    (the status is then "unverified", with the reason and the way out)."""
    try:
        input_sets = verification_input_sets(spec_model, input_shapes, inputs)
    except InputsUnavailable as e:
        return Verification("unverified", f"cannot synthesize verification inputs: {e}", rtol, way_out="inputs")
    shadow = has_bfloat16(spec_model)
    verification = verify(original, folded, input_sets, rtol, output_types(spec_model), shadow=shadow)
    if shadow and plan is not None and verification.status == "passed":
        verification.notes.extend(bfloat16_rounding(spec_model, plan))
    return verification
