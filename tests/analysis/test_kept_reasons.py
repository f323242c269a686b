"""Every kept LN's reason is true under the never-slower rule (docs/DESIGN.md sections 2.3, 4.1, 9):
an LN that `fold_costly` folds was kept by a decision on its cost, and says so with its figures;
a structural reason (the proof, a side effect) is given only where no fold is possible at all."""

import pytest

import onnx_lnfold

from conftest import MODELS
from graphs import Graph, fold_checked

COMMITTED = sorted(p.stem for p in MODELS.glob("*.onnx"))


@pytest.mark.parametrize("name", COMMITTED)
def test_an_ln_that_fold_costly_folds_is_kept_for_its_cost(name):
    model = MODELS / f"{name}.onnx"
    default = onnx_lnfold.analyze(model, keep_ort_fusions=False)
    costly = onnx_lnfold.analyze(model, keep_ort_fusions=False, fold_costly=True)
    assert {d.node for d in default.folded} <= {d.node for d in costly.folded}  # folding costly never folds less
    foldable = {d.node for d in costly.folded}
    wrong = [(d.node, d.stage, d.code) for d in default.kept if d.node in foldable and d.stage != "cost"]
    assert wrong == []
    for d in default.kept:
        if d.code == "centering-costs-more":
            assert "instructions per run at" in d.reason and "ReduceMean over axis" in d.blocked.detail


def _gelu_stem():
    """A projection, a gate (x * sigmoid(x): a Mul by a factor varying along the axis), an LN whose
    beta folds into the next projection's bias: its input is zero-mean only once the gate's output
    is centered explicitly."""
    g = Graph()
    x = g.input("x", ["b", "s", 64])
    h = g.linear(x, 64, 64, "proj")
    gate = g.node("Sigmoid", [h])
    act = g.node("Mul", [h, gate], name="act")
    g.output(g.linear(g.ln(act, 64, "ln"), 64, 64, "head"))
    return g.model()


def test_a_centering_that_does_not_pay_keeps_its_ln_for_that_cost():
    """One LN after a GELU-like gate: the centering that would unlock it costs more than its fold
    saves; the LN says so (its stage, code, the centering, the figures), and folds with fold_costly."""
    result = onnx_lnfold.fold(_gelu_stem(), verify=False)
    (kept,) = result.plan.kept
    assert kept.stage == "cost" and kept.code == "centering-costs-more"
    assert kept.blocking_tensor == result.model.graph.node(3).outputs[0].name  # the gate's output
    assert "would unlock 1 LN" in kept.blocked.detail and "instructions per run at 8192 tokens (the default), d=64" in kept.blocked.detail
    text = result.report.format_text()
    assert "kept: (centering-costs-more)" in text
    fold_checked(_gelu_stem(), folded=1, auxiliary_centering=True)
