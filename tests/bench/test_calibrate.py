"""`onnx-lnfold calibrate` (onnx_lnfold/bench/calibrate.py), rehearsed on the CPU provider: a table
of every kind the rule prices, each shape with its spread, that `--costs` folds by, deterministically;
a provider the session does not get is refused."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys

import numpy as np
import onnx
import onnx.numpy_helper
import onnxruntime as ort
import pytest

import onnx_lnfold
from onnx_lnfold.bench import calibrate
from onnx_lnfold.bench.graphs import chain_model
from onnx_lnfold.bench.tables import rehearsal_of, write_table
from onnx_lnfold.core.ops import LAYER_NORM, RMS_NORM
from onnx_lnfold.decide import costs

from conftest import MODELS, ROOT

CPU_ONLY = "CUDAExecutionProvider" not in ort.get_available_providers()
_ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


@pytest.fixture(scope="module")
def table_path(tmp_path_factory):
    """`onnx-lnfold calibrate --quick` (two widths, two token counts, three rounds, two processes)."""
    out = tmp_path_factory.mktemp("cal") / "costs.json"
    proc = subprocess.run([sys.executable, "-m", "onnx_lnfold", "calibrate", "--quick", "--threads", "1", "-o", str(out),
                           "--samples", str(out.with_name("samples.json"))], capture_output=True, text=True, env=_ENV)
    assert proc.returncode == 0, proc.stderr
    assert "What the never-slower rule decides by this table and by the built-in CPU one" in proc.stdout
    assert "  fit: " in proc.stdout
    assert " GB (a measuring process)" in proc.stdout.splitlines()[0]  # the memory it took, stated
    return out


def test_the_table_prices_every_kind_at_every_measured_shape_with_its_spread(table_path):
    table = costs.load_table(table_path)
    assert (table.provider, table.unit, table.onnxruntime) == ("CPUExecutionProvider", "us", ort.__version__)
    assert set(table.costs) == {*costs.KINDS, *costs.LAYOUT_KINDS}  # the layout kinds too: a table of its own
    for kind in table.costs:
        shapes = {(p.width, p.tokens) for p in table.points[kind]}
        assert shapes == {(w, t) for w in calibrate.QUICK_WIDTHS for t in calibrate.QUICK_TOKENS}, kind
        assert all(p.spread >= 0 for p in table.points[kind])
    assert "wall clock" in table.measured_by and "2 processes x 3 rounds" in table.measured_by


def test_a_table_is_made_again_from_the_samples_it_kept(table_path):
    again = table_path.with_name("again.json")
    proc = subprocess.run([sys.executable, "-m", "onnx_lnfold", "calibrate", "--from-samples",
                           str(table_path.with_name("samples.json")), "-o", str(again)], capture_output=True, text=True,
                          env=_ENV)
    assert proc.returncode == 0, proc.stderr
    first, second = costs.load_table(table_path), costs.load_table(again)
    assert first.costs == second.costs and first.points == second.points
    assert "(table from " in second.measured_by
    assert json.loads(again.read_text())["rehearsal"] == json.loads(table_path.read_text())["rehearsal"]


def test_a_quick_table_is_marked_and_folding_by_it_warns(table_path, tmp_path):
    marked = json.loads(table_path.read_text())["rehearsal"]
    assert marked.startswith("measured by --quick (4 shapes, 3 rounds)") and "too few" in marked
    report = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, "-m", "onnx_lnfold", str(MODELS / "gpt2.onnx"), "--dry-run", "--costs",
                           str(table_path), "--json", str(report)], capture_output=True, text=True, env=_ENV)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.startswith(f"onnx_lnfold: warning: --costs {table_path} is measured by --quick")
    assert any(note.startswith("Warning: --costs") for note in json.loads(report.read_text())["notes"])
    # A table measured in full is no rehearsal: the built-in one, written again, warns of nothing.
    full = tmp_path / "full.json"
    write_table(costs.builtin_table(), full)
    assert rehearsal_of(full) is None and rehearsal_of(table_path) == marked


def test_folding_by_the_calibrated_table_is_deterministic(table_path):
    model = MODELS / "opt_pre_ln.onnx"
    first = onnx_lnfold.analyze(model, costs=str(table_path)).to_dict()
    again = onnx_lnfold.analyze(model, costs=str(table_path)).to_dict()
    assert first["decisions"] == again["decisions"]
    for decision in first["decisions"]:
        if decision.get("code") == "costs-more":
            assert decision["reason"].endswith(f"({table_path})") and " us per run at " in decision["reason"]


def test_each_chain_is_its_kind_repeated(tmp_path):
    per_node = {"ln": 1, "sln": 1, "skip_ln": 1, "skip_sln": 1, "add": 1, "bias_add": 1, "center": 2, "strided_center": 2,
                "strided_ln": 9, "transpose": 1}
    assert set(per_node) == set(calibrate.CHAIN_OF.values())
    for chain, per in per_node.items():
        model = onnx.load_from_string(chain_model(chain, 64, "float32", 4, residual_chain=False))
        assert len(model.graph.node) == 4 * per, chain
        assert len(model.graph.output) == 1, chain  # no running sum: a Skip form as ORT fuses an Add read once
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def test_a_layout_chain_reduces_the_stream_over_its_non_last_axis():
    """The layout kinds run on [1, d, rows], as ORT runs a norm its transpose optimizer moved off the
    last axis: the decomposed LN normalizes each column over d, the centering leaves every column's
    mean zero, and an even Transpose chain gives x back."""
    x = np.random.default_rng(0).standard_normal((1, 64, 10)).astype(np.float32)
    outputs = {}
    for chain in ("strided_center", "strided_ln", "transpose"):
        session = ort.InferenceSession(chain_model(chain, 64, "float32", 1 if chain != "transpose" else 2,
                                                   residual_chain=False), providers=["CPUExecutionProvider"])
        assert session.get_inputs()[0].shape == [1, 64, "rows"], chain
        outputs[chain] = session.run(None, {"x": x})[0]
    assert np.abs(outputs["strided_center"].mean(axis=1)).max() < 1e-6
    model = onnx.load_from_string(chain_model("strided_ln", 64, "float32", 1, residual_chain=False))
    gamma, beta = (onnx.numpy_helper.to_array(t) for t in model.graph.initializer if t.name in ("gamma_col", "beta_col"))
    centered = x - x.mean(axis=1, keepdims=True)
    expected = centered / np.sqrt((centered**2).mean(axis=1, keepdims=True) + 1e-5) * gamma + beta
    np.testing.assert_allclose(outputs["strided_ln"], expected, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(outputs["transpose"], x)


def test_the_rule_s_comparisons_say_when_a_table_cannot_tell():
    table = costs.builtin_table()
    ratio, word = calibrate.judged(table, [("SimplifiedLayerNormalization", 768)], [("LayerNormalization", 768)], 8192)
    assert word == "less" and ratio < 1
    ratio, word = calibrate.judged(table, [("BiasAdd", 768)], [("BiasAdd", 768)], 8192)
    assert word == "cannot tell" and ratio == 1
    text = calibrate.decisions_text(table, table)
    assert "<- differs" not in text and "LN -> SLN + beta Add" in text


def test_a_fit_below_zero_gives_no_ratio():
    """A marginal cost wall clock cannot resolve may fit below zero at few tokens: no ratio is printed
    for it (it read 'x-0.035 costs less'), and the table cannot tell."""
    builtin = costs.builtin_table()
    below = dataclasses.replace(builtin, costs={**builtin.costs, "BiasAdd": costs.Cost(-5e5, 0.0, 0.0)})
    ratio, word = calibrate.judged(below, [(RMS_NORM.op_type, 768), ("BiasAdd", 768)], [(LAYER_NORM.op_type, 768)], 16)
    assert ratio != ratio and word == "cannot tell"
    text = calibrate.decisions_text(below, builtin)
    assert "no ratio (a fit at or below 0)" in text and not re.search(r"x-\d", text)


@pytest.mark.skipif(not CPU_ONLY, reason="needs an onnxruntime without the CUDA provider")
def test_calibrating_a_provider_the_session_does_not_get_is_refused(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "onnx_lnfold", "calibrate", "--provider", "CUDA", "-o",
                           str(tmp_path / "c.json")], capture_output=True, text=True, env=_ENV)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "has no CUDAExecutionProvider" in proc.stderr and not (tmp_path / "c.json").exists()
