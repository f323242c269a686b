"""Inputs for verification, synthesized from the graph's input specs.

Integer inputs that index an embedding table are drawn inside its row count (else Gather reads
out of bounds), other integer inputs are ones (attention masks), floats are standard normal.
Dynamic dims take small sizes: the first dim `batch_size`, every other one `sequence_length`;
a symbol shared by several inputs gets one size.
"""

from __future__ import annotations

import zipfile

import numpy as np
import onnx_ir as ir

from onnx_lnfold._errors import LnFoldError

# Ops an index tensor may pass through on its way to a Gather without changing its values.
_INDEX_PASSTHROUGH = {"Cast", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity", "Expand"}


def parse_input_shape(spec: str) -> tuple[str, tuple[int, ...]]:
    """'NAME:D1,D2,...' -> (NAME, (D1, D2, ...))."""
    name, sep, dims = spec.rpartition(":")
    try:
        if not sep or not name:
            raise ValueError
        shape = tuple(int(d) for d in dims.split(","))
        if any(d < 0 for d in shape):
            raise ValueError
    except ValueError:
        raise LnFoldError(f"bad --input-shape '{spec}': expected NAME:D1,D2,... with non-negative integers") from None
    return name, shape


def _index_bound(value: ir.Value, depth: int = 0) -> int | None:
    """The smallest row count of the Gather tables `value` indexes, if it indexes any."""
    bounds = []
    for node, index in value.uses():
        if node.op_type == "Gather" and index == 1:
            data = node.inputs[0]
            shape = data.shape if data is not None else None
            axis = node.attributes["axis"].as_int() if "axis" in node.attributes else 0
            if shape is not None and isinstance(shape[axis], int):
                bounds.append(shape[axis])
        elif node.op_type in _INDEX_PASSTHROUGH and index == 0 and depth < 8:
            bound = _index_bound(node.outputs[0], depth + 1)
            if bound is not None:
                bounds.append(bound)
    return min(bounds) if bounds else None


def synthesize_inputs(
    model: ir.Model,
    shapes: dict[str, tuple[int, ...]] | None = None,
    *,
    batch_size: int = 2,
    sequence_length: int = 8,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    shapes = dict(shapes or {})
    rng = np.random.default_rng(seed)
    symbols: dict[str, int] = {}
    feeds: dict[str, np.ndarray] = {}
    graph_inputs = [v for v in model.graph.inputs if not v.is_initializer()]
    unknown = set(shapes) - {v.name for v in graph_inputs}
    if unknown:
        raise LnFoldError(f"--input-shape names no graph input: {', '.join(sorted(unknown))}")
    for value in graph_inputs:
        name = value.name or ""
        if name in shapes:
            dims = shapes[name]
        else:
            if value.shape is None:
                raise LnFoldError(f"graph input '{name}' has no shape; give one with --input-shape {name}:D1,D2,...")
            dims_list = []
            for i, d in enumerate(value.shape):
                if isinstance(d, int):
                    dims_list.append(d)
                    continue
                default = batch_size if i == 0 else sequence_length
                key = d.value if isinstance(d, ir.SymbolicDim) else None
                if key is None:
                    dims_list.append(default)
                else:
                    dims_list.append(symbols.setdefault(key, default))
            dims = tuple(dims_list)
        dtype = value.dtype
        if dtype is None:
            raise LnFoldError(f"graph input '{name}' has no element type")
        np_dtype = dtype.numpy()
        if dtype.is_floating_point():
            feeds[name] = rng.standard_normal(dims).astype(np_dtype)
        elif dtype == ir.DataType.BOOL:
            feeds[name] = np.ones(dims, dtype=bool)
        elif dtype.is_integer():
            bound = _index_bound(value)
            if bound is not None:
                feeds[name] = rng.integers(0, bound, size=dims).astype(np_dtype)
            else:
                feeds[name] = np.ones(dims, dtype=np_dtype)
        else:
            raise LnFoldError(f"graph input '{name}' is {dtype.name}; pass inputs with --inputs FILE.npz")
    return feeds


def check_inputs(model: ir.Model, inputs: dict[str, np.ndarray]) -> None:
    """User-given verification inputs must name every graph input, and only those, with its
    element type and rank: else onnxruntime would fail on the original and the check be skipped."""
    graph_inputs = {v.name: v for v in model.graph.inputs if not v.is_initializer()}
    missing = sorted(set(graph_inputs) - set(inputs))
    extra = sorted(set(inputs) - set(graph_inputs))
    if missing or extra:
        parts = []
        if missing:
            parts.append("missing " + ", ".join(missing))
        if extra:
            parts.append("not graph inputs: " + ", ".join(extra))
        raise LnFoldError(f"--inputs does not match the graph inputs ({'; '.join(parts)})")
    for name, value in graph_inputs.items():
        array = inputs[name]
        if value.dtype is not None:
            try:
                expected = np.dtype(value.dtype.numpy())
            except (TypeError, ValueError, NotImplementedError):  # no numpy counterpart: let ORT judge
                expected = None
            if expected is not None and array.dtype != expected:
                raise LnFoldError(f"--inputs: '{name}' is {array.dtype}, the graph input is {expected}")
        if value.shape is not None and len(value.shape) != array.ndim:
            raise LnFoldError(f"--inputs: '{name}' has rank {array.ndim}, the graph input has rank {len(value.shape)}")


def load_inputs(path: str) -> dict[str, np.ndarray]:
    try:
        data = np.load(path, allow_pickle=False)
        if not isinstance(data, np.lib.npyio.NpzFile):
            raise ValueError("an .npy array, not an .npz archive of named arrays")
        with data:
            return {k: data[k] for k in data.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise LnFoldError(f"{path}: cannot read inputs ({e})".splitlines()[0]) from None
