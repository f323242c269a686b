"""Ops that carry a zero mean, with the normalized axis followed through them (docs/DESIGN.md section 2)."""

import numpy as np
import pytest

from graphs import Graph, fold_checked


def _stream(g: Graph, d: int = 16, name: str = "proj") -> str:
    """[b, s, d] tensor that folds: a linear layer on a graph input."""
    return g.linear(g.input("x", ["b", "s", 8]), 8, d, name)


@pytest.mark.parametrize(
    "op,attrs",
    [("Identity", {}), ("Neg", {}), ("Dropout", {}), ("Cast", {"to": 1})],
)
def test_unary_ops_carry(op, attrs):
    g = Graph()
    h = g.node(op, [_stream(g)], **attrs)
    g.output(g.ln(h, 16, "ln"))
    fold_checked(g.model(), folded=1)


def test_cast_to_int_breaks_the_chain():
    g = Graph()
    h = g.node("Cast", [g.node("Cast", [_stream(g)], to=7)], to=1)
    g.output(g.ln(h, 16, "ln"))
    result = fold_checked(g.model(), folded=0, kept=1)
    assert "casts to INT64" in result.plan.kept[0].reason


@pytest.mark.parametrize("op", ["Mul", "Div"])
def test_scaling_by_a_factor_constant_along_the_axis(op):
    g = Graph()
    temp = g.input("t", ["b", "s", 1])  # data-dependent, constant along the axis
    h = g.node(op, [_stream(g), temp])
    h = g.node("Mul", [g.const("scale", value=np.float32(1.7)), h])
    g.output(g.ln(h, 16, "ln"))
    fold_checked(g.model(), folded=1)


def test_layer_scale_affine_chain_centers_the_product():
    """CaiT / ConvNeXt layer scale: residual + gamma * Linear(...). The linear layer is centered so
    that gamma * output is zero-mean: W[:, j] -= mean_j(W[:, j] * g[j]) / g[j]."""
    g = Graph()
    x = g.input("x", ["b", "s", 8])
    h0 = g.linear(x, 8, 16, "embed")
    branch = g.linear(g.node("Relu", [g.linear(g.ln(h0, 16, "ln1"), 16, 32, "fc1")]), 32, 16, "fc2")
    h1 = g.node("Add", [h0, g.node("Mul", [g.const("layer_scale", (16,)), branch], name="ls")])
    g.output(g.ln(h1, 16, "ln2"))
    result = fold_checked(g.model(), folded=2)
    edits = {e.tensor: e for e in result.plan.edits}
    assert edits["fc2.weight"].weights is not None and edits["fc2.bias"].weights is not None
    assert edits["embed.weight"].weights is None
    assert edits["fc2.weight"].to_dict()["weighted"] is True


def test_layer_scale_with_a_zero_entry_is_kept():
    g = Graph()
    h = _stream(g)
    scale = np.linspace(0.5, 1.5, 16).astype(np.float32)
    scale[3] = 0.0
    h = g.node("Mul", [h, g.const("ls", value=scale)], name="ls")
    g.output(g.ln(h, 16, "ln"))
    result = fold_checked(g.model(), folded=0, kept=1)
    assert "has a zero entry" in result.plan.kept[0].reason


def test_mul_by_a_data_dependent_factor_varying_along_the_axis_is_kept():
    g = Graph()
    h = g.node("Mul", [_stream(g), g.input("gate", ["b", "s", 16])])
    g.output(g.ln(h, 16, "ln"))
    result = fold_checked(g.model(), folded=0, kept=1)
    assert "not a constant per-channel scale" in result.plan.kept[0].reason


def test_scaled_stream_must_not_reach_a_sink_before_the_scale():
    """One linear layer read raw by one LN and scaled by another: centering it for either LN
    changes what the other sees by a non-uniform amount, so both are refused."""
    g = Graph()
    branch = _stream(g)
    g.output(g.ln(branch, 16, "ln_raw"))
    g.output(g.ln(g.node("Mul", [branch, g.const("ls", (16,))], name="ls"), 16, "ln_scaled"))
    result = fold_checked(g.model(), folded=0, kept=2)
    reasons = {d.reason for d in result.plan.decisions}
    assert all("not uniform along the axis" in r or "two incompatible ways" in r for r in reasons), reasons


def test_divisor_varying_along_the_axis_is_kept():
    g = Graph()
    h = g.node("Div", [_stream(g), g.const("d", (16,))])
    g.output(g.ln(h, 16, "ln"))
    result = fold_checked(g.model(), folded=0, kept=1)
    assert "divides by a tensor that varies" in result.plan.kept[0].reason


def test_sub_of_two_streams():
    g = Graph()
    x = g.input("x", ["b", "s", 8])
    h = g.node("Sub", [g.linear(x, 8, 16, "a"), g.linear(x, 8, 16, "b")])
    g.output(g.ln(h, 16, "ln"))
    result = fold_checked(g.model(), folded=1)
    assert len(result.plan.edits) == 4


def test_reshape_flatten_keep_the_last_axis():
    g = Graph()
    x = g.input("x", [2, 3, 8])
    h = g.linear(x, 8, 16, "proj")
    h = g.node("Reshape", [h, g.ints("shape", [6, 16])])
    h = g.node("Flatten", [g.node("Unsqueeze", [h, g.ints("ax", [0])])], axis=2)
    h = g.node("Squeeze", [g.node("Unsqueeze", [h, g.ints("ax2", [1])]), g.ints("ax3", [1])])
    g.output(g.ln(h, 16, "ln"))
    fold_checked(g.model(), folded=1)


def test_reshape_that_splits_the_axis_is_kept():
    g = Graph()
    x = g.input("x", [2, 3, 8])
    h = g.linear(x, 8, 16, "proj")
    h = g.node("Reshape", [h, g.ints("shape", [2, 3, 4, 4])])
    g.output(g.ln(h, 4, "ln"))
    result = fold_checked(g.model(), folded=0, kept=1)
    assert "does not keep the normalized axis whole" in result.plan.kept[0].reason


def test_vit_patch_embedding_moves_channels_to_the_last_axis():
    """Conv -> Reshape -> Transpose, class token Concat, position Add: ViT's first LN."""
    g = Graph()
    x = g.input("x", ["b", 3, 8, 8])
    y = g.node("Conv", [x, g.const("cw", (16, 3, 4, 4)), g.const("cb", (16,))], strides=[4, 4])
    y = g.node("Reshape", [y, g.ints("shape", [0, 16, 4])])
    y = g.node("Transpose", [y], perm=[0, 2, 1])
    cls = g.node("Expand", [g.const("cls", (1, 1, 16)), g.node("Concat", [g.node("Slice", [g.node("Shape", [x]), g.ints("s0", [0]), g.ints("s1", [1])]), g.ints("one16", [1, 16])], axis=0)])
    y = g.node("Concat", [cls, y], axis=1)
    y = g.node("Add", [y, g.const("pos", (1, 5, 16))])
    g.output(g.ln(y, 16, "ln"))
    result = fold_checked(g.model(), folded=1)
    assert {(e.tensor, e.axis) for e in result.plan.edits} == {("cw", 0), ("cb", 0), ("cls", 2), ("pos", 2)}


def test_concat_along_the_normalized_axis_is_kept():
    g = Graph()
    x = g.input("x", ["b", "s", 8])
    h = g.node("Concat", [g.linear(x, 8, 8, "a"), g.linear(x, 8, 8, "b")], axis=-1)
    g.output(g.ln(h, 16, "ln"))
    result = fold_checked(g.model(), folded=0, kept=1)
    assert "along the normalized axis" in result.plan.kept[0].reason


def test_split_and_slice_along_other_axes():
    g = Graph()
    h = _stream(g)
    a, b = g.node("Split", [h, g.ints("sizes", [1, 1])], n_out=2, axis=0)
    h = g.node("Add", [a, b])
    h = g.node("Slice", [h, g.ints("st", [0]), g.ints("en", [3]), g.ints("ax", [1])])
    g.output(g.ln(h, 16, "ln"))
    result = fold_checked(g.model(), folded=1)
    assert result.plan.edits


def test_slice_of_the_normalized_axis_is_kept():
    g = Graph()
    h = g.node("Slice", [_stream(g), g.ints("st", [0]), g.ints("en", [8]), g.ints("ax", [2])])
    g.output(g.ln(h, 8, "ln"))
    result = fold_checked(g.model(), folded=0, kept=1)
    assert "slices the normalized axis" in result.plan.kept[0].reason


def test_gather_of_the_stream_along_another_axis():
    g = Graph()
    h = g.node("Gather", [_stream(g), g.ints("last", [0, 2])], axis=1)
    g.output(g.ln(h, 16, "ln"))
    fold_checked(g.model(), folded=1)


@pytest.mark.parametrize("op", ["ReduceMean", "ReduceSum"])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_global_pooling_over_other_axes(op, keepdims):
    g = Graph()
    h = g.node(op, [_stream(g), g.ints("axes", [1])], keepdims=keepdims)
    g.output(g.ln(h, 16, "ln"))
    fold_checked(g.model(), folded=1)


def test_a_data_dependent_shift_is_kept():
    """A per-row mean added back onto the stream cannot be removed by editing weights."""
    g = Graph()
    h = _stream(g)
    h = g.node("Add", [g.node("ReduceMean", [h, g.ints("axes", [2])], keepdims=1), h])
    g.output(g.ln(h, 16, "ln"))
    result = fold_checked(g.model(), folded=0, kept=1)
    assert "constant along the normalized axis; it is not a constant" in result.plan.kept[0].reason
