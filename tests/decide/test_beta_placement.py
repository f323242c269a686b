"""Where a folded LN's beta goes, and the cost rule that keeps an LN whose fold would cost ONNX
Runtime more than the LN (docs/DESIGN.md section 4): every placement exact through ONNX Runtime,
the plan's `beta` and `beta_sites` asserted; the key-projection proof's refusals."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import onnx_lnfold
from onnx_lnfold.decide import costs

from graphs import Graph, fold_checked, ops

# The narrowest width measured (benchmarks/results/EMISSION_COSTS.md): the cost rule extrapolates
# below it, where per-token costs take over.
D, HEADS = 64, 4


def _attention(
    *,
    key_output: bool = False,
    key_read_twice: bool = False,
    softmax_axis: int = -1,
    mask: bool = False,
    scale_op: str = "Mul",
    scale_keys: bool = False,
    past_keys: bool = False,
    shape_from_input: bool = False,
    reshape_scores: bool = False,
) -> onnx.ModelProto:
    """x -> Linear (its weight and bias centerable) -> LN -> q, k (no bias, as Whisper's k_proj),
    v -> heads -> softmax(q k^T * scale [+ mask]) v -> out projection."""
    g = Graph(seed=3)
    x = g.input("x", ["b", "s", D])
    n = g.ln(g.linear(x, D, D, "embed"), D, "ln")
    q, k, v = g.linear(n, D, D, "q"), g.linear(n, D, D, "k", bias=False), g.linear(n, D, D, "v")
    if shape_from_input:  # TorchScript: [Shape(x)[0], -1, H, Dh] built at run time
        batch = g.node("Unsqueeze", [g.node("Gather", [g.node("Shape", [n]), g.ints("zero", 0)], axis=0), g.ints("ax0", [0])])
        heads = g.node("Concat", [batch, g.ints("rest", [-1, HEADS, D // HEADS])], axis=0)
    else:
        heads = g.ints("heads", [0, 0, HEADS, D // HEADS])

    def split(t: str, perm: list[int], name: str) -> str:
        return g.node("Transpose", [g.node("Reshape", [t, heads], name=f"{name}/reshape")], perm=perm, name=f"{name}/t")

    keys = split(k, [0, 2, 3, 1], "kt")
    if scale_keys:  # sdpa as the dynamo exporter writes it: q and k each scaled by sqrt(scale)
        keys = g.node("Mul", [keys, g.const("k_scale", value=np.float32(0.7))], name="k_scale")
    if past_keys:
        keys = g.node("Concat", [g.input("past_keys", ["b", HEADS, D // HEADS, "p"]), keys], axis=-1, name="cat")
    if key_output:
        g.output(k)
    scores = g.node("MatMul", [split(q, [0, 2, 1, 3], "qh"), keys], name="scores")
    scores = g.node(scale_op, [scores, g.const("scale", value=np.float32(0.35))], name="scale")
    if reshape_scores:  # BART: [B, H, T, S] -> [B*H, T, S] and back, around the mask
        full = g.node("Shape", [scores], name="scores_shape")
        last2 = g.node("Slice", [full, g.ints("two", [2]), g.ints("four", [4])], name="last2")
        flat = g.node("Concat", [g.ints("minus1", [-1]), last2], axis=0, name="flat_shape")
        scores = g.node("Reshape", [g.node("Reshape", [scores, flat], name="flatten_heads"), full], name="unflatten")
    if mask:
        scores = g.node("Add", [scores, g.input("mask", ["b", 1, 1, "s"])], name="mask")
    probs = g.node("Softmax", [scores], axis=softmax_axis, name="softmax")
    ctx = g.node("MatMul", [probs, split(v, [0, 2, 1, 3], "vh")], name="ctx")
    merged = g.node("Reshape", [g.node("Transpose", [ctx], perm=[0, 2, 1, 3]), g.ints("merge", [0, 0, D])])
    y = g.linear(merged, D, D, "o")
    if key_read_twice:
        y = g.node("Add", [y, g.node("Relu", [k])], name="second_reader")
    g.output(y)
    if past_keys:
        g.inputs.sort(key=lambda i: i.name)  # any order; keep it fixed
    return g.model()


K_DROPPED = "k/matmul: dropped, the Softmax over the keys removes it"


@pytest.mark.parametrize(
    "variant",
    [{}, {"mask": True}, {"scale_op": "Div"}, {"scale_keys": True}, {"shape_from_input": True},
     {"reshape_scores": True}],
    ids=["plain", "mask", "div", "sdpa-scaled-keys", "torchscript-reshape", "bart-reshaped-scores"],
)
def test_key_projection_share_is_dropped(variant):
    model = _attention(**variant)
    result = fold_checked(model, folded=1, fold_costly=False)
    d = result.plan.decision_for("ln")
    assert d.beta == "consumers"
    assert d.beta_sites == ("q/matmul: its bias", K_DROPPED, "v/matmul: its bias")
    # No Add was written for beta, and none created after the key projection.
    assert ops(result.model_proto)["Add"] == ops(model)["Add"]
    k_readers = [n.op_type for n in result.model_proto.graph.node if "k/matmul_out" in n.input]
    assert k_readers == ["Reshape"]


@pytest.mark.parametrize(
    "variant,why",
    [
        ({"key_output": True}, "'k/matmul_out' is a graph output"),  # a KV cache's present key
        ({"key_read_twice": True}, "'k/matmul_out' is read by Reshape 'kt/reshape', Relu"),
        ({"softmax_axis": 2}, "Softmax 'softmax' normalizes over axis 2, not the key axis"),
        ({"past_keys": True}, "Concat 'cat' reads the shifted projection output"),
    ],
    ids=["keys-are-an-output", "keys-read-elsewhere", "softmax-over-queries", "past-keys"],
)
def test_key_projection_refusals_leave_beta_an_add_and_the_cost_rule_keeps_the_ln(variant, why):
    """Past keys concatenated in front carry no shift (a cache the original filled, or keys of
    another model), so the scores stop being shifted alike along the key axis."""
    result = fold_checked(_attention(**variant), folded=0, kept=1, fold_costly=False)
    d = result.plan.decision_for("ln")
    assert (d.stage, d.code) == ("cost", "costs-more")
    assert why in d.reason
    assert "k/matmul' has no bias, and its share cannot be dropped" in d.reason
    assert d.reason.endswith(f"({costs.builtin_table().source})")


def test_a_bias_free_mlp_projection_is_not_told_about_keys():
    """An up-projection without a bias feeding its activation: its share of beta cannot be dropped,
    and the reason says what reads it, not that it reads 'the shifted keys'."""
    g = Graph(seed=6)
    n = g.ln(g.linear(g.input("x", ["b", "s", D]), D, D, "embed"), D, "ln")
    up = g.linear(n, D, 4 * D, "up_proj", bias=False)
    g.output(g.linear(g.node("Relu", [up], name="act"), 4 * D, D, "down_proj"))
    d = onnx_lnfold.analyze(g.model()).decision_for("ln")
    assert "Relu 'act' reads the shifted projection output, which reaches no attention Softmax" in d.reason
    assert "keys (" not in d.reason and "shifted keys" not in d.reason


def _ln_into(consumer_width: int, *, bias: bool, d: int = D) -> onnx.ModelProto:
    g = Graph(seed=5)
    n = g.ln(g.linear(g.input("x", ["b", "s", d]), d, d, "embed"), d, "ln")
    g.output(g.linear(n, d, consumer_width, "head", bias=bias))
    return g.model()


def test_a_bias_is_created_where_it_costs_less_than_the_add():
    """A consumer without a bias whose output is narrower than the LN: an Add of `beta @ W` over
    [tokens, 64] costs less than one of beta over [tokens, 384], and the fold with it less than the
    LN. (At d=64 it does not: an Add's cost per token outweighs what the fold saves per token.)"""
    model = _ln_into(64, bias=False, d=384)
    result = fold_checked(model, folded=1, fold_costly=False)
    d = result.plan.decision_for("ln")
    assert d.beta == "consumers" and d.beta_sites == ("head/matmul: a bias created for it",)
    (add,) = [n for n in result.model_proto.graph.node if n.name.endswith("bias_from_beta")]
    assert add.op_type == "Add" and add.output[0] == "head/matmul_out"  # the graph output keeps its name
    assert add.doc_string.startswith("onnx_lnfold: adds to 'head/matmul' its share of the beta of LayerNormalization 'ln'")


def test_no_bias_is_created_over_a_wider_output_and_the_ln_is_kept():
    """An LM head: a bias over the vocabulary would cost more than beta's Add over d, which costs
    more than the LN."""
    result = fold_checked(_ln_into(4 * D, bias=False), folded=0, kept=1, fold_costly=False)
    d = result.plan.decision_for("ln")
    assert (d.stage, d.code) == ("cost", "costs-more")
    assert "a created bias costs more than the Add" in d.reason


def test_existing_bias_takes_beta():
    result = fold_checked(_ln_into(4 * D, bias=True), folded=1, fold_costly=False)
    assert result.plan.decision_for("ln").beta_sites == ("head/matmul: its bias",)


def test_an_ln_whose_beta_would_stay_an_add_is_kept_with_the_cost_code():
    g = Graph(seed=7)
    n = g.ln(g.linear(g.input("x", ["b", "s", D]), D, D, "embed"), D, "ln")
    g.output(n)
    result = fold_checked(g.model(), folded=0, kept=1, fold_costly=False)
    d = result.plan.decision_for("ln")
    assert (d.stage, d.code) == ("cost", "costs-more")
    assert d.reason.startswith("kept: its beta would stay a separate Add over the LN's output (the LN's output")
    assert "SimplifiedLayerNormalization + an Add of beta costs more than LayerNormalization" in d.reason
    decision = next(x for x in result.report.to_dict()["decisions"] if x["node"] == "ln")
    assert (decision["stage"], decision["code"]) == ("cost", "costs-more")
    # Asked to, it folds (exactly: beta as an Add); without beta it folds by default.
    assert fold_checked(g.model(), folded=1).plan.decision_for("ln").beta == "add"
    g = Graph(seed=7)
    g.output(g.ln(g.linear(g.input("x", ["b", "s", D]), D, D, "embed"), D, "ln", bias=False))
    assert fold_checked(g.model(), folded=1, fold_costly=False).plan.decision_for("ln").beta == "none"


def test_an_ln_ort_fuses_with_its_residual_folds_even_with_beta_as_an_add():
    """ORT runs the original's `Add + LayerNormalization` as SkipLayerNormalization, which costs
    more than the residual Add, SimplifiedLayerNormalization and beta's Add together."""
    g = Graph(seed=9)
    x = g.input("x", ["b", "s", D])
    a, b = g.linear(x, D, D, "a"), g.linear(x, D, D, "b")
    g.output(g.ln(g.node("Add", [a, b], name="residual"), D, "ln"))
    model = g.model()
    result = fold_checked(model, folded=1, fold_costly=False)
    d = result.plan.decision_for("ln")
    assert d.beta == "add" and d.rewrite == "SimplifiedLayerNormalization" and d.residual_add is None
    assert "Skip" not in "".join(n.op_type for n in result.model_proto.graph.node)
    fused = onnx_lnfold.fold(model, fuse_residual="always")
    assert fused.plan.decision_for("ln").rewrite == "com.microsoft::SkipSimplifiedLayerNormalization"


def test_cost_table_decisions():
    """The rules as the measured costs give them, at a few widths."""
    pricing = costs.default_pricing()  # the built-in table at the default token count
    for d in (64, 384, 768, 1024):
        ln, sln, skip = [("LayerNormalization", d)], [("SimplifiedLayerNormalization", d)], [("SkipLayerNormalization", d)]
        assert not pricing.costs_more(sln, ln)
        assert pricing.costs_more(sln + [("BiasAdd", d)], ln)
        assert not pricing.costs_more([("Add", d)] + sln + [("BiasAdd", d)], skip)
        assert not pricing.fused_residual_pays(d)  # auto leaves the residual Add unfused on CPU
        assert not pricing.created_bias_pays([2 * d], d)
        if d >= 4 * costs.NARROWEST:  # narrower than that, an Add is priced at the narrowest width
            assert pricing.created_bias_pays([d // 4], d)
        one = costs.Saving(pricing.saving(sln, ln).amount, 0.0, d, pricing)  # its central figure alone
        assert not pricing.centering_pays(d, [one])


def test_cost_table_is_the_committed_measurement():
    """The built-in table (onnx_lnfold/decide/tables/cpu.json) is what benchmarks/emission_costs.py
    fits to its committed results, every measured shape and its spread included, not numbers typed
    in by hand (re-measure: python -m benchmarks.emission_costs, which writes the table)."""
    import json

    from benchmarks.emission_costs import fit, table

    from conftest import ROOT

    committed = json.loads((ROOT / "benchmarks" / "results" / "emission_costs.json").read_text())
    results = committed["results"]
    assert {(r["d"], r["batch"] * r["seq"]) for r in results} == {
        (d, t) for d in (64, 256, 384, 768, 1024) for t in (16, 128, 1024, 8192)
    }
    fitted = fit(results)
    builtin = costs.builtin_table()
    assert set(fitted) == set(builtin.costs) == {*costs.KINDS, *costs.LAYOUT_KINDS}
    for kind, coefficients in fitted.items():
        cost = builtin.costs[kind]
        assert (cost.fixed, cost.per_token, cost.per_element, cost.per_width) == pytest.approx(coefficients, rel=1e-3), kind
    expected = table(results, committed["command"], committed["machine"])
    assert (builtin.provider, builtin.unit, builtin.source) == (
        "CPUExecutionProvider", "instructions", "benchmarks/results/EMISSION_COSTS.md"
    )
    for kind in fitted:
        assert [(p.tokens, p.width) for p in builtin.points[kind]] == [(p.tokens, p.width) for p in expected.points[kind]]
        for got, want in zip(builtin.points[kind], expected.points[kind]):
            assert (got.value, got.spread) == pytest.approx((want.value, want.spread), rel=1e-6), kind


@pytest.mark.parametrize("named", [True, False])
def test_an_ln_is_priced_as_onnxruntime_runs_it(named, tmp_path):
    """ORT fuses `Add + LayerNormalization` into SkipLayerNormalization only where its own shape
    inference (no data propagation) names every dim of both addends: behind a `Reshape(x, [0, -1,
    d])` it cannot (the TorchScript Whisper encoder's last LN). There the original runs a plain LN,
    and a fold whose beta stays an Add costs more: kept. With named dims, ORT runs SkipLayerNormalization,
    which costs more than the fold: folded."""
    import onnxruntime as ort

    g = Graph(seed=11)
    x = g.input("x", ["b", "s", D])
    a, b = g.linear(x, D, D, "a"), g.linear(x, D, D, "b")
    if not named:
        target = g.ints("target", [0, -1, D])
        a = g.node("Reshape", [a, target], name="ra")
        b = g.node("Reshape", [b, target], name="rb")
    g.output(g.ln(g.node("Add", [a, b], name="residual"), D, "ln"))
    model = g.model()
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.optimized_model_filepath = str(tmp_path / "opt.onnx")
    ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    assert ("SkipLayerNormalization" in ops(onnx.load(tmp_path / "opt.onnx"))) == named
    result = fold_checked(model, folded=int(named), kept=int(not named), fold_costly=False)
    if not named:
        assert result.plan.decision_for("ln").code == "costs-more"


def test_a_gemm_whose_bias_is_a_block_takes_no_beta():
    """beta @ W is one row: a Gemm whose C is an [M, N] block can neither take it nor get a bias
    created beside it; beta stays an Add (folded here only because asked to: fold_costly)."""
    g = Graph(seed=13)
    x = g.input("x", [4, 8])
    n = g.ln(g.node("Gemm", [x, g.const("w", (8, 384)), g.const("c", (384,))]), 384, "ln")
    g.output(g.node("Gemm", [n, g.const("w2", (384, 6)), g.const("c2", (4, 6))], name="head"))
    result = fold_checked(g.model(), folded=1)
    assert result.plan.decision_for("ln").beta == "add"
    assert "Gemm 'head' reads it" in onnx_lnfold.analyze(g.model()).decision_for("ln").reason


def test_an_ln_the_plans_centering_unlocks_is_kept_for_its_cost_not_for_the_broken_proof(monkeypatch):
    """TorchScript's Whisper encoder: the explicit centering sits after the GELU's trailing `* 0.5`
    (so ONNX Runtime still fuses the Gelu), one scalar Mul past where the final LN's proof breaks.
    That LN is kept because its beta would stay an Add before a graph output, and its reason must
    say so, not that no edit can center its input: `--fold-costly` folds it with the same centering.
    The centering is written past the conv stem's Transpose and its position table's Add, over the
    last axis of [batch, 32, 64], where ONNX Runtime runs it (tests/ort_fusions). Right past the
    Transpose, the session would run it over axis 1 of [batch, 64, 32], strided, and the cost rule
    prices it so: at one item's 32 tokens it then costs more than the 4 LNs it unlocks save, where
    over the last axis the difference is within the figures' spread."""
    from onnx_lnfold.analysis import edits

    from conftest import MODELS

    shapes = {"input_features": (64, 16, 64)}
    plan = onnx_lnfold.analyze(MODELS / "whisper_encoder_torchscript.onnx", input_shapes=shapes)
    [kept] = plan.kept
    assert (kept.node, kept.code, kept.stage) == ("/model/layer_norm/LayerNormalization", "costs-more", "cost")
    assert "is a graph output" in kept.reason
    costly = onnx_lnfold.analyze(MODELS / "whisper_encoder_torchscript.onnx", input_shapes=shapes, fold_costly=True)
    assert len(costly.folded) == 5 and [c.tensor for c in costly.centerings] == [c.tensor for c in plan.centerings]
    assert [(c.tensor, c.axis) for c in plan.centerings] == [("/model/Add_2_output_0", 2)]
    one_item = onnx_lnfold.analyze(MODELS / "whisper_encoder_torchscript.onnx")
    assert {d.code for d in one_item.kept} == {"cost-unresolved", "costs-more"} and not one_item.folded
    assert "'/model/Add_2_output_0' - ReduceMean over axis 2 is inserted" in one_item.decisions[0].reason
    assert "strided" not in one_item.decisions[0].reason
    assert "at 32 tokens (the graph's static shape per item, the batch dynamic)" in one_item.decisions[0].reason

    monkeypatch.setattr(edits, "_past_added_constants", lambda value, uses, shapes, readers: (value, uses))
    past_transpose = onnx_lnfold.analyze(MODELS / "whisper_encoder_torchscript.onnx")
    assert {d.code for d in past_transpose.kept} == {"centering-costs-more", "costs-more"} and not past_transpose.folded
    reason = past_transpose.decisions[0].reason
    assert "'/model/Transpose_output_0' - ReduceMean over axis 2 (ONNX Runtime runs it over a non-last axis: a strided reduction)" in reason
