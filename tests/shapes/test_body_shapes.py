"""Shapes inside If/Loop bodies, from the outer scope's values they read (docs/DESIGN.md section 5).

optimum's merged decoders (`decoder_model_merged.onnx`) hold the decoder without and with past as
the two branches of one If, reusing value names. ONNX's data propagation then stops in the second
branch it infers ("Data for input 0 already exists"), and every value after the first Shape chain
there had no rank: the LNs of that branch stayed, and the weights both branches share got an
untied copy for the branch that folded. Each body the whole-model inference leaves short is now
inferred on its own, its outer-scope reads typed from the enclosing graph.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx_lnfold
from onnx_lnfold.shapes.infer import infer
from onnx_lnfold.verify.sessions import compare, run_model

from conftest import MODELS
from graphs import fold_checked

D = 16


def _decoder_branch(name: str, last_op: str) -> onnx.GraphProto:
    """A decoder as optimum exports it, inside a branch: positions from the ids' shape (Shape ->
    Range -> Tile, as `cache_position.unsqueeze(0).repeat(batch, 1)`), token + position tables,
    one pre-LN block reading the outer graph's weights. Every value name is the same in both
    branches; only the last op differs."""
    nodes = [
        helper.make_node("Shape", ["ids"], ["shape"], name="shape"),
        helper.make_node("Gather", ["shape", "one"], ["seq"], axis=0, name="seq"),
        helper.make_node("Gather", ["shape", "zero"], ["batch"], axis=0, name="batch"),
        helper.make_node("Range", ["zero", "seq", "one"], ["arange"], name="arange"),
        helper.make_node("Unsqueeze", ["arange", "axes0"], ["row"], name="row"),
        helper.make_node("Unsqueeze", ["batch", "axes0"], ["batch1"], name="batch1"),
        helper.make_node("Concat", ["batch1", "one1"], ["repeats"], axis=0, name="repeats"),
        helper.make_node("Tile", ["row", "repeats"], ["position_ids"], name="tile"),
        helper.make_node("Gather", ["pos", "position_ids"], ["positions"], axis=0, name="positions"),
        helper.make_node("Gather", ["tok", "ids"], ["tokens"], axis=0, name="tokens"),
        helper.make_node("Add", ["tokens", "positions"], ["h0"], name="embed"),
        helper.make_node("LayerNormalization", ["h0", "g1", "b1"], ["n1"], axis=-1, name="ln1"),
        helper.make_node("MatMul", ["n1", "W"], ["mm"], name="fc"),
        helper.make_node("Add", ["mm", "c"], ["fc_out"], name="fc_bias"),
        helper.make_node("Add", ["h0", "fc_out"], ["h1"], name="residual"),
        helper.make_node("LayerNormalization", ["h1", "g2", "b2"], ["n2"], axis=-1, name="ln2"),
        helper.make_node(last_op, ["n2"], [f"{name}_y"], name="out"),
    ]
    return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, None)])


def _merged_decoder(weight_read_outside: bool = False) -> onnx.ModelProto:
    rng = np.random.default_rng(5)

    def arr(*shape, loc=0.3):
        return rng.normal(loc, 1.0, size=shape).astype(np.float32)

    inits = [
        numpy_helper.from_array(arr(32, D), "tok"),
        numpy_helper.from_array(arr(64, D), "pos"),
        numpy_helper.from_array(arr(D, D), "W"),
        numpy_helper.from_array(arr(D), "c"),
        *(numpy_helper.from_array(arr(D, loc=1.0), f"g{i}") for i in (1, 2)),
        *(numpy_helper.from_array(arr(D, loc=0.0), f"b{i}") for i in (1, 2)),
        numpy_helper.from_array(np.array(1, np.int64), "one"),
        numpy_helper.from_array(np.array(0, np.int64), "zero"),
        numpy_helper.from_array(np.array([0], np.int64), "axes0"),
        numpy_helper.from_array(np.array([1], np.int64), "one1"),
    ]
    nodes = [
        helper.make_node("If", ["cond"], ["y"], then_branch=_decoder_branch("then", "Relu"),
                         else_branch=_decoder_branch("else", "Neg"), name="optimum::if"),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "s", D])]
    if weight_read_outside:  # W also feeds a projection of the main graph: it cannot change in place
        nodes.append(helper.make_node("MatMul", ["feats", "W"], ["proj"], name="outside"))
        outputs.append(helper.make_tensor_value_info("proj", TensorProto.FLOAT, ["b", D]))
    inputs = [
        helper.make_tensor_value_info("ids", TensorProto.INT64, ["b", "s"]),
        helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
        helper.make_tensor_value_info("feats", TensorProto.FLOAT, ["b", D]),
    ]
    model = helper.make_model(helper.make_graph(nodes, "merged", inputs, outputs, inits),
                              opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    return model


def _same_on_both_branches(original: onnx.ModelProto, folded: onnx.ModelProto) -> None:
    rng = np.random.default_rng(1)
    for cond in (True, False):
        feeds = {"ids": rng.integers(0, 32, (2, 7)), "cond": np.array(cond), "feats": rng.normal(size=(2, D)).astype(np.float32)}
        for diff in compare(run_model(original.SerializeToString(), feeds), run_model(folded.SerializeToString(), feeds)):
            assert diff.rel_diff < 1e-5, (cond, diff)


def test_branches_that_reuse_value_names_get_ranks_from_the_outer_scope():
    """Before: 0/4 folded, 'the rank of input 'h0' is unknown' in both branches (the whole If's
    inference stopped at the second branch's Shape)."""
    model = _merged_decoder()
    # What ONNX's own inference leaves (if it ever gives h0 a rank, this test says less).
    proto = onnx.shape_inference.infer_shapes(model, data_prop=True)
    for branch in proto.graph.node[0].attribute:
        h0 = [vi for vi in branch.g.value_info if vi.name == "h0"]
        assert not h0 or not h0[0].type.tensor_type.HasField("shape"), h0
    result = fold_checked(model, folded=4)
    # Every use of the shared tables and weights is centered the same way: in place, no copy.
    assert sorted((e.tensor, e.untie) for e in result.plan.edits) == [
        ("W", False), ("c", False), ("pos", False), ("tok", False),
    ]
    assert not result.plan.centerings
    _same_on_both_branches(model, result.model_proto)


def test_a_weight_both_branches_center_and_the_main_graph_reads_gets_one_copy():
    """Centered for both branches, read unchanged outside: one copy, read by both branches."""
    model = _merged_decoder(weight_read_outside=True)
    result = fold_checked(model, folded=4)
    (w,) = [e for e in result.plan.edits if e.tensor == "W"]
    assert w.untie and w.new_name == "W.centered" and len(w.uses) == 2  # one MatMul per branch
    copies = [t.name for t in result.model_proto.graph.initializer if t.name.startswith("W")]
    assert sorted(copies) == ["W", "W.centered"]
    branches = [a.g for a in result.model_proto.graph.node[0].attribute]
    assert all("W.centered" in n.input for b in branches for n in b.node if n.op_type == "MatMul" and n.name.startswith("fc")), branches
    _same_on_both_branches(model, result.model_proto)


def _contrib_body(cond_in: str | None) -> onnx.GraphProto:
    """EmbedLayerNormalization (a contrib op ONNX inference stops at) feeding a SkipLayerNorm."""
    nodes = [
        helper.make_node("EmbedLayerNormalization", ["ids", "", "word", "posw", "", "e.gamma", "e.beta"],
                         ["emb", "mask_index"], domain="com.microsoft", epsilon=1e-5, name="embed_ln"),
        helper.make_node("MatMul", ["emb", "fcw"], ["fc"], name="fc"),
        helper.make_node("SkipLayerNormalization", ["fc", "emb", "sk.gamma", "sk.beta"], ["y"],
                         domain="com.microsoft", epsilon=1e-5, name="skip"),
    ]
    if cond_in is None:  # an If branch
        return helper.make_graph(nodes, "branch", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    nodes.append(helper.make_node("Identity", [cond_in], ["cond_out"]))
    return helper.make_graph(
        nodes, "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []), helper.make_tensor_value_info(cond_in, TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )


@pytest.mark.parametrize("op", ["If", "Loop"])
def test_contrib_ops_in_a_body_get_ranks_from_symbolic_inference(op):
    """ONNX Runtime's symbolic inference ran on the main graph only: a SkipLayerNorm in a body
    behind an EmbedLayerNormalization had no rank. Run on the body, it gives one, and the reason
    is the real one (cf. tests/carry/test_carry.py's main-graph case)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0.3, 1, shape).astype(np.float32), name)
             for name, shape in (("word", (32, D)), ("posw", (32, D)), ("e.gamma", (D,)), ("e.beta", (D,)),
                                 ("fcw", (D, D)), ("sk.gamma", (D,)), ("sk.beta", (D,)))]
    inputs = [helper.make_tensor_value_info("ids", TensorProto.INT32, ["b", "s"]),
              helper.make_tensor_value_info("cond", TensorProto.BOOL, [])]
    if op == "If":
        node = helper.make_node("If", ["cond"], ["out"], then_branch=_contrib_body(None), else_branch=_contrib_body(None))
    else:
        inits.append(numpy_helper.from_array(np.array(1, np.int64), "trips"))
        node = helper.make_node("Loop", ["trips", "cond"], ["out"], body=_contrib_body("cond_in"))
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 9
    # No explicit centering: one of the EmbedLayerNormalization's output would fold the SkipLN (its
    # CPU kernel costs more than the centering and the fold), and the test is about its reason.
    result = onnx_lnfold.fold(model, verify=False, auxiliary_centering=False)
    kept = sorted((d.op_type, d.code, d.reason) for d in result.plan.kept)
    skips = [(code, reason) for op_type, code, reason in kept if op_type.endswith("SkipLayerNormalization")]
    assert len(skips) == (2 if op == "If" else 1), kept
    for code, reason in skips:  # before: unknown-shape, "the rank of input 'fc' is unknown"
        assert code == "normalization-output" and "is the output of EmbedLayerNormalization" in reason, reason


@pytest.mark.parametrize("keeps_rank", [True, False])
def test_a_loop_carried_value_the_body_does_not_type_gets_its_initial_values_rank(keeps_rank):
    """A carried value may change its dims from one iteration to the next: the body is given the
    rank of the initial value, with no dim, where the body gives the value back with that rank
    (then every iteration has it). Where it does not, no rank, as ONNX's Loop inference gives."""
    if keeps_rank:  # FastGelu: only ONNX Runtime's inference knows its output's rank
        step = helper.make_node("FastGelu", ["acc"], ["acc_out"], domain="com.microsoft")
    else:
        step = helper.make_node("Unsqueeze", ["acc", "axis0"], ["acc_out"])
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), step],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []), helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, None)],
    )
    graph = helper.make_graph(
        [helper.make_node("Loop", ["trips", "cond", "x"], ["final"], body=body)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", D]), helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("final", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array(2, np.int64), "trips"), numpy_helper.from_array(np.array([0], np.int64), "axis0")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 9
    by_onnx, by_ort, _ = infer(ir.serde.deserialize_model(model))
    body_path = ((0, "body", 0),)
    if keeps_rank:
        assert by_onnx[(body_path, "acc")][0] == (None, None, None)
        assert len(by_ort[(body_path, "acc_out")][0]) == 3
    else:
        assert by_onnx[(body_path, "acc")][0] is None and by_onnx[(body_path, "acc_out")][0] is None


# --------------------------------------------------------------------------- optimum's Whisper merge
def test_whisper_merged_decoder_folds_every_ln_of_both_branches():
    """optimum's decoder_model_merged.onnx of a small Whisper (models/make/export_decoder_models.py).
    Before: 7/14, 'the rank of input '/model/decoder/Add_output_0' is unknown' in the branch
    without cache, and 12 untied copies of the weights both branches share (+198,144 bytes).
    Every LN folds exactly (`fold_costly`); by default the six whose beta would stay an Add are kept
    for what that Add costs on ONNX Runtime's CPU EP: the self-attention LNs (Whisper's k_proj has
    no bias, and the keys are returned as the cache, so beta's share cannot be dropped) and the
    final LN (the tied LM head has no bias)."""
    default = onnx_lnfold.analyze(MODELS / "whisper_merged_decoder.onnx")
    costly = [d for d in default.kept if d.code == "costs-more"]
    assert (len(default.folded), len(costly), len(default.kept)) == (8, 6, 6), [(d.node, d.reason) for d in default.kept]
    assert all("self_attn_layer_norm" in d.node or "decoder/layer_norm" in d.node for d in costly)
    result = onnx_lnfold.fold(MODELS / "whisper_merged_decoder.onnx", fold_costly=True)
    plan, verification = result.plan, result.report.verification
    assert (len(plan.folded), len(plan.decisions)) == (14, 14), [(d.node, d.reason) for d in plan.kept]
    assert verification.status == "passed", verification.reason
    assert verification.max_rel_diff < 1e-5
    sets = verification.input_sets
    # both branches at both sizes; the realistic-scale set runs one of them
    assert [s.rsplit("use_cache_branch=", 1)[1] for s in sets][:4] == ["True", "False", "True", "False"]
    assert all("[realistic scale]" in s for s in sets[4:])
    # The weights both branches share are centered in place, once for both. The token table is
    # also the LM head's (through a Transpose): a copy, or the Gathers' outputs centered, as
    # --tied-weights says; a copy serves both branches.
    tokens = "model.decoder.embed_tokens.weight_merged_0"
    assert len([e for e in plan.edits if e.tensor != tokens]) == 13
    assert all(not e.untie for e in plan.edits if e.tensor != tokens)
    untie = onnx_lnfold.fold(MODELS / "whisper_merged_decoder.onnx", verify=False, tied_weights="untie").plan
    assert [(e.tensor, len(e.uses)) for e in untie.edits if e.untie] == [(tokens, 2)]
    with np.load(MODELS / "whisper_merged_decoder.inputs.npz") as f:
        feeds = {k: f[k] for k in f.files}
    with np.load(MODELS / "whisper_merged_decoder.outputs.npz") as f:
        expected = {k: f[k] for k in f.files}
    got = run_model(result.model_proto.SerializeToString(), feeds)  # against torch, cached branch
    for key, ref in expected.items():
        np.testing.assert_allclose(got[key], ref, rtol=0, atol=2e-5 * np.abs(ref).max())
