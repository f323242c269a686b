"""Tensors whose data does not match their dims are refused at load, naming the tensor; the odd
but valid ones still load. (io/tensor_data.py; the files the model names: load/model.py.)"""

import os

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_lnfold.core.errors import InvalidInput
from onnx_lnfold.io.tensor_io import FileRegionTensor
from onnx_lnfold.io.wire import LARGE_TENSOR_BYTES
from onnx_lnfold.load.model import load_model, load_path


def _model(*tensors: TensorProto, nodes=()) -> onnx.ModelProto:
    graph = helper.make_graph(list(nodes), "g", [], [], initializer=list(tensors))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _tensor(name, dtype, dims, **data) -> TensorProto:
    t = TensorProto(name=name, data_type=dtype)
    t.dims.extend(dims)
    for field, value in data.items():
        if field == "raw_data":
            t.raw_data = value
        else:
            getattr(t, field).extend(value)
    return t


def _refused(source, *phrases):
    with pytest.raises(InvalidInput) as e:
        load_model(source)
    message = str(e.value)
    assert "\n" not in message
    for phrase in phrases:
        assert phrase in message, message
    return message


# --- refused --------------------------------------------------------------------------------------

MALFORMED = {
    "raw_data short": (_tensor("w", TensorProto.FLOAT, [16], raw_data=b"\0" * 8), "holds 8 bytes", "need 64"),
    "raw_data long": (_tensor("w", TensorProto.FLOAT, [2], raw_data=b"\0" * 12), "holds 12 bytes", "need 8"),
    "negative dim": (_tensor("w", TensorProto.FLOAT, [-4, 4], raw_data=b"\0" * 64), "negative dimension", "[-4, 4]"),
    "huge dims, little data": (_tensor("w", TensorProto.FLOAT, [1 << 20, 1 << 20], raw_data=b"\0" * 256), "4,398,046,511,104"),
    "dims past int64": (_tensor("w", TensorProto.FLOAT, [1 << 40] * 3, raw_data=b"\0" * 16), "more than any file can hold"),
    "no data": (_tensor("w", TensorProto.FLOAT, [1 << 31]), "holds no data", "8,589,934,592 bytes"),
    "float_data short": (_tensor("w", TensorProto.FLOAT, [4], float_data=[1, 2, 3]), "holds 3 values in float_data", "need 4"),
    "values in another field": (_tensor("w", TensorProto.FLOAT, [2], int64_data=[1, 2]), "in int64_data, not in float_data"),
    "fp16 int32_data short": (_tensor("w", TensorProto.FLOAT16, [3], int32_data=[0, 0]), "int32_data", "need 3"),
    "int4 unpacked in int32_data": (_tensor("w", TensorProto.INT4, [4], int32_data=[1, 2, 3, 4]), "holds 4 values", "need 2"),
    "int4 raw_data short": (_tensor("w", TensorProto.INT4, [5], raw_data=b"\0\0"), "holds 2 bytes", "need 3"),
    "complex64 one float a value": (_tensor("w", TensorProto.COMPLEX64, [2], float_data=[1, 2]), "need 4"),
    "strings short": (_tensor("w", TensorProto.STRING, [3], string_data=[b"a", b"b"]), "holds 2 strings", "need 3"),
    "strings in raw_data": (_tensor("w", TensorProto.STRING, [1], raw_data=b"a"), "string tensor with raw_data"),
    "undefined type": (_tensor("w", TensorProto.UNDEFINED, [1], raw_data=b"\0"), "data type 0"),
}


@pytest.mark.parametrize("kind", MALFORMED)
def test_a_malformed_initializer_is_refused_naming_it(kind):
    tensor, *phrases = MALFORMED[kind]
    _refused(_model(tensor), "tensor 'w'", *phrases)


def test_a_malformed_constant_in_a_body_is_refused():
    bad = _tensor("", TensorProto.FLOAT, [8], raw_data=b"\0" * 4)
    body = helper.make_graph([helper.make_node("Constant", [], ["c"], value=bad)], "then", [], [])
    node = helper.make_node("If", ["cond"], ["y"], then_branch=body, else_branch=body)
    _refused(_model(nodes=[node]), "tensor 'c'", "holds 4 bytes", "need 32")


def test_a_malformed_initializer_of_a_body_is_refused():
    body = helper.make_graph([], "then", [], [], initializer=[_tensor("inner", TensorProto.INT64, [3], int64_data=[1])])
    node = helper.make_node("If", ["cond"], ["y"], then_branch=body, else_branch=body)
    _refused(_model(nodes=[node]), "tensor 'inner'", "need 3")


def test_a_large_raw_data_left_in_the_file_is_measured_too(tmp_path):
    """Initializers of 64 KiB and more are read without their raw_data (io/proto_read.py): the
    length noted in the file is checked against their dims all the same."""
    held = LARGE_TENSOR_BYTES * 2
    path = tmp_path / "m.onnx"
    onnx.save(_model(_tensor("big", TensorProto.FLOAT, [held], raw_data=b"\0" * held)), path)
    with pytest.raises(InvalidInput, match=f"tensor 'big' holds {held:,} bytes, but its dims \\[{held}\\] of FLOAT need {4 * held:,}"):
        load_path(path)


def test_an_onnx_ir_model_is_checked_as_well():
    model = ir.serde.deserialize_model(_model(_tensor("w", TensorProto.FLOAT, [16], raw_data=b"\0" * 8)))
    _refused(model, "tensor 'w' holds 8 bytes")
    external = ir.ExternalTensor("w.data", 0, 12, ir.DataType.FLOAT, shape=ir.Shape([16]), name="w")
    value = ir.Value(name="w", shape=ir.Shape([16]), type=ir.TensorType(ir.DataType.FLOAT), const_value=external)
    graph = ir.Graph([], [], nodes=[], initializers=[value], opset_imports={"": 17})
    _refused(ir.Model(graph, ir_version=8), "tensor 'w'", "length is 12 bytes", "need 64")


# --- external data --------------------------------------------------------------------------------


def _external(tmp_path, **entries) -> onnx.ModelProto:
    """A model whose `w` (16 floats) is in w.data at offset 64, the file 128 bytes long."""
    data = np.arange(16, dtype=np.float32)
    (tmp_path / "w.data").write_bytes(b"\xff" * 64 + data.tobytes())
    t = _tensor("w", TensorProto.FLOAT, [16])
    t.data_location = TensorProto.EXTERNAL
    for key, value in {"location": "w.data", "offset": "64", "length": "64", **entries}.items():
        if value is not None:
            t.external_data.add(key=key, value=value)
    return _model(t)


@pytest.mark.parametrize(
    "entries, phrase",
    [
        ({"location": "w\0.data"}, "location 'w\\x00.data' holds a NUL byte"),
        ({"location": None}, "names no file"),
        ({"offset": "-64"}, "offset '-64' is not a number of bytes"),
        ({"offset": "hostile"}, "offset 'hostile' is not a number of bytes"),
        ({"length": "0x40"}, "length '0x40' is not a number of bytes"),
        ({"length": "32"}, "length is 32 bytes, but its dims [16] of FLOAT need 64"),
        ({"length": str(1 << 30)}, "is truncated"),
        ({"location": "a" * 5000}, "cannot be used"),
    ],
)
def test_malformed_external_data_entries_are_refused(tmp_path, entries, phrase):
    path = tmp_path / "m.onnx"
    onnx.save(_external(tmp_path, **entries), path)
    with pytest.raises(InvalidInput) as e:
        load_path(path)
    assert "'w'" in str(e.value) and phrase in str(e.value)


@pytest.mark.parametrize("kind, phrase", [("fifo", "is not a regular file"), ("directory", "is a directory")])
def test_a_data_file_that_is_not_a_file_is_said_so(tmp_path, kind, phrase):
    path = tmp_path / "m.onnx"
    onnx.save(_external(tmp_path, location="odd.data"), path)
    os.mkfifo(tmp_path / "odd.data") if kind == "fifo" else (tmp_path / "odd.data").mkdir()
    with pytest.raises(InvalidInput, match=f"external data file 'odd.data' of tensor 'w' {phrase}"):
        load_path(path)


def test_a_model_path_that_is_a_fifo_is_never_opened(tmp_path):
    path = tmp_path / "m.onnx"
    os.mkfifo(path)  # opening it to read would wait for a writer
    with pytest.raises(InvalidInput, match="not a regular file"):
        load_path(path)


# --- valid ----------------------------------------------------------------------------------------


def test_odd_but_valid_tensors_load():
    four_bit = helper.make_tensor("int4", TensorProto.INT4, [5], [1, -2, 3, -4, 5])  # packed: 3 int32_data
    assert len(four_bit.int32_data) == 3
    tensors = [
        _tensor("empty", TensorProto.FLOAT, [0]),
        _tensor("empty_raw", TensorProto.FLOAT, [2, 0], raw_data=b""),
        numpy_helper.from_array(np.array(2.5, dtype=np.float32), "scalar"),
        helper.make_tensor("strings", TensorProto.STRING, [2], [b"a", b"bc"]),
        four_bit,
        numpy_helper.from_array(np.array([1, -2, 3], dtype=np.int8), "int8"),
        helper.make_tensor("int4_raw", TensorProto.INT4, [5], b"\x01\x02\x03", raw=True),
        helper.make_tensor("fp16", TensorProto.FLOAT16, [3], np.array([1, 2, 3], dtype=np.float16)),
        helper.make_tensor("complex", TensorProto.COMPLEX64, [2], [1 + 2j, 3 - 4j]),
        helper.make_tensor("uint32", TensorProto.UINT32, [2], [1, 2]),
    ]
    assert len(tensors[7].int32_data) == 3  # fp16 held in int32_data
    model, _ = load_model(_model(*tensors))
    inits = model.graph.initializers
    assert inits["scalar"].const_value.numpy() == np.float32(2.5)
    np.testing.assert_array_equal(inits["fp16"].const_value.numpy(), [1, 2, 3])
    np.testing.assert_array_equal(inits["int4"].const_value.numpy(), [1, -2, 3, -4, 5])
    assert list(inits["strings"].const_value.numpy()) == [b"a", b"bc"]
    assert inits["empty"].const_value.numpy().shape == (0,)


def test_external_data_at_an_offset_loads(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(_external(tmp_path, length=None), path)
    model = load_path(path)
    np.testing.assert_array_equal(model.graph.initializers["w"].const_value.numpy(), np.arange(16, dtype=np.float32))


def test_a_large_initializer_still_stays_in_the_file(tmp_path):
    path = tmp_path / "m.onnx"
    weights = np.arange(LARGE_TENSOR_BYTES // 2, dtype=np.float32)
    onnx.save(_model(numpy_helper.from_array(weights, "big")), path)
    big = load_path(path).graph.initializers["big"].const_value
    assert isinstance(big, FileRegionTensor)
    np.testing.assert_array_equal(big.numpy(), weights)


def test_every_external_tensor_is_read_from_beside_the_model(tmp_path, monkeypatch):
    """An initializer, a Constant node's value and an If body's initializer, all in a data file
    beside the model, read from another working folder: each tensor is located beside the model."""
    values = {name: np.arange(16, dtype=np.float32) + k for k, name in enumerate(("w", "c", "b"))}
    body = helper.make_graph(
        [helper.make_node("Add", ["x", "b"], ["y"])], "body", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [16])],
        initializer=[numpy_helper.from_array(values["b"], "b")],
    )
    nodes = [
        helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(values["c"], "c")),
        helper.make_node("Add", ["w", "c"], ["x"]),
        helper.make_node("If", ["cond"], ["out"], then_branch=body, else_branch=body),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [16])], initializer=[numpy_helper.from_array(values["w"], "w")],
    )
    folder = tmp_path / "model"
    folder.mkdir()
    onnx.save(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), folder / "m.onnx",
        save_as_external_data=True, all_tensors_to_one_file=True, location="m.data", size_threshold=0, convert_attribute=True,
    )
    monkeypatch.chdir(tmp_path)
    model = load_path(folder / "m.onnx")
    then = model.graph.node(2).attributes["then_branch"].as_graph()
    found = {
        "w": model.graph.initializers["w"].const_value,
        "c": model.graph.node(0).attributes["value"].as_tensor(),
        "b": then.initializers["b"].const_value,
    }
    for name, tensor in found.items():
        assert isinstance(tensor, ir.ExternalTensor) and os.path.samefile(tensor.base_dir, folder), name
        np.testing.assert_array_equal(tensor.numpy(), values[name])
