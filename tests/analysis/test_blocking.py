"""The side-effect rule and the other reasons an LN stays LayerNormalization (docs/DESIGN.md section 3)."""

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import helper

import onnx_lnfold
from onnx_lnfold.core.ir import weight_bytes

from conftest import ROOT
from graphs import Graph, fold_checked, ops


def test_stream_tensor_that_is_a_graph_output_blocks_every_ln_that_needs_it():
    g = Graph()
    x = g.input("x", ["b", "s", 8])
    h0 = g.linear(x, 8, 16, "embed")
    n1 = g.ln(h0, 16, "ln1")
    h1 = g.node("Add", [h0, g.linear(n1, 16, 16, "mlp")], name="residual")
    g.output(g.ln(h1, 16, "ln2"))
    g.output(h0)  # like output_hidden_states
    result = fold_checked(g.model(), folded=0, kept=2)
    for d in result.plan.kept:
        assert d.reason == "tensor 'embed/bias_out' would change, and it is a graph output"
        assert d.blocking_tensor == "embed/bias_out"
        assert (d.stage, d.code) == ("side-effect", "graph-output")


def _tied_model(head: str = "transpose", mlp: int = 16) -> onnx.ModelProto:
    """Embeddings and LM head share one table, as GPT-2, OPT and BLOOM exports do: the head reads
    it through a Transpose, or directly (Gemm transB=1). `mlp` sizes the block, and so the share
    of the weights the table is."""
    g = Graph()
    ids = g.input("ids", ["b", "s"], elem_type=onnx.TensorProto.INT64)
    table = g.const("wte", (40, 16))
    h = g.node("Gather", [table, ids], name="embed")
    up = g.linear(g.ln(h, 16, "ln1"), 16, mlp, "up") if mlp != 16 else g.ln(h, 16, "ln1")
    h = g.node("Add", [h, g.linear(up, mlp, 16, "mlp")])
    n = g.ln(h, 16, "ln_f")
    if head == "transpose":
        g.output(g.node("MatMul", [n, g.node("Transpose", [table], perm=[1, 0])], name="lm_head"))
    else:
        g.output(g.node("Gemm", [g.node("Reshape", [n, g.ints("rows", [-1, 16])]), table], transB=1, name="lm_head"))
    return g.model()


def _tied_lm(tied_weights: str, head: str = "transpose", mlp: int = 16):
    result = onnx_lnfold.fold(_tied_model(head, mlp), tied_weights=tied_weights)
    assert len(result.plan.folded) == 2 and result.report.verification.status == "passed"
    return result


@pytest.mark.parametrize(("tied_weights", "head"), [("center", "transpose"), ("auto", "gemm")])
def test_tied_embedding_is_centered_after_the_gather_and_the_table_is_kept(tied_weights, head):
    """Asked for, or chosen by `auto` where the head reads the table itself (a copy, or a restored
    table, would double the table's memory at run time)."""
    result = _tied_lm(tied_weights, head)
    assert not [e for e in result.plan.edits if e.tensor == "wte"] and result.plan.untied_bytes == 0
    (centering,) = result.plan.centerings
    assert (centering.tensor, centering.axis, centering.instead_of_untie) == ("embed_out", 2, "wte")
    assert centering.saved_bytes == 40 * 16 * 4 and centering.uses == ("add_5:0", "ln1:0")
    inits = result.model.graph.initializers
    assert "wte.centered" not in inits and len(inits["wte"].const_value.numpy()) == 40
    assert ops(result.model_proto)["ReduceMean"] == 1


@pytest.mark.parametrize(("tied_weights", "head"), [("derive", "transpose"), ("auto", "transpose"), ("derive", "gemm")])
def test_tied_embedding_gathers_read_the_table_minus_its_row_means(tied_weights, head, tmp_path):
    """Asked for, or chosen by `auto` where the head reads the table through a Transpose and a copy
    would grow the file by more than 1% (the table is 2,560 of 4,928 weight bytes here): the
    Gathers read `table - row means`, which ONNX Runtime folds into a centered table at session
    start, so its optimized graph has no node the original's has not; the head keeps the table."""
    import onnxruntime as ort

    result = _tied_lm(tied_weights, head)
    assert not result.plan.centerings
    (edit,) = [e for e in result.plan.edits if e.tensor == "wte"]
    assert edit.untie and edit.means_name == "wte.row_means" and edit.new_name == "wte.centered"
    assert edit.copy_bytes == result.plan.untied_bytes == 40 * 4  # the row means, not a table
    assert ("whose Transpose ONNX Runtime folds" in edit.note) == (head == "transpose")
    inits = result.model.graph.initializers
    assert "wte.centered" not in inits  # computed by ONNX Runtime at load
    original = onnx.numpy_helper.to_array(next(t for t in _tied_model(head).graph.initializer if t.name == "wte"))
    np.testing.assert_array_equal(inits["wte"].const_value.numpy(), original)
    np.testing.assert_allclose(inits["wte.row_means"].const_value.numpy(), original.mean(axis=1, keepdims=True), rtol=1e-6)

    def optimized_ops(model: onnx.ModelProto, name: str) -> dict[str, int]:
        options = ort.SessionOptions()
        options.optimized_model_filepath = str(tmp_path / name)
        ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        return ops(onnx.load(tmp_path / name))

    before, after = optimized_ops(_tied_model(head), "original.onnx"), optimized_ops(result.model_proto, "folded.onnx")
    assert after.get("Sub", 0) == before.get("Sub", 0)  # the Sub was folded at session start


@pytest.mark.parametrize("tied_weights", ["untie", "auto"])
def test_tied_embedding_is_untied_and_the_lm_head_keeps_the_original(tied_weights):
    """Asked for, or chosen by `auto` (the default) where the head reads the table through a
    Transpose (ONNX Runtime folds that into a copy of its own, so ours costs no memory at run time)
    and the copy adds at most 1% to the weights: 2,560 bytes beside a 16 x 2048 MLP."""
    result = _tied_lm(tied_weights, mlp=2048)
    assert result.plan.untied_bytes * 100 <= weight_bytes(ir.from_proto(_tied_model(mlp=2048)))
    assert not result.plan.centerings
    (edit,) = [e for e in result.plan.edits if e.tensor == "wte"]
    assert (edit.note is not None) == (tied_weights == "auto")
    assert edit.untie and edit.new_name == "wte.centered"
    assert edit.copy_bytes == 40 * 16 * 4 == result.plan.untied_bytes
    inits = result.model.graph.initializers
    assert not np.allclose(inits["wte"].const_value.numpy().mean(axis=1), 0)
    np.testing.assert_allclose(inits["wte.centered"].const_value.numpy().mean(axis=1), 0, atol=1e-6)


def test_no_aux_centering_unties_tied_weights():
    plan = onnx_lnfold.fold(_tied_model(), auxiliary_centering=False, verify=False).plan
    assert not plan.centerings and plan.untied_bytes == 40 * 16 * 4


def test_weight_listed_as_graph_input_is_not_a_constant():
    g = Graph()
    x = g.input("x", ["b", "s", 8])
    h = g.linear(x, 8, 16, "proj", bias=False)
    g.output(g.ln(h, 16, "ln"))
    model = g.model()
    model.graph.input.append(helper.make_tensor_value_info("proj.weight", onnx.TensorProto.FLOAT, [8, 16]))
    result = fold_checked(model, folded=0, kept=1)
    reason = result.plan.kept[0].reason
    assert reason.startswith("weight 'proj.weight' of MatMul 'proj/matmul' is a graph input")
    assert "overridden at run time" in reason
    assert result.plan.kept[0].code == "weight-is-input"
    # The report says how to get a model whose weights are constants.
    assert "re-export without keep_initializers_as_inputs=True" in result.report.format_text()


def test_stream_from_a_graph_input_is_kept():
    g = Graph()
    x = g.input("x", ["b", "s", 16])
    g.output(g.ln(g.node("Add", [x, g.const("c", (16,))]), 16, "ln"))
    result = fold_checked(g.model(), folded=0, kept=1, auxiliary_centering=False)  # the proof's own refusal, no centering
    assert result.plan.kept[0].reason == "tensor 'x' is a graph input: its mean depends on the data"
    assert result.plan.kept[0].code == "graph-input"


def test_nonlinearity_breaks_the_chain():
    g = Graph()
    h = g.node("Relu", [g.linear(g.input("x", ["b", "s", 8]), 8, 16, "proj")])
    g.output(g.ln(h, 16, "ln"))
    result = fold_checked(g.model(), folded=0, kept=1, auxiliary_centering=False)  # the proof's own refusal, no centering
    assert "Relu 'relu_3' does not carry a zero mean" in result.plan.kept[0].reason
    assert (result.plan.kept[0].stage, result.plan.kept[0].code) == ("proof", "not-carried")


def test_post_ln_stream_feeding_a_matmul_blocks_the_edit():
    """OPT-350m / BERT shape: the centered tensor also feeds attention projections."""
    g = Graph()
    h0 = g.linear(g.input("x", ["b", "s", 8]), 8, 16, "embed")
    q = g.linear(h0, 16, 16, "q")
    g.output(g.ln(g.node("Add", [h0, q]), 16, "ln"))
    result = fold_checked(g.model(), folded=0, kept=1)
    assert result.plan.kept[0].reason == (
        "tensor 'embed/bias_out' would change, and it feeds MatMul 'q/matmul', which mixes the shift into every output"
    )
    assert (result.plan.kept[0].stage, result.plan.kept[0].code) == ("side-effect", "mixes-shift")


def test_ln_with_used_mean_output_is_kept():
    g = Graph()
    h = g.linear(g.input("x", ["b", "s", 8]), 8, 16, "proj")
    y, mean = g.ln(h, 16, "ln", n_out=2)
    g.output(y)
    g.output(mean)
    result = fold_checked(g.model(), folded=0, kept=1)
    assert result.plan.kept[0].reason == "its Mean output 'ln_out1' is used, and RMSNorm has no such output"
    assert (result.plan.kept[0].stage, result.plan.kept[0].code) == ("form", "stats-output-used")


def test_downstream_ln_exposing_its_mean_does_not_absorb_the_shift():
    g = Graph()
    h = g.linear(g.input("x", ["b", "s", 8]), 8, 16, "proj")
    g.output(g.ln(h, 16, "ln1"))
    y, mean = g.ln(h, 16, "ln2", n_out=2)
    g.output(y)
    g.output(mean)
    result = fold_checked(g.model(), folded=0, kept=2)
    assert "exposes its Mean/InvStdDev outputs" in result.plan.decision_for("ln1").reason
    assert (result.plan.decision_for("ln1").stage, result.plan.decision_for("ln1").code) == ("side-effect", "stats-output-used")


def test_simplified_layer_norm_consumer_does_not_absorb_the_shift():
    g = Graph()
    h = g.linear(g.input("x", ["b", "s", 8]), 8, 16, "proj")
    g.output(g.ln(h, 16, "ln"))
    g.output(g.node("SimplifiedLayerNormalization", [h, g.const("s", (16,))], axis=-1, epsilon=1e-5, name="rms"))
    result = fold_checked(g.model(), folded=0, kept=1)
    assert "SimplifiedLayerNormalization 'rms'" in result.plan.kept[0].reason
    assert (result.plan.kept[0].stage, result.plan.kept[0].code) == ("side-effect", "not-carried")


def test_blocked_ln_does_not_block_an_independent_one():
    g = Graph()
    x = g.input("x", ["b", "s", 8])
    a = g.linear(x, 8, 16, "a")
    g.output(g.ln(a, 16, "ln_a"))
    g.output(a)
    g.output(g.ln(g.linear(x, 8, 16, "b"), 16, "ln_b"))
    result = fold_checked(g.model(), folded=1, kept=1)
    assert result.plan.decision_for("ln_b").folded
    assert "graph output" in result.plan.decision_for("ln_a").reason


def test_constant_shared_with_an_unrelated_layer_is_untied():
    g = Graph()
    x = g.input("x", ["b", "s", 8])
    w = g.const("shared_w", (8, 16))
    g.output(g.ln(g.node("MatMul", [x, w], name="folded_path"), 16, "ln"))
    g.output(g.node("Relu", [g.node("MatMul", [x, w], name="other_path")]))
    result = fold_checked(g.model(), folded=1)
    (edit,) = result.plan.edits
    assert edit.untie and edit.uses == ("folded_path:1",)


def test_final_ln_exposing_its_mean_blocks_the_whole_pre_ln_stream():
    g = Graph()
    h0 = g.linear(g.input("x", ["b", "s", 8]), 8, 16, "embed")
    h1 = g.node("Add", [h0, g.linear(g.ln(h0, 16, "ln1"), 16, 16, "mlp")])
    y, mean = g.ln(h1, 16, "ln_f", n_out=2)
    g.output(y)
    g.output(mean)
    result = fold_checked(g.model(), folded=0, kept=2)
    assert "Mean output" in result.plan.decision_for("ln_f").reason
    assert "exposes its Mean/InvStdDev" in result.plan.decision_for("ln1").reason


def test_a_kept_layer_norm_still_absorbs_the_shift_of_a_folded_one():
    g = Graph()
    x = g.input("x", ["b", "s", 8])
    emb = g.linear(x, 8, 16, "embed")
    g.output(g.ln(emb, 16, "ln_e"))
    h = g.node("Add", [emb, g.node("Relu", [g.linear(x, 8, 16, "side")], name="act")])
    g.output(g.ln(h, 16, "ln_x"))
    # Without explicit centering: one of 'act_out' would unlock ln_x, which ORT runs fused with its
    # residual Add as SkipLayerNormalization, whose kernel costs more than the centering and the fold.
    result = fold_checked(g.model(), folded=1, kept=1, auxiliary_centering=False)
    assert result.plan.decision_for("ln_e").folded
    assert "Relu 'act' does not carry a zero mean" in result.plan.decision_for("ln_x").reason
    # By default: ln_e's beta would stay an Add (kept); ln_x folds through one centering.
    plan = fold_checked(g.model(), folded=1, kept=1, fold_costly=False, auxiliary_centering=True).plan
    assert plan.decision_for("ln_x").folded and len(plan.centerings) == 1
    assert plan.decision_for("ln_e").code == "costs-more"


def test_every_code_in_a_report_is_a_documented_one():
    """Codes are the stable part of a refusal: each is listed, with its meaning, in CODES and in
    docs/DESIGN.md; an unknown one cannot even be made."""

    from onnx_lnfold.core.blocked import CODES, STAGES, Blocked

    design = (ROOT / "docs" / "DESIGN.md").read_text()
    missing = [code for code in CODES if f"`{code}`" not in design]
    assert not missing, f"codes not in docs/DESIGN.md: {missing}"
    with pytest.raises(ValueError, match="unknown Blocked code"):
        Blocked("no-such-code", "why")
    g = Graph()
    x = g.input("x", ["b", "s", 8])
    h = g.node("Relu", [g.linear(x, 8, 16, "proj")])
    g.output(g.ln(h, 16, "ln"))
    decision = onnx_lnfold.analyze(g.model(), auxiliary_centering=False).to_dict()["decisions"][0]
    assert decision["code"] == "not-carried" and decision["code"] in CODES
    assert decision["stage"] == "proof" and decision["stage"] in STAGES
    stages_doc = [stage for stage in STAGES if f"`{stage}`" not in design]
    assert not stages_doc, f"stages not in docs/DESIGN.md: {stages_doc}"


def test_the_same_code_from_either_direction_is_told_apart_by_its_stage():
    """One carry rule answers both directions: a Relu below the LN's producer (the centered tensor
    feeds it) and a Relu above the LN (its input comes through it) share the code 'not-carried'."""
    g = Graph()
    x = g.input("x", ["b", "s", 8])
    h = g.linear(x, 8, 16, "proj")
    g.output(g.ln(h, 16, "ln_below"))
    g.output(g.node("Relu", [h], name="side_relu"))
    g.output(g.ln(g.node("Relu", [g.linear(x, 8, 16, "other")], name="above_relu"), 16, "ln_above"))
    result = fold_checked(g.model(), folded=0, kept=2, auxiliary_centering=False)  # the proof's own refusal, no centering
    below, above = result.plan.decision_for("ln_below"), result.plan.decision_for("ln_above")
    assert (below.stage, below.code) == ("side-effect", "not-carried")
    assert (above.stage, above.code) == ("proof", "not-carried")
    assert "would change, and it feeds Relu 'side_relu'" in below.reason
