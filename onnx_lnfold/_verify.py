"""Verification: run the original and the folded model in ONNX Runtime and compare every output.

Graph optimizations are disabled for the comparison so that ONNX Runtime's own fusions cannot hide
(or cause) a difference. The figures are max |diff| and max |diff| / max |ref| per output.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

import numpy as np

logger = logging.getLogger(__name__)

# Tolerances on max|diff| / max|ref|: fp32 folds land near 1e-6, fp16 within its own rounding.
DEFAULT_RTOL = {"float32": 1e-4, "float16": 1e-2}

ModelBytesOrPath = Union[bytes, str, Path]


@dataclass
class OutputDiff:
    name: str
    shape: tuple[int, ...]
    max_abs_diff: float
    max_abs_ref: float

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
        }


@dataclass
class Verification:
    status: str  # "passed", "failed" or "skipped"
    reason: str = ""
    rtol: float | None = None
    input_shapes: dict[str, list[int]] = field(default_factory=dict)
    outputs: list[OutputDiff] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    @property
    def max_rel_diff(self) -> float:
        return max((o.rel_diff for o in self.outputs), default=0.0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "reason": self.reason,
            "rtol": self.rtol,
            "max_rel_diff": self.max_rel_diff if self.outputs else None,
            "input_shapes": self.input_shapes,
            "outputs": [o.to_dict() for o in self.outputs],
        }


def onnxruntime_missing() -> str | None:
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return "onnxruntime is not installed (pip install 'onnx_lnfold[ort]')"
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


def run_model(model: ModelBytesOrPath, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = _session(model)
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds)))


def compare(reference: dict[str, np.ndarray], candidate: dict[str, np.ndarray]) -> list[OutputDiff]:
    diffs = []
    for name, ref in reference.items():
        got = candidate[name]
        if ref.dtype.kind not in "fc":
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


def verify(
    original: ModelBytesOrPath,
    folded: ModelBytesOrPath,
    feeds: dict[str, np.ndarray],
    rtol: float,
) -> Verification:
    """Compare the two models on `feeds`; status 'failed' when any output exceeds `rtol`."""
    missing = onnxruntime_missing()
    if missing:
        return Verification(status="skipped", reason=missing, rtol=rtol)
    shapes = {k: list(v.shape) for k, v in feeds.items()}
    try:
        reference = run_model(original, feeds)
    except Exception as e:  # the original itself does not run: nothing to compare against
        reason = f"the original model does not run in onnxruntime: {e}".splitlines()[0]
        return Verification(status="skipped", reason=reason, rtol=rtol, input_shapes=shapes)
    try:
        candidate = run_model(folded, feeds)
    except Exception as e:
        reason = f"the folded model does not run in onnxruntime: {e}".splitlines()[0]
        return Verification(status="failed", reason=reason, rtol=rtol, input_shapes=shapes)
    outputs = compare(reference, candidate)
    worst = max(outputs, key=lambda o: o.rel_diff, default=None)
    if worst is not None and not worst.rel_diff <= rtol:
        reason = f"output '{worst.name}' differs: max|diff| {worst.max_abs_diff:.3g}, relative {worst.rel_diff:.3g} > rtol {rtol:g}"
        return Verification("failed", reason, rtol, shapes, outputs)
    return Verification("passed", "", rtol, shapes, outputs)
