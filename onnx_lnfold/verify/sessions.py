"""Running models in ONNX Runtime for the check: CPU sessions with graph optimizations off (its
fusions can neither hide nor cause a difference), their outputs compared (`compare`), and a
model in memory handed over as bytes or, when large, as a temporary file (`OrtSource`)."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Union

import numpy as np
import onnx_ir as ir

from onnx_lnfold.core.ir import weight_bytes
from onnx_lnfold.io import scratch
from onnx_lnfold.io.external_data import save_with_external_data, uses_external_data
from onnx_lnfold.verify.oracle import blockwise
from onnx_lnfold.verify.oracle.paced import Progress
from onnx_lnfold.verify.verdict import OutputDiff

ModelBytesOrPath = Union[bytes, str, Path]


def onnxruntime_missing() -> str | None:
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return "onnxruntime is not installed"
    return None


def session_options():
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    # Fatal only: a model that fails to run raises, and its message is what the report shows;
    # ONNX Runtime's own (colored) log line would repeat it on stderr.
    options.log_severity_level = 4
    options.log_verbosity_level = 0
    # Prepacking gives each MatMul a private packed copy of its weight; without it ONNX Runtime
    # runs on the external data file mapped into memory (session_state_utils.cc), pages the kernel
    # can share and drop: a session of a file with external data holds about none of its weights.
    options.add_session_config_entry("session.disable_prepacking", "1")
    return options


def session_for(model: ModelBytesOrPath, perturbed: bool = False, progress: Progress | None = None):
    """A session of `model`: one ONNX Runtime session, or, for a model whose weights would not sit
    comfortably in the memory available, a `BlockwiseSession` (`blockwise_session`), which says to
    `progress` which block it is on. `perturbed`: the model with its weights moved by one rounding
    step, block by block (`verify.judges.sensitivity.measure_sensitivity`); a single session of it
    is not made here."""
    import onnxruntime as ort

    if perturbed:
        proto, folder = blockwise.load_structure(model)
        return blockwise.BlockwiseSession(
            proto, folder, session_options, perturbed=True, label=_label(model), progress=progress
        )
    found = blockwise_session(model, progress)
    if found is not None:
        return found
    source = model if isinstance(model, bytes) else str(model)
    return ort.InferenceSession(source, session_options(), providers=["CPUExecutionProvider"])


def blockwise_session(model: ModelBytesOrPath, progress: Progress | None = None) -> blockwise.BlockwiseSession | None:
    """`model` run block by block, each block's weights read from the model's file in place, where
    its weights would not sit comfortably in the memory available (which block it is on said to
    `progress`); else None."""
    above = blockwise.blockwise_above()
    if above is None or (isinstance(model, bytes) and len(model) <= above):
        return None
    proto, folder = blockwise.load_structure(model)
    if not blockwise.runs_blockwise(proto):
        return None
    return blockwise.BlockwiseSession(proto, folder, session_options, label=_label(model), progress=progress)


def _label(model: ModelBytesOrPath) -> str:
    return Path(model).name if not isinstance(model, bytes) else "the model"


def ort_run_options():
    """Run options that keep ONNX Runtime's own log quiet (a failed run raises, with its message)."""
    import onnxruntime as ort

    run_options = ort.RunOptions()
    run_options.log_severity_level = 4
    return run_options


def is_blockwise(session) -> bool:
    return isinstance(session, blockwise.BlockwiseSession)


def run_session(session, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds, ort_run_options())))


def run_sets(session, feeds_list: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray] | Exception]:
    """Each input set's outputs, or the exception its run raised: a `BlockwiseSession` runs every
    set through each block in turn (its weights read once), a session the sets one by one."""
    if is_blockwise(session):
        return session.run_many(feeds_list, ort_run_options())
    results: list[dict[str, np.ndarray] | Exception] = []
    for feeds in feeds_list:
        try:
            results.append(run_session(session, feeds))
        except Exception as e:  # noqa: BLE001 - reported per set by the caller
            results.append(e)
    return results


def run_model(model: ModelBytesOrPath, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return run_session(session_for(model), feeds)


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


def relative(reference: np.ndarray, candidate: np.ndarray) -> float:
    """max|candidate - reference| / max|reference|: one output's figure, as `compare` gives it."""
    return compare({"": reference}, {"": candidate})[0].rel_diff


# How much of ONNX Runtime's message a reason quotes.
ORT_MESSAGE_CHARS = 200
# ONNX Runtime's words (status names and message) for a model it finds invalid, rather than one it
# cannot run (an op it has no kernel for: "is not a registered function/op", "Could not find an
# implementation"): its graph check, type and shape inference. Every status it raises for a
# session's creation is in onnxruntime/core/common/status.h.
ORT_INVALID_MODEL = ("INVALID_GRAPH", "INVALID_PROTOBUF", "This is an invalid model", "Type Error", "InferenceError]")


def refuses_model(e: BaseException) -> bool:
    """Whether ONNX Runtime's failure to make a session says the model is invalid."""
    text = str(e)
    return any(words in text for words in ORT_INVALID_MODEL)


def first_line(e: BaseException, limit: int = 240) -> str:
    text = (str(e).strip().splitlines() or [type(e).__name__])[0]
    # ONNX Runtime's status prefix, the model it loaded and its source location say nothing to a user.
    text = re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", text)
    text = re.sub(r"^Load model from .* failed:(Fatal error: )?", "", text)
    text = re.sub(r"\S*onnxruntime_src/\S+ ", "", text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


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
            self._dir = str(scratch.make("verify"))
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
