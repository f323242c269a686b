"""ONNX's checker on every model before folding (`load.validate`): each invalid kind refused with its
one sentence, what ONNX Runtime runs (and every committed model) let through, and an original ONNX
Runtime refuses as invalid refused rather than left "not verified"."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx_lnfold
from onnx_lnfold import InvalidInput, NotVerified
from onnx_lnfold.load.model import load_model, load_path
from onnx_lnfold.load.validate import REASON_CHARS, check_model

import hostile_models
from conftest import MODELS

COMMITTED = sorted(MODELS.glob("**/*.onnx"))


@pytest.mark.parametrize("path", COMMITTED, ids=[str(p.relative_to(MODELS)) for p in COMMITTED])
def test_every_committed_model_passes_the_check(path):
    """ORT-optimized (contrib ops, some without their domain's import), fp16-converted (nodes out of
    order), quantized, KV-cache and onnxruntime-genai models (declared shapes that differ from
    ONNX's inference) all run in ONNX Runtime: none is refused."""
    check_model(load_path(path), path)


# Each invalid kind of tests/hostile_models.py and the sentence it is refused with (after "PATH: ").
REFUSED = {
    "cycle": "invalid ONNX model: the graph has a cycle (a node reads, through other nodes, what it writes)",
    "dangling-input": "invalid ONNX model: input 'nobody_makes_this' of node Add 'bias' is made by no node, "
    "graph input or initializer",
    "ln-without-scale": "invalid ONNX model: Node(ln) with schema(::LayerNormalization:17) has input size 1 not in "
    "range [min=2, max=3].",
    "axis-out-of-range": "invalid ONNX model: LayerNormalization 'ln' has axis 5, outside [-3, 3) for its rank-3 "
    "input 't0'",
    "int32-ln-input": "invalid ONNX model: [ShapeInferenceError] (op_type:LayerNormalization, node name: ln): X "
    "typestr: T, has unsupported type: tensor(int32)",
    "no-default-opset": "invalid ONNX model: No opset import for domain ''",
    "opset-7": "invalid ONNX model: No Op registered for LayerNormalization with domain_version of 7",
    "duplicate-output": "invalid ONNX model: Graph must be in single static assignment (SSA) form, however 'h' has "
    "been used as output names multiple times.",
    "if-nested-200": "not a readable ONNX model: its graphs (If/Loop/Scan bodies) nest deeper than protobuf parses",
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_invalid_kind_is_refused_in_one_sentence(name, tmp_path, capfd):
    path = hostile_models.case(name).build(tmp_path)
    with pytest.raises(InvalidInput) as refused:
        load_model(path)
    assert str(refused.value) == f"{path}: {REFUSED[name]}"
    assert hostile_models.case(name).expect in str(refused.value).lower()
    assert capfd.readouterr().err == ""  # onnx_ir's own warning (an unresolved input) kept quiet


def test_a_model_in_memory_is_checked_too(tmp_path):
    proto = onnx.load(str(hostile_models.case("opset-7").build(tmp_path)))
    for source in (proto, ir.serde.deserialize_model(proto)):
        with pytest.raises(InvalidInput, match=r"^invalid ONNX model: No Op registered for LayerNormalization"):
            load_model(source)


def _ln_model() -> onnx.ModelProto:
    return hostile_models._ln_graph()


def test_what_onnx_runtime_runs_is_not_refused():
    """Nodes out of order, a com.microsoft op without its domain's import, a declared intermediate
    shape that differs from inference, an output and an input without a shape: ONNX's checker alone
    refuses each."""
    proto = _ln_model()
    nodes = list(proto.graph.node)
    del proto.graph.node[:]
    proto.graph.node.extend(reversed(nodes))
    proto.graph.node.append(helper.make_node("Gelu", ["y"], ["g"], domain="com.microsoft", name="gelu"))
    proto.graph.output.append(helper.make_tensor_value_info("g", TensorProto.FLOAT, None))
    proto.graph.value_info.append(helper.make_tensor_value_info("h", TensorProto.FLOAT, []))
    proto.graph.input[0].type.tensor_type.ClearField("shape")
    model, _ = load_model(proto)
    assert [n.name for n in model.graph][0] == "bias_out"  # the model keeps its order; only the copy checked is sorted


def test_a_large_weight_is_not_read(tmp_path):
    """The checker reads the graph with its large initializers as placeholders: a weight whose bytes
    are corrupt on disk (read only when used) does not stop the check."""
    proto = _ln_model()
    big = numpy_helper.from_array(np.zeros((512, 512), np.float32), "unused_big")
    proto.graph.initializer.append(big)
    path = tmp_path / "m.onnx"
    onnx.save(proto, str(path), save_as_external_data=True, location="m.onnx.data", size_threshold=1 << 16)
    model = load_path(path)
    check_model(model, path)
    tensor = model.graph.initializers["unused_big"].const_value
    assert isinstance(tensor, ir.ExternalTensor) and not tensor._array  # noqa: SLF001 - nothing was read


def test_reason_is_cut_to_one_bounded_line(tmp_path):
    proto = _ln_model()
    next(n for n in proto.graph.node if n.name == "ln").op_type = "NoSuchOp" + "x" * 500
    with pytest.raises(InvalidInput) as refused:
        load_model(proto)
    text = str(refused.value)
    assert "\n" not in text and len(text) <= len("invalid ONNX model: ") + REASON_CHARS


def test_a_model_onnx_runtime_refuses_is_invalid_input(tmp_path):
    """A declared type ONNX Runtime refuses (the checker's copy drops value_info): exit 2, not
    'not verified' with --no-verify offered."""
    proto = _ln_model()
    proto.graph.value_info.append(helper.make_tensor_value_info("h", TensorProto.INT64, None))
    path = tmp_path / "m.onnx"
    onnx.save(proto, str(path))
    with pytest.raises(InvalidInput) as refused:
        onnx_lnfold.fold(path)
    text = str(refused.value)
    assert text.startswith(f"{path}: invalid model: onnxruntime refuses it: Type Error: ")
    assert "\n" not in text and "verify" not in text


def test_an_op_onnx_runtime_cannot_run_is_not_verified_in_one_short_line(tmp_path):
    path = hostile_models.case("custom-domain-op").build(tmp_path)
    with pytest.raises(NotVerified) as refused:
        onnx_lnfold.fold(path)
    text = str(refused.value)
    assert "com.example:Frobnicate" in text and "Load model from" not in text
    assert "\n" not in text and len(text) <= 200


def test_the_folds_own_output_is_not_refused():
    """SimplifiedLayerNormalization is ONNX Runtime's op in the default domain, which ONNX does not
    define: a folded model given back to the tool is checked as ONNX Runtime's other ops are."""
    proto = _ln_model()
    ln = next(n for n in proto.graph.node if n.name == "ln")
    ln.op_type = "SimplifiedLayerNormalization"
    del ln.input[2:]
    load_model(proto)


def test_a_model_with_every_tensor_external_is_checked_in_full(tmp_path):
    """Shape inference reads small constant inputs (Unsqueeze's axes): an export that keeps every
    tensor external is checked with those read, and folds."""
    folder = tmp_path / "in"
    folder.mkdir()
    path = folder / "gpt2.onnx"
    onnx.save(onnx.load(MODELS / "gpt2.onnx"), path, save_as_external_data=True, size_threshold=0, location="w.data")
    model, _ = load_model(path)
    check_model(model, path)
    assert onnx_lnfold.analyze(path).folded


def test_a_graph_output_declared_at_another_rank_is_merged_as_onnx_runtime_merges_it(tmp_path):
    """An exporter's output declared with shape [] while it infers as rank 3 (PP-OCRv5's paddle2onnx
    exports): ONNX Runtime loads it, warning that it falls back to a lenient merge, so the check
    lets it through."""
    proto = hostile_models._ln_graph()
    del proto.graph.output[:]
    proto.graph.output.append(helper.make_tensor_value_info("y", TensorProto.FLOAT, []))
    path = tmp_path / "m.onnx"
    path.write_bytes(proto.SerializeToString())
    import onnxruntime as ort

    ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])  # ONNX Runtime loads it
    model, _ = load_model(path)
    check_model(model, path)
