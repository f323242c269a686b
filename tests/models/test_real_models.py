"""Graphs real exporters produce: the committed models in models/ (made by models/make/export_models.py)."""

import subprocess
import sys

import numpy as np
import onnx
import pytest

import onnx_lnfold
from onnx_lnfold.verify.sessions import run_model

from conftest import MODELS
from graphs import assert_equivalent, assert_fold_count, ops

# name: (folded, total, fragment of the reason every kept LN gives)
COSTS_MORE = "costs more than LayerNormalization on ONNX Runtime's CPU EP"
EXPECTED = {
    "gpt2": (5, 5, None),
    # The stream is exposed after the embeddings and after the first block: that block's two LNs
    # stay; the three behind hidden_states_1 (second block, ln_f) fold through one explicit
    # centering of it, which the exposed tensor does not see.
    "gpt2_hidden_states": (3, 5, "is inserted (an explicit centering), and that centering costs"),
    # Post-LN: the embeddings LN's beta would stay an Add (it feeds a residual Add): kept, it costs
    # less. Each other LN folds through an explicit centering of the LN output before it: ORT runs
    # it fused with its residual Add as SkipLayerNormalization, whose CPU kernel costs more than
    # the centering, the Add, SimplifiedLayerNormalization and beta's Add together.
    "bert": (4, 5, COSTS_MORE),
    "opt_pre_ln": (4, 5, COSTS_MORE),  # the final LN: its beta would stay an Add before the tied LM head
    # Post-LN: the two LNs ORT runs fused with their residual Add fold through one explicit
    # centering each (the first one's residual sum, whose projection the attention reads too; the
    # LN output before the second); the other two stay for their beta.
    "opt_post_ln": (2, 4, COSTS_MORE),
    "gpt_neox": (5, 5, None),
    # One explicit centering of the embeddings LN output; that LN itself is kept: its beta would
    # stay an Add.
    "bloom": (5, 6, COSTS_MORE),
    "vit": (5, 5, None),
    # Coverage of other producers of ONNX graphs (models/make/export_coverage_models.py).
    "gpt2_ort_opt0": (5, 5, None),  # ORT transformers optimizer: 4 SkipLayerNormalization
    "gpt2_ort_opt1": (5, 5, None),
    "bert_ort_opt0": (4, 5, COSTS_MORE),
    "bert_ort_opt1": (4, 5, COSTS_MORE),
    "bert_torchscript_ort_opt1": (4, 5, "no RMSNorm counterpart"),  # EmbedLayerNormalization, then post-LN as bert
    "gpt2_torchscript_opset14": (4, 5, COSTS_MORE),  # decomposed LNs; ORT fuses none with its residual Add
    "convnext_block": (0, 5, None),  # depthwise convs and layer scale break the chains
    # Priced per item (32 frames: this stand-in's static shape), where the explicit centering of the
    # conv stem's GELU output does not pay (it folded 5/5 through it at the 8192-token default).
    "whisper_encoder": (0, 5, None),
}
NORMALIZATIONS = ("LayerNormalization", "SkipLayerNormalization", "EmbedLayerNormalization")
RMS = ("SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization")


@pytest.fixture(scope="module", params=sorted(EXPECTED))
def folded(request):
    name = request.param
    return name, onnx_lnfold.fold(MODELS / f"{name}.onnx")


def test_fold_count_and_reasons(folded):
    name, result = folded
    n_folded, total, reason = EXPECTED[name]
    plan = result.plan
    assert_fold_count(plan, n_folded, total)
    if reason:
        assert all(reason in d.reason for d in plan.kept), [d.reason for d in plan.kept]
    counts = ops(result.model_proto)
    fused = sum(d.op_type != "decomposed LayerNorm" for d in plan.kept)  # a decomposed one stays many nodes
    assert sum(counts.get(op, 0) for op in NORMALIZATIONS) == fused
    assert sum(counts.get(op, 0) for op in RMS) == n_folded


def test_equivalent_at_two_sequence_lengths(folded):
    name, result = folded
    original = onnx.load(MODELS / f"{name}.onnx")
    if result.plan.folded:
        assert result.report.verification.status == "passed"
        assert result.report.verification.max_rel_diff < 1e-5
    if name.startswith("whisper"):  # the time axis is fixed by the positional table
        assert_equivalent(original, result.model_proto, rtol=1e-5, batch_size=2, sequence_length=16, sequence_length2=16)
    else:
        assert_equivalent(original, result.model_proto, rtol=1e-5, batch_size=2, sequence_length=8, sequence_length2=5)


def test_folded_model_matches_torch(folded):
    """Against the outputs torch computed at export time, not only against the ONNX original."""
    name, result = folded
    with np.load(MODELS / f"{name}.inputs.npz") as f:
        feeds = {k: f[k] for k in f.files}
    with np.load(MODELS / f"{name}.outputs.npz") as f:
        expected = {k: f[k] for k in f.files}
    got = run_model(result.model_proto.SerializeToString(), feeds)
    for key, ref in expected.items():
        np.testing.assert_allclose(got[key], ref, rtol=0, atol=2e-5 * np.abs(ref).max())


def test_gpt2_tied_embedding_is_centered_after_its_gather_on_request():
    result = onnx_lnfold.fold(MODELS / "gpt2.onnx", verify=False, tied_weights="center")
    plan = result.plan
    assert plan.untied_bytes == 0 and not [e for e in plan.edits if e.untie]
    (centering,) = plan.centerings
    assert centering.instead_of_untie == "model.lm_head.weight" and centering.saved_bytes == 512 * 64 * 4
    assert centering.axis == 2 and len(centering.required_by) == 5  # the residual stream starts there
    assert ops(result.model_proto).get("ReduceMean", 0) == ops(onnx.load(MODELS / "gpt2.onnx")).get("ReduceMean", 0) + 1


def test_gpt2_tied_embedding_is_derived_by_default():
    """A copy would grow the file by 15%; the head reads the table through a Transpose, so the
    Gather reads `table - row means`, which ONNX Runtime folds at session start."""
    result = onnx_lnfold.fold(MODELS / "gpt2.onnx")
    plan = result.plan
    (edit,) = [e for e in plan.edits if e.untie]
    assert edit.means_name and edit.copy_bytes == plan.untied_bytes == 512 * 4
    assert not plan.centerings and result.report.verification.passed


def test_gpt2_tied_lm_head_is_untied_on_request():
    result = onnx_lnfold.fold(MODELS / "gpt2.onnx", verify=False, tied_weights="untie")
    assert not result.plan.centerings
    untied = [e for e in result.plan.edits if e.untie]
    assert len(untied) == 1
    (edit,) = untied
    assert edit.role == "embedding table" and edit.axis == 1
    assert edit.copy_bytes == 512 * 64 * 4 == result.plan.untied_bytes
    # The LM head still reads the original table.
    head_uses = [n for n in result.model.graph if n.op_type == "Transpose" and n.inputs[0].name == edit.tensor]
    assert head_uses


def test_post_ln_opt_names_the_attention_input():
    plan = onnx_lnfold.fold(MODELS / "opt_post_ln.onnx", verify=False, auxiliary_centering=False).plan
    first = plan.decisions[0]
    assert "would change, and it feeds MatMul" in first.reason
    assert all("is the output of LayerNormalization" in d.reason for d in plan.kept[1:])
    # With explicit centering, the two ORT runs fused with their residual Add fold: the first
    # through a centering of its residual sum (its projection's output feeds the attention too, so
    # no weight edit centers it), the other through one of the LN output before it.
    plan = onnx_lnfold.fold(MODELS / "opt_post_ln.onnx", verify=False).plan
    assert [d.node for d in plan.folded] == ["node_layer_norm", "node_layer_norm_2"]
    assert [c.tensor for c in plan.centerings] == ["add_166", "layer_norm_1"]
    assert plan.folded[0].reason == "input is zero-mean once 'add_166' is centered explicitly"


def test_bloom_without_auxiliary_centering_folds_only_the_embeddings_layer_norm():
    import onnx_ir as ir

    model = ir.load(str(MODELS / "bloom.onnx"))
    plan = onnx_lnfold.analyze(model, auxiliary_centering=False, fold_costly=True)
    assert len(plan.folded) == 1 and not plan.centerings
    assert all("is the output of LayerNormalization" in d.reason for d in plan.kept)
    # By default not even that one: its beta would stay an Add over the stream.
    plan = onnx_lnfold.analyze(model, auxiliary_centering=False)
    assert not plan.folded and plan.decisions[0].code == "costs-more"


def test_bloom_centers_the_embeddings_layer_norm_output_once():
    plan = onnx_lnfold.fold(MODELS / "bloom.onnx", verify=False).plan
    (centering,) = [c for c in plan.centerings if not c.instead_of_untie]  # the other: tied embeddings
    assert centering.tensor == "layer_norm" and centering.axis == 2
    assert len(centering.required_by) == 5


def test_onnxruntimes_optimized_graph_grows_only_by_what_the_plan_states(tmp_path):
    """ORT fuses Add+LayerNormalization itself but never Add+SimplifiedLayerNormalization. With
    `auto` the fold leaves those residual Adds unfused (the fused kernel costs more on CPU): ORT's
    optimized graph grows by them, the beta Adds and the centerings the report states, and no
    more; with `always` every fusion ORT made is there as SkipSimplifiedLayerNormalization."""
    import onnxruntime as ort

    def optimized_nodes(model_path):
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.optimized_model_filepath = str(tmp_path / "opt.onnx")
        options.log_severity_level = 3
        ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
        return ops(onnx.load(tmp_path / "opt.onnx"))

    for name in ("gpt2", "opt_pre_ln", "gpt_neox", "vit", "gpt2_ort_opt1"):
        before = optimized_nodes(MODELS / f"{name}.onnx")
        for mode in ("auto", "always"):
            result = onnx_lnfold.fold(MODELS / f"{name}.onnx", verify=False, fuse_residual=mode)
            result.save(tmp_path / "folded.onnx")
            after = optimized_nodes(tmp_path / "folded.onnx")
            # RMSNorm ops have no beta input: a beta costs one Add where nothing downstream has
            # a bias to absorb it (an LM head); the report says so per LN.
            # An explicit centering (tied embeddings) is one ReduceMean and one Sub.
            beta_adds = sum(d.beta == "add" for d in result.plan.folded)
            centering = 2 * len(result.plan.centerings)
            # A SkipLayerNormalization ORT made, left unfused: its residual Add and the bias Add
            # it had taken in too (ViT's).
            unfused = before.get("SkipLayerNormalization", 0) - after.get("SkipLayerNormalization", 0)
            unfused -= after.get("SkipSimplifiedLayerNormalization", 0)
            bound = sum(before.values()) + beta_adds + centering + 2 * max(unfused, 0)
            assert sum(after.values()) <= bound, (name, mode)
            if mode == "always":
                assert after.get("SkipSimplifiedLayerNormalization", 0) >= before.get("SkipLayerNormalization", 0), name


def test_auto_leaves_residual_adds_unfused_and_always_fuses_them():
    plan = onnx_lnfold.fold(MODELS / "gpt2.onnx", verify=False).plan
    assert not [d for d in plan.folded if d.residual_add]  # ln_f's too: Add + SLN cost less on CPU
    always = onnx_lnfold.fold(MODELS / "gpt2.onnx", verify=False, fuse_residual="always").plan
    assert len([d for d in always.folded if d.residual_add]) == 4
    never = onnx_lnfold.fold(MODELS / "gpt2.onnx", verify=False, fuse_residual="never").plan
    assert not [d for d in never.folded if d.residual_add]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_cost_rule_knows_which_layer_norms_onnxruntime_fuses(name, tmp_path):
    """The cost rule prices an LN as the SkipLayerNormalization ORT makes of it with its residual
    Add exactly where ORT's session optimizer does so (`decide.targets.ort_fuses_residual`)."""
    import onnx_ir as ir
    import onnxruntime as ort

    from onnx_lnfold.core.names import display_names
    from onnx_lnfold.decide.targets import ort_fuses_residual
    from onnx_lnfold.forms import LnKind
    from onnx_lnfold.forms.recognize import find_layer_norms
    from onnx_lnfold.shapes.table import ShapeTable

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.optimized_model_filepath = str(tmp_path / "opt.onnx")
    options.log_severity_level = 3
    ort.InferenceSession(str(MODELS / f"{name}.onnx"), options, providers=["CPUExecutionProvider"])
    model = ir.load(str(MODELS / f"{name}.onnx"))
    made = ops(onnx.load(tmp_path / "opt.onnx")).get("SkipLayerNormalization", 0)
    made -= sum(n.op_type == "SkipLayerNormalization" for n in model.graph)
    shapes = ShapeTable(model)
    cands = find_layer_norms(model.graph, shapes, display_names(model.graph))
    ours = sum(ort_fuses_residual(c, shapes) for c in cands if c.kind is not LnKind.EMBED_LAYER_NORM)
    assert ours == made



def test_skip_layer_norm_becomes_skip_simplified_with_centered_bias():
    plan = onnx_lnfold.fold(MODELS / "gpt2_ort_opt1.onnx", verify=False).plan
    skips = [d for d in plan.decisions if d.op_type == "com.microsoft::SkipLayerNormalization"]
    assert len(skips) == 4 and all(d.rewrite == "com.microsoft::SkipSimplifiedLayerNormalization" for d in skips)
    assert any(e.role == "SkipLayerNormalization bias" and e.axis == 0 for e in plan.edits)


def test_embed_layer_normalization_is_reported():
    plan = onnx_lnfold.fold(MODELS / "bert_torchscript_ort_opt1.onnx", verify=False).plan
    assert plan.decisions[0].op_type == "com.microsoft::EmbedLayerNormalization"
    assert "no RMSNorm counterpart" in plan.decisions[0].reason


def test_decomposed_layer_norms_are_recognized_and_folded():
    plan = onnx_lnfold.fold(MODELS / "gpt2_torchscript_opset14.onnx", verify=False, fold_costly=True).plan
    assert {d.op_type for d in plan.decisions} == {"decomposed LayerNorm"}
    assert all(d.epsilon == pytest.approx(1e-5) for d in plan.decisions)
    # Block LNs feed Shape nodes and a Reshape -> Gemm (Conv1D): beta goes into the Gemm bias.
    # ln_f feeds the bias-free LM head: its beta stays an Add.
    assert [d.beta for d in plan.decisions] == ["consumers"] * 4 + ["add"]


def test_bert_embeddings_layer_norm_folds_only_when_asked():
    """Its output feeds a residual Add: its beta would stay an Add, which costs more than the LN."""
    decision = onnx_lnfold.fold(MODELS / "bert.onnx", verify=False).plan.decisions[0]
    assert (decision.stage, decision.code) == ("cost", "costs-more")
    plan = onnx_lnfold.fold(MODELS / "bert.onnx", verify=False, fold_costly=True, auxiliary_centering=False).plan
    assert plan.decisions[0].folded and plan.decisions[0].beta == "add"
    assert {e.role for e in plan.edits} == {"embedding table"}


@pytest.mark.slow
def test_export_script_reproduces_a_model(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    subprocess.run(
        [sys.executable, str(MODELS / "make" / "export_models.py"), "--only", "gpt2", "--out-dir", str(tmp_path)],
        check=True,
    )
    result = onnx_lnfold.fold(tmp_path / "gpt2.onnx")
    assert len(result.plan.folded) == 5
    assert result.report.verification.status == "passed"


MAGIKA = "magika==1.0.3"  # its wheel ships models/standard_v3_3/model.onnx (jax2tf + tf2onnx)


@pytest.mark.slow
def test_magika_layer_norms_are_recognized_with_their_real_reasons(tmp_path):
    """Google's Magika writes its two LayerNorms as E[x^2] - E[x]^2 with Max(0, .) (jax2tf): both
    are recognized; neither folds, each for its own reason. The wheel is fetched and unzipped,
    never installed."""
    import zipfile

    fetched = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", MAGIKA, "-d", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    wheels = sorted(tmp_path.glob("magika-*.whl"))
    if fetched.returncode != 0 or not wheels:
        pytest.skip(f"{MAGIKA} could not be fetched: {(fetched.stderr.strip().splitlines() or ['?'])[-1]}")
    with zipfile.ZipFile(wheels[0]) as wheel:
        wheel.extract("magika/models/standard_v3_3/model.onnx", tmp_path)
    plan = onnx_lnfold.fold(tmp_path / "magika/models/standard_v3_3/model.onnx", verify=False).plan
    assert [(d.op_type, d.status, d.axis) for d in plan.decisions] == [("LayerNorm as E[x^2]-E[x]^2", "kept", 1)] * 2
    first, second = plan.decisions
    assert first.node.endswith("MagikaV2/LayerNorm_0/Sum") and second.node.endswith("MagikaV2/LayerNorm_1/Sum")
    # Over the 512 channels of [batch, 512, 256]: not the trailing axis an RMSNorm op normalizes.
    assert (first.code, first.stage) == ("not-last-axis", "form") and "axis 1 of 3" in first.reason
    # After the global max pooling: no weight edit makes a max zero-mean.
    assert (second.code, second.stage) == ("not-carried", "proof")
    assert "GlobalMaxPool" in second.reason and "does not carry a zero mean" in second.reason
    assert plan.edits == [] and plan.centerings == []


# name: (LNs, of which per-head q/k LNs over Dh of [.., Dh]); all fold, none through an explicit
# centering (docs/DESIGN.md section 2.4)
QK_LAYERNORM = {
    "stablelm_dynamo": (21, 16),  # per head: 2 layers x (q, k) x 4 heads
    "stablelm_torchscript": (21, 16),
    "persimmon_dynamo": (9, 4),  # one LN over Dh: 2 layers x (q, k)
    "persimmon_torchscript": (9, 4),
}


@pytest.mark.slow
def test_per_head_qk_layer_norms_fold_without_explicit_centering(tmp_path):
    """StableLM and Persimmon with qk_layernorm=True, exported by dynamo (opset 18) and TorchScript
    (opset 17): every LN folds, the q/k projections centered head by head, v's never."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    subprocess.run([sys.executable, str(MODELS / "make" / "export_qk_layernorm_models.py"), "--out-dir", str(tmp_path)], check=True)
    for name, (total, per_head) in QK_LAYERNORM.items():
        result = onnx_lnfold.fold(tmp_path / f"{name}.onnx")
        plan = result.plan
        assert (len(plan.decisions), len(plan.folded)) == (total, total), (name, [(d.node, d.reason) for d in plan.kept])
        assert plan.centerings == [], name
        assert result.report.verification.status == "passed", name
        blocked = [e for e in plan.edits if e.block is not None]
        assert all(e.block == 16 for e in blocked), name
        if name.startswith("stablelm"):  # q_proj and k_proj of each layer, every head
            assert len(blocked) == 4 and all(e.blocks is None for e in blocked), name
        else:  # the fused q/k/v weight and bias of each layer: q's and k's heads, not v's
            q_and_k = tuple(3 * h + i for h in range(4) for i in (0, 1))
            assert len(blocked) == 4 and all(e.blocks == q_and_k for e in blocked), name
        assert sum(d.axis == 3 for d in plan.folded) == per_head, name  # the heads' LNs: over Dh of rank 4
