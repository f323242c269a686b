"""The pieces of protobuf's wire format that `io.proto_read` and `io.proto_write` share.

https://protobuf.dev/programming-guides/encoding/ ; field numbers from onnx.proto.
"""

from __future__ import annotations

# An initializer whose raw bytes are at least this large is left in the file when read and
# streamed when written: the same bound both ways, so a model read back reads what was written.
LARGE_TENSOR_BYTES = 1 << 16

# Field numbers: ModelProto.graph, GraphProto.initializer, TensorProto.raw_data.
MODEL_GRAPH = 7
GRAPH_INITIALIZER = 5
TENSOR_RAW_DATA = 9

# Wire types (3 and 4, groups, are not used by onnx.proto).
VARINT, FIXED64, LENGTH_DELIMITED, FIXED32 = 0, 1, 2, 5


def encode_varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def length_key(field: int, length: int) -> bytes:
    """The tag of a length-delimited field and its length: what precedes its bytes."""
    return encode_varint(field << 3 | LENGTH_DELIMITED) + encode_varint(length)
