"""The shape the cost rule decides at (docs/DESIGN.md section 4.1, `decide.pricing`): the graph's static
token count, else the given inputs' (`inputs=` / `input_shapes=`, `--inputs` / `--input-shape`), else
the table's default; and what the rule does where its table cannot tell the two sides apart."""

from __future__ import annotations

import dataclasses
import json

import numpy as np

import onnx_lnfold
from onnx_lnfold.bench.tables import write_table
from onnx_lnfold.decide import costs
from onnx_lnfold.decide.pricing import DEFAULT, GIVEN, STATIC

from conftest import MODELS
from graphs import Graph, fold_checked

D = 64


def _into_head(dims) -> Graph:
    """An LN whose beta goes into the bias of the layer after it (folds wherever SLN is cheaper)."""
    g = Graph(seed=3)
    n = g.ln(g.linear(g.input("x", dims), D, D, "embed"), D, "ln")
    g.output(g.linear(n, D, D, "head"))
    return g


def test_a_static_graph_is_priced_at_its_own_token_count():
    """A graph of 35 atoms: its LN runs at 35 tokens whatever the inputs given."""
    plan = onnx_lnfold.analyze(_into_head([1, 35, D]).model())
    assert plan.decision_for("ln").priced_at == f"at 35 tokens ({STATIC})"


def test_the_given_inputs_decide_where_the_graph_does_not():
    model = _into_head(["batch", "seq", D]).model()
    assert onnx_lnfold.analyze(model).decision_for("ln").priced_at == f"at 8192 tokens ({DEFAULT})"
    step = onnx_lnfold.analyze(model, input_shapes={"x": (1, 1, D)}).decision_for("ln")
    assert step.priced_at == f"at 1 token ({GIVEN}; priced at 16, the fewest the table measured)"
    given = onnx_lnfold.analyze(model, inputs={"x": np.zeros((4, 300, D), np.float32)}).decision_for("ln")
    assert given.priced_at == f"at 1200 tokens ({GIVEN})"


def test_a_size_the_graph_computes_from_its_inputs_is_found():
    """A convolution's output length (PP-OCRv5's recognizer: its LNs read [batch, W / 8, C]) is
    known once the input's size is: ONNX inference with the inputs at the given shapes."""
    g = Graph(seed=4)
    x = g.input("x", ["batch", 8, "width"])
    y = g.node("Conv", [x, g.const("w", (D, 8, 4))], name="conv", strides=[4])  # [batch, D, width / 4]
    y = g.node("Transpose", [y], name="t", perm=[0, 2, 1])
    g.output(g.linear(g.ln(y, D, "ln"), D, D, "head"))
    plan = onnx_lnfold.analyze(g.model(), input_shapes={"x": (2, 8, 320)})
    assert plan.decision_for("ln").priced_at == f"at 160 tokens ({GIVEN})"


def test_a_decision_can_change_with_the_shape_and_the_reason_says_which_decided():
    """GPT-2's final LN, whose residual Add ONNX Runtime fuses: at 8192 tokens the built-in table has
    the unfused Add + SimplifiedLayerNormalization cheaper; at 16 tokens the fused
    SkipSimplifiedLayerNormalization (a node's dispatch weighs more there). Both verified."""
    model = MODELS / "gpt2.onnx"
    default = onnx_lnfold.fold(model).plan.decision_for("node_layer_norm_4")
    assert default.rewrite == "SimplifiedLayerNormalization" and default.priced_at.endswith(f"({DEFAULT})")
    inputs = {"input_ids": np.arange(16, dtype=np.int64).reshape(2, 8)}
    small = onnx_lnfold.fold(model, inputs=inputs)
    decision = small.plan.decision_for("node_layer_norm_4")
    assert decision.rewrite == "com.microsoft::SkipSimplifiedLayerNormalization"
    assert decision.priced_at == f"at 16 tokens ({GIVEN})" and small.report.verification.status == "passed"
    # post-LN BERT: the explicit centering that unlocks four LNs pays at 8192 tokens, not at 16
    bert = MODELS / "bert.onnx"
    assert len(onnx_lnfold.analyze(bert).folded) == 4
    at_16 = onnx_lnfold.analyze(bert, input_shapes={"input_ids": (2, 8), "attention_mask": (2, 8)})
    assert len(at_16.folded) == 0 and at_16.decisions[0].code == "costs-more"
    assert "at 16 tokens (the given inputs), d=" in at_16.decisions[0].reason


def test_the_command_line_prices_at_the_input_shape_it_is_given(tmp_path, capsys):
    from onnx_lnfold._cli import main

    src = tmp_path / "m.onnx"
    src.write_bytes(_into_head(["batch", "seq", D]).model().SerializeToString())
    assert main([str(src), "--dry-run", "--input-shape", "x:2,50,64", "--json", str(tmp_path / "r.json"), "-q"]) == 0
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["decisions"][0]["priced_at"] == f"at 100 tokens ({GIVEN})"
    assert report["costs"].startswith(costs.builtin_table().source)


def _wide_table(tmp_path) -> str:
    """The built-in table with every point's spread ten times its value: it can tell nothing apart."""
    table = costs.builtin_table()
    points = {k: tuple(dataclasses.replace(p, spread=10 * abs(p.value)) for p in ps) for k, ps in table.points.items()}
    path = tmp_path / "wide.json"
    write_table(dataclasses.replace(table, points=points), path)
    return str(path)


def test_where_the_table_cannot_tell_the_ln_stays(tmp_path):
    """Never slower: a fold the table cannot show cheaper is not made, and the reason says why."""
    model = _into_head(["batch", "seq", D]).model()
    assert fold_checked(model, folded=1, fold_costly=False).plan.decision_for("ln").beta == "consumers"
    d = onnx_lnfold.analyze(model, costs=_wide_table(tmp_path)).decision_for("ln")
    assert (d.stage, d.code) == ("cost", "cost-unresolved")
    assert "cannot tell SimplifiedLayerNormalization from LayerNormalization" in d.reason
    assert "a difference within the figures' spread of" in d.reason and "folds only what it shows cheaper" in d.reason


def test_where_the_table_cannot_tell_no_centering_is_inserted(tmp_path):
    """BERT's centerings pay at 8192 tokens by the built-in table; by a table that cannot tell, none
    is inserted and its LNs stay."""
    bert = MODELS / "bert.onnx"
    assert onnx_lnfold.analyze(bert).centerings
    plan = onnx_lnfold.analyze(bert, costs=_wide_table(tmp_path))
    assert not plan.centerings and not plan.folded
