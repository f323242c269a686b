"""Run ONNX Runtime's own optimizers on weightless copies of a model (docs/DESIGN.md section 10):
the transformers optimizer (`onnxruntime.transformers.optimizer`: `optimize_by_onnxruntime`, then
`optimize_by_fusion`, as `optimize_model` composes them) and the graph optimizations of an
inference session (ORT_ENABLE_ALL, CPU). What ONNX Runtime made of the graph comes back as
`onnx.GraphProto`s; what that means for the fold is `_fusions`' business.

Nothing here reads a real weight: the models are `_weightless` copies, their large constants
references into one sparse file of zeros. The session writes its optimized model's initializers
to /dev/null (the graph is all that is read back) and never prepacks weights. The transformers
optimizer reads constants (a table's shape, Q/K/V weights to concatenate), so the zeros are
loaded for it: memory of the model's size while it runs.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import onnx

from onnx_lnfold._weightless import ZEROS_FILE, WeightlessFolder


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


def _optimized_by_session(path: Path, folder: WeightlessFolder, level: str, tag: str, disabled=()) -> Path:
    """The model an ONNX Runtime CPU session at optimization `level` (a GraphOptimizationLevel
    name) writes back for `path`: its initializers go to /dev/null where links are possible."""
    import onnxruntime as ort

    optimized = folder.path / f"{path.stem}.{tag}.onnx"
    data_name = f"{path.stem}.{tag}.data"
    sink = folder.path / data_name
    if os.path.exists(os.devnull) and not sink.exists():
        with contextlib.suppress(OSError):
            sink.symlink_to(os.devnull)  # the weights ORT writes back are not wanted
    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    options.log_severity_level = 3
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.optimized_model_filepath = str(optimized)
    options.add_session_config_entry("session.optimized_model_external_initializers_file_name", data_name)
    options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    options.add_session_config_entry("session.disable_prepacking", "1")
    kwargs = {"disabled_optimizers": list(disabled)} if disabled else {}
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"], **kwargs)
    return optimized


def session_graph(path: Path, folder: WeightlessFolder) -> onnx.GraphProto:
    """The graph an ONNX Runtime session on the CPU runs `path` as (ORT_ENABLE_ALL, the default)."""
    return _graph_only(_optimized_by_session(path, folder, "ORT_ENABLE_ALL", "session"))


def _with_zeros(model: onnx.ModelProto, folder: WeightlessFolder) -> onnx.ModelProto:
    """Every external reference pointed at the zero file (ORT's optimizer writes its own data
    file, which went to /dev/null), then loaded: the transformers optimizer reads values."""
    from onnx.external_data_helper import ExternalDataInfo, _get_all_tensors

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
    onnx.external_data_helper.load_external_data_for_model(model, str(folder.path))
    return model


# `optimize_model`'s own settings for opt_level 1 (ConstantSharing disabled, CPU).
_LEVEL1_DISABLED = ["ConstantSharing"]


class TransformersOptimizer:
    """`onnxruntime.transformers.optimizer` on one weightless model file, per (model_type,
    opt_level), as `optimize_model(path, model_type, opt_level=...)` runs: at opt_level 1 an
    ONNX Runtime session's basic optimizations first (shared by every model_type), then the
    Python fusions of that model_type, with the num_heads and hidden_size a user would pass (0:
    the optimizer detects them)."""

    def __init__(self, path: Path, folder: WeightlessFolder):
        self.path = path
        self.folder = folder
        self._level1: Path | None = None

    def _level1_path(self) -> Path:
        """What `optimize_by_onnxruntime(path, opt_level=1, disabled_optimizers=["ConstantSharing"])`
        writes (the session `optimize_model` runs at opt_level 1 on the CPU), with ONNX Runtime's
        warnings off and the weights to /dev/null."""
        if self._level1 is None:
            self._level1 = _optimized_by_session(self.path, self.folder, "ORT_ENABLE_BASIC", "o1", _LEVEL1_DISABLED)
        return self._level1

    def run(self, model_type: str, opt_level: int, num_heads: int = 0, hidden_size: int = 0) -> onnx.GraphProto:
        """The optimized graph (initializers without their data)."""
        from onnxruntime.transformers.optimizer import optimize_by_fusion

        if opt_level == 0:
            model = onnx.load(str(self.path))  # the zeros, loaded
        else:
            model = _with_zeros(onnx.load(str(self._level1_path()), load_external_data=False), self.folder)
        with _quiet():
            optimized = optimize_by_fusion(model, model_type, num_heads, hidden_size)
        graph = optimized.model.graph
        for tensor in graph.initializer:  # drop the zeros: only the graph is read
            tensor.ClearField("raw_data")
        return graph


__all__ = ["TransformersOptimizer", "ort_version", "session_graph"]
