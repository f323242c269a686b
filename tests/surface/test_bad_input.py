"""Bad input, odd input and safe writes: one line on stderr and exit 2, nothing written, the input
never touched. (The basic cases, missing/empty/junk files and unknown flags, are in test_cli.py.)"""

import json
import os
import shutil

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from conftest import MODELS
from helpers import make_large_model, relocate_external_data
from helpers import run_cli as _cli

SMALL = dict(hidden=32, layers=2, vocab=64, positions=32)


def _snapshot(folder):
    """Every file under `folder` with its bytes: to show nothing was written or changed."""
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file() and not p.is_symlink()}


def _assert_refused(code, out, err, message):
    assert code == 2, (out, err)
    assert err.count("\n") == 1 and err.startswith("onnx_lnfold: error:"), err
    assert message in err, err
    assert "Traceback" not in err


@pytest.fixture
def ext_model(tmp_path):
    """A small GPT-2-style model with its weights in `m.onnx.data`, in its own folder."""
    folder = tmp_path / "in"
    folder.mkdir()
    return make_large_model.make_model(folder / "m.onnx", **SMALL)


def _relocate(model_path, location, tensor="wte"):
    """Point one external tensor of the model at `location`."""
    relocate_external_data(model_path, location, tensor)


# --- files that are not ONNX models ---------------------------------------------------------------

PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x06\x00\x00\x00\x1f\x15\xc4\x89"


@pytest.mark.parametrize(
    "name,data,message",
    [
        ("image.png", PNG + bytes(range(256)) * 4, "not"),
        ("notes.onnx", b"this is a text file, not a model\n" * 20, "not"),
        ("tensor.onnx", helper.make_tensor("t", TensorProto.FLOAT, [2], [1.0, 2.0]).SerializeToString(), "not"),
        ("corrupt.onnx", None, "not"),
    ],
    ids=["png", "text", "tensor-proto", "corrupt"],
)
def test_non_onnx_files_are_refused(tmp_path, name, data, message):
    if data is None:  # a real model with its protobuf framing broken in the middle
        raw = bytearray((MODELS / "gpt2.onnx").read_bytes())
        raw[len(raw) // 2 : len(raw) // 2 + 64] = b"\xff" * 64
        data = bytes(raw[: len(raw) // 2 + 64])
    path = tmp_path / name
    path.write_bytes(data)
    before = _snapshot(tmp_path)
    _assert_refused(*_cli(path), message)
    assert _snapshot(tmp_path) == before


# --- external data --------------------------------------------------------------------------------


def test_missing_external_data_file(ext_model):
    ext_model.with_name("m.onnx.data").unlink()
    before = _snapshot(ext_model.parent)
    _assert_refused(*_cli(ext_model), "is missing")
    assert _snapshot(ext_model.parent) == before


@pytest.mark.parametrize("location", ["../outside.data", "sub/../../outside.data", "/etc/passwd", "ABSOLUTE"])
def test_external_data_outside_the_folder_is_refused(ext_model, location):
    outside = ext_model.parent.parent / "outside.data"
    shutil.copy(ext_model.with_name("m.onnx.data"), outside)
    if location == "ABSOLUTE":
        location = str(outside)
    _relocate(ext_model, location)
    before = _snapshot(ext_model.parent.parent)
    _assert_refused(*_cli(ext_model), "lies outside the model's folder")
    assert _snapshot(ext_model.parent.parent) == before


def test_external_data_symlink_leading_outside_is_refused(ext_model):
    outside = ext_model.parent.parent / "outside.data"
    shutil.move(ext_model.with_name("m.onnx.data"), outside)
    ext_model.with_name("m.onnx.data").symlink_to(outside)
    _assert_refused(*_cli(ext_model), "lies outside the model's folder")


def test_external_data_symlink_inside_the_folder_is_read(ext_model, tmp_path):
    sub = ext_model.parent / "weights"
    sub.mkdir()
    shutil.move(ext_model.with_name("m.onnx.data"), sub / "real.data")
    ext_model.with_name("m.onnx.data").symlink_to(sub / "real.data")
    code, out, err = _cli(ext_model, "-o", tmp_path / "o.onnx", "-q")
    assert code == 0, err


def test_truncated_external_data_is_refused(ext_model):
    data = ext_model.with_name("m.onnx.data")
    data.write_bytes(data.read_bytes()[:1000])
    _assert_refused(*_cli(ext_model), "is truncated")


def test_hard_linked_external_data_is_refused(ext_model, tmp_path):
    os.link(ext_model.with_name("m.onnx.data"), tmp_path / "elsewhere.data")
    _assert_refused(*_cli(ext_model), "hard links")


# --- destinations ---------------------------------------------------------------------------------


def test_output_equal_to_input_in_other_spellings(ext_model):
    folder = ext_model.parent
    (folder / "sub").mkdir()
    (folder / "alias.onnx").symlink_to(ext_model)
    before = _snapshot(folder)
    for output in (folder / "sub" / ".." / "m.onnx", folder / "alias.onnx"):
        _assert_refused(*_cli(ext_model, "-o", output), "would overwrite the input")
    _assert_refused(*_cli("m.onnx", "-o", "./m.onnx", cwd=folder), "would overwrite the input")
    assert _snapshot(folder) == before


def test_output_over_the_inputs_external_data_is_refused(ext_model):
    folder = ext_model.parent
    before = _snapshot(folder)
    # the output model itself, or its data file OUT.onnx.data, would replace m.onnx.data
    _assert_refused(*_cli(ext_model, "-o", folder / "m.onnx.data"), "overwrite the input's external data")
    shutil.move(folder / "m.onnx.data", folder / "w.onnx.data")
    relocate_external_data(ext_model, "w.onnx.data")
    before = _snapshot(folder)
    _assert_refused(*_cli(ext_model, "-o", folder / "w.onnx"), "would overwrite the input's external data")
    assert _snapshot(folder) == before


def test_output_under_a_file_is_refused(tmp_path):
    (tmp_path / "file").write_text("x")
    before = _snapshot(tmp_path)
    _assert_refused(*_cli(MODELS / "gpt2.onnx", "-o", tmp_path / "file" / "out.onnx"), "is not a folder")
    assert _snapshot(tmp_path) == before


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root writes to 0o500 folders")
def test_read_only_output_folder_is_refused(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        _assert_refused(*_cli(MODELS / "gpt2.onnx", "-o", folder / "out.onnx"), "not writable")
        assert list(folder.iterdir()) == []
    finally:
        folder.chmod(0o700)


@pytest.mark.skipif(not os.path.isdir("/sys/kernel"), reason="needs a Linux /sys")
def test_unwritable_output_folder_even_for_root():
    # os.access() says yes to root for any folder; /sys refuses new files to everyone.
    code, out, err = _cli(MODELS / "gpt2.onnx", "-o", "/sys/kernel/lnfold-test.onnx")
    assert code == 2 and "Traceback" not in err and err.count("\n") == 1
    assert "writ" in err  # "cannot write to the output folder" or "is not writable"


def test_failed_write_leaves_nothing(tmp_path, monkeypatch):
    """A write that dies half-way (disk full, say) leaves no partial file and no temp folder."""
    import onnx_ir as ir

    from onnx_lnfold._cli import main

    src = make_large_model.make_model(tmp_path / "m.onnx", **SMALL)
    real_save = ir.save

    def failing_save(model, path, **kwargs):
        real_save(model, path, **kwargs)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ir, "save", failing_save)
    before = _snapshot(tmp_path)
    assert main([str(src), "-o", str(tmp_path / "out.onnx"), "-q"]) == 2
    assert _snapshot(tmp_path) == before and sorted(os.listdir(tmp_path)) == ["m.onnx", "m.onnx.data"]


def test_json_path_refusals(tmp_path):
    src = tmp_path / "gpt2.onnx"
    shutil.copy(MODELS / "gpt2.onnx", src)
    before = _snapshot(tmp_path)
    _assert_refused(*_cli(src, "-o", tmp_path / "o.onnx", "--json", src), "--json would overwrite")
    _assert_refused(*_cli(src, "-o", tmp_path / "o.onnx", "--json", tmp_path / "no" / "r.json"), "does not exist")
    assert _snapshot(tmp_path) == before


# --- usage ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args,message",
    [
        (["--rtol"], "expected one argument"),
        (["--rtol", "abc"], "invalid float value"),
        (["--rtol", "-1"], "--rtol must be a positive number"),
        (["--target", "tensorrt"], "invalid choice"),
        (["-x"], "unrecognized arguments"),
        (["--input-shape", "input_ids:2,x"], "bad --input-shape"),
        (["--input-shape", "input_ids:-1,8"], "bad --input-shape"),
        (["--input-shape", ":2,8"], "bad --input-shape"),
        (["--in-place", "-o", "elsewhere.onnx"], "--in-place and --output name different files"),
    ],
)
def test_bad_usage(tmp_path, args, message):
    src = tmp_path / "gpt2.onnx"
    shutil.copy(MODELS / "gpt2.onnx", src)
    before = _snapshot(tmp_path)
    _assert_refused(*_cli(src, *args), message)
    assert _snapshot(tmp_path) == before


def test_no_arguments_at_all():
    code, out, err = _cli()
    assert code == 2 and "required: model" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda d: d / "missing.npz", "cannot read inputs"),
        (lambda d: _save_npy(d / "x.npy"), "not an .npz archive"),
        (lambda d: _write(d / "junk.npz", b"PK\x03\x04 not really a zip"), "cannot read inputs"),
        (lambda d: _save_npz(d / "names.npz", ids=np.zeros((2, 8), np.int64)), "missing input_ids; not graph inputs: ids"),
        (lambda d: _save_npz(d / "dtype.npz", input_ids=np.zeros((2, 8), np.float32)), "is float32, the graph input is int64"),
        (lambda d: _save_npz(d / "rank.npz", input_ids=np.zeros((16,), np.int64)), "has rank 1, the graph input has rank 2"),
    ],
)
def test_bad_inputs_file(tmp_path, make, message):
    src = tmp_path / "gpt2.onnx"
    shutil.copy(MODELS / "gpt2.onnx", src)
    inputs = make(tmp_path)
    before = _snapshot(tmp_path)
    _assert_refused(*_cli(src, "--inputs", inputs), message)
    assert _snapshot(tmp_path) == before


def _write(path, data):
    path.write_bytes(data)
    return path


def _save_npy(path):
    np.save(path, np.zeros((2, 8), np.int64))
    return path


def _save_npz(path, **arrays):
    np.savez(path, **arrays)
    return path


# --- odd but valid models -------------------------------------------------------------------------


def test_no_layer_norm_with_external_data(tmp_path):
    """Nothing to fold: exit 0, the model is written unchanged, its weights still external."""
    w = onnx.numpy_helper.from_array(np.arange(4096, dtype=np.float32).reshape(64, 64), "w")
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64])],
        [w],
    )
    src = tmp_path / "mm.onnx"
    onnx.save(helper.make_model(g), src, save_as_external_data=True, location="mm.onnx.data", size_threshold=0)
    code, out, err = _cli(src, "-o", tmp_path / "o.onnx")
    assert code == 0, err
    assert "nothing to fold" in out
    assert (tmp_path / "o.onnx.data").read_bytes() == (tmp_path / "mm.onnx.data").read_bytes()
    # The weights are the input's bytes, the model file is written again (it names o.onnx.data):
    # an equivalent copy, said so.
    assert f"Wrote {tmp_path / 'o.onnx'} (an equivalent copy of the input, re-serialized: nothing was folded)" in out
    assert "(equivalent copy)" in out.splitlines()[0]


def test_initializer_listed_as_graph_input_is_kept_with_a_reason(tmp_path):
    """Old exporters list weights as graph inputs: they can be fed at run time, so a weight edit
    there is refused; without explicit centering the LNs that need it are kept, with that reason.
    By default the stream behind it is centered explicitly instead, and the weight is untouched.
    Verification feeds only the real inputs."""
    model = make_large_model.build(**SMALL)
    proto = onnx.load_from_string(_proto_bytes(model))
    weight = next(i for i in proto.graph.initializer if i.name == "blocks.0.fc2.weight")
    proto.graph.input.append(helper.make_tensor_value_info(weight.name, weight.data_type, list(weight.dims)))
    src = tmp_path / "m.onnx"
    onnx.save(proto, src)
    code, out, err = _cli(src, "-o", tmp_path / "o.onnx", "--no-aux-centering", "--fold-costly")  # ln_f: beta as Add
    assert code == 0, err
    assert "blocks.1.ln" in out and "2 kept" in out and "graph input" in out
    assert "Verification (passed" in out and "inputs input_ids(2, 8)" in out
    code, out, err = _cli(src, "-o", tmp_path / "o.onnx", "--json", tmp_path / "r.json", "--fold-costly")
    report = json.loads((tmp_path / "r.json").read_text())
    assert code == 0 and "3/3 LayerNorms folded" in out, err
    assert [c["tensor"] for c in report["centerings"]] == ["h1"]
    assert "blocks.0.fc2.weight" not in {e["tensor"] for e in report["edits"]}
    assert report["verification"]["status"] == "passed"


def _proto_bytes(model):
    import onnx_ir as ir

    return ir.to_proto(model).SerializeToString()


def test_opset_13_decomposed_layer_norm_folds(tmp_path):
    src = make_large_model.make_model(tmp_path / "m13.onnx", opset=13, **SMALL)
    assert not any(n.op_type == "LayerNormalization" for n in onnx.load(src, load_external_data=False).graph.node)
    # (its ln_f is no LayerNormalization ORT would fuse: its beta, an Add before the LM head, costs
    # more than it saves; folded as asked)
    code, out, err = _cli(src, "-o", tmp_path / "o.onnx", "--fold-costly")
    assert code == 0, err
    assert "LayerNorm nodes: 3 folded, 0 kept (of 3)" in out and "ReduceMean 6 -> 0" in out
    assert "Verification (passed" in out


def test_float16_weights_fold_and_verify(tmp_path):
    src = make_large_model.make_model(tmp_path / "m16.onnx", dtype="float16", **SMALL)
    code, out, err = _cli(src, "-o", tmp_path / "o.onnx", "--fold-costly")  # ln_f's beta stays an Add
    assert code == 0, err
    assert "3 folded" in out and "Verification (passed" in out and "rtol 0.01" in out


def test_bfloat16_weights_fold_and_say_why_verification_is_skipped(tmp_path):
    """ONNX Runtime's CPU provider has no bfloat16 Add: the check is reported as skipped, cleanly."""
    src = make_large_model.make_model(tmp_path / "mbf16.onnx", dtype="bfloat16", **SMALL)
    code, out, err = _cli(src, "-o", tmp_path / "o.onnx", "--fold-costly")  # ln_f's beta stays an Add
    assert code == 0, err
    assert "Traceback" not in err and "Traceback" not in out
    assert "3 folded" in out
    verification = next(line for line in out.splitlines() if line.startswith("Verification"))
    assert verification.startswith(("Verification: skipped (the original model does not run", "Verification (passed"))
    assert (tmp_path / "o.onnx").is_file()
