"""Tensors whose data does not match their dims, refused when the model is read.

A tensor says its size twice: by `dims` x `data_type`, and by the data it holds (`raw_data`, a
typed field such as `float_data`, or a range of an external file). Where the two differ the model
is malformed, whatever the tensor is for: read as the dims say, it runs past its data (or reads
another tensor's); written as the dims say, it becomes gigabytes of zeros. So every tensor of the
model (initializers and Constant values, in every graph, body and function) is checked here,
before anything sizes a buffer, a file or a loop by its dims, from counts alone: no data is read.

Sizes are Python integers, so no product of dims overflows; the packing of each type (4-bit and
2-bit values, complex numbers) is onnx.proto's, the width of each type onnx-ir's
(`DataType.bitwidth`), the typed field of each onnx's (`helper.tensor_dtype_to_field`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping

import onnx
import onnx_ir as ir

from onnx_lnfold.core.errors import InvalidInput
from onnx_lnfold.core.ir import graphs_of
from onnx_lnfold.io.proto_graphs import bodies, graphs_within

# No file or protobuf holds this much: dims that say more are refused whatever the data.
MAX_TENSOR_BYTES = 1 << 63

_TYPED_FIELDS = ("float_data", "int32_data", "int64_data", "double_data", "uint64_data")
_DIGITS = re.compile(r"[0-9]+\Z")
_SHOWN_DIMS = 8  # a message shows this many dims at most
_SHOWN_CHARS = 60  # and this much of a string from the file


def quoted(text: str) -> str:
    """A string from the model file, quoted and cut to fit a one-line message."""
    text = text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + "..."
    return repr(text)


def _dims(dims) -> str:
    dims = list(dims)
    shown = ", ".join(str(d) for d in dims[:_SHOWN_DIMS])
    return f"[{shown}{', ...' if len(dims) > _SHOWN_DIMS else ''}]"


def _dtype(tensor: onnx.TensorProto, name: str) -> ir.DataType:
    try:
        dtype = ir.DataType(tensor.data_type)
    except ValueError:
        dtype = ir.DataType.UNDEFINED
    if dtype == ir.DataType.UNDEFINED:
        raise InvalidInput(f"tensor '{name}' has data type {tensor.data_type}, which ONNX does not define")
    return dtype


def _elements(dims, name: str) -> int:
    if any(d < 0 for d in dims):
        raise InvalidInput(f"tensor '{name}' has a negative dimension: dims {_dims(dims)}")
    return math.prod(dims)


def _bytes(dtype: ir.DataType, elements: int, dims, name: str) -> int:
    """The bytes `elements` values of `dtype` take packed (as raw_data or external data hold them)."""
    size = -(-elements * dtype.bitwidth // 8)
    if size >= MAX_TENSOR_BYTES:
        raise InvalidInput(f"tensor '{name}' has dims {_dims(dims)} of {dtype.name}: {size:.3g} bytes, more than any file can hold")
    return size


def _typed_count(dtype: ir.DataType, elements: int) -> int:
    """How many entries of its typed field a tensor of `elements` values holds (onnx.proto): two
    per complex number, the 4-bit and 2-bit types packed a byte per entry, else one per value."""
    if dtype in (ir.DataType.COMPLEX64, ir.DataType.COMPLEX128):
        return 2 * elements
    bits = dtype.bitwidth
    if bits < 8 and 8 % bits == 0:
        return -(-elements * bits // 8)
    return elements


def _check_external(tensor: onnx.TensorProto, name: str, dtype: ir.DataType, elements: int) -> None:
    entries = {entry.key: entry.value for entry in tensor.external_data}
    location = entries.get("location", "")
    if not location:
        raise InvalidInput(f"tensor '{name}' is stored in external data but names no file (no 'location' entry)")
    if "\0" in location:
        raise InvalidInput(f"tensor '{name}': its external data location {quoted(location)} holds a NUL byte")
    if dtype == ir.DataType.STRING:
        raise InvalidInput(f"tensor '{name}' is a string tensor stored in external data, which ONNX does not allow")
    for key in ("offset", "length"):
        value = entries.get(key)
        if value is not None and not _DIGITS.match(value):
            raise InvalidInput(
                f"tensor '{name}': its external data {key} {quoted(value)} is not a number of bytes (0 or more)"
            )
    _bytes(dtype, elements, tensor.dims, name)  # the length against them: `check_external_tensor`


def check_tensor_proto(tensor: onnx.TensorProto, name: str | None = None, raw_length: int | None = None) -> None:
    """Refuse `tensor` unless the data it holds is what its dims and type say. `raw_length`: the
    length of a raw_data left in the file (`io.proto_read`), for a tensor parsed without it."""
    name = name or tensor.name
    dtype = _dtype(tensor, name)
    elements = _elements(tensor.dims, name)
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        _check_external(tensor, name, dtype, elements)
        return
    if dtype == ir.DataType.STRING:
        if tensor.HasField("raw_data"):
            raise InvalidInput(f"tensor '{name}' is a string tensor with raw_data; ONNX holds strings in string_data")
        held, need, what = len(tensor.string_data), elements, "strings"
    elif tensor.HasField("raw_data") or raw_length is not None:
        held = raw_length if raw_length is not None else len(tensor.raw_data)
        need, what = _bytes(dtype, elements, tensor.dims, name), "bytes"
    else:
        size = _bytes(dtype, elements, tensor.dims, name)
        try:
            field = onnx.helper.tensor_dtype_to_field(tensor.data_type)
        except KeyError:  # a type newer than this onnx: only raw_data can hold it
            raise InvalidInput(f"tensor '{name}' of {dtype.name} holds no raw_data, the only field this onnx reads it from") from None
        held, need, what = len(getattr(tensor, field)), _typed_count(dtype, elements), f"values in {field}"
        if not held and need:
            others = [f for f in _TYPED_FIELDS if getattr(tensor, f)]
            if others:
                raise InvalidInput(f"tensor '{name}' of {dtype.name} holds its values in {others[0]}, not in {field}")
            raise InvalidInput(
                f"tensor '{name}' holds no data, but its dims {_dims(tensor.dims)} of {dtype.name} need {size:,} bytes"
            )
    if held != need:
        raise InvalidInput(
            f"tensor '{name}' holds {held:,} {what}, but its dims {_dims(tensor.dims)} of {dtype.name} need {need:,}"
        )


def _proto_tensors(model: onnx.ModelProto) -> Iterator[tuple[onnx.TensorProto, str, bool]]:
    """(tensor, name to report, whether an initializer of the main graph) for every tensor of the
    model: initializers and tensor attributes of every graph, body and function."""
    graphs = [g for function in model.functions for node in function.node for g in bodies(node)]
    nodes = [node for function in model.functions for node in function.node]
    for graph in (g for top in [model.graph, *graphs] for g in graphs_within(top)):
        yield from ((t, t.name, graph is model.graph) for t in graph.initializer)
        nodes.extend(graph.node)
    for node in nodes:
        if not node.attribute:
            continue
        owner = next((o for o in node.output if o), node.name)
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t, attr.t.name or owner, False
            yield from ((t, t.name or owner, False) for t in attr.tensors)


def check_tensors(model: onnx.ModelProto, raw_lengths: Mapping[str, int] | None = None) -> None:
    """Refuse the model if any of its tensors holds other data than its dims say. `raw_lengths`:
    the raw_data lengths of main-graph initializers parsed without it (`io.proto_read`)."""
    raw_lengths = raw_lengths or {}
    for tensor, name, main in _proto_tensors(model):
        check_tensor_proto(tensor, name, raw_lengths.get(tensor.name) if main else None)


def _ir_tensors(model: ir.Model) -> Iterator[tuple[ir.TensorProtocol, str]]:
    graphs = [*graphs_of(model), *model.functions.values()]
    for graph in graphs:
        if isinstance(graph, ir.Graph):
            for value in graph.initializers.values():
                if value.const_value is not None:
                    yield value.const_value, value.name or ""
        for node in graph:
            owner = next((o.name for o in node.outputs if o is not None and o.name), node.name or "")
            for attr in node.attributes.values():
                if attr.is_ref() or attr.value is None:
                    continue
                if attr.type == ir.AttributeType.TENSOR:
                    yield attr.value, attr.value.name or owner
                elif attr.type == ir.AttributeType.TENSORS:
                    yield from ((t, t.name or owner) for t in attr.value)


def check_ir_tensors(model: ir.Model) -> None:
    """`check_tensors` for a model given in onnx-ir's form: a tensor still backed by its
    TensorProto is checked as one; an external tensor by its offset and length; any other by its
    dims (its data is an array of those dims)."""
    for tensor, name in _ir_tensors(model):
        if isinstance(tensor, ir.TensorProtoTensor):
            check_tensor_proto(tensor.raw, name)
            continue
        if isinstance(tensor, ir.ExternalTensor):
            check_external_tensor(tensor, name)
            continue
        elements = _elements(list(tensor.shape), name)
        if tensor.dtype != ir.DataType.STRING:
            _bytes(tensor.dtype, elements, list(tensor.shape), name)


def check_external_tensor(tensor: ir.ExternalTensor, name: str) -> None:
    """Refuse an external tensor whose offset is negative or whose length is not the bytes its
    dims say. (Where its file is known, a range past the file's end is said first: truncated.)"""
    dims = list(tensor.shape)
    need = _bytes(tensor.dtype, _elements(dims, name), dims, name)
    if tensor.offset is not None and tensor.offset < 0:
        raise InvalidInput(f"tensor '{name}': its external data offset {tensor.offset} is negative")
    if tensor.length is not None and tensor.length != need:
        raise InvalidInput(
            f"tensor '{name}': its external data length is {tensor.length:,} bytes, "
            f"but its dims {_dims(dims)} of {tensor.dtype.name} need {need:,}"
        )


__all__ = ["MAX_TENSOR_BYTES", "check_external_tensor", "check_ir_tensors", "check_tensor_proto", "check_tensors", "quoted"]
