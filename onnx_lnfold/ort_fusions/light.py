"""The transformers optimizer's output as it comes back from a weightless copy (`ort_fusions.probe`):
the whole model, every large tensor a reference into the zero file instead of its zeros.

The fusion checks read only the nodes; the optimizer-first count (`ort_fusions.optimizer_first`)
reads the graph whole, its large tensors rebound to the original's by name. A large tensor is one
the weightless copy would not keep (`ort_fusions.weightless`: floats over `keep_bytes`, integers
and booleans over `keep_integer_bytes`); the others keep their values, as they did in the copy.

This module imports onnx alone: the optimizer's child process (`probe.OptimizerProcess`), which
need not find the package, loads it by its path.
"""

from __future__ import annotations

import math

import onnx
from onnx import helper

_STRING = onnx.TensorProto.STRING


def _nbytes(tensor: onnx.TensorProto) -> int:
    count = math.prod(tensor.dims)
    try:
        itemsize = helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    except (KeyError, ValueError):
        itemsize = 1
    return count * itemsize


def _strip(
    tensor: onnx.TensorProto, zeros_file: str, keep_bytes: int, keep_integer_bytes: int, integers: frozenset
) -> None:
    """Replace the data of a large `tensor` by a reference to `zeros_file` (its type and shape
    stay); leave a small one, a string and a reference as they are."""
    if tensor.data_location == onnx.TensorProto.EXTERNAL or tensor.data_type == _STRING:
        return
    nbytes = _nbytes(tensor)
    if nbytes <= (keep_integer_bytes if tensor.data_type in integers else keep_bytes):
        return
    for name in ("raw_data", "float_data", "int32_data", "int64_data", "double_data", "uint64_data"):
        tensor.ClearField(name)
    tensor.data_location = onnx.TensorProto.EXTERNAL
    del tensor.external_data[:]
    for key, value in (("location", zeros_file), ("offset", "0"), ("length", str(nbytes))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value


def _graph_tensors(graph: onnx.GraphProto):
    yield from graph.initializer
    yield from _node_tensors(graph.node)


def _node_tensors(nodes):
    for node in nodes:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("g"):
                yield from _graph_tensors(attr.g)
            for body in attr.graphs:
                yield from _graph_tensors(body)


def light_model(
    model: onnx.ModelProto, zeros_file: str, keep_bytes: int, keep_integer_bytes: int, integer_types: list[int]
) -> onnx.ModelProto:
    """`model` (changed in place and returned) with the data of every large tensor, initializers
    and Constant values of every graph and function, replaced by a reference to `zeros_file`."""
    integers = frozenset(integer_types)
    tensors = [*_graph_tensors(model.graph), *(t for f in model.functions for t in _node_tensors(f.node))]
    for tensor in tensors:
        _strip(tensor, zeros_file, keep_bytes, keep_integer_bytes, integers)
    return model


__all__ = ["light_model"]
