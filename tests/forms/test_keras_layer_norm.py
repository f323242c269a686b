"""Keras' LayerNormalization as tf2onnx writes it (forms/keras_layer_norm.py): the mean and variance
as ReduceMean or GlobalAveragePool, Sqrt then Reciprocal, the affine folded into
`x * (gamma * r) + (beta - mean * gamma * r)`. The committed models are tf2onnx 1.16's own output
(models/make/export_keras_models.py)."""

import numpy as np
import onnx
import pytest

import onnx_lnfold
from onnx_lnfold.forms.keras_layer_norm import KerasLayerNormForm

from conftest import MODELS
from graphs import Graph

KIND = KerasLayerNormForm.kind


@pytest.mark.parametrize("name, mean_op", [("keras_ln_last_axis_3d", "GlobalAveragePool"), ("keras_ln_last_axis_4d", "ReduceMean")])
def test_tf2onnx_layer_norms_are_recognized_and_fold_exactly(name, mean_op):
    model = onnx.load(MODELS / f"{name}.onnx")
    assert mean_op in {n.op_type for n in model.graph.node}
    (decision,) = onnx_lnfold.analyze(model).decisions
    assert decision.op_type == KIND
    assert decision.code == "costs-more"  # its beta would need a bias the head has not: the cost rule keeps it
    result = onnx_lnfold.fold(model, fold_costly=True)
    assert len(result.plan.folded) == 1 and result.report.verification.passed
    assert max(o.exact for o in result.report.verification.outputs) < 1e-12
    ops = {n.op_type for n in result.model_proto.graph.node}
    assert "SimplifiedLayerNormalization" in ops and "Reciprocal" not in ops and mean_op not in ops


def test_a_tf2onnx_layer_norm_over_another_axis_is_kept_for_that():
    (decision,) = onnx_lnfold.analyze(MODELS / "keras_ln_axis1_3d.onnx").decisions
    assert decision.op_type == KIND and decision.code == "not-last-axis"


def test_the_fused_batch_normalization_lowering_is_not_recognized_yet():
    """With Keras' default epsilon tf2onnx takes its fused path (ReduceSumSquare, BatchNormalization
    over a reshaped view): a form of its own, not this one."""
    assert onnx_lnfold.analyze(MODELS / "keras_ln_fused_3d.onnx").decisions == []


def _keras_ln(g: Graph, x: str, d: int, read_elsewhere: bool = False) -> str:
    axes = g.ints("axes", [-1])
    mean = g.node("ReduceMean", [x, axes], keepdims=1, name="mean")
    dev = g.node("Sub", [x, mean])
    var = g.node("ReduceMean", [g.node("Mul", [dev, dev]), axes], keepdims=1)
    r = g.node("Reciprocal", [g.node("Sqrt", [g.node("Add", [var, g.const("eps", value=np.float32(1e-6))])])])
    gr = g.node("Mul", [r, g.const("gamma", value=g.rng.uniform(0.5, 1.5, d))])
    shift = g.node("Sub", [g.const("beta", (d,)), g.node("Mul", [mean, gr])])
    if read_elsewhere:
        g.output(var)
    return g.node("Add", [g.node("Mul", [x, gr]), shift])


def test_the_form_folds_behind_a_projection_and_stays_when_an_intermediate_is_read():
    g = Graph()
    h = g.linear(g.input("x", ["b", "s", 16]), 16, 16, "proj")
    g.output(g.linear(_keras_ln(g, h, 16), 16, 8, "head"))
    result = onnx_lnfold.fold(g.model(), fold_costly=True)
    assert [d.op_type for d in result.plan.folded] == [KIND] and result.report.verification.passed
    g = Graph()
    h = g.linear(g.input("x", ["b", "s", 16]), 16, 16, "proj")
    g.output(g.linear(_keras_ln(g, h, 16, read_elsewhere=True), 16, 8, "head"))
    (kept,) = onnx_lnfold.analyze(g.model(), fold_costly=True).kept
    assert kept.code == "intermediate-read" and "the variance" in kept.reason
