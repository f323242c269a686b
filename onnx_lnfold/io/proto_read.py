"""Read an ONNX model file without reading its weights.

`onnx.load` reads the whole file and then parses it: two copies of every weight at the peak
(figures: benchmarks/results/large_model.json). Here the file is memory-mapped and its protobuf wire format
walked: the main graph's large initializers are parsed without their `raw_data`, whose byte range
in the file is noted instead, and everything else is parsed as usual. Those initializers become
`FileRegionTensor`s, read when (and only as far as) they are used: copied in the kernel when
written unchanged, read a block at a time when centered.

Anything this walker does not expect (a graph split over several fields, a tensor with two
`raw_data` fields, protobuf groups) makes it give up: the caller then parses the file whole, and
reports a broken file as it always did.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from pathlib import Path

import onnx
import onnx_ir as ir

from onnx_lnfold.core.errors import InvalidInput
from onnx_lnfold.io.proto_graphs import graphs_within
from onnx_lnfold.io.tensor_data import check_tensors
from onnx_lnfold.io.tensor_io import FileRegionTensor, file_stamp, raw_dtype
from onnx_lnfold.io.wire import (
    FIXED32,
    FIXED64,
    GRAPH_INITIALIZER,
    LARGE_TENSOR_BYTES,
    LENGTH_DELIMITED,
    MODEL_GRAPH,
    TENSOR_RAW_DATA,
    VARINT,
)

# Initializers whose raw_data is at least this large stay in the file.
IN_FILE_MIN_BYTES = LARGE_TENSOR_BYTES


class _Unexpected(Exception):
    """The file is not the plain protobuf this walker reads; parse it the usual way."""


def _varint(buf, pos: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise _Unexpected
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def _fields(buf, start: int, end: int):
    """(field number, wire type, field start, value start, value end) of each field in [start, end)."""
    pos = start
    while pos < end:
        key, value_start = _varint(buf, pos, end)
        wire = key & 7
        if wire == VARINT:
            _, value_end = _varint(buf, value_start, end)
        elif wire == FIXED64:
            value_end = value_start + 8
        elif wire == FIXED32:
            value_end = value_start + 4
        elif wire == LENGTH_DELIMITED:
            length, value_start = _varint(buf, value_start, end)
            value_end = value_start + length
        else:  # groups: not in onnx.proto
            raise _Unexpected
        if value_end > end:
            raise _Unexpected
        yield key >> 3, wire, pos, value_start, value_end
        pos = value_end


def _initializer(buf, start: int, end: int) -> tuple[onnx.TensorProto, tuple[int, int] | None]:
    """The TensorProto in [start, end), without its raw_data if that is large: (proto, (offset, length))."""
    header = bytearray()
    raw: tuple[int, int] | None = None
    for field, wire, field_start, value_start, value_end in _fields(buf, start, end):
        if field == TENSOR_RAW_DATA and wire == LENGTH_DELIMITED:
            if raw is not None:
                raise _Unexpected
            raw = (value_start, value_end - value_start)
        else:
            header += buf[field_start:value_end]
    tensor = onnx.TensorProto()
    if raw is None or raw[1] < IN_FILE_MIN_BYTES:
        tensor.ParseFromString(buf[start:end])
        return tensor, None
    tensor.ParseFromString(bytes(header))
    dtype = ir.DataType(tensor.data_type)
    if raw_dtype(dtype) is None or tensor.data_location == onnx.TensorProto.EXTERNAL:
        tensor.ParseFromString(buf[start:end])
        return tensor, None
    return tensor, raw


def _sparse_initializers(graph: onnx.GraphProto) -> int:
    """How many sparse initializers the graph and the bodies of its nodes hold, at any depth."""
    return sum(len(g.sparse_initializer) for g in graphs_within(graph))


def check_representable(proto: onnx.ModelProto) -> None:
    """Refuse what onnx_ir would silently drop on the way in (and the output would then lack):
    sparse initializers and training information. One line, a way out."""
    sparse = _sparse_initializers(proto.graph)
    if sparse:
        raise InvalidInput(
            f"the model has {sparse} sparse_initializer(s), which onnx_lnfold cannot keep; "
            "convert them to dense initializers first"
        )
    if len(proto.training_info):
        raise InvalidInput(
            f"the model has training_info ({len(proto.training_info)} entries), which onnx_lnfold cannot keep "
            "and whose update bindings would not match the centered weights; fold an inference-only copy "
            "(clear ModelProto.training_info) instead"
        )


@dataclass(frozen=True)
class ProtoInFile:
    """A model file's proto with its large initializers' bytes left in the file: `regions` gives
    each one's (offset, length) there, `stamp` the file as the offsets hold."""

    proto: onnx.ModelProto
    path: Path
    regions: dict[str, tuple[int, int]]
    stamp: tuple[int, int, int, int]

    def initializer(self, tensor: onnx.TensorProto) -> ir.TensorProtocol:
        """The main graph's initializer `tensor` as an IR tensor, its bytes read when used: from
        its region of this file, its external data file (beside this one) or the proto."""
        found = ir.serde.deserialize_tensor(tensor, str(self.path.parent))
        region = self.regions.get(tensor.name)
        if region is None:
            return found
        return FileRegionTensor.of(found, self.path, region[0], tensor.name, self.stamp)


def read_proto(path: Path, check: bool = True) -> ProtoInFile | None:
    """The proto of the model at `path` with its large initializers left in the file, checked as
    `read_model` checks it (`check`: unless read and checked already), or None when the file is
    not one this walker reads."""
    with open(path, "rb") as file:
        # The offsets below hold for the file as it is now: its tensors check this stamp on read.
        stamp = file_stamp(os.fstat(file.fileno()))
        try:
            buf = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError):  # a file system without memory maps: parse it whole
            return None
        try:
            size = len(buf)
            model_rest = bytearray()
            graph_span = None
            for field, wire, field_start, value_start, value_end in _fields(buf, 0, size):
                if field == MODEL_GRAPH and wire == LENGTH_DELIMITED:
                    if graph_span is not None:  # protobuf would merge the two: leave that to protobuf
                        raise _Unexpected
                    graph_span = (value_start, value_end)
                else:
                    model_rest += buf[field_start:value_end]
            if graph_span is None:
                raise _Unexpected
            graph_rest = bytearray()
            initializers: list[onnx.TensorProto] = []
            regions: dict[str, tuple[int, int]] = {}
            names: set[str] = set()
            for field, wire, field_start, value_start, value_end in _fields(buf, *graph_span):
                if field == GRAPH_INITIALIZER and wire == LENGTH_DELIMITED:
                    tensor, raw = _initializer(buf, value_start, value_end)
                    if tensor.name in names:  # which one wins is protobuf's and the IR's business
                        raise _Unexpected
                    names.add(tensor.name)
                    if raw is not None:
                        if not tensor.name:
                            raise _Unexpected
                        regions[tensor.name] = raw
                    initializers.append(tensor)
                else:
                    graph_rest += buf[field_start:value_end]
            proto = onnx.ModelProto()
            proto.ParseFromString(bytes(model_rest))
            proto.graph.ParseFromString(bytes(graph_rest))
            proto.graph.initializer.extend(initializers)
        except (_Unexpected, ValueError, OverflowError):
            return None
        except Exception as e:  # a DecodeError, under whatever name the protobuf runtime gives it
            if type(e).__name__ == "DecodeError":
                return None
            raise
        finally:
            buf.close()
    del initializers, model_rest, graph_rest
    if not proto.HasField("graph") or proto.ir_version == 0:
        return None
    if check:
        check_representable(proto)
        check_tensors(proto, {name: length for name, (_, length) in regions.items()})
    return ProtoInFile(proto, path, regions, stamp)


def read_model(path: Path) -> ir.Model | None:
    """The model at `path` with its large initializers left in the file, or None when the file is
    not one this walker reads (the caller falls back to `onnx.load`)."""
    found = read_proto(path)
    if found is None:
        return None
    model = ir.serde.deserialize_model(found.proto)  # its errors are the caller's to report
    for name, (offset, _) in found.regions.items():  # each length is its header's bytes: checked
        value = model.graph.initializers.get(name)
        if value is None or value.const_value is None:  # let the usual path judge this file
            return None
        value.const_value = FileRegionTensor.of(value.const_value, path, offset, name, found.stamp)
    return model
