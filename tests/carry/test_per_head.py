"""Per-head q/k LayerNorms (StableLM, Persimmon: docs/DESIGN.md section 2.4): the projection is
centered head by head, in blocks of the head size, and no explicit centering is needed. Graphs
built in code the way the exporters write them; every fold checked through ONNX Runtime."""

from __future__ import annotations

import pytest

import onnx_lnfold

from graphs import Graph, fold_checked, ops

HEADS, DH, HIDDEN = 4, 8, 16


def _attention(g: Graph, q: str, k: str, v: str) -> str:
    """softmax(q k^T) v over [b, H, s, Dh] heads, back to [b, s, H*Dh]."""
    scores = g.node("MatMul", [q, g.node("Transpose", [k], perm=[0, 1, 3, 2])])
    heads = g.node("MatMul", [g.node("Softmax", [scores], axis=-1), v])
    return g.node("Reshape", [g.node("Transpose", [heads], perm=[0, 2, 1, 3]), g.ints(f"merge_{q}", [0, 0, HEADS * DH])])


def _heads(g: Graph, y: str, name: str) -> str:
    """[b, s, H*Dh] -> [b, H, s, Dh]."""
    split = g.node("Reshape", [y, g.ints(f"{name}.heads", [0, 0, HEADS, DH])], name=f"{name}/view")
    return g.node("Transpose", [split], perm=[0, 2, 1, 3], name=f"{name}/transpose")


def _per_head_ln(g: Graph, heads: str, name: str, how: str) -> str:
    """StableLmLayerNormPerHead: one LN (gamma, no beta) per head of [b, H, s, Dh], split along H
    by Split or by SplitToSequence + SequenceAt, then put back together."""
    def ln(x: str, h: int) -> str:
        return g.node("LayerNormalization", [x, g.const(f"{name}.{h}.gamma", (DH,))], name=f"{name}/norm{h}", epsilon=1e-5)

    if how == "Split":
        pieces = g.node("Split", [heads, g.ints(f"{name}.ones", [1] * HEADS)], n_out=HEADS, name=f"{name}/split", axis=1)
        return g.node("Concat", [ln(p, h) for h, p in enumerate(pieces)], name=f"{name}/concat", axis=1)
    seq = g.node("SplitToSequence", [heads, g.ints(f"{name}.one", 1)], name=f"{name}/split", axis=1)
    normed = [ln(g.node("SequenceAt", [seq, g.ints(f"{name}.at{h}", h)], name=f"{name}/at{h}"), h) for h in range(HEADS)]
    return g.node("ConcatFromSequence", [g.node("SequenceConstruct", normed, name=f"{name}/seq")], name=f"{name}/concat", axis=1)


def _stablelm_like(how: str) -> Graph:
    g = Graph()
    stream = g.linear(g.input("x", ["b", "s", 8]), 8, HIDDEN, "embed")
    normed = g.ln(stream, HIDDEN, "input_ln")
    q = _per_head_ln(g, _heads(g, g.linear(normed, HIDDEN, HEADS * DH, "q_proj", bias=False), "q"), "q_ln", how)
    k = _per_head_ln(g, _heads(g, g.linear(normed, HIDDEN, HEADS * DH, "k_proj", bias=False), "k"), "k_ln", how)
    v = _heads(g, g.linear(normed, HIDDEN, HEADS * DH, "v_proj", bias=False), "v")
    out = g.node("Add", [stream, g.linear(_attention(g, q, k, v), HEADS * DH, HIDDEN, "o_proj")], name="residual")
    g.output(g.ln(out, HIDDEN, "final_ln"))
    return g


@pytest.mark.parametrize("how", ["Split", "SplitToSequence"])
def test_stablelm_per_head_layer_norms_fold_with_the_projections_centered_by_head(how):
    """Every head's LN folds, q_proj and k_proj centered in blocks of the head size (each head's LN
    asks for its own block; together, every block), v_proj untouched, no explicit centering."""
    result = fold_checked(_stablelm_like(how).model(), folded=2 + 2 * HEADS)
    plan = result.plan
    assert not plan.centerings
    blocked = {(e.tensor, e.axis, e.block, e.blocks) for e in plan.edits if e.block is not None}
    assert blocked == {("q_proj.weight", 1, DH, None), ("k_proj.weight", 1, DH, None)}
    assert "v_proj.weight" not in {e.tensor for e in plan.edits}
    text = result.report.format_text()
    assert f"q_proj.weight  axis 1 in blocks of {DH}  MatMul weight" in text


def _persimmon_like(rope_first: bool = False) -> Graph:
    """A fused q/k/v projection viewed as [b, s, H, 3, Dh]; q and k (positions 0 and 1 of axis 3)
    normalized over Dh, v (position 2) not."""
    g = Graph()
    stream = g.linear(g.input("x", [2, 5, 8]), 8, HIDDEN, "embed")
    normed = g.ln(stream, HIDDEN, "input_ln")
    fused = g.linear(normed, HIDDEN, 3 * HEADS * DH, "qkv")
    view = g.node("Reshape", [fused, g.ints("qkv.heads", [0, 0, HEADS, 3, DH])], name="view")
    q, k, v = (g.node("Gather", [view, g.ints(f"select{i}", i)], name=f"select{i}", axis=3) for i in range(3))
    if rope_first:  # rotary embeddings before the LN: q * cos + rotate_half(q) * sin
        cos, sin = g.const("cos", (5, 1, DH)), g.const("sin", (5, 1, DH))
        halves = g.node("Split", [q], n_out=2, axis=-1, num_outputs=2)
        rotated = g.node("Concat", [g.node("Neg", [halves[1]]), halves[0]], axis=-1)
        q = g.node("Add", [g.node("Mul", [q, cos]), g.node("Mul", [rotated, sin])], name="rope")
    q = g.ln(q, DH, "q_ln")
    k = g.ln(k, DH, "k_ln")
    q, k, v = (g.node("Transpose", [t], perm=[0, 2, 1, 3]) for t in (q, k, v))
    out = g.node("Add", [stream, g.linear(_attention(g, q, k, v), HEADS * DH, HIDDEN, "dense")], name="residual")
    g.output(g.ln(out, HIDDEN, "final_ln"))
    return g


def test_persimmon_fused_qkv_is_centered_in_the_blocks_of_q_and_k_only():
    """q's and k's blocks of the fused weight and bias are centered (one edit each, both LNs'
    blocks together); v's blocks are left alone, so attention sees the same values."""
    result = fold_checked(_persimmon_like().model(), folded=4)
    plan = result.plan
    assert not plan.centerings
    q_and_k = tuple(sorted(3 * h + i for h in range(HEADS) for i in (0, 1)))
    blocked = {(e.tensor, e.axis, e.block, e.blocks) for e in plan.edits if e.block is not None}
    assert blocked == {("qkv.weight", 1, DH, q_and_k), ("qkv.bias", 0, DH, q_and_k)}
    assert {e.tensor: e.untie for e in plan.edits}["qkv.weight"] is False  # one edit, in place
    text = result.report.format_text()
    assert f"axis 1 in blocks of {DH} ({', '.join(map(str, q_and_k))} of {3 * HEADS})" in text
    edit = next(e for e in plan.edits if e.tensor == "qkv.weight")
    assert edit.to_dict()["block"] == DH and edit.to_dict()["blocks"] == list(q_and_k)


def test_rotary_embedding_before_the_per_head_layer_norm_keeps_it():
    """RoPE multiplies by position-dependent factors and mixes the halves of Dh: no weight edit
    makes its output zero-mean, so the LN after it stays (k's still folds)."""
    result = fold_checked(_persimmon_like(rope_first=True).model(), folded=3, kept=1)
    kept = result.plan.decision_for("q_ln")
    assert kept.stage == "proof" and kept.code in ("varying-factor", "axis-not-kept"), kept.reason
    blocked = {(e.tensor, e.block, e.blocks) for e in result.plan.edits if e.block is not None}
    k_only = tuple(3 * h + 1 for h in range(HEADS))
    assert blocked == {("qkv.weight", DH, k_only), ("qkv.bias", DH, k_only)}


def test_heads_split_off_the_last_axis_in_pieces_of_one_head():
    """torch.split(q, Dh, dim=-1): pieces of whole heads along the axis, one LN each."""
    g = Graph()
    stream = g.linear(g.input("x", ["b", "s", 8]), 8, HIDDEN, "embed")
    q = g.linear(g.ln(stream, HIDDEN, "input_ln"), HIDDEN, HEADS * DH, "q_proj")
    pieces = g.node("Split", [q], n_out=HEADS, axis=-1, num_outputs=HEADS)
    normed = [g.ln(p, DH, f"head{h}", bias=False) for h, p in enumerate(pieces)]
    g.output(g.linear(g.node("Concat", normed, axis=-1), HEADS * DH, HIDDEN, "out"))
    result = fold_checked(g.model(), folded=1 + HEADS)
    assert {(e.tensor, e.axis, e.block, e.blocks) for e in result.plan.edits if e.block} == {
        ("q_proj.weight", 1, DH, None),
        ("q_proj.bias", 0, DH, None),
    }


def test_a_head_read_before_its_layer_norm_keeps_the_layer_norms_that_need_it():
    """A q head also read by something else (a graph output here) would see the centering."""
    g = _stablelm_like("Split")
    g.output("q/transpose_out")
    result = onnx_lnfold.fold(g.model(), verify=False)
    q_heads = [d for d in result.plan.decisions if d.node.startswith("q_ln/")]
    assert q_heads and all(not d.folded and d.stage == "side-effect" for d in q_heads)
    assert all(d.folded for d in result.plan.decisions if d.node.startswith("k_ln/"))


def test_per_head_blocks_never_become_an_explicit_centering():
    """Explicit centering removes the mean of a whole axis; blocks need their own: the q LNs of
    a stream that no weight edit can center stay LNs (a Relu before the reshape into heads)."""
    g = Graph()
    stream = g.linear(g.input("x", ["b", "s", 8]), 8, HEADS * DH, "embed")
    heads = _heads(g, g.node("Relu", [stream]), "q")
    g.output(_per_head_ln(g, heads, "q_ln", "Split"))
    result = fold_checked(g.model(), folded=0, kept=HEADS)
    assert not result.plan.centerings
    assert {d.code for d in result.plan.decisions} == {"not-carried"}
    assert ops(result.model_proto)["LayerNormalization"] == HEADS and not result.plan.edits
