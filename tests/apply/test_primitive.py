"""`--target primitive`: RMSNorm as standard ops, in the form ONNX Runtime's own fusion turns back
into `SimplifiedLayerNormalization` (docs/DESIGN.md section 4). OpenVINO's side:
tests/runtimes/test_openvino.py."""

import collections
import os
import tempfile

import onnx
import onnxruntime as ort
import pytest

import onnx_lnfold
from onnx_lnfold.core.ops import PRIMITIVE_OPS, PRIMITIVE_RMS

from conftest import MODELS
from graphs import Graph, ops

# Committed models of both ReduceMean spellings: axes an input (opset 18) and an attribute (14, 17).
MODELS_FOLDED = ["gpt2", "vit", "whisper_encoder", "gpt2_torchscript_opset14", "vit_torchscript"]


def _optimized(model: onnx.ModelProto, level) -> onnx.ModelProto:
    so = ort.SessionOptions()
    so.graph_optimization_level = level
    so.log_severity_level = 3
    with tempfile.TemporaryDirectory() as folder:
        so.optimized_model_filepath = os.path.join(folder, "optimized.onnx")
        ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        return onnx.load(so.optimized_model_filepath)


def _nodes(model: onnx.ModelProto) -> collections.Counter:
    """Each node as (domain, op type, attributes): what kernel ORT runs with which settings."""
    return collections.Counter(
        (n.domain, n.op_type, tuple(sorted((a.name, str(onnx.helper.get_attribute_value(a))) for a in n.attribute)))
        for n in model.graph.node
    )


def test_primitive_target_writes_standard_ops_only():
    result = onnx_lnfold.fold(MODELS / "gpt2.onnx", target="primitive")
    assert result.report.verification.status == "passed"
    assert {d.rewrite for d in result.plan.folded} == {PRIMITIVE_RMS}
    folded = result.model_proto
    onnx.checker.check_model(folded, full_check=True)  # SimplifiedLayerNormalization would fail it
    counts = ops(folded)
    assert "LayerNormalization" not in counts and "SimplifiedLayerNormalization" not in counts
    assert {o.domain: o.version for o in folded.opset_import} == {"": 18}  # no conversion, no contrib domain
    for op in ("ReduceMean", "Sqrt", "Div"):
        assert counts[op] == 5, op
    reduce_means = [n for n in folded.graph.node if n.op_type == "ReduceMean"]
    assert all(len(n.input) == 2 and not n.attribute[0].name == "axes" for n in reduce_means)  # opset 18: an input


@pytest.mark.parametrize("name", MODELS_FOLDED)
def test_onnx_runtime_fuses_it_into_the_default_targets_graph(name):
    """At ORT_ENABLE_EXTENDED (and ALL, the default) ORT's SimplifiedLayerNormFusion makes the
    primitive form SimplifiedLayerNormalization: the optimized graph is the default target's, node
    for node with the same attributes, so it runs the same kernels (what `decide.targets.cost_nodes`
    prices it as). Below EXTENDED it is not fused."""
    source = MODELS / f"{name}.onnx"
    # The image and audio stand-ins at a batch of 512: per item (17 / 32 tokens) nothing of theirs
    # pays; this test is about the graph the folds make.
    shapes = {"vit": {"pixel_values": (512, 3, 32, 32)}, "whisper_encoder": {"input_features": (512, 16, 64)}}.get(name)
    primitive = onnx_lnfold.fold(source, target="primitive", input_shapes=shapes)
    default = onnx_lnfold.fold(source, input_shapes=shapes)
    assert len(primitive.plan.folded) == len(default.plan.folded) > 0
    assert primitive.report.verification.status == "passed"
    for level in (ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED, ort.GraphOptimizationLevel.ORT_ENABLE_ALL):
        fused = _optimized(primitive.model_proto, level)
        assert _nodes(fused) == _nodes(_optimized(default.model_proto, level)), level
        assert ops(fused).get("SimplifiedLayerNormalization", 0) >= len(primitive.plan.folded)
    basic = _optimized(primitive.model_proto, ort.GraphOptimizationLevel.ORT_ENABLE_BASIC)
    assert "SimplifiedLayerNormalization" not in ops(basic)


def test_below_opset_18_the_axes_are_an_attribute():
    result = onnx_lnfold.fold(MODELS / "gpt2_torchscript_opset14.onnx", target="primitive")
    emitted = [n for n in result.model_proto.graph.node if n.op_type == "ReduceMean" and "/rms_mean" in n.name]
    assert emitted and all(len(n.input) == 1 for n in emitted)
    assert all({a.name: onnx.helper.get_attribute_value(a) for a in n.attribute} == {"axes": [-1], "keepdims": 1} for n in emitted)


def test_the_emitted_form_is_the_one_both_fusions_read():
    """Pow(x, 2) -> ReduceMean -> Add(epsilon) -> Sqrt -> Div(x, .) -> Mul(., gamma), each
    intermediate read once, x the same tensor for Pow and Div."""
    g = Graph()
    h = g.linear(g.input("x", ["b", "s", 8]), 8, 16, "proj")
    g.output(g.ln(h, 16, "ln", bias=False), ["b", "s", 16])
    folded = onnx_lnfold.fold(g.model(), target="primitive").model_proto
    by_output = {o: n for n in folded.graph.node for o in n.output}
    (mul,) = [n for n in folded.graph.node if n.name == "ln/rms_scale"]
    chain, node = [mul], mul
    while node.op_type != "Pow":
        node = by_output[node.input[1 if node.op_type == "Div" else 0]]  # Div(x, rms): up its divisor
        chain.append(node)
    assert [n.op_type for n in reversed(chain)] == list(PRIMITIVE_OPS)
    pow_, _, add, _, div, _ = reversed(chain)
    assert div.input[0] == pow_.input[0]
    readers = collections.Counter(i for n in folded.graph.node for i in n.input)
    assert all(readers[n.output[0]] == 1 for n in chain[1:])  # every intermediate read once
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in folded.graph.initializer}
    assert float(inits[pow_.input[1]]) == 2.0 and float(inits[add.input[1]]) == pytest.approx(1e-5)


def test_fp16_layer_norms_are_kept_for_the_primitive_target():
    """In fp16 the primitive form would overflow (squares above 256) and round its epsilon; the
    default target folds the same LNs."""
    result = onnx_lnfold.fold(MODELS / "gpt2_fp16.onnx", target="primitive")
    assert not result.plan.folded
    assert {(d.stage, d.code) for d in result.plan.kept} == {("form", "no-target-form")}
    assert onnx_lnfold.fold(MODELS / "gpt2_fp16.onnx").plan.folded
