"""ONNX Runtime's own fusions decide which LNs stay for them (docs/DESIGN.md section 10): the
transformers optimizer's EmbedLayerNormalization (`fusion-cost`) and a session's fusions that a fold
would lose (`fusion-lost`), both run on weightless copies of the graph.

Models: the committed BERT exports, `models/make/export_fusion_models.py` (DistilBERT, GPT-Neo, a
Pegasus decoder, a small TorchScript Whisper encoder) and graphs built in code (tests/graphs.py).
"""

from __future__ import annotations

import contextlib
import io
import sys
import tempfile
import uuid
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest

import onnx_lnfold
from onnx_lnfold.analysis import edits
from onnx_lnfold.bench import session_graph
from onnx_lnfold.load.model import load_model
from onnx_lnfold.ort_fusions import fusion_cost, prefilter
from onnx_lnfold.ort_fusions.session_layout import moved_centerings
from onnx_lnfold.ort_fusions.weightless import KEEP_BYTES, ZEROS_FILE, WeightlessFolder, weightless_clone
from onnx_lnfold.report.kept import explain_kept

from conftest import MODELS
from graphs import bert_attention_block, gelu_stem_stream

optimizer = pytest.importorskip("onnxruntime.transformers.optimizer")


def session_ops(model: onnx.ModelProto | str, tmp_path) -> Counter:
    """Op types (contrib ops as `com.microsoft::Op`) of the graph an ORT_ENABLE_ALL CPU session runs."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    out = tmp_path / "session_optimized.onnx"
    options.optimized_model_filepath = str(out)
    source = model if isinstance(model, str) else model.SerializeToString()
    ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
    graph = onnx.load(str(out), load_external_data=False).graph
    return Counter(f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in graph.node)


def optimized(model: onnx.ModelProto | str, model_type: str = "bert", opt_level: int = 0) -> tuple[int, int]:
    """(nodes, EmbedLayerNormalization nodes) after `optimize_model` with the committed models'
    4 heads and hidden size 64. Opt level 1 is composed as `optimize_model` composes it (a
    basic-level CPU session without ConstantSharing, then `optimize_by_fusion`): its own
    `optimize_by_onnxruntime` imports torch, which the test environment need not have."""
    if opt_level == 1:
        with tempfile.TemporaryDirectory() as scratch:
            # beside a model file: the session's output refers to its external data by relative path
            folder = Path(model).parent if isinstance(model, str) else Path(scratch)
            out = folder / f"o1-{uuid.uuid4().hex}.onnx"
            options = ort.SessionOptions()
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
            options.log_severity_level = 3
            options.optimized_model_filepath = str(out)
            source = model if isinstance(model, str) else model.SerializeToString()
            try:
                ort.InferenceSession(source, options, providers=["CPUExecutionProvider"],
                                     disabled_optimizers=["ConstantSharing"])
                model = onnx.load(str(out))
            finally:
                out.unlink(missing_ok=True)
        opt_level = 0
    with contextlib.redirect_stdout(io.StringIO()):
        result = optimizer.optimize_model(model, model_type, 4, 64, opt_level=opt_level)
    nodes = result.model.graph.node
    return len(nodes), sum(n.op_type == "EmbedLayerNormalization" for n in nodes)


# --- weightless copies ---------------------------------------------------------------------------


def test_a_weightless_copy_refers_to_one_sparse_file_of_zeros_and_touches_no_weight():
    model, _ = load_model(MODELS / "bert_torchscript.onnx")
    tensors = {name: value.const_value for name, value in model.graph.initializers.items()}
    with WeightlessFolder() as folder:
        path = folder.write(weightless_clone(model, folder), "copy.onnx")
        proto = onnx.load(str(path), load_external_data=False)
        zeros = folder.path / ZEROS_FILE
        external = [t for t in proto.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
        inline = [t for t in proto.graph.initializer if t.data_location != onnx.TensorProto.EXTERNAL]
        assert len(external) == 15 and len(inline) == 24  # the 2-D weights; gammas, betas, biases, shapes
        for t in external:
            info = {e.key: e.value for e in t.external_data}
            assert (info["location"], info["offset"]) == (ZEROS_FILE, "0")
        integer = (onnx.TensorProto.INT64, onnx.TensorProto.INT32)
        assert all(t.data_type in integer or len(t.raw_data) <= KEEP_BYTES for t in inline)
        largest = max(int(dict((e.key, e.value) for e in t.external_data)["length"]) for t in external)
        assert zeros.stat().st_size == largest == 512 * 64 * 4  # the word table
        assert zeros.stat().st_blocks * 512 < zeros.stat().st_size  # sparse: made with truncate
        assert path.stat().st_size < 0.1 * (MODELS / "bert_torchscript.onnx").stat().st_size
    assert all(model.graph.initializers[name].const_value is t for name, t in tensors.items())


def _as_constant_node(model: ir.Model) -> ir.Model:
    """`model` with its largest initializer made by a Constant node instead."""
    name = max(model.graph.initializers, key=lambda n: model.graph.initializers[n].const_value.nbytes)
    value = model.graph.initializers.pop(name)
    tensor, value.const_value = value.const_value, None
    model.graph.insert_before(model.graph.node(0), ir.Node("", "Constant", [], {"value": ir.AttrTensor("value", tensor)}, outputs=[value]))
    value.const_value = tensor  # as onnx-ir's loader gives a Constant's output
    return model


@pytest.mark.parametrize(
    "name",
    ["bert_torchscript", "gpt2_merged_decoder", "clip_fp16", "adaln_torchscript", "bert_qdq_int8", "bert_dynamic_int8",
     "bert_matmul_nbits_int4", "constant"],
)
def test_the_original_written_without_a_clone_is_the_stripped_clone_written(name):
    """`write_stripped` swaps the model's constants for their stand-ins while it serializes, and
    puts them back: the file is the stripped clone's, byte for byte, and the model is as it was."""
    if name == "constant":  # a large Constant node's value, swapped in its attribute and its output
        model = _as_constant_node(load_model(MODELS / "gpt2.onnx")[0])
    else:
        model, _ = load_model(MODELS / f"{name}.onnx")
    before = ir.to_proto(model).SerializeToString()
    tensors = {name: value.const_value for name, value in model.graph.initializers.items()}
    attributes = {id(node): dict(node.attributes) for node in model.graph.all_nodes()}
    with WeightlessFolder() as folder:
        written = folder.write_stripped(model, "original.onnx").read_bytes()
        assert folder.stripped_bytes > 0
        assert written == folder.write(weightless_clone(model, folder), "clone.onnx").read_bytes()
    assert all(model.graph.initializers[name].const_value is t for name, t in tensors.items())
    assert all(
        all(node.attributes[key] is attr for key, attr in attributes[id(node)].items()) for node in model.graph.all_nodes()
    )
    assert ir.to_proto(model).SerializeToString() == before


@pytest.mark.parametrize("name", ["bert_torchscript", "distilbert_torchscript", "whisper_encoder_torchscript", "gpt2"])
def test_zeros_change_none_of_onnx_runtimes_decisions(name, tmp_path):
    """The session's and the transformers optimizer's graphs of the weightless copy have the op
    counts of the real model's (docs/DESIGN.md section 10)."""
    model, _ = load_model(MODELS / f"{name}.onnx")
    with WeightlessFolder() as folder:
        copy = str(folder.write(weightless_clone(model, folder), "copy.onnx"))
        assert session_ops(copy, tmp_path) == session_ops(str(MODELS / f"{name}.onnx"), tmp_path)
        for level in (0, 1):
            assert optimized(copy, opt_level=level) == optimized(str(MODELS / f"{name}.onnx"), opt_level=level)


# --- EmbedLayerNormalization: what the transformers optimizer fuses ---------------------------------


@pytest.mark.parametrize(
    "name, folded, fused_by_ort, nodes",
    [
        # dynamo BERT: positions sized by the attention mask; the optimizer fuses no embedding
        ("bert", ["node_layer_norm"], False, (113, 114)),
        ("bert_ort_opt0", ["node_layer_norm"], False, (113, 114)),
        ("bert_ort_opt1", ["node_layer_norm"], False, (115, 116)),
        # TorchScript BERT and DistilBERT: fused (with the model's num_heads, as users pass it)
        ("bert_torchscript", [], True, (56, 56)),
        ("distilbert_torchscript", [], True, (29, 29)),
    ],
)
def test_the_embeddings_ln_stays_exactly_where_onnx_runtime_fuses_it(name, folded, fused_by_ort, nodes):
    path = MODELS / f"{name}.onnx"
    # Every LN that folds exactly without explicit centerings (the cost rule is
    # tests/decide/test_beta_placement.py's): the fusion rule alone.
    result = onnx_lnfold.fold(path, verify=False, fold_costly=True, auxiliary_centering=False)
    embeddings = result.plan.decisions[0]
    assert [d.node for d in result.plan.folded] == folded
    assert (embeddings.code == "fusion-cost") == fused_by_ort
    # ORT's own node counts after optimize_model (model_type bert, opt_level 0) of the original
    # and of the fold: the same EmbedLayerNormalization count, so the fold lost no fusion.
    original, after_fold = optimized(str(path)), optimized(result.model_proto)
    assert (original[0], after_fold[0]) == nodes
    assert original[1] == after_fold[1] == int(fused_by_ort)
    if fused_by_ort:
        assert embeddings.stage == "cost" and "into com.microsoft::EmbedLayerNormalization" in embeddings.reason
        assert "opt_level 0, num_heads 4, hidden_size 64; onnxruntime " in embeddings.reason
        assert "stayed a LayerNorm" in result.plan.advice[0]
        # without the check the fold costs the optimizer its fusion (+2 to +5 nodes)
        unchecked = onnx_lnfold.fold(path, verify=False, keep_ort_fusions=False, fold_costly=True, auxiliary_centering=False)
        assert unchecked.plan.decisions[0].folded
        lost = optimized(unchecked.model_proto)
        assert lost[1] == 0 and lost[0] > nodes[0]
    else:
        assert all("EmbedLayerNormalization" not in advice for advice in result.plan.advice)


@pytest.mark.parametrize("name", ["gpt_neo", "pegasus_decoder"])
def test_embedding_sums_the_optimizer_leaves_alone_fold(name):
    """GPT-Neo and the Pegasus decoder read their embedding sum with an LN (the structural
    likeness of ORT's matcher that the fold used to trust); the optimizer fuses none of them."""
    plan = onnx_lnfold.analyze(MODELS / f"{name}.onnx", fold_costly=True)
    assert prefilter.embedding_sums(_candidates(MODELS / f"{name}.onnx"))  # the pre-filter let ORT decide
    assert len(plan.folded) == len(plan.decisions) == 5 and plan.advice == []
    for model_type, level in fusion_cost.EMBED_RUNS:
        assert optimized(str(MODELS / f"{name}.onnx"), model_type, level)[1] == 0


def _candidates(path):
    from onnx_lnfold.analysis.planner import candidates
    from onnx_lnfold.shapes.table import ShapeTable

    model, _ = load_model(path)
    return candidates(model, ShapeTable(model))


# --- session fusions a fold would lose ------------------------------------------------------------


def test_a_fold_that_would_lose_a_session_fusion_keeps_its_ln(tmp_path):
    """ONNX Runtime's session AttentionFusion starts from a LayerNormalization: folding the LN
    under a BERT attention block costs the Attention op."""
    model = bert_attention_block()
    assert session_ops(model, tmp_path)["com.microsoft::Attention"] == 1
    result = onnx_lnfold.fold(model, fold_costly=True)  # the LN's beta would stay an Add: the fusion rule alone
    (decision,) = result.plan.decisions
    assert not decision.folded and (decision.code, decision.stage) == ("fusion-lost", "cost")
    assert decision.reason.startswith(
        "kept: folding it would cost ONNX Runtime's Attention fusion at 'context_reshape' (the fused pattern "
        "reads its output): an onnxruntime "
    )
    assert decision.blocking_tensor == "context_reshape"
    assert result.report.to_dict()["decisions"][0]["code"] == "fusion-lost"
    # with the check off the LN would fold, and the session would lose its Attention
    unchecked = onnx_lnfold.fold(model, keep_ort_fusions=False, fold_costly=True)
    assert len(unchecked.plan.folded) == 1 and unchecked.report.verification.status == "passed"
    assert session_ops(unchecked.model_proto, tmp_path)["com.microsoft::Attention"] == 0


def test_the_explicit_centering_goes_after_the_gelu_so_its_fusion_stays(tmp_path, monkeypatch):
    """A TorchScript GELU ends `* 0.5`: the centering after it keeps ONNX Runtime's (Bias)Gelu
    fusion; inside it (on the product, as the fold used to place it) it costs the fusion, and the
    check keeps both LNs it would unlock."""
    model = gelu_stem_stream()
    result = onnx_lnfold.fold(model)
    assert len(result.plan.folded) == 2 and result.report.verification.status == "passed"
    assert [c.tensor for c in result.plan.centerings] == ["gelu/half_out"]
    before, after = session_ops(model, tmp_path), session_ops(result.model_proto, tmp_path)
    assert before["com.microsoft::BiasGelu"] == after["com.microsoft::BiasGelu"] == 1

    monkeypatch.setattr(edits, "centering_site", lambda value, axis, uses, names=None, shapes=None: (value, axis, uses))
    inside = onnx_lnfold.fold(model)
    assert not inside.plan.folded
    assert {(d.code, d.stage) for d in inside.plan.decisions} == {("fusion-lost", "cost")}
    assert "BiasGelu fusion at 'gelu/half' (its explicit centering reads 'gelu/mul_out', inside the fused pattern)" in (
        inside.plan.decisions[0].reason
    )
    unchecked = onnx_lnfold.fold(model, keep_ort_fusions=False, fold_costly=True)
    assert [c.tensor for c in unchecked.plan.centerings] == ["gelu/mul_out"]
    assert session_ops(unchecked.model_proto, tmp_path)["com.microsoft::BiasGelu"] == 0


def test_a_fusion_that_took_in_a_decomposed_lns_gamma_is_not_a_loss(tmp_path):
    """A decomposed LN with a scalar gamma: ONNX Runtime leaves the normalization as it is and
    makes the gamma Mul the alpha of the next MatMul (FusedMatMul). The fold puts gamma into the
    RMS op's scale, so that fused node goes, and nine nodes with it: nothing is lost, the LN folds
    (found by the fuzz graphs)."""
    from graphs import Graph, decomposed_ln

    g = Graph(seed=3)
    normalized = decomposed_ln(g, g.linear(g.input("x", ["b", "s", 16]), 16, 16, "proj"), 16, "ln", divide="Reciprocal", affine=False)
    scaled = g.node("Mul", [normalized, g.const("ln.gamma", value=np.array([1.7], np.float32))], name="ln/gamma")
    g.output(g.linear(scaled, 16, 16, "out", bias=False))
    model = g.model()
    result = onnx_lnfold.fold(model)
    assert [d.folded for d in result.plan.decisions] == [True] and result.report.verification.status == "passed"
    before, after = session_ops(model, tmp_path), session_ops(result.model_proto, tmp_path)
    assert (before["com.microsoft::FusedMatMul"], after["com.microsoft::FusedMatMul"]) == (1, 0)
    assert sum(after.values()) < sum(before.values()) - 5


def test_the_torchscript_whisper_encoder_keeps_its_gelu_fusions(tmp_path):
    path = MODELS / "whisper_encoder_torchscript.onnx"
    result = onnx_lnfold.fold(path, fold_costly=True)
    assert len(result.plan.folded) == len(result.plan.decisions) == 5
    # after the stem's `* 0.5`, past its Transpose and its position table's Add, over the last axis
    # (analysis.edits.centering_site)
    assert [(c.tensor, c.axis) for c in result.plan.centerings] == [("/model/Add_2_output_0", 2)]
    assert result.report.verification.status == "passed"
    before, after = session_ops(str(path), tmp_path), session_ops(result.model_proto, tmp_path)
    assert before["com.microsoft::Gelu"] == after["com.microsoft::Gelu"] == 2


def _session_nodes(model: str | onnx.ModelProto, tmp_path, tag: str) -> tuple[dict[str, str], dict[str, str]]:
    """(name -> op of every node, the normalization group's roles) of the graph ONNX Runtime runs
    (ORT_ENABLE_ALL, CPU)."""
    if isinstance(model, onnx.ModelProto):
        onnx.save(model, tmp_path / f"{tag}.onnx")
        model = str(tmp_path / f"{tag}.onnx")
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / f"{tag}.optimized.onnx")
    options.log_severity_level = 3
    ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    graph = onnx.load(options.optimized_model_filepath).graph
    return {n.name: n.op_type for n in graph.node}, session_graph.norm_roles(graph)


@pytest.mark.parametrize("name", ["whisper_encoder_torchscript", "stablelm_qk_torchscript"])
def test_onnx_runtime_runs_every_node_outside_the_norms_as_it_did(name, tmp_path):
    """What a fold changes in the graph ONNX Runtime runs is what it prices: outside the
    normalization group the fold's session runs the original's nodes, by name and op. Shapes the
    fold declared for its new tensors had told the optimizer more than it knew of the original:
    with the input's symbolic batch dim, ReshapeFusion folded Whisper's attention Reshape shapes in
    the fold only (and the memory plan that followed slowed the trained encoder's MatMuls:
    benchmarks/results/profile_diff/WHOLE_RUN.md); with dims as numbers, StableLM's q/k Slices
    became Splits in the fold only."""
    path = MODELS / f"{name}.onnx"
    result = onnx_lnfold.fold(path, fold_costly=True, verify=False)
    assert result.plan.folded
    nodes, roles = {}, {}
    nodes["original"], roles["original"] = _session_nodes(str(path), tmp_path, "original")
    nodes["folded"], roles["folded"] = _session_nodes(result.model_proto, tmp_path, "folded")
    shared, alone = session_graph.split_nodes(nodes, roles)
    assert alone == {"original": {}, "folded": {}}
    matmuls = {name for name, op in nodes["original"].items() if op == "MatMul"}
    assert matmuls and matmuls <= shared


def _ran_reduce_mean(model: onnx.ModelProto, tmp_path) -> tuple[onnx.GraphProto, list[str], list[int]]:
    """The session's optimized graph (ORT_ENABLE_ALL, CPU) of `model`, and the input and axes of its
    one ReduceMean."""
    import onnxruntime as ort

    folded, optimized = tmp_path / "folded.onnx", tmp_path / "optimized.onnx"
    onnx.save(model, folded)
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(optimized)
    options.log_severity_level = 3
    ort.InferenceSession(str(folded), options, providers=["CPUExecutionProvider"])
    graph = onnx.load(str(optimized)).graph
    [ran] = [n for n in graph.node if n.op_type == "ReduceMean"]
    return graph, list(ran.input), {a.name: onnx.helper.get_attribute_value(a) for a in ran.attribute}["axes"]


def test_onnx_runtime_runs_the_centering_past_the_stem_add_on_the_last_axis_and_one_right_past_the_transpose_strided(
    tmp_path, monkeypatch
):
    """What `analysis.edits.centering_site` and `decide.pricing.centering_kind` rest on, on the
    Whisper stem (Gelu -> Transpose -> + position table): a centering written past the Add runs
    where written; one written right past the Transpose runs as a ReduceMean over axis 1 of the
    Gelu's output, the Transpose pushed down past the Sub (`session_layout.moved_centerings` reads
    that off the session's graph). Should ONNX Runtime change either, this fails and the placement
    and the pricing must follow."""
    path = MODELS / "whisper_encoder_torchscript.onnx"
    result = onnx_lnfold.fold(path, fold_costly=True, verify=False)
    graph, inputs, axes = _ran_reduce_mean(result.model_proto, tmp_path)
    assert (inputs, axes) == (["/model/Add_2_output_0"], [2])
    assert moved_centerings(result.plan.centerings, graph) == set()

    monkeypatch.setattr(edits, "_past_added_constants", lambda value, uses, shapes, readers: (value, uses))
    past_transpose = onnx_lnfold.fold(path, fold_costly=True, verify=False)
    [mean] = [n for n in past_transpose.model_proto.graph.node if n.op_type == "ReduceMean"]
    written = {a.name: onnx.helper.get_attribute_value(a) for a in mean.attribute}
    assert (list(mean.input), written["axes"]) == (["/model/Transpose_output_0"], [2])
    graph, inputs, axes = _ran_reduce_mean(past_transpose.model_proto, tmp_path)
    assert (inputs, axes) == (["/model/Mul_3_output_0"], [1])  # the Gelu's output, before the Transpose
    assert moved_centerings(past_transpose.plan.centerings, graph) == {"/model/Transpose_output_0"}


def test_a_centering_the_session_moves_off_the_written_axis_is_priced_where_it_runs(monkeypatch):
    """The cost rule's own layout rules aside (here: every centering priced as written), the plan is
    made again once the folded copy's session is seen running a centering elsewhere: written right
    past the Whisper stem's Transpose and priced as a last-axis centering, the fold of 4 LNs pays at
    a batch of 4 (128 tokens); run strided, as the session runs it, it costs more and they stay."""
    from onnx_lnfold.analysis import fold_set, planner

    def as_written(value, axis, shapes):
        return "StridedCentering" if value.name in shapes.moved_centerings else "Centering"

    monkeypatch.setattr(edits, "_past_added_constants", lambda value, uses, shapes, readers: (value, uses))
    monkeypatch.setattr(fold_set, "centering_kind", as_written)
    monkeypatch.setattr(planner, "centering_kind", as_written)
    path, shapes = MODELS / "whisper_encoder_torchscript.onnx", {"input_features": (4, 16, 64)}
    unchecked = onnx_lnfold.analyze(path, input_shapes=shapes, keep_ort_fusions=False)
    assert len(unchecked.folded) == 4 and [c.tensor for c in unchecked.centerings] == ["/model/Transpose_output_0"]
    checked = onnx_lnfold.analyze(path, input_shapes=shapes)
    assert {d.code for d in checked.kept} == {"centering-costs-more", "costs-more"} and not checked.folded


def test_the_analysis_stays_pure_and_runs_onnx_runtime_once_per_graph(monkeypatch):
    model = ir.from_proto(bert_attention_block())
    # A first analysis names the unnamed Constant tensor; from then on an analysis changes nothing.
    onnx_lnfold.analyze(model, keep_ort_fusions=False)
    before = ir.to_proto(model).SerializeToString()
    fusion_cost.clear_cache()
    calls = []
    session = fusion_cost.session_graph
    monkeypatch.setattr(fusion_cost, "session_graph", lambda path, folder: calls.append(path.name) or session(path, folder))
    first = onnx_lnfold.analyze(model, fold_costly=True)
    assert calls == ["original.onnx", "folded.onnx"]
    assert onnx_lnfold.analyze(model, fold_costly=True).to_dict() == first.to_dict() and len(calls) == 2  # cached
    assert ir.to_proto(model).SerializeToString() == before


# --- without onnxruntime -----------------------------------------------------------------------------


def test_without_onnxruntime_everything_folds_and_the_advice_says_nothing_was_checked(monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime.transformers.optimizer", None)  # `import` raises ImportError
    plan = onnx_lnfold.analyze(MODELS / "bert_torchscript.onnx", fold_costly=True, auxiliary_centering=False)
    assert [d.node for d in plan.folded] == ["/model/embeddings/LayerNorm/LayerNormalization"]
    assert plan.advice == [
        "Fusions: not checked (onnxruntime (with its transformers optimizer) is not installed): folding may cost "
        "fusions that ONNX Runtime's transformers optimizer (onnxruntime.transformers.optimizer.optimize_model) or "
        "a session would make on the original; run the optimizer first, then fold the optimized model."
    ]
    fold_pass = onnx_lnfold.LnFoldPass(fold_costly=True)
    fold_pass(ir.from_proto(bert_attention_block()))
    assert len(fold_pass.plan.folded) == 1 and fold_pass.plan.advice[0].startswith("Fusions: not checked")


def test_switched_off_nothing_is_checked_and_nothing_is_said():
    plan = onnx_lnfold.analyze(MODELS / "bert_torchscript.onnx", keep_ort_fusions=False, fold_costly=True, auxiliary_centering=False)
    assert len(plan.folded) == 1 and plan.advice == []


# --- the report ------------------------------------------------------------------------------------------


def test_the_grouped_headline_of_a_fusion_reason_keeps_its_apostrophes():
    report = onnx_lnfold.fold(MODELS / "bert_torchscript.onnx", verify=False).report
    text = report.format_text()
    assert "Runtime'...'" not in text
    assert (
        "  1 kept: (fusion-cost) ONNX Runtime's transformers optimizer fuses it into EmbedLayerNormalization,\n"
        "    which has no RMS form: run the optimizer first\n"
        "      /model/embeddings/LayerNorm/LayerNormalization\n"
        "          onnxruntime.transformers.optimizer.optimize_model;"
    ) in text


def test_a_code_without_a_heading_of_its_own_is_headed_by_its_meaning():
    from onnx_lnfold.analysis.plan import LnDecision
    from onnx_lnfold.core.blocked import CODES, Blocked

    reason = "kept: ONNX Runtime's fusion reads 'a.weight' and 'b' (the graph's own)"
    decision = LnDecision("ln", "LayerNormalization", "kept", 2, 1e-5, blocked=Blocked("internal", reason, stage="cost"))
    assert explain_kept(decision) == (f"(internal) {CODES['internal']}", reason)


# --- slow: the Whisper tiny.en TorchScript encoder ---------------------------------------------------------


@pytest.mark.slow
def test_whisper_tiny_torchscript_encoder_folds_without_losing_a_gelu(tmp_path):
    """WhisperModel.encoder at tiny.en sizes (d_model 384, 4 layers, 6 heads, 80 mel bins),
    perturbed weights, exported by the TorchScript exporter at opset 17: the fold used to center
    the conv stem's GELU product and cost ONNX Runtime one Gelu fusion (Gelu 2 -> 1)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    sys.path.insert(0, str(MODELS / "make"))
    from export_models import perturb, seed_for

    cfg = transformers.WhisperConfig(
        d_model=384, encoder_layers=4, encoder_attention_heads=6, decoder_layers=4, decoder_attention_heads=6,
        num_mel_bins=80, encoder_ffn_dim=1536, decoder_ffn_dim=1536, vocab_size=51864, max_source_positions=1500,
        attn_implementation="eager",
    )
    encoder = transformers.WhisperModel(cfg).get_encoder().eval()
    torch.manual_seed(seed_for("whisper_tiny_ts"))
    perturb(encoder, seed_for("whisper_tiny_ts"))

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = encoder

        def forward(self, features):
            return self.encoder(features, return_dict=True).last_hidden_state

    path = tmp_path / "whisper_tiny_en_encoder.onnx"
    with contextlib.redirect_stderr(io.StringIO()):
        torch.onnx.export(
            Encoder().eval(), (torch.randn(1, 80, 3000),), str(path), dynamo=False, opset_version=17,
            input_names=["input_features"], output_names=["last_hidden_state"],
            dynamic_axes={"input_features": {0: "batch"}, "last_hidden_state": {0: "batch"}},
        )
    result = onnx_lnfold.fold(path, input_shapes={"input_features": (1, 80, 3000)})
    assert len(result.plan.folded) == len(result.plan.decisions) == 9
    assert [c.tensor for c in result.plan.centerings] == ["/encoder/Mul_3_output_0"]
    assert result.report.verification.status == "passed"
    before, after = session_ops(str(path), tmp_path), session_ops(result.model_proto, tmp_path)
    assert before["com.microsoft::Gelu"] == after["com.microsoft::Gelu"] == 2
    assert np.isfinite(result.report.verification.max_rel_diff)


def test_a_large_model_is_optimized_in_a_child_that_reads_only_what_it_asks_for(monkeypatch):
    """Above `CHILD_ABOVE_BYTES` of weights the transformers optimizer runs in a child process (in
    the weightless copy's folder, so it loads only the zeros it reads): same decisions."""
    from onnx_lnfold.ort_fusions import probe

    expected = onnx_lnfold.analyze(MODELS / "distilbert_torchscript.onnx").to_dict()
    fusion_cost.clear_cache()
    monkeypatch.setattr(fusion_cost, "CHILD_ABOVE_BYTES", 0)
    started = []
    popen = probe.subprocess.Popen
    monkeypatch.setattr(probe.subprocess, "Popen", lambda *a, **k: started.append(k["cwd"]) or popen(*a, **k))
    assert onnx_lnfold.analyze(MODELS / "distilbert_torchscript.onnx").to_dict() == expected
    assert len(started) == 1  # one child for every run of the analysis
    assert expected["decisions"][0]["code"] == "fusion-cost"
    # the child sends the optimizer's output back whole (its large tensors as references), which
    # the optimizer-first count analyzes
    assert (expected["optimizer_first"]["folded"], expected["optimizer_first"]["at_least"]) == (4, True)


_ECHO_CHILD = """
import json, struct, sys
import onnx
out = sys.stdout.buffer
for line in sys.stdin:
    source, model_type, heads, hidden = json.loads(line)
    if model_type == "fail":
        reply = b"ER" + b"ValueError: no such model_type"
    else:
        reply = b"OK" + onnx.helper.make_model(onnx.helper.make_graph([], model_type, [], [])).SerializeToString()
    out.write(struct.pack(">Q", len(reply)) + reply)
    out.flush()
"""


def test_the_optimizer_child_answers_jobs_sent_ahead_in_any_order(monkeypatch, tmp_path):
    """Jobs are sent ahead (`submit`) and their answers asked for in any order (`result`): each
    gets its own answer, a failed job raises for that job alone, and closing with answers unread
    does not wait on the child."""
    from onnx_lnfold.ort_fusions import probe

    monkeypatch.setattr(probe, "_CHILD", _ECHO_CHILD)
    child = probe.OptimizerProcess(tmp_path)
    jobs = [child.submit(tmp_path / "m.onnx", kind, 0, 0) for kind in ("bert", "fail", "bart", "gpt2")]
    assert child.result(jobs[2]).graph.name == "bart"
    assert child.result(jobs[0]).graph.name == "bert"
    with pytest.raises(RuntimeError, match="no such model_type"):
        child.result(jobs[1])
    assert child.run(tmp_path / "m.onnx", "t5", 0, 0).graph.name == "t5"  # after an unread answer (gpt2)
    assert child.result(jobs[3]).graph.name == "gpt2"  # read on the way to t5's, and kept
    child.submit(tmp_path / "m.onnx", "bert", 0, 0)
    child.close()  # returns though that answer is unread
    with pytest.raises(RuntimeError, match="without an answer"):
        child.result(5)


def test_the_childs_allocator_settings_join_the_tunables_already_set():
    """A user's own glibc tunables reach the child; where they name one of ours, theirs wins."""
    from onnx_lnfold.ort_fusions.session_save import ALLOCATOR_TUNABLES, child_env

    assert child_env({"A": "1"}) == {"A": "1", "GLIBC_TUNABLES": ":".join(ALLOCATOR_TUNABLES)}
    theirs = "glibc.malloc.mmap_max=8:glibc.malloc.arena_max=2"
    got = child_env({"GLIBC_TUNABLES": theirs})["GLIBC_TUNABLES"].split(":")
    assert "glibc.malloc.mmap_max=8" in got and "glibc.malloc.arena_max=2" in got
    assert "glibc.malloc.mmap_max=0" not in got and ALLOCATOR_TUNABLES[1] in got


def test_a_large_copys_session_graph_is_written_by_a_child_whose_allocator_keeps_its_pages(monkeypatch):
    """Past `SESSION_CHILD_ABOVE_BYTES` of zeros the session's optimized model is written by a child
    process (`session_save`, glibc told to keep what it frees): the same graph as in this process,
    and a session that fails there raises here with ONNX Runtime's own message."""
    from onnx_lnfold.ort_fusions import probe, session_save

    model, _ = load_model(MODELS / "whisper_encoder_torchscript.onnx")
    runs = []
    run = probe.subprocess.run
    monkeypatch.setattr(probe.subprocess, "run", lambda cmd, **k: runs.append(k["env"]) or run(cmd, **k))
    with WeightlessFolder() as folder:
        path = folder.write(weightless_clone(model, folder), "copy.onnx")
        here = probe.session_graph(path, folder)
        assert runs == []
        monkeypatch.setattr(probe, "SESSION_CHILD_ABOVE_BYTES", 0)
        there = probe._graph_only(probe._optimized_by_session(path, folder, "ORT_ENABLE_ALL", "child"))
        assert [n.SerializeToString() for n in there.node] == [n.SerializeToString() for n in here.node]
        assert len(runs) == 1
        assert set(session_save.ALLOCATOR_TUNABLES) <= set(runs[0]["GLIBC_TUNABLES"].split(":"))
        monkeypatch.setattr(probe, "SESSION_CHILD_ABOVE_BYTES", -1)  # a copy without zeros too
        x, y = (onnx.helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [2]) for n in "xy")
        unknown = onnx.helper.make_graph([onnx.helper.make_node("NoSuchOp", ["x"], ["y"])], "g", [x], [y])
        onnx.save(onnx.helper.make_model(unknown), folder.path / "broken.onnx")
        with pytest.raises(RuntimeError, match="NoSuchOp"):
            probe._optimized_by_session(folder.path / "broken.onnx", folder, "ORT_ENABLE_ALL", "broken")


def test_the_clone_is_let_go_before_the_folded_session_is_waited_for(monkeypatch):
    """The caller's `meanwhile`, run while ONNX Runtime makes the folded copy's session, finds the
    weightless clone the plan was applied to unreachable: a collection there frees it."""
    import gc
    import weakref

    from onnx_lnfold._pipeline import analyze_for_target
    from onnx_lnfold.core.options import FoldOptions

    fusion_cost.clear_cache()
    clones: list[weakref.ref] = []
    real = fusion_cost.weightless_clone
    monkeypatch.setattr(fusion_cost, "weightless_clone", lambda *a: clones.append(weakref.ref(c := real(*a))) or c)
    alive: list[bool] = []

    def meanwhile() -> None:
        gc.collect()
        alive.extend(ref() is not None for ref in clones)

    model, _ = load_model(MODELS / "gpt2.onnx")
    _, bound = analyze_for_target(model, FoldOptions(), meanwhile=meanwhile)
    assert bound.plan.folded and clones and alive == [False] * len(clones)
