"""Float first (docs/DESIGN.md section 2.6): a quantized model's report says what folding the float
model before quantizing would fold, counted on a float copy recovered from the file
(`ort_fusions.float_first`), or why none could be recovered.

Models: the committed quantized fixtures (models/make/export_quantized_models.py, from `bert` and
`gpt2`), and graphs built here for what cannot be recovered.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx_lnfold
from onnx_lnfold.analysis.planner import Planner
from onnx_lnfold.core.options import FoldOptions
from onnx_lnfold.core.quantized import quantized_ops
from onnx_lnfold.ort_fusions import float_first as float_first_module
from onnx_lnfold.ort_fusions.float_first import NotRecovered, float_copy, float_first
from onnx_lnfold.shapes.table import ShapeTable

from conftest import MODELS

ort = pytest.importorskip("onnxruntime")

FIXTURES = (
    "bert_qdq_int8",
    "bert_qdq_int8_per_channel",
    "bert_dynamic_int8",
    "bert_int8_cast_mul",
    "bert_matmul_nbits_int4",
    "gpt2_qdq_int8",
    "gpt2_qdq_int8_per_channel",
    "gpt2_dynamic_int8",
    "gpt2_int8_cast_mul",
)
# Quantizations of the weights only: the copy computes the quantized model's function exactly.
WEIGHTS_ONLY = ("bert_int8_cast_mul", "bert_matmul_nbits_int4", "gpt2_int8_cast_mul")


def _source(name: str) -> str:
    return name.split("_", 1)[0]


def _inputs(name: str) -> dict[str, np.ndarray]:
    with np.load(MODELS / f"{name}.inputs.npz") as f:
        return {k: f[k] for k in f.files}


def _run(model: ir.Model | onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The model's outputs in ONNX Runtime, no graph optimization."""
    proto = ir.to_proto(model) if isinstance(model, ir.Model) else model
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _max_diff(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return max(float(np.abs(x.astype(np.float64) - y).max()) for x, y in zip(a, b))


def _ops(model: ir.Model) -> Counter:
    """Op types, a Gemm counted as the MatMul and Add that quantize_dynamic writes for it."""
    found = Counter(node.op_type for node in model.graph)
    gemms = found.pop("Gemm", 0)
    return found + Counter({"MatMul": gemms, "Add": gemms})


@pytest.fixture(scope="module", params=FIXTURES)
def copied(request):
    model = ir.load(str(MODELS / f"{request.param}.onnx"))
    before = ir.to_proto(model).SerializeToString()
    copy = float_copy(model)
    assert ir.to_proto(model).SerializeToString() == before  # the model itself is not changed
    return request.param, model, copy


def test_the_copy_is_the_float_models_graph(copied):
    """No quantized op is left, and the copy has the float source's ops."""
    name, _, copy = copied
    assert not quantized_ops(copy.graph)
    assert _ops(copy) == _ops(ir.load(str(MODELS / f"{_source(name)}.onnx")))


def test_the_copy_computes_the_quantized_function(copied):
    """Where only weights were quantized, the copy computes what the quantized model computes;
    elsewhere it differs by the activations' quantization, and is closer to the float source than
    the quantized model is."""
    name, model, copy = copied
    feeds = _inputs(name)
    quantized, floats = _run(model, feeds), _run(copy, feeds)
    source = _run(onnx.load(MODELS / f"{_source(name)}.onnx"), feeds)
    if name in WEIGHTS_ONLY:
        assert _max_diff(floats, quantized) == 0.0
    else:
        assert _max_diff(floats, source) < _max_diff(quantized, source)
    assert _max_diff(floats, source) < 0.05


@pytest.mark.parametrize("name", [n for n in FIXTURES if "qdq" in n])
def test_weights_are_the_dequantized_ones_exactly(name):
    """Every DequantizeLinear of a constant (int8 weights per tensor or per channel, int32 biases)
    becomes the tensor ONNX Runtime computes for it, bit for bit."""
    proto = onnx.load(MODELS / f"{name}.onnx")
    constants = {t.name: t for t in proto.graph.initializer}
    dequantized = [n for n in proto.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in constants]
    per_axis = [n for n in dequantized if np.prod(constants[n.input[1]].dims) > 1]
    assert len(dequantized) > 30 and bool(per_axis) == ("per_channel" in name)
    outputs = [n.output[0] for n in dequantized]
    proto.graph.output.extend(helper.make_empty_tensor_value_info(out) for out in outputs)
    computed = _run(proto, _inputs(name))[-len(outputs) :]
    copy = float_copy(ir.load(str(MODELS / f"{name}.onnx")))
    for out, tensor in zip(outputs, computed):
        np.testing.assert_array_equal(copy.graph.initializers[f"{out}_float"].const_value.numpy(), tensor)


def _plain_counts(model: ir.Model) -> tuple[int, int]:
    """(folded, LNs) of the plan with no fusion check, as the float copy is planned."""
    plan = Planner.start(model, FoldOptions(), ShapeTable(model)).plan({}).plan
    return len(plan.folded), len(plan.decisions)


def test_the_count_is_the_float_sources(copied):
    """The copy folds what the float source folds, planned alike: bert 4 of 5, gpt2 5 of 5."""
    name, model, copy = copied
    expected = _plain_counts(ir.load(str(MODELS / f"{_source(name)}.onnx")))
    assert expected == {"bert": (4, 5), "gpt2": (5, 5)}[_source(name)]
    planner = Planner.start(model, FoldOptions(), ShapeTable(model))
    before = ir.to_proto(model).SerializeToString()
    first = float_first(planner, planner.plan({}).plan)
    assert ir.to_proto(model).SerializeToString() == before
    assert first is not None and (first.folded, first.layer_norms) == expected and first.unrecovered is None


@pytest.mark.parametrize(
    ("name", "here", "there"), [("bert_qdq_int8", 0, 4), ("gpt2_qdq_int8", 0, 5), ("gpt2_dynamic_int8", 1, 5)]
)
def test_the_report_says_what_the_float_model_folds(name, here, there):
    plan = onnx_lnfold.analyze(MODELS / f"{name}.onnx")
    assert plan.float_first == {
        "folded": there,
        "layer_norms": 5,
        "folded_here": here,
        "layer_norms_here": 5,
        "unrecovered": None,
    }
    assert plan.to_dict()["float_first"] == plan.float_first
    (line,) = [line for line in plan.advice if line.startswith("Quantized:")]
    assert line.endswith(
        f"folding the float model recovered from this file folds {there} of its 5 LNs (here {here} of 5)."
    )


def test_a_float_model_has_no_float_first():
    plan = onnx_lnfold.analyze(MODELS / "bert.onnx")
    assert plan.float_first is None and plan.to_dict()["float_first"] is None


def _layer_norm_of(source: onnx.NodeProto, inputs: list[onnx.ValueInfoProto], constants) -> onnx.ModelProto:
    """x -> `source` -> Add of itself -> LayerNormalization -> y, over 8 channels."""
    nodes = [
        source,
        helper.make_node("Add", ["x_float", "x_float"], ["sum"]),
        helper.make_node("LayerNormalization", ["sum", "gamma", "beta"], ["y"], axis=-1),
    ]
    constants = [*constants, numpy_helper.from_array(np.ones(8, np.float32), "gamma")]
    constants.append(numpy_helper.from_array(np.zeros(8, np.float32), "beta"))
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])
    graph = helper.make_graph(nodes, "g", inputs, [out], constants)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def test_a_dequantization_of_a_computed_tensor_is_not_recovered():
    """A DequantizeLinear of an int8 graph input undoes no quantization the file shows: the report
    says the float model cannot be recovered, and counts nothing."""
    dq = helper.make_node("DequantizeLinear", ["x", "s", "z"], ["x_float"], name="dq")
    x = helper.make_tensor_value_info("x", TensorProto.INT8, [2, 8])
    scale = [
        numpy_helper.from_array(np.array(0.5, np.float32), "s"),
        numpy_helper.from_array(np.array(0, np.int8), "z"),
    ]
    model = ir.serde.deserialize_model(_layer_norm_of(dq, [x], scale))
    with pytest.raises(NotRecovered, match="DequantizeLinear 'dq' reads no constant"):
        float_copy(model)
    plan = onnx_lnfold.analyze(model)
    assert plan.float_first["unrecovered"] and plan.float_first["folded"] is None
    assert plan.advice[-1].endswith(
        "the float model cannot be recovered from this file (DequantizeLinear 'dq' reads "
        "no constant, no moved constant and no QuantizeLinear)."
    )


def test_a_copy_over_the_memory_limit_is_not_made(monkeypatch):
    """The float weights of bert_qdq_int8 take some hundred KiB: under a smaller limit, no copy."""
    monkeypatch.setattr(float_first_module, "FLOAT_COPY_BYTES", 1 << 16)
    with pytest.raises(NotRecovered, match=r"its float weights would take 0\.\d GiB of memory, over 0 GiB"):
        float_copy(ir.load(str(MODELS / "bert_qdq_int8.onnx")))


def test_a_blocked_dequantization_is_not_recovered():
    """Opset 21's block_size is not undone: the copy is given up, not guessed."""
    dq = helper.make_node("DequantizeLinear", ["w", "s", "z"], ["w_float"], name="dq", axis=1, block_size=4)
    mul = helper.make_node("MatMul", ["x", "w_float"], ["x_float"])
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])
    constants = [
        numpy_helper.from_array(np.ones((8, 8), np.int8), "w"),
        numpy_helper.from_array(np.full((8, 2), 0.5, np.float32), "s"),
        numpy_helper.from_array(np.zeros((8, 2), np.int8), "z"),
    ]
    proto = _layer_norm_of(dq, [x], constants)
    proto.graph.node.insert(1, mul)
    with pytest.raises(NotRecovered, match="blocked"):
        float_copy(ir.serde.deserialize_model(proto))
