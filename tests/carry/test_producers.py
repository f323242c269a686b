"""Producers whose constant weights can be centered (docs/DESIGN.md section 2.1)."""

import numpy as np
import pytest

from graphs import Graph, fold_checked, ops


def test_matmul_weight_is_centered_along_its_output_axis():
    g = Graph()
    x = g.input("x", ["b", "s", 8])
    h = g.linear(x, 8, 16, "proj")
    g.output(g.ln(h, 16, "ln"))
    result = fold_checked(g.model(), folded=1)
    edits = {e.tensor: e for e in result.plan.edits}
    assert edits["proj.weight"].axis == 1 and edits["proj.weight"].role == "MatMul weight"
    assert edits["proj.bias"].axis == 0
    weight = result.model.graph.initializers["proj.weight"].const_value.numpy()
    np.testing.assert_allclose(weight.mean(axis=1), 0, atol=1e-6)
    assert ops(result.model_proto)["SimplifiedLayerNormalization"] == 1


def test_batched_matmul_weight():
    g = Graph()
    x = g.input("x", [3, "s", 8])
    h = g.node("MatMul", [x, g.const("w3", (3, 8, 16))])
    g.output(g.ln(h, 16, "ln"))
    result = fold_checked(g.model(), folded=1)
    assert result.plan.edits[0].axis == 2


@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("bias_shape", [(16,), (1, 16), (4, 16), ()])
def test_gemm_weight_and_bias(trans_b, bias_shape):
    g = Graph()
    x = g.input("x", [4, 8])
    w = g.const("w", (16, 8) if trans_b else (8, 16))
    h = g.node("Gemm", [x, w, g.const("c", bias_shape)], transB=trans_b, alpha=0.7, beta=1.3)
    g.output(g.ln(h, 16, "ln"))
    result = fold_checked(g.model(), folded=1)
    edits = {e.tensor: e for e in result.plan.edits}
    assert edits["w"].axis == (0 if trans_b else 1)
    assert edits["c"].axis == (None if bias_shape in ((), ) else len(bias_shape) - 1)


def test_conv_over_channels_via_transpose():
    g = Graph()
    x = g.input("x", ["b", 3, 8, 8])
    y = g.node("Conv", [x, g.const("cw", (12, 3, 2, 2)), g.const("cb", (12,))], strides=[2, 2])
    t = g.node("Transpose", [y], perm=[0, 2, 3, 1])
    g.output(g.ln(t, 12, "ln"))
    result = fold_checked(g.model(), folded=1)
    assert {(e.tensor, e.axis) for e in result.plan.edits} == {("cw", 0), ("cb", 0)}


def test_conv_normalized_over_channel_axis_directly_is_a_multi_axis_ln():
    g = Graph()
    x = g.input("x", ["b", 3, 8])
    y = g.node("Conv", [x, g.const("cw", (12, 3, 1))])
    g.output(g.ln(y, 8, "ln", axis=1))
    result = fold_checked(g.model(), folded=0, kept=1)
    assert "normalizes over 2 axes" in result.plan.kept[0].reason


def test_grouped_conv_is_kept_with_reason():
    g = Graph()
    x = g.input("x", ["b", 4, 8, 8])
    y = g.node("Conv", [x, g.const("cw", (8, 2, 1, 1))], group=2)
    t = g.node("Transpose", [y], perm=[0, 2, 3, 1])
    g.output(g.ln(t, 8, "ln"))
    result = fold_checked(g.model(), folded=0, kept=1)
    assert "grouped Conv (group=2)" in result.plan.kept[0].reason


def test_embedding_gather_rows_are_centered():
    g = Graph()
    ids = g.input("ids", ["b", "s"], elem_type=7)
    e = g.node("Gather", [g.const("table", (50, 16)), ids])
    g.output(g.ln(e, 16, "ln"))
    result = fold_checked(g.model(), folded=1)
    (edit,) = result.plan.edits
    assert (edit.tensor, edit.axis, edit.role, edit.untie) == ("table", 1, "embedding table", False)


def _positions_by_gather_nd(g: Graph, ids: str, table: str, index_tuple: int = 1) -> str:
    """The dynamo exporter's `table[position_ids]` (Whisper's decoder): positions 0..s-1 from the
    ids' shape, repeated over the batch, looked up by GatherND with index tuples of one entry
    (`index_tuple` entries: the last ones are 0)."""
    shape = g.node("Shape", [ids])
    seq = g.node("Gather", [shape, g.ints("one", 1)], axis=0)
    batch = g.node("Gather", [shape, g.ints("zero", 0)], axis=0)
    row = g.node("Unsqueeze", [g.node("Range", [g.ints("start", 0), seq, g.ints("step", 1)]), g.ints("ax0", [0])])
    repeats = g.node("Concat", [g.node("Unsqueeze", [batch, g.ints("ax0b", [0])]), g.ints("once", [1])], axis=0)
    positions = g.node("Unsqueeze", [g.node("Tile", [row, repeats]), g.ints("ax_last", [-1])])
    if index_tuple > 1:  # [b, s, index_tuple - 1, 1] zeros beside: tuples (position, 0, ...)
        zeros = g.node("Mul", [positions, g.ints("nought", 0)])
        positions = g.node("Concat", [positions] + [zeros] * (index_tuple - 1), axis=-1)
    return g.node("GatherND", [table, positions], name="positions")


def test_position_rows_looked_up_by_gather_nd_are_centered():
    """Before: the table was no producer, and the lookup's output was centered explicitly
    (1 ReduceMean + 1 Sub per run) where that unlocked two LNs, else the LNs stayed."""
    g = Graph()
    ids = g.input("ids", ["b", "s"], elem_type=7)
    h = g.node("Add", [g.node("Gather", [g.const("tokens", (50, 16)), ids]), _positions_by_gather_nd(g, ids, g.const("pos", (64, 16)))])
    g.output(g.ln(h, 16, "ln"))
    result = fold_checked(g.model(), folded=1)
    assert [(e.tensor, e.axis, e.role, e.untie) for e in result.plan.edits] == [
        ("pos", 1, "embedding table", False), ("tokens", 1, "embedding table", False),
    ]
    assert not result.plan.centerings


def test_gather_nd_whose_normalized_axis_comes_from_its_indices_is_kept():
    """Index tuples as long as the table's rank pick single entries: the normalized axis is one
    of the indices' axes, and no edit of the table centers it."""
    g = Graph()
    h = g.linear(g.input("x", [4, 8]), 8, 16, "proj")
    rows, cols = np.meshgrid(np.arange(4) * 3, np.arange(16), indexing="ij")
    picked = g.node("GatherND", [g.const("pos", (64, 16)), g.ints("pairs", np.stack([rows, cols], -1))], name="pick")
    g.output(g.ln(g.node("Add", [h, picked]), 16, "ln"))
    (kept,) = fold_checked(g.model(), folded=0, kept=1).plan.kept
    assert kept.code == "axis-not-kept" and "the normalized axis of GatherND 'pick' comes from its indices" in kept.reason


def test_added_constant_broadcast_along_axis_becomes_zero():
    """A constant of size 1 along the normalized axis is a pure shift: it is zeroed."""
    g = Graph()
    x = g.input("x", ["b", 4, 8])
    h = g.linear(x, 8, 16, "proj", bias=False)
    h = g.node("Add", [h, g.const("shift", (1, 1, 1))])
    h = g.node("Add", [g.const("pos", (1, 4, 16)), h])
    g.output(g.ln(h, 16, "ln"))
    result = fold_checked(g.model(), folded=1)
    edits = {e.tensor: e for e in result.plan.edits}
    assert edits["shift"].axis is None and edits["pos"].axis == 2
    assert not result.model.graph.initializers["shift"].const_value.numpy().any()


def test_scalar_constant_is_zeroed():
    g = Graph()
    x = g.input("x", ["b", "s", 8])
    h = g.node("Sub", [g.linear(x, 8, 16, "proj"), g.const("scalar", value=np.float32(0.7))])
    g.output(g.ln(h, 16, "ln"))
    result = fold_checked(g.model(), folded=1)
    assert {e.tensor: e.axis for e in result.plan.edits}["scalar"] is None
