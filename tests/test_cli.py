"""The command line: outputs, reports, refusals and exit codes."""

import json
import shutil
import subprocess
import sys

import numpy as np
import onnx
import pytest

from conftest import MODELS
from helpers import run_cli as _cli
from onnx_lnfold._cli import main


@pytest.fixture
def gpt2(tmp_path):
    path = tmp_path / "gpt2.onnx"
    shutil.copy(MODELS / "gpt2.onnx", path)
    return path


def test_default_output_beside_the_input_and_report(gpt2):
    code, out, err = _cli(gpt2)
    assert code == 0, err
    target = gpt2.with_name("gpt2.lnfold.onnx")
    assert target.is_file()
    assert "LayerNorm nodes: 5 folded, 0 kept (of 5)" in out
    assert "LayerNormalization 5 -> 0" in out and "SimplifiedLayerNormalization 0 -> 4" in out
    assert "com.microsoft::SkipSimplifiedLayerNormalization 0 -> 1" in out
    assert "Verification (passed" in out and f"Wrote {target}" in out
    assert sorted(p.name for p in gpt2.parent.iterdir()) == ["gpt2.lnfold.onnx", "gpt2.onnx"]  # no temp files left


def test_json_report(gpt2, tmp_path):
    out_json = tmp_path / "r.json"
    assert main([str(gpt2), "-o", str(tmp_path / "o.onnx"), "--json", str(out_json), "-q"]) == 0
    report = json.loads(out_json.read_text())
    assert report["folded"] == 5 and report["kept"] == 0
    assert {d["status"] for d in report["decisions"]} == {"folded"}
    assert all(d["op_type"] == "LayerNormalization" and d["reason"] for d in report["decisions"])
    assert report["untied_bytes"] == 131072 and not report["centerings"]
    (untied,) = [e for e in report["edits"] if e["untie"]]
    assert untied["tensor"] == "model.lm_head.weight" and "ONNX Runtime folds into a copy of its own" in untied["note"]
    assert report["verification"]["status"] == "passed"
    assert report["verification"]["outputs"][0]["name"] == "logits"
    assert report["ops_before"]["LayerNormalization"] == 5 and "LayerNormalization" not in report["ops_after"]
    assert report["output"] == str(tmp_path / "o.onnx")


def test_dry_run_prints_the_plan_and_writes_nothing(gpt2, tmp_path):
    code, out, _ = _cli(gpt2, "--dry-run", "--json", tmp_path / "plan.json")
    assert code == 0
    assert "folded" in out and "model.lm_head.weight" in out and "untied" in out
    assert "dry run" in out
    assert sorted(p.name for p in gpt2.parent.iterdir()) == ["gpt2.onnx", "plan.json"]


def test_kept_lns_are_listed_with_their_reason(tmp_path):
    code, out, _ = _cli(MODELS / "opt_post_ln.onnx", "--dry-run")
    assert code == 0
    assert "0 folded, 4 kept" in out
    assert "it feeds MatMul" in out and "is the output of LayerNormalization" in out


def test_verification_failure_exits_1_and_writes_nothing(gpt2):
    before = gpt2.read_bytes()
    code, out, err = _cli(gpt2, "--rtol", "1e-15")
    assert code == 1
    assert "verification failed" in err and "Refused to write" in out
    assert sorted(p.name for p in gpt2.parent.iterdir()) == ["gpt2.onnx"]
    assert gpt2.read_bytes() == before


def test_no_verify(gpt2, tmp_path):
    code, out, _ = _cli(gpt2, "-o", tmp_path / "x.onnx", "--no-verify")
    assert code == 0 and "Verification: skipped (disabled by --no-verify)" in out


def test_input_shape_and_inputs_file(gpt2, tmp_path):
    code, out, _ = _cli(gpt2, "-o", tmp_path / "a.onnx", "--input-shape", "input_ids:3,11")
    assert code == 0 and "input_ids(3, 11)" in out
    np.savez(tmp_path / "in.npz", input_ids=np.arange(14, dtype=np.int64).reshape(2, 7))
    code, out, _ = _cli(gpt2, "-o", tmp_path / "b.onnx", "--inputs", tmp_path / "in.npz")
    assert code == 0 and "input_ids(2, 7)" in out


def test_in_place_needs_the_flag(gpt2):
    code, _, err = _cli(gpt2, "-o", gpt2)
    assert code == 2 and "would overwrite the input" in err
    code, out, _ = _cli(gpt2, "--in-place")
    assert code == 0
    assert sum(n.op_type.endswith("SimplifiedLayerNormalization") for n in onnx.load(gpt2).graph.node) == 5


def test_nothing_to_fold(tmp_path):
    g = onnx.helper.make_graph(
        [onnx.helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])],
    )
    path = tmp_path / "relu.onnx"
    onnx.save(onnx.helper.make_model(g), path)
    code, out, _ = _cli(path)
    assert code == 0 and "nothing to fold" in out


@pytest.mark.parametrize(
    "make_args,message",
    [
        (lambda d: [d / "missing.onnx"], "no such file"),
        (lambda d: [d], "is a directory"),
        (lambda d: [_write(d / "empty.onnx", b"")], "file is empty"),
        (lambda d: [_write(d / "junk.onnx", b"\xff\xfe not a protobuf \x00" * 7)], "not"),
        (lambda d: [_write(d / "trunc.onnx", (MODELS / "gpt2.onnx").read_bytes()[:5000])], "not"),
        (lambda d: [MODELS / "gpt2.onnx", "--bogus"], "unrecognized arguments: --bogus"),
        (lambda d: [MODELS / "gpt2.onnx", "--input-shape", "input_ids"], "bad --input-shape"),
        (lambda d: [MODELS / "gpt2.onnx", "-o", d / "no" / "such" / "dir.onnx"], "output folder does not exist"),
        (lambda d: [MODELS / "gpt2.onnx", "-o", d / "x.onnx", "--input-shape", "nope:1,2"], "names no graph input"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, make_args, message):
    args = make_args(tmp_path)
    before = sorted(tmp_path.iterdir())
    code, out, err = _cli(*args)
    assert code == 2, (out, err)
    assert err.count("\n") == 1 and err.startswith("onnx_lnfold: error:") and message in err
    assert "Traceback" not in err
    assert sorted(tmp_path.iterdir()) == before


def _write(path, data: bytes):
    path.write_bytes(data)
    return path


def test_report_piped_into_head_ends_quietly():
    cmd = f"{sys.executable} -m onnx_lnfold {MODELS / 'gpt2.onnx'} --dry-run | head -1; exit ${{PIPESTATUS[0]}}"
    proc = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.startswith("onnx_lnfold:")
    assert proc.stderr == ""
