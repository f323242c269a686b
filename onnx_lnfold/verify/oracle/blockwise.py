"""Running a model in ONNX Runtime block by block, for models larger than the memory at hand.

The model's structure is read without its weights and cut where few tensors are live
(`verify.oracle.cut`). Each block becomes a sub-model whose initializers still name the model's own
external-data file (ONNX Runtime is told the folder: nothing is copied), one session at a time:
made, run on every input set, released before the next block's. The tensors crossing the cut are
kept in memory, each dropped after the last block that reads it. The memory is then about the
largest block's weights (mapped pages, released with the session) plus the activations, not the
model's weights.

`perturbed=True` runs the model with every float weight of two or more elements moved by up to one
rounding step (`perturb`), each block's weights perturbed in memory: no copy of the model is written.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Generator
from pathlib import Path
from types import SimpleNamespace

import ml_dtypes
import numpy as np
import onnx

from onnx_lnfold.verify.oracle.cut import Cut, cut, tensor_bytes
from onnx_lnfold.verify.oracle.paced import Progress, drain, telling

logger = logging.getLogger(__name__)

# A model runs block by block when its weights exceed this share of the memory available.
BLOCKWISE_SHARE = 0.25
# A block holds about this share of the memory available in weights (at least BLOCK_MIN_BYTES).
BLOCK_SHARE = 0.05
BLOCK_MIN_BYTES = 64 << 20
# External tensors up to this size are put in the sub-model itself (shapes and other small constants).
_INLINE_BYTES = 1 << 16
_FLOATS = frozenset(
    {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE}
)


def load_structure(model: bytes | str | Path) -> tuple[onnx.ModelProto, str | None]:
    """The model without its external data, and the folder that data is read from."""
    if isinstance(model, bytes):
        return onnx.load_from_string(model), None
    return onnx.load(str(model), load_external_data=False), os.path.dirname(os.path.abspath(str(model)))


def weights_bytes(proto: onnx.ModelProto) -> int:
    return sum(tensor_bytes(t) for t in proto.graph.initializer)


def available_memory() -> int | None:
    """Bytes the system can give without swapping (Linux's MemAvailable), None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def blockwise_above() -> int | None:
    """Weight bytes above which a model runs block by block (None: never, memory unknown)."""
    available = available_memory()
    return None if available is None else int(BLOCKWISE_SHARE * available)


def block_bytes() -> int:
    available = available_memory() or 0
    return max(BLOCK_MIN_BYTES, int(BLOCK_SHARE * available))


def runs_blockwise(proto: onnx.ModelProto) -> bool:
    """Whether `proto` (its structure) is to run block by block: its weights over `blockwise_above()`."""
    above = blockwise_above()
    return above is not None and weights_bytes(proto) > above


class BlockwiseSession:
    """A model run block by block, with the part of `onnxruntime.InferenceSession`'s interface the
    check uses (`get_outputs`, `run`), and `run_many` to run every input set through each block
    while its session is held (each block's weights read once for all sets). Which block it is on
    is logged and said to `progress`, where given."""

    def __init__(
        self,
        proto: onnx.ModelProto,
        folder: str | None,
        options_for,
        perturbed: bool = False,
        label: str = "the model",
        progress: Progress | None = None,
    ):
        self._proto, self._folder, self._options_for, self._perturbed = proto, folder, options_for, perturbed
        self.label = f"{label}, its weights perturbed" if perturbed else label
        self._say = telling(progress, logger)
        self.cut: Cut = cut(proto.graph, block_bytes())
        self._outputs = [o.name for o in proto.graph.output]
        self._initializers = {t.name: (index, t) for index, t in enumerate(proto.graph.initializer)}
        # The last block reading each crossing tensor (graph outputs: kept to the end).
        self._last: dict[str, int] = {}
        for number, block in enumerate(self.cut.blocks):
            for name in block.inputs:
                self._last[name] = number
        for name in self._outputs:
            self._last[name] = len(self.cut.blocks)
        logger.info(
            "running %s block by block: %d blocks, the largest %.2f GB of weights",
            proto.graph.name or "the model",
            len(self.cut.blocks),
            self.cut.largest_block_bytes / 1e9,
        )

    def get_outputs(self):
        return [SimpleNamespace(name=name) for name in self._outputs]

    def run(self, names, feeds, run_options=None):
        (result,) = self.run_many([feeds], run_options)
        if isinstance(result, Exception):
            raise result
        return [result[name] for name in names or self._outputs]

    def run_many(self, feeds_list: list[dict[str, np.ndarray]], run_options=None) -> list[dict | Exception]:
        """Each input set's outputs by name, or the exception it raised (the others go on)."""
        return drain(self.steps(feeds_list, run_options))

    def steps(self, feeds_list: list[dict[str, np.ndarray]], run_options=None) -> Generator[float, None, list]:
        """`run_many` a block at a time: yields the share of the weights read after each block (the
        check advances its passes over a file together, `verify.oracle.paced`) and returns what
        `run_many` returns."""
        values: list[dict | Exception] = [dict(feeds) for feeds in feeds_list]
        blocks = self.cut.blocks
        total, done = max(sum(b.weight_bytes for b in blocks), 1), 0
        for number, block in enumerate(blocks):
            self._say(
                f"Verifying in onnxruntime: {self.label}, block {number + 1} of {len(blocks)} ({block.weight_bytes / 1e9:.2f} GB)"
            )
            live = [v for v in values if isinstance(v, dict)]
            if not live:
                break
            sub = self._sub_model(block, live[0])
            options = self._options_for()
            if self._folder is not None:
                options.add_session_config_entry("session.model_external_initializers_file_folder_path", self._folder)
            # Perturbed weights are handed over as they are (the session uses their memory), not
            # serialized into the sub-model (which would hold them twice more).
            overrides = [_ortvalue(self._moved(name)) for name in block.weights] if self._perturbed else []
            for name, value in zip(block.weights, overrides):
                if value is not None:
                    options.add_initializer(name, value)
            try:
                session = _session(sub, options)
            except Exception as e:  # noqa: BLE001 - the block does not load: no set runs
                values = [e if isinstance(v, dict) else v for v in values]
                break
            del sub
            for index, current in enumerate(values):
                if not isinstance(current, dict):
                    continue
                try:
                    outputs = session.run(list(block.outputs), {n: current[n] for n in block.inputs}, run_options)
                except Exception as e:  # noqa: BLE001 - this set fails; the others go on
                    values[index] = e
                    continue
                current.update(zip(block.outputs, outputs))
                for name in block.inputs:
                    if self._last.get(name) == number:
                        current.pop(name, None)
            del session, overrides
            done += block.weight_bytes
            yield done / total
        return [v if isinstance(v, Exception) else {n: self._output(v, n) for n in self._outputs} for v in values]

    def _output(self, values: dict, name: str) -> np.ndarray:
        if name in values or name not in self._initializers:
            return values[name]
        moved = self._moved(name) if self._perturbed else None  # a weight
        return (
            moved
            if moved is not None
            else onnx.numpy_helper.to_array(self._initializers[name][1], base_dir=self._folder or "")
        )

    def _sub_model(self, block, feeds: dict[str, np.ndarray]) -> bytes:
        graph = self._proto.graph
        nodes = [graph.node[i] for i in self.cut.order[block.start : block.stop]]
        inputs = [_value_info(name, feeds[name]) for name in block.inputs]
        outputs = [onnx.ValueInfoProto(name=name) for name in block.outputs]
        initializers = [self._inline(self._initializers[name][1]) for name in block.weights]
        if self._perturbed:
            nodes = [self._perturbed_constant(i, graph.node[i]) for i in self.cut.order[block.start : block.stop]]
        sub = onnx.helper.make_graph(nodes, f"{graph.name}_block{block.start}", inputs, outputs, initializers)
        model = onnx.helper.make_model(sub, opset_imports=self._proto.opset_import, ir_version=self._proto.ir_version)
        model.functions.extend(self._proto.functions)
        return model.SerializeToString()

    def _inline(self, tensor: onnx.TensorProto) -> onnx.TensorProto:
        """A small external tensor with its data in place (ONNX Runtime reads shapes and other
        constants of a model given as bytes only from there); a large one as it is, read in place."""
        if tensor.data_location != onnx.TensorProto.EXTERNAL or tensor_bytes(tensor) > _INLINE_BYTES:
            return tensor
        return onnx.numpy_helper.from_array(
            onnx.numpy_helper.to_array(tensor, base_dir=self._folder or ""), tensor.name
        )

    def _moved(self, name: str) -> np.ndarray | None:
        """Weight `name` perturbed, None where it stays (not float, or a scalar)."""
        index, tensor = self._initializers[name]
        if tensor.data_type not in _FLOATS or np.prod(tensor.dims) < 2:
            return None
        return perturb(onnx.numpy_helper.to_array(tensor, base_dir=self._folder or ""), seed=index)

    def _perturbed_constant(self, index: int, node: onnx.NodeProto) -> onnx.NodeProto:
        if node.op_type != "Constant":
            return node
        attr = next((a for a in node.attribute if a.name == "value" and a.type == onnx.AttributeProto.TENSOR), None)
        if attr is None or attr.t.data_type not in _FLOATS or np.prod(attr.t.dims) < 2:
            return node
        moved = onnx.NodeProto()
        moved.CopyFrom(node)
        values = onnx.numpy_helper.to_array(attr.t, base_dir=self._folder or "")
        for a in moved.attribute:
            if a.name == "value":
                a.t.CopyFrom(onnx.numpy_helper.from_array(perturb(values, seed=~index), attr.t.name))
        return moved


_PERTURB_BLOCK = 1 << 20  # elements


def perturb(values: np.ndarray, seed: int) -> np.ndarray:
    """`values` moved by up to one rounding step of their type: w * (1 + u * eps), u uniform in
    [-1, 1] (drawn from `seed`), rounded back."""
    values = np.asarray(values)
    eps = float(ml_dtypes.finfo(values.dtype).eps)
    rng = np.random.default_rng(seed)
    moved = np.empty_like(values)
    flat, out = values.reshape(-1), moved.reshape(-1)
    # In blocks: float64 copies of a whole embedding table would hold several times its size.
    for start in range(0, flat.size, _PERTURB_BLOCK):
        block = flat[start : start + _PERTURB_BLOCK].astype(np.float64)
        out[start : start + block.size] = block * (1.0 + eps * rng.uniform(-1.0, 1.0, block.size))
    return moved


def _value_info(name: str, value) -> onnx.ValueInfoProto:
    """A sub-model input typed as the tensor that will feed it (its shape left free: input sets
    differ)."""
    array = np.asarray(value)
    if array.dtype.name == "bfloat16":
        elem = onnx.TensorProto.BFLOAT16
    else:
        elem = onnx.helper.np_dtype_to_tensor_dtype(array.dtype)
    return onnx.helper.make_tensor_value_info(name, elem, None)


def _ortvalue(array: np.ndarray | None):
    import onnxruntime as ort

    return None if array is None else ort.OrtValue.ortvalue_from_numpy(array)


def _session(model: bytes, options):
    import onnxruntime as ort

    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
