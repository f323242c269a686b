"""Every explicit centering that unlocks an LN is found (docs/DESIGN.md section 2.3): a stream sum
tried for one LN too, where its fold pays for it, and wherever it unlocks one with `fold_costly`.
ELECTRA's and DETR's first residual sum reads a projection that the Q/K/V MatMuls read too (its
weights cannot be centered: `mixes-shift`); DeBERTa's reads a masked embeddings LN output, which
the attention reads too."""

import pytest

import onnx_lnfold

from graphs import Graph, assert_equivalent

D = 16


def _attention(g: Graph, h: str, name: str) -> str:
    q, k, v = (g.linear(h, D, D, f"{name}/{p}") for p in "qkv")
    scores = g.node("MatMul", [q, g.node("Transpose", [k], perm=[0, 2, 1])], name=f"{name}/scores")
    attended = g.node("MatMul", [g.node("Softmax", [scores], axis=-1), v], name=f"{name}/attend")
    return g.linear(attended, D, D, f"{name}/o")


def _post_ln_encoder(start: str):
    """Embeddings LN, then two post-LN layers. `start`: "projection" (ELECTRA: the stream starts at
    a projection of the embeddings LN's output, which the first attention reads too) or "mask"
    (DeBERTa: at `LN(embeddings) * mask`)."""
    g = Graph()
    ids = g.input("input_ids", ["b", "s"], 7)
    width = 8 if start == "projection" else D
    emb = g.ln(g.node("Gather", [g.const("emb.table", (50, width)), ids], name="emb/gather"), width, "emb/ln")
    if start == "projection":
        h = g.linear(emb, width, D, "project")
    else:
        h = g.node("Mul", [emb, g.input("mask", ["b", "s", 1])], name="emb/mask")
    for i in range(2):
        h = g.ln(g.node("Add", [_attention(g, h, f"l{i}/attn"), h], name=f"l{i}/res1"), D, f"l{i}/ln1")
        ffn = g.linear(g.node("Relu", [g.linear(h, D, 2 * D, f"l{i}/up")]), 2 * D, D, f"l{i}/down")
        h = g.ln(g.node("Add", [ffn, h], name=f"l{i}/res2"), D, f"l{i}/ln2")
    g.output(h)
    return g.model()


@pytest.mark.parametrize("start", ["projection", "mask"])
def test_fold_costly_centers_the_first_residual_sum(start):
    """Before: the first layer's LN stayed (`mixes-shift`; `normalization-output` for the mask),
    while the same kind of centering folded the three after it."""
    model = _post_ln_encoder(start)
    without = onnx_lnfold.analyze(model, fold_costly=True, auxiliary_centering=False)
    assert without.decisions[1].code == ("mixes-shift" if start == "projection" else "normalization-output")
    result = onnx_lnfold.fold(model, fold_costly=True)
    assert len(result.plan.folded) == 5
    assert "l0/res1_out" in [c.tensor for c in result.plan.centerings]
    assert result.report.verification.status == "passed"
    assert_equivalent(model, result.model_proto, rtol=1e-5)


@pytest.mark.parametrize("start", ["projection", "mask"])
def test_the_default_centers_one_sum_where_it_pays(start):
    """ORT runs the first layer's LN fused with its residual Add (SkipLayerNormalization, whose CPU
    kernel costs more than a centering and the unfused nodes together): by default it folds
    through the one centering of its sum. The kept embeddings LN of the masked stream (its beta
    stays an Add: the mask's Mul reads it) is kept for its own cost."""
    plan = onnx_lnfold.analyze(_post_ln_encoder(start))
    assert plan.decisions[1].status == "folded"
    assert plan.decisions[1].reason == "input is zero-mean once 'l0/res1_out' is centered explicitly"
    assert [(d.node, d.stage, d.code) for d in plan.kept] == ([] if start == "projection" else [("emb/ln", "cost", "costs-more")])
