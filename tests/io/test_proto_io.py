"""One-file models read without their weights (`io.proto_read`) and written a tensor at a time
(`io.proto_write`): the same model as `onnx.load` / `ir.to_proto` give, at a fraction of the memory."""

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import helper, numpy_helper

import onnx_lnfold
from onnx_lnfold.core.errors import LnFoldError
from onnx_lnfold.io.proto_read import IN_FILE_MIN_BYTES, read_model
from onnx_lnfold.io.proto_write import STREAM_MIN_BYTES, write_model
from onnx_lnfold.io.tensor_io import FileRegionTensor
from onnx_lnfold.load.model import load_path
from onnx_lnfold.verify.sessions import run_model

from graphs import Graph
from helpers import run_cli

D = 256  # a 256 x 256 float32 weight is 256 KB: large enough to stay in the file


def _model() -> onnx.ModelProto:
    g = Graph()
    x = g.input("x", ["b", "s", D])
    h = g.linear(x, D, D, "proj")  # proj.weight stays in the file, proj.bias (1 KB) does not
    h = g.node("Add", [h, g.linear(g.ln(h, D, "ln_a"), D, D, "mlp")])
    g.output(g.ln(h, D, "ln_b"))
    return g.model()


@pytest.fixture
def path(tmp_path):
    p = tmp_path / "m.onnx"
    onnx.save(_model(), p)
    return p


def _usual(path) -> onnx.ModelProto:
    """What the model at `path` serializes to when parsed whole."""
    return ir.to_proto(ir.serde.deserialize_model(onnx.load(path)))


def _clear_data_location(proto: onnx.ModelProto) -> onnx.ModelProto:
    """Some exporters set data_location=DEFAULT explicitly; it means the same as unset."""
    for t in proto.graph.initializer:
        if t.data_location == onnx.TensorProto.DEFAULT:
            t.ClearField("data_location")
    return proto


def test_large_initializers_stay_in_the_file_and_read_back_the_same(path):
    model = read_model(path)
    assert model is not None
    in_file = {n for n, v in model.graph.initializers.items() if isinstance(v.const_value, FileRegionTensor)}
    assert in_file == {"proj.weight", "mlp.weight"}
    expected = {t.name: numpy_helper.to_array(t) for t in onnx.load(path).graph.initializer}
    raw = path.read_bytes()
    for name in in_file:
        tensor = model.graph.initializers[name].const_value
        assert raw[tensor.offset : tensor.offset + tensor.length] == expected[name].tobytes()
    for name, value in model.graph.initializers.items():
        np.testing.assert_array_equal(value.const_value.numpy(), expected[name])
    assert ir.to_proto(model) == _usual(path)


def test_the_whole_graph_survives(tmp_path):
    """Constant nodes, subgraphs, value_info, metadata and functions are parsed as usual."""
    model = _model()
    model.metadata_props.add(key="k", value="v")
    model.graph.value_info.append(helper.make_tensor_value_info("proj/matmul_out", onnx.TensorProto.FLOAT, ["b", "s", D]))
    big = numpy_helper.from_array(np.full((300, 100), 0.5, np.float32), "big_const")
    model.graph.node.insert(0, helper.make_node("Constant", [], ["c"], value=big))
    model.graph.output.append(helper.make_tensor_value_info("c", onnx.TensorProto.FLOAT, [300, 100]))
    p = tmp_path / "m.onnx"
    onnx.save(model, p)
    assert ir.to_proto(read_model(p)) == _usual(p)


def _fall_back(tmp_path, proto_bytes: bytes):
    p = tmp_path / "odd.onnx"
    p.write_bytes(proto_bytes)
    assert read_model(p) is None
    return p


def test_a_graph_split_over_two_fields_falls_back_to_protobuf(tmp_path):
    """Protobuf merges repeated occurrences of a message field; only protobuf does that right."""
    first = _model()
    extra = onnx.ModelProto()
    extra.graph.initializer.append(numpy_helper.from_array(np.ones((200, 100), np.float32), "late"))
    p = _fall_back(tmp_path, first.SerializeToString() + extra.SerializeToString())
    loaded = load_path(p)
    assert set(loaded.graph.initializers) == {t.name for t in first.graph.initializer} | {"late"}


def test_tensors_without_raw_data_or_with_external_data_are_left_to_protobuf(tmp_path):
    model = _model()
    typed = helper.make_tensor("typed", onnx.TensorProto.FLOAT, [20000], np.ones(20000, np.float32).tolist())  # float_data
    model.graph.initializer.append(typed)
    strings = helper.make_tensor("strings", onnx.TensorProto.STRING, [2], [b"a" * 40000, b"b"])
    model.graph.initializer.append(strings)
    p = tmp_path / "m.onnx"
    onnx.save(model, p)
    loaded = read_model(p)
    assert not isinstance(loaded.graph.initializers["typed"].const_value, FileRegionTensor)
    assert not isinstance(loaded.graph.initializers["strings"].const_value, FileRegionTensor)
    assert ir.to_proto(loaded) == _usual(p)

    ext = tmp_path / "ext"
    ext.mkdir()
    onnx.save(_model(), ext / "e.onnx", save_as_external_data=True, all_tensors_to_one_file=True, location="e.data", size_threshold=1024)
    loaded = read_model(ext / "e.onnx")
    kinds = {n: type(v.const_value) for n, v in loaded.graph.initializers.items()}
    assert kinds["proj.weight"] is ir.ExternalTensor and FileRegionTensor not in kinds.values()


@pytest.mark.parametrize("cut", [1, 100, -5])
def test_broken_files_are_left_to_the_usual_errors(path, cut):
    data = path.read_bytes()
    broken = data[:cut] if cut > 0 else data[:cut]
    path.write_bytes(broken)
    assert read_model(path) is None
    with pytest.raises(LnFoldError, match="not a readable ONNX model|not an ONNX model"):
        load_path(path)


def test_repeated_initializer_names_are_left_to_protobuf(tmp_path):
    """Which of two same-named initializers wins is the usual path's business (found by review:
    the walker bound the first one's bytes, the IR keeps the last)."""
    model = _model()
    first = numpy_helper.from_array(np.full((256, 256), 1.0, np.float32), "dup")
    last = helper.make_tensor("dup", onnx.TensorProto.FLOAT, [256, 256], np.full(256 * 256, 2.0, np.float32).tolist())
    model.graph.initializer.extend([first, last])
    p = _fall_back(tmp_path, model.SerializeToString())
    assert load_path(p).graph.initializers["dup"].const_value.numpy()[0, 0] == 2.0


def test_no_memory_map_means_parsing_the_file_whole(path, monkeypatch):
    import mmap

    def refuse(*args, **kwargs):
        raise OSError(19, "No such device")

    monkeypatch.setattr(mmap, "mmap", refuse)
    assert read_model(path) is None
    assert not any(isinstance(v.const_value, FileRegionTensor) for v in load_path(path).graph.initializers.values())


def test_a_file_replaced_while_it_is_read_is_never_read_as_the_weights(path, monkeypatch):
    """The stamp is the file's as it was walked (found by review: taken after parsing, a file
    replaced in between passed the check and gave other bytes)."""
    deserialize = ir.serde.deserialize_model

    def replace_file_meanwhile(proto):
        longer = _model()
        longer.producer_name = "an exporter with a longer name shifts every offset"
        onnx.save(longer, path)
        return deserialize(proto)

    monkeypatch.setattr(ir.serde, "deserialize_model", replace_file_meanwhile)
    model = read_model(path)
    with pytest.raises(LnFoldError, match="the file changed after the model was read"):
        model.graph.initializers["proj.weight"].const_value.numpy()


def test_packed_4_bit_initializers_go_in_with_the_graph(tmp_path):
    """Only whole-byte tensors are streamed, so the model can read back what it rebinds to
    (found by review: a rebound INT4 tensor could not be read)."""
    model = _model()
    packed = ir.Tensor(np.tile(np.array([-8, 7, 0, 3], dtype=np.int8), 512 * 128), dtype=ir.DataType.INT4, name="q")
    model.graph.initializer.append(ir.serde.serialize_tensor(packed))
    p = tmp_path / "q.onnx"
    onnx.save(model, p)
    result = onnx_lnfold.fold(p, verify=False)
    result.save(p)
    q = result.model.graph.initializers["q"].const_value
    assert not isinstance(q, FileRegionTensor)
    assert q.tobytes() == packed.tobytes()
    assert _clear_data_location(onnx.load(p)) == _clear_data_location(result.model_proto)


def test_a_file_changed_after_reading_is_never_read_as_the_weights(path):
    model = load_path(path)
    weight = model.graph.initializers["proj.weight"].const_value
    assert isinstance(weight, FileRegionTensor)
    onnx.save(_model(), path)  # same content, new file: the offsets may no longer hold
    with pytest.raises(LnFoldError, match="the file changed after the model was read"):
        weight.numpy()


def test_written_file_parses_to_the_model_and_runs_the_same(path, tmp_path):
    result = onnx_lnfold.fold(path)
    assert len(result.plan.folded) == 2
    expected = _clear_data_location(ir.to_proto(result.model))
    out = tmp_path / "out.onnx"
    seen = []
    offsets = write_model(result.model, out, callback=lambda t, info: seen.append(t.nbytes))
    assert set(offsets) == {n for n, v in result.model.graph.initializers.items() if v.const_value.nbytes >= STREAM_MIN_BYTES}
    assert len(seen) == len(offsets) >= 2
    assert _clear_data_location(onnx.load(out)) == expected
    x = np.random.default_rng(0).standard_normal((2, 5, D)).astype(np.float32)
    got, ref = run_model(str(out), {"x": x}), run_model(str(path), {"x": x})
    for name in ref:
        np.testing.assert_allclose(got[name], ref[name], rtol=1e-4, atol=1e-5)


def test_every_kind_of_tensor_streams_its_bytes(path, tmp_path):
    """Parsed protobuf tensors, numpy arrays, lazy tensors, centered weights, file regions."""
    from onnx_lnfold.apply.centering import CenteredTensor

    model = ir.serde.deserialize_model(onnx.load(path))  # TensorProtoTensor
    inits = model.graph.initializers
    mlp = inits["mlp.weight"].const_value.numpy()
    inits["mlp.weight"].const_value = ir.Tensor(mlp.copy(), name="mlp.weight")
    extra = {
        "lazy": ir.LazyTensor(lambda: ir.Tensor(mlp * 2), dtype=ir.DataType.FLOAT, shape=ir.Shape(mlp.shape), name="lazy"),
        "centered": CenteredTensor(ir.Tensor(mlp), 1, "centered"),
        "region": read_model(path).graph.initializers["proj.weight"].const_value,
    }
    for name, tensor in extra.items():
        value = ir.Value(name=name, shape=ir.Shape(mlp.shape), type=ir.TensorType(ir.DataType.FLOAT))
        value.const_value = tensor
        model.graph.register_initializer(value)
    offsets = write_model(model, tmp_path / "kinds.onnx")
    assert set(offsets) == {"proj.weight", "mlp.weight", "lazy", "centered", "region"}
    written = {t.name: numpy_helper.to_array(t) for t in onnx.load(tmp_path / "kinds.onnx").graph.initializer}
    for name, value in model.graph.initializers.items():
        np.testing.assert_array_equal(written[name], value.const_value.numpy(), err_msg=name)
    np.testing.assert_allclose(written["centered"].mean(axis=1), 0, atol=1e-6)


def test_a_tensor_that_writes_the_wrong_length_is_refused(tmp_path):
    class Short(ir.Tensor):
        def tofile(self, file):
            file.write(b"\0" * (self.nbytes - 4))

    model = ir.serde.deserialize_model(_model())
    value = model.graph.initializers["proj.weight"]
    value.const_value = Short(value.const_value.numpy(), name="proj.weight")
    with pytest.raises(LnFoldError, match="wrote 262140 bytes, not 262144"):
        write_model(model, tmp_path / "o.onnx")


def test_in_place_api_save_rebinds_to_the_new_file(path):
    result = onnx_lnfold.fold(path)
    before = {n: v.const_value.numpy().copy() for n, v in result.model.graph.initializers.items()}
    result.save(path)
    for name, value in result.model.graph.initializers.items():
        if isinstance(value.const_value, FileRegionTensor):
            assert value.const_value.path == str(path)
        np.testing.assert_array_equal(value.const_value.numpy(), before[name])
    assert _clear_data_location(onnx.load(path)) == _clear_data_location(ir.to_proto(result.model))


def test_cli_in_place_on_a_one_file_model(path):
    x = np.random.default_rng(1).standard_normal((1, 3, D)).astype(np.float32)
    ref = run_model(str(path), {"x": x})
    code, _, err = run_cli(path, "--in-place", "-q")
    assert code == 0, err
    assert sorted(p.name for p in path.parent.iterdir()) == ["m.onnx"]
    assert {n.op_type for n in onnx.load(path).graph.node} >= {"SimplifiedLayerNormalization"}
    got = run_model(str(path), {"x": x})
    for name in ref:
        np.testing.assert_allclose(got[name], ref[name], rtol=1e-4, atol=1e-5)


def test_thresholds_agree():
    """What the reader leaves in the file, the writer streams back out."""
    assert IN_FILE_MIN_BYTES == STREAM_MIN_BYTES
