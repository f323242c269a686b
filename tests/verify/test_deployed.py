"""The check at the level users run (`verify.deployed`, docs/DESIGN.md section 6, "At the level users run"): a quantized
model's fold is also judged at ORT_ENABLE_ALL against the original's own sensitivity there, as is any
model's where asked; a fold that moves the deployed outputs beyond that is refused."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import onnx_lnfold
from onnx_lnfold.core.errors import InvalidInput
from onnx_lnfold.verify.case import Case, Compared
from onnx_lnfold.verify.deployed import LEVEL, check_deployed
from onnx_lnfold.verify.request import VerifyRequest
from onnx_lnfold.verify.verdict import OutputDiff

from conftest import MODELS, ROOT


def _deployed(name: str, **keywords) -> dict | None:
    result = onnx_lnfold.fold(MODELS / f"{name}.onnx", **keywords)
    assert result.report.verification.status == "passed"
    return result.report.to_dict()["verification"]["deployed"]


@pytest.mark.parametrize("name", ["bert_dynamic_int8", "bert_matmul_nbits_int4", "bert_int8_cast_mul"])
def test_a_quantized_models_fold_is_judged_at_the_deployed_level(name):
    deployed = _deployed(name)
    assert deployed["level"] == LEVEL and deployed["passed"]
    assert deployed["rel_diff"] <= deployed["allowed"] and deployed["sensitivity"] >= 0


def test_a_float_models_fold_is_judged_there_where_asked():
    assert _deployed("bert") is None
    assert _deployed("bert", deployed_check="always")["passed"]
    assert _deployed("bert_dynamic_int8", deployed_check="never") is None


def test_the_report_says_both_figures():
    text = " ".join(onnx_lnfold.fold(MODELS / "bert_dynamic_int8.onnx").report.format_text().split())  # unwrapped
    assert f"at {LEVEL} (as deployed): fold vs original" in text and "the original's own sensitivity there" in text


def test_an_unknown_setting_is_refused_before_any_work():
    with pytest.raises(InvalidInput, match="deployed_check"):
        onnx_lnfold.fold(MODELS / "bert.onnx", deployed_check="sometimes")


def _moved(model: onnx.ModelProto, scale: float) -> bytes:
    """`model` with its largest float weight scaled: a wrong 'fold'."""
    moved = onnx.ModelProto()
    moved.CopyFrom(model)
    tensors = [t for t in moved.graph.initializer if t.data_type == onnx.TensorProto.FLOAT]
    largest = max(tensors, key=lambda t: int(np.prod(t.dims)))
    largest.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(largest) * scale, largest.name))
    return moved.SerializeToString()


def _case(model: onnx.ModelProto) -> Case:
    with np.load(MODELS / "bert_dynamic_int8.inputs.npz") as f:
        feeds = {k: f[k] for k in f.files}
    outputs = [o.name for o in model.graph.output]
    case = Case(VerifyRequest(), model.SerializeToString(), model.SerializeToString(), [], {})
    case.compared = [Compared(feeds, feeds, {}, {})]
    case.worst = {name: OutputDiff(name, (), 0.0, 1.0, rtol=1e-4) for name in outputs}
    return case


def test_a_fold_that_moves_the_deployed_outputs_is_refused():
    model = onnx.load(str(MODELS / "bert_dynamic_int8.onnx"))
    case = _case(model)
    same = check_deployed(case, case.original, model.SerializeToString())
    assert same.passed and same.rel_diff == 0.0
    wrong = check_deployed(case, case.original, _moved(model, 1.01))
    assert not wrong.passed and wrong.rel_diff > wrong.allowed


def test_the_command_line_takes_the_setting(tmp_path):
    out = tmp_path / "bert.folded.onnx"
    run = subprocess.run(
        [sys.executable, "-m", "onnx_lnfold", str(MODELS / "bert.onnx"), "-o", str(out), "--deployed-check", "always"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    assert f"at {LEVEL} (as deployed)" in " ".join(run.stdout.split())
