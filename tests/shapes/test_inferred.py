"""What an inference found (`shapes.infer.Inferred`), read from the proto it wrote as each value
is asked for: the same shapes and types as reading every one up front, its made-up symbols tagged,
what is set replacing what was read, and nothing read that nobody asked for."""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from onnx_lnfold.shapes import infer as infer_module
from onnx_lnfold.shapes.infer import GENERATED_PREFIX, Inferred, onnx_inference, proto_dims


def _model() -> onnx.ModelProto:
    """x [batch, seq, 8] -> Relu -> Flatten -> [unk__0, 8]: a dim the inference names itself."""
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Flatten", ["r"], ["f"], axis=2),
        helper.make_node("Shape", ["f"], ["s"]),
        helper.make_node("Cast", ["f"], ["c"], to=TensorProto.INT64),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 8])],
        [helper.make_tensor_value_info("c", TensorProto.INT64, None)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _eager(proto: onnx.ModelProto) -> dict:
    inferred = onnx.shape_inference.infer_shapes(proto, data_prop=True).graph
    return {
        ((), vi.name): (proto_dims(vi.type), vi.type.tensor_type.elem_type)
        for vi in (*inferred.value_info, *inferred.output, *inferred.input)
    }


def test_each_value_reads_as_reading_all_up_front_would():
    proto = _model()
    found = onnx_inference(proto)
    expected = _eager(proto)
    assert set(found) == set(expected) and len(found) == len(expected)
    assert {key: found[key] for key in expected} == expected
    assert found[((), "f")][0][1] == 8 and found[((), "c")][1] == TensorProto.INT64
    assert all(found.has_shape(key) == (shape is not None) for key, (shape, _) in expected.items())
    assert ((), "nowhere") not in found and found.get(((), "nowhere")) is None


def test_only_what_is_asked_for_is_read(monkeypatch):
    found = onnx_inference(_model())
    read: list[onnx.TypeProto] = []
    real = infer_module.proto_dims
    monkeypatch.setattr(infer_module, "proto_dims", lambda t: read.append(t) or real(t))
    assert found[((), "r")][0] is not None
    assert found[((), "r")][0] is not None  # read once
    assert len(read) == 1


def test_tagged_marks_made_up_symbols_and_keeps_shared_ones():
    found = onnx_inference(_model()).tagged("onnx", {"batch", "seq"})
    assert found[((), "r")][0] == ("batch", "seq", 8)
    assert found[((), "f")][0] == (f"{GENERATED_PREFIX}onnx:unk__0", 8)


def test_what_is_set_replaces_what_was_read():
    found = onnx_inference(_model())
    found[((), "r")] = (None, TensorProto.FLOAT)
    found.update({((1, "then_branch", 0), "inner"): ((4,), TensorProto.FLOAT)})
    assert found[((), "r")] == (None, TensorProto.FLOAT) and not found.has_shape(((), "r"))
    assert found[((1, "then_branch", 0), "inner")] == ((4,), TensorProto.FLOAT)
    assert len(found) == len(_eager(_model())) + 1
    assert len(Inferred()) == 0 and dict(Inferred()) == {}
