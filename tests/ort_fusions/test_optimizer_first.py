"""Optimizer first (docs/DESIGN.md section 10, item 4): where ONNX Runtime's transformers optimizer's
output folds more LNs than the graph given, the Order line says so with both counts, counted on
the optimizer's output of a weightless copy with the model's own tensors rebound by name.

Models: the committed GPT-Neo (dynamo; its TorchScript export behaves alike), DistilBERT and BERT
TorchScript exports, and graphs built here for the rebinding itself.
"""

from __future__ import annotations

import contextlib
import io
import logging

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import helper, numpy_helper

import onnx_lnfold
from onnx_lnfold.ort_fusions import fusion_cost
from onnx_lnfold.ort_fusions.light import light_model
from onnx_lnfold.ort_fusions.optimizer_first import already_optimized, rebound
from onnx_lnfold.ort_fusions.weightless import INTEGER_TYPES, KEEP_BYTES, KEEP_INTEGER_BYTES, ZEROS_FILE

from conftest import MODELS

ort = pytest.importorskip("onnxruntime")
optimizer = pytest.importorskip("onnxruntime.transformers.optimizer")

LINE = (
    "Order: run ONNX Runtime's transformers optimizer (onnxruntime.transformers.optimizer.optimize_model) "
    "first, then fold its output: on a weightless copy (model_type bert, opt_level 0, num_heads 4, "
    f"hidden_size 64, onnxruntime {ort.__version__}) "
)


def folded_after_the_real_optimizer(path, tmp_path) -> tuple[int, int]:
    """(folded, LNs) of the fold's analysis of `optimize_model`'s output on the real model (with
    the settings the check gives it)."""
    with contextlib.redirect_stdout(io.StringIO()):
        result = optimizer.optimize_model(str(path), "bert", 4, 64, opt_level=0)
    out = tmp_path / f"{path.stem}.optimized.onnx"
    result.save_model_to_file(str(out))
    plan = onnx_lnfold.analyze(out)
    return len(plan.folded), len(plan.decisions)


@pytest.fixture
def counted(monkeypatch):
    """The models whose optimizer output the check rebound and analyzed."""
    calls = []
    real = fusion_cost.rebound
    monkeypatch.setattr(fusion_cost, "rebound", lambda optimized, model: calls.append(1) or real(optimized, model))
    return calls


# --- where the optimizer's output folds more -------------------------------------------------------


def test_gpt_neo_folds_one_ln_more_after_the_optimizer_and_the_order_line_says_so(tmp_path):
    path = MODELS / "gpt_neo.onnx"
    plan = onnx_lnfold.analyze(path)
    assert (len(plan.folded), len(plan.decisions)) == (3, 5)
    assert plan.advice == [LINE + "4 of the 5 LayerNorms of its output fold, against 3 of 5 here."]
    assert plan.optimizer_first == {
        "folded": 4,
        "layer_norms": 5,
        "folded_here": 3,
        "layer_norms_here": 5,
        "at_least": False,
        "unknown_tensors": [],
        "optimizer": "onnxruntime.transformers.optimizer.optimize_model",
        "model_type": "bert",
        "opt_level": 0,
        "num_heads": 4,
        "hidden_size": 64,
        "onnxruntime": ort.__version__,
        "advice": "run it first, then fold its output",
    }
    assert plan.to_dict()["optimizer_first"] == plan.optimizer_first
    # what the weightless copy counted is what the fold makes of the real optimizer's output
    assert folded_after_the_real_optimizer(path, tmp_path) == (4, 5)


def test_tensors_the_optimizer_made_from_zeros_make_the_count_a_lower_bound(tmp_path):
    """DistilBERT (TorchScript): the optimizer concatenates Q, K and V into one Attention weight per
    layer, from the zeros; those two are unknown to the analysis, so the line says "at least", and
    joins the embeddings LN's EmbedLayerNormalization reason on one Order line."""
    path = MODELS / "distilbert_torchscript.onnx"
    plan = onnx_lnfold.analyze(path)
    assert (len(plan.folded), len(plan.decisions)) == (0, 5)
    facts = plan.optimizer_first
    assert (facts["folded"], facts["layer_norms"], facts["at_least"]) == (4, 5, True)
    assert facts["unknown_tensors"] == ["Attention_0_qkv_weight", "Attention_1_qkv_weight"]
    (line,) = plan.advice
    assert line.startswith("Order: run ONNX Runtime's transformers optimizer")
    assert "its EmbedLayerNormalization fusion is why '/model/embeddings/LayerNorm/LayerNormalization' stayed" in line
    assert line.endswith(
        f"(model_type bert, opt_level 0, num_heads 4, hidden_size 64, onnxruntime {ort.__version__}) at least 4 of "
        "the 5 LayerNorms of its output fold (taking the 2 large tensors it computed from the copy's zeros for "
        "unknown inputs), against 0 of 5 here."
    )
    assert folded_after_the_real_optimizer(path, tmp_path) == (4, 5)


# --- where it does not -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, here, there",
    [
        ("adaln_torchscript", 1, 1),  # the optimizer changes nothing the fold's costs depend on
        ("gpt2_hidden_states", 3, 0),  # its SkipLayerNormalizations read the hidden states, graph outputs
    ],
)
def test_no_line_where_the_optimizers_output_folds_no_more(name, here, there, counted, tmp_path):
    plan = onnx_lnfold.analyze(MODELS / f"{name}.onnx")
    assert len(plan.folded) == here and counted == [1]  # counted, and not more
    assert plan.optimizer_first is None and plan.to_dict()["optimizer_first"] is None
    assert not any("then fold its output" in advice for advice in plan.advice)
    assert folded_after_the_real_optimizer(MODELS / f"{name}.onnx", tmp_path)[0] == there


@pytest.mark.parametrize(
    "name, options",
    [
        ("gpt2", {}),  # every LN folds
        ("bert_ort_opt0", {}),  # the optimizer's output already: an LN kept for its cost all the same
        ("keras_ln_axis1_3d", {}),  # the one LN is kept for its form, which no optimizer changes
        ("gpt_neo", {"keep_ort_fusions": False}),  # no fusion check, no count
    ],
)
def test_it_runs_only_where_it_can_matter(name, options, counted):
    plan = onnx_lnfold.analyze(MODELS / f"{name}.onnx", **options)
    assert counted == [] and plan.optimizer_first is None


def test_a_failure_says_nothing_and_is_logged(monkeypatch, caplog):
    def fails(optimized, model):
        raise RuntimeError("no")

    monkeypatch.setattr(fusion_cost, "rebound", fails)
    with caplog.at_level(logging.INFO, logger="onnx_lnfold.ort_fusions.fusion_cost"):
        plan = onnx_lnfold.analyze(MODELS / "gpt_neo.onnx")
    assert plan.optimizer_first is None and plan.advice == []
    assert "optimize_model(model_type=bert, opt_level=0)'s output was not counted: RuntimeError: no" in caplog.text


def test_an_optimizer_output_that_is_no_valid_graph_says_nothing(caplog, capfd):
    """The optimizer drops the If of a merged decoder, whose outputs then come from nothing."""
    with caplog.at_level(logging.INFO, logger="onnx_lnfold.ort_fusions.fusion_cost"):
        plan = onnx_lnfold.analyze(MODELS / "gpt2_merged_decoder.onnx")
    assert plan.optimizer_first is None
    assert "no valid graph: nothing makes its output 'logits'" in caplog.text
    assert capfd.readouterr().err == ""


# --- the rebinding -------------------------------------------------------------------------------------


def _original() -> ir.Model:
    """x -> MatMul(w) -> Add(c) -> Mul(b) -> y; c a Constant node."""
    graph = helper.make_graph(
        [
            helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.full(512, 3, np.float32), "c")),
            helper.make_node("MatMul", ["x", "w"], ["h"]),
            helper.make_node("Add", ["h", "c"], ["h2"]),
            helper.make_node("Mul", ["h2", "b"], ["y"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", 512])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["n", 512])],
        [
            numpy_helper.from_array(np.ones((512, 512), np.float32), "w"),
            numpy_helper.from_array(np.full(512, 2, np.float32), "b"),
        ],
    )
    return ir.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))


def _optimized() -> onnx.ModelProto:
    """What an optimizer might write from a weightless copy of `_original()`: `w` and `c` kept,
    `b` reshaped (a new shape under the old name), a new large weight `w2` and Constant `k`, a
    small new `s`; every tensor as the copy's zeros, but `s`."""
    zeros = lambda shape, name: numpy_helper.from_array(np.zeros(shape, np.float32), name)  # noqa: E731
    graph = helper.make_graph(
        [
            helper.make_node("Constant", [], ["c"], value=zeros(512, "c")),
            helper.make_node("Constant", [], ["k"], value=zeros((512, 8), "k")),
            helper.make_node("MatMul", ["x", "w"], ["h"]),
            helper.make_node("Add", ["h", "c"], ["h2"]),
            helper.make_node("Mul", ["h2", "b"], ["h3"]),
            helper.make_node("MatMul", ["h3", "w2"], ["h4"]),
            helper.make_node("MatMul", ["h4", "k"], ["h5"]),
            helper.make_node("Add", ["h5", "s"], ["y"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", 512])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["n", 8])],
        [
            zeros((512, 512), "w"),
            zeros((1, 512), "b"),
            zeros((512, 512), "w2"),
            numpy_helper.from_array(np.full(8, 5, np.float32), "s"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    return light_model(model, ZEROS_FILE, KEEP_BYTES, KEEP_INTEGER_BYTES, sorted(int(t) for t in INTEGER_TYPES))


def test_the_optimizers_output_comes_back_with_its_large_tensors_as_references():
    model = _optimized()
    external = {t.name for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL}
    assert external == {"w", "b", "w2"} and not any(t.raw_data for t in model.graph.initializer if t.name in external)
    assert numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == "s")).tolist() == [5] * 8
    constants = {n.output[0]: n.attribute[0].t for n in model.graph.node if n.op_type == "Constant"}
    assert all(t.data_location == onnx.TensorProto.EXTERNAL for t in constants.values())
    assert {e.key: e.value for e in constants["k"].external_data} == {
        "location": ZEROS_FILE,
        "offset": "0",
        "length": "16384",
    }


def test_the_models_own_tensors_are_rebound_by_name_type_and_shape_and_the_others_are_unknown():
    original = _original()
    own_w = original.graph.initializers["w"].const_value
    own_c = original.graph.node(0).attributes["value"].value
    result = rebound(_optimized(), original)
    graph = result.model.graph
    assert graph.initializers["w"].const_value is own_w  # the same object: nothing copied or read
    constant = next(node for node in graph if node.op_type == "Constant")
    assert constant.attributes["value"].value is own_c and constant.outputs[0].const_value is own_c
    # `b` has another shape there, `w2` and `k` are new: unknown inputs, of their type and shape
    assert result.unknown == ("b", "w2", "k")
    inputs = {value.name: value for value in graph.inputs}
    assert list(inputs) == ["x", "b", "w2", "k"]
    assert [inputs[n].shape.dims for n in ("b", "w2", "k")] == [(1, 512), (512, 512), (512, 8)]
    assert inputs["k"].dtype == ir.DataType.FLOAT and not [
        n for n in graph if n.op_type == "Constant" and n.outputs[0].name == "k"
    ]
    assert [n.inputs[1] for n in graph if n.op_type == "MatMul"][2] is inputs["k"]
    assert graph.initializers["s"].const_value.numpy().tolist() == [5] * 8  # small: as the copy kept it
    assert not any(isinstance(v.const_value, ir.ExternalTensor) for v in graph.initializers.values())
    assert original.graph.initializers["w"].const_value is own_w  # the model is not changed


def test_a_graph_with_a_contrib_op_is_the_optimizers_output_already():
    assert already_optimized(ir.load(MODELS / "bert_ort_opt0.onnx"))
    assert not already_optimized(ir.load(MODELS / "bert_torchscript.onnx"))
