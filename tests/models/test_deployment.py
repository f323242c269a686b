"""The fold inside an ONNX Runtime deployment pipeline: the order against the transformers
optimizer, fp16 conversion before or after, int8 dynamic quantization after, an Olive workflow.

Models: models/bert_torchscript.onnx and models/clip.onnx (export_deployment_models.py) and the
committed models of export_models.py.
"""

from __future__ import annotations

import contextlib
import io
import re

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest

import onnx_lnfold

from conftest import MODELS
from graphs import Graph

optimizer = pytest.importorskip("onnxruntime.transformers.optimizer")
float16 = pytest.importorskip("onnxruntime.transformers.float16")

HEADS, HIDDEN = 4, 64  # of every committed model


def ort_session(model: onnx.ModelProto | str, level=ort.GraphOptimizationLevel.ORT_DISABLE_ALL, optimized_path=None):
    options = ort.SessionOptions()
    options.graph_optimization_level = level
    options.log_severity_level = 3
    if optimized_path:
        options.optimized_model_filepath = str(optimized_path)
    source = model if isinstance(model, str) else model.SerializeToString()
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


def ort_optimized_nodes(model: onnx.ModelProto, tmp_path) -> int:
    """Nodes of the graph ONNX Runtime runs (session optimizations at level ALL)."""
    out = tmp_path / "ort_optimized.onnx"
    ort_session(model, ort.GraphOptimizationLevel.ORT_ENABLE_ALL, out)
    return len(onnx.load(out).graph.node)


def optimize(model: onnx.ModelProto, model_type: str, tmp_path) -> onnx.ModelProto:
    """`optimize_model` through files as users run it, at opt level 0: its own fusions, the ones
    that matter here (level 1 first runs an ORT session, and ORT's optimizer then imports torch,
    which the test extra does not install)."""
    src, out = tmp_path / "to_optimize.onnx", tmp_path / "optimized.onnx"
    onnx.save(model, src)
    with contextlib.redirect_stdout(io.StringIO()):
        opt = optimizer.optimize_model(str(src), model_type=model_type, num_heads=HEADS, hidden_size=HIDDEN, opt_level=0)
    opt.save_model_to_file(str(out))
    return onnx.load(out)


def fold(model, **options) -> onnx_lnfold.FoldResult:
    return onnx_lnfold.fold(model, **options)


# --- 1. order against onnxruntime.transformers.optimizer ------------------------------------


def test_embeddings_layer_norm_that_ort_would_fuse_is_kept_with_a_reason():
    result = fold(MODELS / "bert_torchscript.onnx")
    embeddings = result.plan.decisions[0]
    assert not embeddings.folded
    assert "EmbedLayerNormalization" in embeddings.reason and "optimizer first" in embeddings.reason
    # Post-LN: the other four read LN outputs. (ORT fuses none of this export's residual Adds with
    # its LN: its shape inference cannot name their dims. So an explicit centering would pay for
    # none, and none reads the kept LN's output: that would cost the fusion it was kept for.)
    assert len(result.plan.folded) == 0 and not result.plan.centerings
    (advice,) = result.plan.advice
    assert advice.startswith("Order:") and embeddings.node in advice
    assert advice in " ".join(result.report.format_text().split())  # the report wraps long lines
    assert result.report.to_dict()["advice"] == [advice]


def test_embeddings_layer_norm_ort_would_not_fuse_still_folds():
    """The dynamo export sizes its positions from the attention mask's shape: ORT's matcher (and
    ours) does not recognize them, so the optimizer keeps the LN and the fold loses nothing."""
    result = fold(MODELS / "bert.onnx")
    embeddings = result.plan.decisions[0]
    assert embeddings.code == "costs-more"  # not for a fusion: its beta would stay an Add
    assert result.plan.advice == []
    result = onnx_lnfold.fold(MODELS / "bert.onnx", fold_costly=True, auxiliary_centering=False)
    assert [d.node for d in result.plan.folded] == ["node_layer_norm"]
    assert result.plan.advice == []


def _bert_embeddings(positions_from: str, decomposed: bool, residual: bool = True) -> onnx.ModelProto:
    """word + token-type + position Gathers -> LN -> Q, K, V (and, with `residual`, the sum of
    their outputs added back to the LN output, as an attention block's residual does); positions
    `Slice(position_ids, 0, seq)` with `seq` from the shape of `positions_from`."""
    g = Graph()
    ids = g.input("input_ids", ["b", "s"], onnx.TensorProto.INT64)
    types = g.input("token_type_ids", ["b", "s"], onnx.TensorProto.INT64)
    mask = g.input("attention_mask", ["b", "s"], onnx.TensorProto.INT64)
    seq = g.node("Gather", [g.node("Shape", [{"input_ids": ids, "attention_mask": mask}[positions_from]]), g.ints("one", 1)])
    end = g.node("Unsqueeze", [seq, g.ints("zero_axis", [0])])
    positions = g.node("Slice", [g.const("position_ids", value=np.arange(32, dtype=np.int64)[None]), g.ints("start", [0]), end, g.ints("axis1", [1])])
    word = g.node("Gather", [g.const("word_table", (50, 16)), ids])
    token_type = g.node("Gather", [g.const("type_table", (2, 16)), types])
    position = g.node("Gather", [g.const("position_table", (32, 16)), positions])
    x = g.node("Add", [g.node("Add", [word, token_type]), position])
    from graphs import decomposed_ln

    n = decomposed_ln(g, x, 16, "embeddings_ln") if decomposed else g.ln(x, 16, "embeddings_ln")
    q, k, v = (g.linear(n, 16, 16, head) for head in ("q", "k", "v"))
    if residual:
        g.output(g.node("Add", [g.node("Add", [g.node("Add", [q, k]), v]), n], name="residual"))
    else:
        for out in (q, k, v):
            g.output(out)
    return g.model()


@pytest.mark.parametrize("decomposed", [False, True])
@pytest.mark.parametrize(
    "positions_from, residual, fused",
    [("input_ids", True, True), ("input_ids", False, False), ("attention_mask", True, False)],
)
def test_embeddings_layer_norm_is_kept_where_ort_fuses_it(positions_from, residual, fused, decomposed):
    """ONNX Runtime's optimizer decides, not a structural likeness of it: it fuses the embeddings
    LN (in either form: it makes a decomposed LN a LayerNormalization first) when the positions
    are sized by the ids and the LN output is read by Q, K, V and a residual Add; the same
    embeddings read by Q, K, V alone, or with positions sized by the attention mask, it leaves,
    and the LN folds."""
    # Every LN that folds exactly (the cost rule is tests/decide/test_beta_placement.py's): the fusion rule alone.
    result = fold(_bert_embeddings(positions_from, decomposed, residual), fold_costly=True)
    embeddings = result.plan.decisions[0]
    if fused:
        assert not embeddings.folded and embeddings.code == "fusion-cost" and embeddings.stage == "cost"
        assert "model_type bert, opt_level 0" in embeddings.reason and "weightless copy" in embeddings.reason
        assert "'word_table', 'position_table', 'type_table'" in embeddings.reason
        assert "stayed a LayerNorm" in result.plan.advice[0]
    else:
        assert embeddings.folded and result.plan.advice == []
    # The optimizer itself, on the real graph, agrees (and the weightless copy changed nothing).
    optimized = optimizer.optimize_model(_bert_embeddings(positions_from, decomposed, residual), "bert", 0, 0, opt_level=0)
    assert any(n.op_type == "EmbedLayerNormalization" for n in optimized.model.graph.node) == fused


def test_embeddings_layer_norm_folds_once_the_optimizer_ran():
    """After the optimizer nothing is left to lose: its EmbedLayerNormalization has no RMS form
    and is reported as such, and no advice is given."""
    result = fold(MODELS / "bert_torchscript_ort_opt1.onnx")
    assert result.plan.advice == []
    assert "no RMSNorm counterpart" in result.plan.decisions[0].reason


@pytest.mark.parametrize(
    "name, model_type",
    [("bert_torchscript", "bert"), ("gpt2", "gpt2")],
)
def test_optimizer_first_loses_no_fusion(name, model_type, tmp_path):
    """ORT's optimized graph of optimize -> fold has the nodes of optimize alone, plus the nodes
    the plan states: the beta Add of a bias-free LM head (README "Known limits") and, in BERT, the
    explicit centerings and beta Adds of its post-LN SkipLayerNormalizations, whose CPU kernel
    costs more than they do; and folding first costs nothing for BERT since the fusion-costing LN
    is kept."""
    original = onnx.load(MODELS / f"{name}.onnx")
    optimized = optimize(original, model_type, tmp_path)
    opt_plan = fold(optimized)
    opt_then_fold = opt_plan.model_proto
    stated = 2 * len(opt_plan.plan.centerings) + sum(d.beta == "add" for d in opt_plan.plan.folded)
    fold_then_opt = optimize(fold(original).model_proto, model_type, tmp_path)
    n_opt = ort_optimized_nodes(optimized, tmp_path)
    n_opt_fold = ort_optimized_nodes(opt_then_fold, tmp_path)
    n_fold_opt = ort_optimized_nodes(fold_then_opt, tmp_path)
    assert n_opt_fold <= n_opt + max(1, stated)
    if name == "bert_torchscript":
        assert n_fold_opt == n_opt
        assert any(n.op_type == "EmbedLayerNormalization" for n in fold_then_opt.graph.node)
    else:  # the advice is right: folding first leaves 4 Reshape -> Gemm -> Reshape unconverted
        assert n_fold_opt > n_opt_fold
        advice = fold(original).plan.advice[0]
        found = re.search(r"leaves 4 more Gemm \((\d+) nodes from the original, (\d+) from the folded graph\)", advice)
        assert found and int(found[1]) < int(found[2]), advice


def test_no_advice_on_an_optimized_graph():
    for name in ("gpt2_ort_opt0", "gpt2_ort_opt1", "bert_ort_opt1"):
        assert fold(MODELS / f"{name}.onnx").plan.advice == [], name


# --- 2. fp16: fold then convert, or convert then fold ----------------------------------------


def to_fp16(model: onnx.ModelProto) -> onnx.ModelProto:
    with contextlib.redirect_stderr(io.StringIO()):
        return float16.convert_float_to_float16(model, keep_io_types=True)


def input_sets(name: str, count: int) -> list[dict[str, np.ndarray]]:
    from onnx_lnfold.feeds.synthesize import synthesize_inputs

    spec = ir.load(MODELS / f"{name}.onnx")
    sets = [dict(np.load(MODELS / f"{name}.inputs.npz"))]
    for seed in range(1, count):
        shapes = {
            v.name: tuple(d if isinstance(d, int) else (3 if i == 0 else 12) for i, d in enumerate(v.shape))
            for v in spec.graph.inputs
        }
        sets.append(synthesize_inputs(spec, shapes, seed=seed))
    return sets


def drift(model: onnx.ModelProto, reference: ort.InferenceSession, feeds_list) -> float:
    """Mean over input sets of max |diff| / max |ref| (worst output) against the fp32 original."""
    session = ort_session(model)
    per_set = []
    for feeds in feeds_list:
        got, ref = session.run(None, feeds), reference.run(None, feeds)
        per_set.append(max(float(np.abs(g.astype(np.float64) - r).max() / np.abs(r).max()) for g, r in zip(got, ref)))
    return float(np.mean(per_set))


@pytest.mark.parametrize("name", ["gpt2", "clip", "bloom", "whisper_encoder"])
def test_fp16_both_orders_fold_alike_and_drift_like_the_converted_original(name):
    """clip, bloom and whisper_encoder need an explicit centering: in an fp16 model it is done in
    fp16, for LNs that normalize in fp16 too. Fold-then-convert drifts as converting the
    original does (measured mean ratio 0.66-1.02 over 8 input sets and 10 models); convert-then-
    fold rounds the centered weights a second time (0.72-1.13)."""
    original = onnx.load(MODELS / f"{name}.onnx")
    # Priced at a batch of 512 (the image and audio stand-ins run 8 to 32 tokens per item, where the
    # centerings do not pay; the text ones are priced at the default anyway).
    shapes = {"clip": {"input_ids": (512, 8), "pixel_values": (512, 3, 32, 32)},
              "whisper_encoder": {"input_features": (512, 16, 64)}}.get(name)
    fp32 = fold(original, input_shapes=shapes)
    converted = to_fp16(original)
    convert_then_fold = fold(converted, input_shapes=shapes)
    assert [d.node for d in convert_then_fold.plan.folded] == [d.node for d in fp32.plan.folded]
    assert all(d.code == "costs-more" for d in fp32.plan.kept)  # an embeddings LN, a bias-free head
    assert len(convert_then_fold.plan.centerings) == len(fp32.plan.centerings)
    reference = ort_session(original)
    feeds_list = input_sets(name, 3)
    baseline = drift(converted, reference, feeds_list)
    assert drift(to_fp16(fp32.model_proto), reference, feeds_list) <= 1.15 * baseline
    assert drift(convert_then_fold.model_proto, reference, feeds_list) <= 1.25 * baseline


def _stream_with_relu_root(dtype, widen: bool) -> onnx.ModelProto:
    """x -> Linear -> Relu (a root no weight edit centers) -> two residual blocks with LNs; with
    `widen`, the fp16 stream is cast to fp32 before the LNs."""
    g = Graph(dtype=dtype)
    h = g.node("Relu", [g.linear(g.input("x", ["b", "s", 8], elem_type=onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))), 8, 16, "proj")])
    if widen:
        g16 = h
        h = g.node("Cast", [g16], to=onnx.TensorProto.FLOAT)
        g.dtype = np.float32
    n1 = g.ln(h, 16, "ln1")
    h2 = g.node("Add", [h, g.linear(n1, 16, 16, "mlp")], name="res")
    g.output(g.ln(h2, 16, "ln2"))
    return g.model(opset=20)


def test_fp16_explicit_centering_only_for_fp16_layer_norms():
    same = fold(_stream_with_relu_root(np.float16, widen=False))
    assert len(same.plan.folded) == 2 and len(same.plan.centerings) == 1
    # Widened to fp32 before the LNs: the fp16 Relu output is not centered for them; the fp32
    # residual sum before the second LN is (ORT runs that LN fused with its Add, and the centering
    # costs less than the fused kernel), an exact fp32 centering.
    widened = fold(_stream_with_relu_root(np.float16, widen=True))
    assert [c.tensor for c in widened.plan.centerings] == ["res_out"]
    assert [d.node for d in widened.plan.folded] == ["ln2"] and widened.plan.kept[0].code == "not-carried"
    assert widened.report.verification.status == "passed"


# --- 3. int8: quantize_dynamic after the fold ------------------------------------------------

quantization = pytest.importorskip("onnxruntime.quantization")


def quantize(model: onnx.ModelProto, tmp_path, **options) -> onnx.ModelProto:
    src, out = tmp_path / "fp32.onnx", tmp_path / "int8.onnx"
    onnx.save(model, src)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        quantization.quantize_dynamic(str(src), str(out), **options)
    return onnx.load(out)


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("name", ["bert", "clip"])
def test_int8_error_after_the_fold_stays_that_of_the_original(name, per_channel, tmp_path):
    """The int8 error of a folded model against the fp32 original is that of the quantized
    original within the spread of weight-rounding draws: exact re-centerings of the same weights
    move it by x0.7-1.6 (README "Deployment pipelines"); measured here x0.76-0.96."""
    original = onnx.load(MODELS / f"{name}.onnx")
    reference = ort_session(original)
    feeds_list = input_sets(name, 3)
    before = drift(quantize(original, tmp_path, per_channel=per_channel), reference, feeds_list)
    after = drift(quantize(fold(original).model_proto, tmp_path, per_channel=per_channel), reference, feeds_list)
    assert after <= 1.25 * before


def test_beta_folded_into_consumer_biases_stays_out_of_the_uint8_activation_range(tmp_path):
    """quantize_dynamic quantizes a MatMul's input per tensor to uint8. With beta folded into the
    consumer's bias (the default), an outlier beta channel no longer widens that range and
    `beta @ W` is added in float: the folded model quantizes better than the original."""
    g = Graph(seed=3)
    h = g.linear(g.input("x", ["b", "s", 32]), 32, 64, "proj")
    beta = g.rng.normal(0, 0.1, 64).astype(np.float32)
    beta[5] = 8.0  # an outlier channel, as trained LNs have
    n = g.node("LayerNormalization", [h, g.const("ln.gamma", (64,)), g.const("ln.beta", value=beta)], name="ln", epsilon=1e-5)
    g.output(g.linear(n, 64, 64, "mlp"))
    original = g.model()
    folded = fold(original)
    assert folded.plan.decisions[0].beta == "consumers"
    reference = ort_session(original)
    rng = np.random.default_rng(0)
    feeds_list = [{"x": rng.standard_normal((2, 16, 32)).astype(np.float32)} for _ in range(4)]
    before = drift(quantize(original, tmp_path), reference, feeds_list)
    after = drift(quantize(folded.model_proto, tmp_path), reference, feeds_list)
    assert after < 0.95 * before
