"""Run ONNX Runtime's own optimizers on weightless copies of a model (docs/DESIGN.md section 10):
the transformers optimizer (`onnxruntime.transformers.optimizer`: `optimize_by_onnxruntime`, then
`optimize_by_fusion`, as `optimize_model` composes them) and the graph optimizations of an
inference session (ORT_ENABLE_ALL, CPU). What ONNX Runtime made of the graph comes back as
`onnx.GraphProto`s (a session's) and `onnx.ModelProto`s (the transformers optimizer's, whole, its
large tensors references into the zero file: `ort_fusions.light`); what that means for the fold
is `ort_fusions.fusion_cost`' business.

Nothing here reads a real weight: the models are `ort_fusions.weightless` copies, their large constants
references into one sparse file of zeros. The session writes its optimized model's initializers
to /dev/null (the graph is all that is read back) and never prepacks weights. The transformers
optimizer reads constants (a table's shape, Q/K/V weights to concatenate, a bias), so it reads
zeros: all of them loaded for a small model, and for a large one only those it asks for, in a
child process (`TransformersOptimizer`).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import struct
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import onnx

from onnx_lnfold.ort_fusions import light, session_save
from onnx_lnfold.ort_fusions.weightless import (
    INTEGER_TYPES,
    KEEP_BYTES,
    KEEP_INTEGER_BYTES,
    ZEROS_FILE,
    WeightlessFolder,
)


def ort_version() -> str | None:
    """onnxruntime's version when it and its transformers optimizer import; else None."""
    try:
        import onnxruntime
        import onnxruntime.transformers.optimizer  # noqa: F401
    except ImportError:
        return None
    return onnxruntime.__version__


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The optimizer prints and logs warnings about the graphs it does not fuse (symbolic shape
    inference, model producer): none of that is the user's business here."""
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        logging.disable(previous)


def _graph_only(path: Path) -> onnx.GraphProto:
    return onnx.load(str(path), load_external_data=False).graph


def session_job(path: Path, folder: WeightlessFolder, level: str, tag: str, disabled=()) -> list:
    """`session_save.write_optimized`'s arguments for the session at optimization `level` (a
    GraphOptimizationLevel name) of `path`, its output `<stem>.<tag>.onnx` in `folder`, the
    optimizers `disabled` off; its initializers go to /dev/null where links are possible."""
    optimized = folder.path / f"{path.stem}.{tag}.onnx"
    return [str(path), str(optimized), session_save.discard_weights(optimized), level, list(disabled)]


def _optimized_by_session(path: Path, folder: WeightlessFolder, level: str, tag: str, disabled=()) -> Path:
    """The model an ONNX Runtime CPU session writes back for `path` (`session_job`,
    `ort_fusions.session_save`). Past `SESSION_CHILD_ABOVE_BYTES` of zeros, in a child process whose
    allocator keeps the pages it frees (`session_save.child_env`)."""
    job = session_job(path, folder, level, tag, disabled)
    if _zero_bytes(path) <= SESSION_CHILD_ABOVE_BYTES:
        session_save.write_optimized(*job)
        return Path(job[1])
    done = subprocess.run(
        session_save.child_command(job),
        env=session_save.child_env(dict(os.environ)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    if done.returncode != 0:
        lines = done.stderr.decode(errors="replace").strip().splitlines()
        raise RuntimeError(lines[-1] if lines else f"the session's process exited with {done.returncode}")
    return Path(job[1])


def session_graph(path: Path, folder: WeightlessFolder) -> onnx.GraphProto:
    """The graph an ONNX Runtime session on the CPU runs `path` as (ORT_ENABLE_ALL, the default)."""
    return _graph_only(_optimized_by_session(path, folder, "ORT_ENABLE_ALL", "session"))


def _zero_bytes(path: Path) -> int:
    """Bytes of the weightless copy `path` that are references into the zero file."""
    from onnx.external_data_helper import ExternalDataInfo, _get_all_tensors

    model = onnx.load(str(path), load_external_data=False)
    return sum(ExternalDataInfo(t).length for t in _get_all_tensors(model) if t.data_location == onnx.TensorProto.EXTERNAL)


def _pointed_at_zeros(path: Path, folder: WeightlessFolder) -> Path:
    """A copy of `path` (written by an ONNX Runtime session, its data sent to /dev/null) whose
    external references point at the zero file instead; no data is read or written."""
    from onnx.external_data_helper import ExternalDataInfo, _get_all_tensors

    model = onnx.load(str(path), load_external_data=False)
    longest = 0
    for tensor in _get_all_tensors(model):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            length = ExternalDataInfo(tensor).length
            longest = max(longest, length)
            del tensor.external_data[:]
            for key, value in (("location", ZEROS_FILE), ("offset", "0"), ("length", str(length))):
                entry = tensor.external_data.add()
                entry.key, entry.value = key, value
    folder.reserve(longest)
    out = path.with_name(f"{path.stem}.zeros.onnx")
    out.write_bytes(model.SerializeToString())
    return out


# What `ort_fusions.light` is told a large tensor is: the weightless copy's own limits.
_LIGHT_ARGS = (ZEROS_FILE, KEEP_BYTES, KEEP_INTEGER_BYTES, sorted(int(t) for t in INTEGER_TYPES))


def _light(model: onnx.ModelProto) -> onnx.ModelProto:
    """The optimizer's output as it is read back: whole, its large tensors references into the
    zero file (`ort_fusions.light`)."""
    return light.light_model(model, *_LIGHT_ARGS)


# The child process: its working directory is the weightless copy's folder, and onnx reads an
# external tensor relative to the working directory when no folder is given, which is how the
# optimizer reads one (`numpy_helper.to_array`): so it reads only the constants the optimizer asks
# for. It loads `ort_fusions.light` by its path (argv[1]; the limits in argv[2], JSON). One job per
# line on stdin (JSON: file, model_type, num_heads, hidden_size); per job, on stdout, 8 bytes of
# length and b"OK" + the optimized model (`ort_fusions.light`: its large tensors references) or
# b"ER" + why.
_CHILD = """
import contextlib, importlib.util, io, json, logging, struct, sys, traceback
import onnx
from onnxruntime.transformers.optimizer import optimize_by_fusion
spec = importlib.util.spec_from_file_location("lnfold_light", sys.argv[1])
light = importlib.util.module_from_spec(spec)
spec.loader.exec_module(light)
light_args = json.loads(sys.argv[2])
logging.disable(logging.WARNING)
out = sys.stdout.buffer
sys.stdout = io.StringIO()
for line in sys.stdin:
    source, model_type, heads, hidden = json.loads(line)
    model = None
    try:
        model = onnx.load(source, load_external_data=False)
        optimized = optimize_by_fusion(model, model_type, heads, hidden).model
        reply = b"OK" + light.light_model(optimized, *light_args).SerializeToString()
    except Exception as error:
        reply = b"ER" + f"{type(error).__name__}: {error}".encode()
    del model
    sys.stdout = io.StringIO()
    out.write(struct.pack(">Q", len(reply)) + reply)
    out.flush()
"""


class OptimizerProcess:
    """The optimizer's child process for one folder (`_CHILD`). `start` it early: its imports take
    a second or two, which the analysis spends on other work meanwhile. Jobs are answered in the
    order they were sent, so several can be sent ahead (`submit`) and their answers read later
    (`result`) while this process does something else."""

    def __init__(self, folder: Path):
        self.folder = folder
        self._process: subprocess.Popen | None = None
        self._sent = 0  # jobs sent
        self._read = 0  # answers read
        self._answers: dict[int, onnx.ModelProto | RuntimeError] = {}  # read, not yet asked for

    def start(self) -> None:
        if self._process is None:
            self._process = subprocess.Popen(
                [sys.executable, "-c", _CHILD, light.__file__, json.dumps(_LIGHT_ARGS)],
                cwd=self.folder,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
            )
            self._sent = self._read = 0
            self._answers.clear()

    def submit(self, source: Path, model_type: str, num_heads: int, hidden_size: int) -> int:
        """Send one job; its number, for `result`."""
        self.start()
        assert self._process is not None and self._process.stdin is not None
        self._process.stdin.write((json.dumps([source.name, model_type, num_heads, hidden_size]) + "\n").encode())
        self._process.stdin.flush()
        self._sent += 1
        return self._sent - 1

    def result(self, job: int) -> onnx.ModelProto:
        """The answer to job number `job` (the answers before it are read and kept)."""
        while job not in self._answers:
            process = self._process
            if process is None or process.stdout is None or self._read >= self._sent:
                raise RuntimeError("the optimizer's process ended without an answer")
            head = process.stdout.read(8)
            if len(head) < 8:
                self.close()
                raise RuntimeError("the optimizer's process ended without an answer")
            reply = process.stdout.read(struct.unpack(">Q", head)[0])
            answer = onnx.ModelProto.FromString(reply[2:]) if reply[:2] == b"OK" else RuntimeError(reply[2:].decode(errors="replace"))
            self._answers[self._read] = answer
            self._read += 1
        answer = self._answers.pop(job)
        if isinstance(answer, RuntimeError):
            raise answer
        return answer

    def run(self, source: Path, model_type: str, num_heads: int, hidden_size: int) -> onnx.ModelProto:
        return self.result(self.submit(source, model_type, num_heads, hidden_size))

    def close(self) -> None:
        if self._process is not None:
            with contextlib.suppress(OSError):
                self._process.stdin.close()  # type: ignore[union-attr]
            if self._read < self._sent or self._sent == 0:
                self._process.kill()  # answers no one will read, or none asked for: not worth waiting
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._process = None


# Weights above which the optimizer runs in a child that reads only what it asks for: loading every
# zero costs 5-7 times the weights' size at the optimizer's peak (2.2-3.1 GB for BERT-base, 4-6 s
# of CPU per run) against 0.2-0.5 GB and 1-2 s in the child, whose start costs about 2 s of CPU
# once per analysis.
CHILD_ABOVE_BYTES = 64 << 20

# Zeros above which a session's optimized model is written in a child process (`session_save`),
# whose allocator reuses what it frees; below, the child's start (about half a second) costs more
# than it saves (benchmarks/results/weightless_session).
SESSION_CHILD_ABOVE_BYTES = 1 << 30

# `optimize_model`'s own settings for opt_level 1 (ConstantSharing disabled, CPU).
_LEVEL1_DISABLED = ["ConstantSharing"]


class TransformersOptimizer:
    """`onnxruntime.transformers.optimizer` on one weightless model file, per (model_type,
    opt_level), as `optimize_model(path, model_type, opt_level=...)` runs: at opt_level 1 an
    ONNX Runtime session's basic optimizations first (shared by every model_type), then the
    Python fusions of that model_type, with the num_heads and hidden_size a user would pass (0:
    the optimizer detects them). The fusions read the zeros: loaded here, or read on demand in
    `child` (what to use above `CHILD_ABOVE_BYTES` of weights)."""

    def __init__(self, path: Path, folder: WeightlessFolder, child: OptimizerProcess | None = None):
        self.path = path
        self.folder = folder
        self._child = child  # None: in this process
        self._level1: Path | None = None

    def _level1_path(self) -> Path:
        """What `optimize_by_onnxruntime(path, opt_level=1, disabled_optimizers=["ConstantSharing"])`
        writes (the session `optimize_model` runs at opt_level 1 on the CPU), with ONNX Runtime's
        warnings off, the weights to /dev/null and the references back to the zero file."""
        if self._level1 is None:
            written = _optimized_by_session(self.path, self.folder, "ORT_ENABLE_BASIC", "o1", _LEVEL1_DISABLED)
            self._level1 = _pointed_at_zeros(written, self.folder)
        return self._level1

    def submit(self, model_type: str, opt_level: int, num_heads: int = 0, hidden_size: int = 0) -> Callable[[], onnx.ModelProto]:
        """`run`, sent ahead to the child where there is one: call what it returns for the result."""
        source = self.path if opt_level == 0 else self._level1_path()
        child = self._child
        if child is None:
            return lambda: self._optimized_here(source, model_type, num_heads, hidden_size)
        job = child.submit(source, model_type, num_heads, hidden_size)
        return lambda: child.result(job)

    def run(self, model_type: str, opt_level: int, num_heads: int = 0, hidden_size: int = 0) -> onnx.ModelProto:
        """The optimized model, its large tensors references into the zero file (`ort_fusions.light`)."""
        return self.submit(model_type, opt_level, num_heads, hidden_size)()

    @staticmethod
    def _optimized_here(source: Path, model_type: str, num_heads: int, hidden_size: int) -> onnx.ModelProto:
        from onnxruntime.transformers.optimizer import optimize_by_fusion

        model = onnx.load(str(source))  # the zeros, loaded from the folder the file is in
        with _quiet():
            optimized = optimize_by_fusion(model, model_type, num_heads, hidden_size)
        return _light(optimized.model)


__all__ = ["CHILD_ABOVE_BYTES", "OptimizerProcess", "TransformersOptimizer", "ort_version", "session_graph"]
