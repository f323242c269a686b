"""The quantized fixtures of models/ (models/make/export_quantized_models.py: ONNX Runtime's static QDQ,
dynamic and MatMulNBits quantizers on `bert` and `gpt2`, and int8 weights read through Cast -> Mul)
through `fold()` and the command line at the default options: what the fold does on them today,
and what must hold: no internal error, an output ONNX Runtime loads at ORT_ENABLE_ALL and runs, and
no DequantizeLinear split from its consumer by an inserted node, whatever the options.
benchmarks/quantized.py measures the same models (ONNX Runtime's optimized graphs, output differences)."""

from __future__ import annotations

import functools
import subprocess
import sys
from dataclasses import dataclass

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import onnx_lnfold
from benchmarks.quantized import FIXTURES, committed_inputs, split_dequantize_pairs
from onnx_lnfold._cli import EXIT_OK

from conftest import MODELS, ROOT


@dataclass(frozen=True)
class Outcome:
    folded: int
    centerings: int
    verification: str
    kept_codes: frozenset[str] = frozenset({"costs-more"})
    lns: int = 5


# The default fold of each fixture. The float `bert` folds 4/5 with its weights centered and `gpt2`
# 5/5 with none: once the weights are quantized, none can be centered (docs/DESIGN.md section 2.6),
# so each fold needs an explicit centering of its residual sum, and gpt2's pre-LN blocks keep their
# LNs for the cost. QDQ keeps every LN: its input is a DequantizeLinear's output, inside a unit.
EXPECTED = {
    "bert_qdq_int8": Outcome(0, 0, "skipped", frozenset({"quantized"})),
    "bert_qdq_int8_per_channel": Outcome(0, 0, "skipped", frozenset({"quantized"})),
    "bert_dynamic_int8": Outcome(4, 4, "passed"),
    "bert_matmul_nbits_int4": Outcome(4, 4, "passed"),
    "bert_int8_cast_mul": Outcome(4, 4, "passed"),
    "gpt2_qdq_int8": Outcome(0, 0, "skipped", frozenset({"quantized"})),
    "gpt2_qdq_int8_per_channel": Outcome(0, 0, "skipped", frozenset({"quantized"})),
    "gpt2_dynamic_int8": Outcome(1, 1, "passed"),
    "gpt2_int8_cast_mul": Outcome(1, 1, "passed"),
}

# What fold_costly folds (every LN whose proof needs nothing inside a quantized unit), and the
# codes of the LNs it keeps.
FOLD_COSTLY = {name: (0, {"quantized"}) if "qdq" in name else (5, set()) for name in EXPECTED}


def _loads_and_runs_optimized(model: str | bytes, name: str) -> None:
    """ONNX Runtime builds `model` at ORT_ENABLE_ALL and runs it on the fixture's committed inputs."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    assert all(np.isfinite(out).all() for out in session.run(None, committed_inputs(name)))


def test_a_float_model_is_not_called_quantized():
    assert not [line for line in onnx_lnfold.analyze(MODELS / "bert.onnx").advice if line.startswith("Quantized")]


def test_every_fixture_is_expected_and_listed():
    assert sorted(EXPECTED) == sorted(FIXTURES)
    readme = (MODELS / "README.md").read_text()
    assert all(f"`{name}`" in readme or f"`{name}," in readme for name in EXPECTED)
    assert all((MODELS / f"{name}.onnx").stat().st_size < 1 << 20 for name in EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fold_outcome_today(name):
    want = EXPECTED[name]
    path = MODELS / f"{name}.onnx"
    result = onnx_lnfold.fold(path)
    plan = result.plan
    assert (len(plan.decisions), len(plan.folded), len(plan.centerings)) == (want.lns, want.folded, want.centerings)
    assert {d.code for d in plan.kept} <= want.kept_codes, [(d.node, d.code, d.reason) for d in plan.kept]
    assert result.report.verification.status == want.verification
    assert split_dequantize_pairs(onnx.load(str(path)), result.model_proto) == []
    (said,) = [line for line in plan.advice if line.startswith("Quantized: ")]  # the report says so, with what stays
    held = sum(d.code == "quantized" for d in plan.kept)
    stays = {0: "no LN stays for that", 1: "1 LN stays for that ('quantized')"}.get(held, f"{held} LNs stay for that ('quantized')")
    assert stays in said
    assert "Fold the float model before quantizing" in said
    _loads_and_runs_optimized(result.model_proto.SerializeToString(), name)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_command_line(name, tmp_path):
    out = tmp_path / f"{name}.folded.onnx"
    run = subprocess.run(
        [sys.executable, "-m", "onnx_lnfold", str(MODELS / f"{name}.onnx"), "-o", str(out), "-q"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert run.returncode == EXIT_OK, run.stderr
    assert "Traceback" not in run.stderr + run.stdout
    assert [ln for ln in run.stderr.splitlines() if ln.strip() and not ln.startswith("WARNING")] == []
    _loads_and_runs_optimized(str(out), name)
    folded = sum(n.op_type == "LayerNormalization" for n in onnx.load(str(out)).graph.node)
    assert folded == EXPECTED[name].lns - EXPECTED[name].folded


@functools.cache
def _fold_costly(name: str) -> tuple[int, bytes, int]:
    """The fixture folded with fold_costly: LNs folded, the model, DequantizeLinear pairs split."""
    path = MODELS / f"{name}.onnx"
    result = onnx_lnfold.fold(path, verify=False, fold_costly=True)
    split = split_dequantize_pairs(onnx.load(str(path)), result.model_proto)
    return len(result.plan.folded), result.model_proto.SerializeToString(), len(split)


@pytest.mark.parametrize("name", sorted(FOLD_COSTLY))
def test_fold_costly_leaves_every_quantized_unit_whole(name):
    """fold_costly folds whatever it costs, but never by a centering inside a quantized unit: no
    DequantizeLinear -> consumer pair is split, and the LNs that would need one say "quantized"."""
    folded, model, split = _fold_costly(name)
    want, codes = FOLD_COSTLY[name]
    assert folded == want
    assert split == 0
    plan = onnx_lnfold.analyze(MODELS / f"{name}.onnx", fold_costly=True)
    assert {d.code for d in plan.kept} == codes
    assert all("DequantizeLinear" in d.reason and "fold the float model before quantizing" in d.reason for d in plan.kept)
    _loads_and_runs_optimized(model, name)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fuse_residual_always_folds_what_it_can_exactly(name):
    """fuse_residual="always" on the LNs whose fold centers the residual sum explicitly (the
    quantized weights cannot be centered): the Add stays an Add (a Skip op would normalize the sum
    uncentered), the centering reads it, and the fold is verified."""
    result = onnx_lnfold.fold(MODELS / f"{name}.onnx", fuse_residual="always")
    assert result.report.verification.status in ("passed", "skipped"), result.report.verification.reason
    _loads_and_runs_optimized(result.model_proto.SerializeToString(), name)
