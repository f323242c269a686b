"""benchmarks.instructions without valgrind: the parts whose mistakes would silently skew the counts."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from conftest import MODELS

ort = pytest.importorskip("onnxruntime")


def test_read_dumps_separates_the_main_thread_and_orders_dumps(tmp_path):
    from benchmarks.instructions import _read_dumps

    prefix = tmp_path / "cg.m.main"
    # callgrind --separate-threads=yes: PREFIX.<dump>-<thread>; dump 10 must sort after dump 2
    for name, ir in {"1-01": 100, "1-02": 7, "1-03": 5, "2-01": 200, "10-01": 300}.items():
        (tmp_path / f"cg.m.main.{name}").write_text(f"version: 1\nevents: Ir\nsummary: {ir}\ntotals: {ir}\n")
    (tmp_path / "cg.m.main-01").write_text("summary: 999\n")  # the final dump at exit: not a segment
    (tmp_path / "cg.m.main_other.1-01").write_text("summary: 5\n")  # another measurement's file
    assert _read_dumps(prefix) == [{"main": 100, "other_threads": 12}, {"main": 200, "other_threads": 0},
                                   {"main": 300, "other_threads": 0}]


def test_stripped_model_has_no_layernorm_and_runs(tmp_path):
    from benchmarks.instructions import _strip_layernorms

    src, dst = MODELS / "gpt2.onnx", tmp_path / "stripped.onnx"
    n_ln = sum(n.op_type == "LayerNormalization" for n in onnx.load(str(src)).graph.node)
    assert _strip_layernorms(src, dst) == n_ln == 5
    m = onnx.load(str(dst))
    assert not any(n.op_type == "LayerNormalization" for n in m.graph.node)
    with np.load(MODELS / "gpt2.inputs.npz") as z:
        feeds = dict(z)
    ref = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = ort.InferenceSession(str(dst), providers=["CPUExecutionProvider"]).run(None, feeds)
    assert [g.shape for g in got] == [r.shape for r in ref]


def test_ideal_model_has_simplified_layernorms_and_runs(tmp_path):
    from benchmarks.instructions import _strip_layernorms

    src, dst = MODELS / "gpt2.onnx", tmp_path / "ideal.onnx"
    assert _strip_layernorms(src, dst, to="SimplifiedLayerNormalization") == 5
    lns = [n for n in onnx.load(str(src)).graph.node if n.op_type == "LayerNormalization"]
    slns = [n for n in onnx.load(str(dst)).graph.node if n.op_type == "SimplifiedLayerNormalization"]
    assert [list(n.input) for n in slns] == [list(n.input[:2]) for n in lns]
    assert [{a.name: onnx.helper.get_attribute_value(a) for a in n.attribute} for n in slns] == \
        [{a.name: onnx.helper.get_attribute_value(a) for a in n.attribute if a.name in ("axis", "epsilon")}
         for n in lns]
    with np.load(MODELS / "gpt2.inputs.npz") as z:
        feeds = dict(z)
    out = ort.InferenceSession(str(dst), providers=["CPUExecutionProvider"]).run(None, feeds)
    assert all(np.isfinite(o).all() for o in out)
