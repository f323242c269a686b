"""Cost tables as data (docs/DESIGN.md section 4.1): the built-in CPU table is one file of the format
`onnx-lnfold calibrate` writes, `--costs FILE` / `costs=` folds by another, a bad file is one line,
and a table's provider, unit and source are what its reasons say."""

from __future__ import annotations

import dataclasses
import json

import pytest

import onnx_lnfold
from onnx_lnfold.bench.tables import write_table
from onnx_lnfold.decide import costs

from graphs import Graph, fold_checked

D = 64


def _beta_add_model():
    """One LN whose output is a graph output: its beta would stay an Add (kept on the built-in table)."""
    g = Graph(seed=7)
    g.output(g.ln(g.linear(g.input("x", ["b", "s", D]), D, D, "embed"), D, "ln"))
    return g.model()


def _residual_model():
    """`Add + LayerNormalization` that ONNX Runtime fuses into SkipLayerNormalization."""
    g = Graph(seed=9)
    x = g.input("x", ["b", "s", D])
    a, b = g.linear(x, D, D, "a"), g.linear(x, D, D, "b")
    g.output(g.ln(g.node("Add", [a, b], name="residual"), D, "ln"))
    return g.model()


def _table(tmp_path, name="costs.json", **changes) -> str:
    """The built-in table with some kinds' costs replaced (`kind=(fixed, per_token, per_element)`), as
    another provider in microseconds."""
    table = costs.builtin_table()
    new = dict(table.costs)
    for kind, figures in changes.items():
        new[kind] = costs.Cost(*figures)
    points = {k: (() if k in changes else v) for k, v in table.points.items()}
    other = dataclasses.replace(table, provider="CUDAExecutionProvider", unit="us", costs=new, points=points)
    path = tmp_path / name
    write_table(other, path)
    return str(path)


def test_the_builtin_table_round_trips_through_its_file_format(tmp_path):
    table = costs.builtin_table()
    write_table(table, tmp_path / "t.json")
    again = costs.load_table(tmp_path / "t.json")
    assert again.costs == table.costs and again.points == table.points and again.unit == "instructions"
    assert again.source == str(tmp_path / "t.json")  # a file names itself in the reasons it gives
    assert table.tokens_range == (16, 8192) and table.narrowest == costs.NARROWEST
    # every figure has a spread, from the processes that measured the nearest shape and the fit there
    for kind in costs.KINDS:
        spread = table.spread(kind, 8192, 768)
        assert 0 < spread < 0.01 * table.cost(kind, 8192, 768), kind


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "no such cost table file"),
        ("{", "not an onnx_lnfold cost table: not JSON"),
        ('{"format": "x"}', "'format' must be 'onnx_lnfold cost table 1'"),
        ('{"format": "onnx_lnfold cost table 1", "unit": "ms", "provider": "P", "costs": {}}', "'unit' must be one of"),
        ('{"format": "onnx_lnfold cost table 1", "unit": "us", "provider": "P", "costs": {}}', "no cost for LayerNormalization"),
    ],
)
def test_a_bad_table_is_one_line_before_any_work(tmp_path, content, message, capsys):
    path = tmp_path / "bad.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(onnx_lnfold.InvalidInput, match=message):
        costs.load_table(path)
    from onnx_lnfold._cli import main

    src = tmp_path / "m.onnx"
    src.write_bytes(_beta_add_model().SerializeToString())
    assert main([str(src), "--costs", str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message.split(":")[0] in err[0]


def test_a_table_where_beta_s_add_is_cheap_folds_what_the_builtin_keeps(tmp_path):
    """The decision is the table's: a provider whose Add of a row costs nothing folds the LN whose
    beta stays an Add; the built-in CPU table keeps it."""
    model = _beta_add_model()
    kept = onnx_lnfold.analyze(model).decision_for("ln")
    assert kept.code == "costs-more" and "on ONNX Runtime's CPU EP" in kept.reason
    path = _table(tmp_path, BiasAdd=(0.0, 0.0, 0.0))
    result = fold_checked(model, folded=1, fold_costly=False, costs=path)
    assert result.plan.decision_for("ln").beta == "add"


def test_reasons_name_the_table_s_provider_unit_and_file(tmp_path):
    path = _table(tmp_path, BiasAdd=(1e8, 0.0, 0.0))
    d = onnx_lnfold.analyze(_beta_add_model(), costs=path).decision_for("ln")
    assert d.code == "costs-more"
    assert "on ONNX Runtime's CUDA EP" in d.reason and " us per run at " in d.reason
    assert d.reason.endswith(f"({path})")


def test_auto_fuses_the_residual_where_the_table_says_the_fused_op_pays(tmp_path):
    model = _residual_model()
    unfused = onnx_lnfold.analyze(model).decision_for("ln")
    assert unfused.rewrite == "SimplifiedLayerNormalization" and unfused.residual_add is None
    path = _table(tmp_path, SkipSimplifiedLayerNormalization=(1.0, 0.0, 0.0))
    fused = fold_checked(model, folded=1, fold_costly=False, costs=path).plan.decision_for("ln")
    assert fused.rewrite == "com.microsoft::SkipSimplifiedLayerNormalization" and fused.residual_add == "residual"


def test_the_cli_folds_by_the_table_it_is_given(tmp_path, capsys):
    from onnx_lnfold._cli import main

    src = tmp_path / "m.onnx"
    src.write_bytes(_beta_add_model().SerializeToString())
    path = _table(tmp_path, BiasAdd=(0.0, 0.0, 0.0))
    assert main([str(src), "--costs", path, "--dry-run", "--json", str(tmp_path / "r.json"), "-q"]) == 0
    report = json.loads((tmp_path / "r.json").read_text())
    assert [d["status"] for d in report["decisions"]] == ["folded"]
    assert main([str(src), "--dry-run", "--json", str(tmp_path / "r.json"), "-q"]) == 0
    assert [d["status"] for d in json.loads((tmp_path / "r.json").read_text())["decisions"]] == ["kept"]
