"""Write a model with its weights inside the .onnx file, one tensor at a time.

`ir.save` (like `onnx.save`) builds the whole ModelProto and then its serialized bytes: two more
copies of every weight beside the model being saved (figures: benchmarks/results/large_model.json).
Here everything but the large initializers' data is serialized as usual, and each large
initializer is then written as its header followed by its bytes, streamed from the tensor
(a centered weight computes them block by block). Protobuf reads a message's fields in any
order, so a field written last parses as if written in its usual place; repeated fields keep
their order. The result parses to the same ModelProto `ir.to_proto` gives, where the tensors
store their data as raw bytes.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

import onnx_ir as ir

from onnx_lnfold.core.errors import CannotWrite
from onnx_lnfold.io.tensor_io import FileRegionTensor, raw_dtype
from onnx_lnfold.io.wire import GRAPH_INITIALIZER, LARGE_TENSOR_BYTES, MODEL_GRAPH, TENSOR_RAW_DATA, length_key

logger = logging.getLogger(__name__)

# Initializers at least this large are streamed; smaller ones go in with the graph.
STREAM_MIN_BYTES = LARGE_TENSOR_BYTES


def _streamable(tensor: ir.TensorProtocol | None) -> bool:
    """Large tensors of whole-byte elements (what `io.proto_read` leaves in a file, and what a
    `FileRegionTensor` can read back after `read_from`); strings and packed 4-bit types go in
    with the graph."""
    return (
        tensor is not None
        and raw_dtype(tensor.dtype) is not None
        and not isinstance(tensor, ir.ExternalTensor)
        and tensor.nbytes >= STREAM_MIN_BYTES
    )


def write_model(model: ir.Model, path: str | os.PathLike, callback: Callable | None = None) -> dict[str, int]:
    """Serialize `model` to `path` as one protobuf file, large initializers streamed; returns
    where each streamed initializer's bytes start in the file, by name.

    `callback(tensor, None)` is called before each streamed tensor is written (progress).
    """
    graph = model.graph
    streamed = {name: v.const_value for name, v in graph.initializers.items() if _streamable(v.const_value)}
    # Serialize with stand-ins that carry each streamed tensor's header but no data.
    try:
        for name, tensor in streamed.items():
            graph.initializers[name].const_value = ir.ExternalTensor(
                "stream",
                0,
                tensor.nbytes,
                tensor.dtype,
                shape=ir.Shape(tensor.shape),
                name=name,
                doc_string=tensor.doc_string,
                metadata_props=dict(tensor.metadata_props),
            )
        proto = ir.to_proto(model)
    finally:
        for name, tensor in streamed.items():
            graph.initializers[name].const_value = tensor

    records: list[tuple[str, bytes, ir.TensorProtocol | None]] = []
    for init in proto.graph.initializer:
        tensor = streamed.get(init.name)
        if tensor is not None:
            init.ClearField("external_data")
            init.ClearField("data_location")
        records.append((init.name, init.SerializeToString(), tensor))
    proto.graph.ClearField("initializer")
    graph_head = proto.graph.SerializeToString()
    proto.ClearField("graph")
    model_head = proto.SerializeToString()

    def body_length(head: bytes, tensor: ir.TensorProtocol | None) -> int:
        if tensor is None:
            return len(head)
        return len(head) + len(length_key(TENSOR_RAW_DATA, tensor.nbytes)) + tensor.nbytes

    lengths = [body_length(head, tensor) for _, head, tensor in records]
    offsets: dict[str, int] = {}
    graph_length = len(graph_head) + sum(len(length_key(GRAPH_INITIALIZER, n)) + n for n in lengths)
    with open(path, "wb") as file:
        file.write(model_head)
        file.write(length_key(MODEL_GRAPH, graph_length))
        file.write(graph_head)
        for (name, head, tensor), length in zip(records, lengths):
            file.write(length_key(GRAPH_INITIALIZER, length))
            file.write(head)
            if tensor is None:
                continue
            if callback is not None:
                callback(tensor, None)
            file.write(length_key(TENSOR_RAW_DATA, tensor.nbytes))
            start = file.tell()
            offsets[name] = start
            tensor.tofile(file)
            if file.tell() - start != tensor.nbytes:  # the lengths above would lie: never write that
                raise CannotWrite(
                    f"internal error: tensor '{tensor.name}' wrote {file.tell() - start} bytes, not {tensor.nbytes}"
                )
    logger.debug("wrote %s: %d initializer(s) streamed", path, len(streamed))
    return offsets


def read_from(model: ir.Model, path: str | os.PathLike, offsets: dict[str, int]) -> None:
    """Point the initializers `write_model` streamed to `path` at their bytes there: the model
    then reads what was written (and nothing of the file it came from)."""
    for name, offset in offsets.items():
        value = model.graph.initializers[name]
        value.const_value = FileRegionTensor.of(value.const_value, path, offset, name)
