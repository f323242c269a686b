"""Ops that carry a zero mean, with the normalized axis followed through them (docs/DESIGN.md section 2)."""

import numpy as np
import pytest

import onnx_lnfold

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


def test_reshape_that_splits_the_axis_into_heads_folds_with_the_weight_centered_in_blocks():
    """[.., 16] -> [.., 4, 4], an LN over the last 4: each block of 4 output columns of the
    projection (and of its bias) is centered on its own (docs/DESIGN.md section 2.4)."""
    g = Graph()
    x = g.input("x", [2, 3, 8])
    h = g.linear(x, 8, 16, "proj")
    h = g.node("Reshape", [h, g.ints("shape", [2, 3, 4, 4])])
    g.output(g.ln(h, 4, "ln"))
    result = fold_checked(g.model(), folded=1)
    assert {(e.tensor, e.axis, e.block, e.blocks) for e in result.plan.edits} == {
        ("proj.weight", 1, 4, None),
        ("proj.bias", 0, 4, None),
    }
    assert not result.plan.centerings


def test_reshape_that_splits_the_axis_with_the_outer_part_normalized_is_kept():
    """[.., 16] -> [.., 4, 4] -> swap the two: the LN's axis is every 4th column, not a block."""
    g = Graph()
    x = g.input("x", [2, 3, 8])
    h = g.linear(x, 8, 16, "proj")
    h = g.node("Reshape", [h, g.ints("shape", [2, 3, 4, 4])])
    h = g.node("Transpose", [h], perm=[0, 1, 3, 2])
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


def test_tile_along_other_axes_carries_the_mean_and_the_shift():
    """TimeSformer's divided space-time attention: the class token, a row of the stream, repeated
    over the frames and joined to the patch tokens. The centered projection shifts the stream, and
    the shift goes through the Tile to the LN (forward) as the zero mean does (backward)."""
    g = Graph()
    h = _stream(g)
    cls = g.node("Slice", [h, g.ints("st", [0]), g.ints("en", [1]), g.ints("ax", [1])], name="cls")
    frames = g.node("Tile", [cls, g.ints("repeats", [1, 3, 1])], name="repeat")
    joined = g.node("Concat", [frames, h], axis=1)
    g.output(g.ln(joined, 16, "ln"))
    result = fold_checked(g.model(), folded=1)
    assert [(e.tensor, e.untie) for e in result.plan.edits] == [("proj.bias", False), ("proj.weight", False)]


def test_tile_along_the_normalized_axis_is_kept():
    """Exact in principle (a repeated row has the row's mean) but refused: DESIGN.md 2.2."""
    g = Graph()
    h = g.node("Tile", [_stream(g), g.ints("repeats", [1, 1, 2])], name="repeat")
    g.output(g.ln(h, 32, "ln"))
    (kept,) = fold_checked(g.model(), folded=0, kept=1).plan.kept
    assert kept.code == "axis-not-kept" and "Tile 'repeat' repeats along the normalized axis" in kept.reason


def test_tile_by_counts_that_are_not_constants_is_kept():
    g = Graph()
    h = g.node("Tile", [_stream(g), g.input("repeats", [3], elem_type=7)], name="repeat")
    g.output(g.ln(h, 16, "ln"))
    (kept,) = onnx_lnfold.fold(g.model(), verify=False, auxiliary_centering=False).plan.kept
    assert kept.code == "axes-not-constant" and "repeats by counts that are not constants" in kept.reason


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


# --- Shapes the analysis can trust: from the graph itself, declared value_info as a hint -------------


def _flatten2(g: Graph, x: str) -> str:
    """TorchScript's `x.flatten(2)`: Reshape(x, Concat(Slice(Shape(x), 0, 2), [-1]))."""
    shape = g.node("Shape", [x], name="flat/shape")
    head = g.node("Slice", [shape, g.ints("flat.s0", [0]), g.ints("flat.s1", [2]), g.ints("flat.ax", [0])])
    target = g.node("Concat", [head, g.ints("flat.minus1", [-1])], axis=0)
    return g.node("Reshape", [x, target], name="flat/reshape")


def _patch_stream(g: Graph) -> str:
    """ViT's patch embedding, every pixel dim dynamic: Conv -> flatten(2) -> Transpose."""
    pixels = g.input("pixels", ["b", 3, "h", "w"])
    conv = g.node("Conv", [pixels, g.const("patch.weight", (16, 3, 2, 2)), g.const("patch.bias", (16,))],
                  name="patch", strides=[2, 2])
    return g.node("Transpose", [_flatten2(g, conv)], perm=[0, 2, 1])


def test_reshape_whose_target_copies_the_inputs_leading_dims_keeps_them():
    """With dynamic height and width no shape inference can name the flattened dim; the target
    copies dims 0 and 1 from the input itself, so the channel axis is kept whole."""
    g = Graph()
    g.output(g.ln(_patch_stream(g), 16, "ln"))
    result = fold_checked(g.model(), folded=1)
    assert not result.plan.centerings  # the conv weights are centered, no explicit centering needed
    assert {e.tensor for e in result.plan.edits} == {"patch.weight", "patch.bias"}


def test_reshape_whose_target_copies_the_inputs_last_dim_keeps_it():
    """GPT-2's Conv1D: Reshape(x, [-1, Shape(x)[-1]]) -> Gemm -> Reshape(y, Concat(Shape(x)[:2], [N]))."""
    g = Graph()
    x = g.input("x", ["b", "s", 8])
    shape = g.node("Shape", [x])
    last = g.node("Unsqueeze", [g.node("Gather", [shape, g.const("i", value=np.int64(-1))]), g.ints("ax0", [0])])
    flat = g.node("Reshape", [x, g.node("Concat", [g.ints("m1", [-1]), last], axis=0)])
    y = g.node("Gemm", [flat, g.const("w", (8, 16)), g.const("c", (16,))])
    head = g.node("Slice", [shape, g.ints("s0", [0]), g.ints("s1", [2])])
    out = g.node("Reshape", [y, g.node("Concat", [head, g.ints("n", [16])], axis=0)])
    g.output(g.ln(out, 16, "ln"))
    fold_checked(g.model(), folded=1)


def test_reshape_whose_target_mixes_the_axis_is_kept():
    """The same flatten, but of axes 1 and 2 (channels with height): the axis is not kept."""
    g = Graph()
    pixels = g.input("pixels", ["b", 3, "h", 4])
    conv = g.node("Conv", [pixels, g.const("patch.weight", (16, 3, 1, 1))], name="patch")
    shape = g.node("Shape", [conv])
    head = g.node("Slice", [shape, g.ints("s0", [0]), g.ints("s1", [1])])
    flat = g.node("Reshape", [conv, g.node("Concat", [head, g.ints("m1", [-1]), g.ints("four", [4])], axis=0)])
    g.output(g.ln(g.node("Transpose", [flat], perm=[0, 2, 1]), 4, "ln"))
    result = fold_checked(g.model(), folded=0, kept=1)
    assert "does not keep the normalized axis whole" in result.plan.kept[0].reason


def _declare_unknown(model, prefix="unk__"):
    """What the fp16 converter and onnx.shape_inference write: value_info with made-up dim names."""
    import onnx

    inferred = onnx.shape_inference.infer_shapes(model)
    n = 0
    for vi in inferred.graph.value_info:
        for d in vi.type.tensor_type.shape.dim:
            if d.HasField("dim_value") and d.dim_value == 16 or d.HasField("dim_param"):
                continue
            d.dim_param = f"{prefix}{n}"
            n += 1
    for vi in inferred.graph.value_info:  # every dim made up, as after a Reshape with -1
        for d in vi.type.tensor_type.shape.dim:
            if not d.HasField("dim_param"):
                d.dim_param = f"{prefix}{n}"
                n += 1
    return inferred


def test_declared_unknown_dims_never_override_what_the_graph_computes():
    """A Reshape to [b*s, 16] and back, with every intermediate dim declared as `unk__N`: the
    graph's own Shape arithmetic says which dim is which."""
    g = Graph()
    x = g.input("x", ["b", "s", 8])
    h = g.linear(x, 8, 16, "proj")
    flat = g.node("Reshape", [h, g.ints("t1", [-1, 16])])
    back = g.node("Reshape", [flat, g.node("Shape", [h])])
    g.output(g.ln(back, 16, "ln"))
    model = _declare_unknown(g.model())
    assert all(d.HasField("dim_param") for vi in model.graph.value_info for d in vi.type.tensor_type.shape.dim)
    fold_checked(model, folded=1)


def test_declared_shapes_still_help_where_inference_knows_nothing():
    """A custom op no inference knows: its declared output shape is the only source, and used."""
    import onnx

    g = Graph()
    h = g.node("Custom", [g.linear(g.input("x", ["b", "s", 8]), 8, 16, "proj")], domain="custom.domain")
    g.output(g.ln(h, 16, "ln"))
    model = g.model()
    model.opset_import.append(onnx.helper.make_opsetid("custom.domain", 1))
    model.graph.value_info.append(onnx.helper.make_tensor_value_info(h, onnx.TensorProto.FLOAT, ["b", "s", 16]))
    import onnx_lnfold

    plan = onnx_lnfold.fold(model, verify=False, auxiliary_centering=False).plan  # ORT cannot run the custom op
    (kept,) = plan.kept
    assert "custom.domain" in kept.reason  # the real obstacle, not "rank unknown"


def test_contrib_ops_get_ranks_from_onnxruntimes_symbolic_inference():
    """ONNX shape inference stops at ORT's contrib ops (a TorchScript BERT after ORT's optimizer:
    EmbedLayerNormalization feeding SkipLayerNormalization); without ranks the SkipLayerNorm's axis
    is unknown. Symbolic inference gives them, so the reason is the real one: post-LN."""
    g = Graph()
    ids = g.input("ids", ["b", "s"], elem_type=6)
    emb, _ = g.node(
        "EmbedLayerNormalization",
        [ids, "", g.const("word", (32, 16)), g.const("pos", (32, 16)), "", g.const("e.gamma", (16,)),
         g.const("e.beta", (16,))],
        n_out=2, name="embed_ln", domain="com.microsoft", epsilon=1e-5,
    )
    branch = g.linear(emb, 16, 16, "fc")
    skip = g.node("SkipLayerNormalization", [branch, emb, g.const("sk.gamma", (16,)), g.const("sk.beta", (16,))],
                  name="skip", domain="com.microsoft", epsilon=1e-5)
    g.output(skip)
    # (An explicit centering of the EmbedLayerNormalization output would unlock it: replacing
    # ORT's SkipLayerNormalization kernel pays for one. Not what this test is about.)
    result = fold_checked(g.model(ms_domain=True), folded=0, kept=2, auxiliary_centering=False)
    reasons = {d.node: d.reason for d in result.plan.kept}
    assert "is the output of EmbedLayerNormalization 'embed_ln'" in reasons["skip"], reasons


def test_shape_inference_leaves_the_model_and_the_working_folder_alone(tmp_path, monkeypatch):
    """Inference runs on a light copy: the caller's model keeps its value_info (ORT's fusions
    depend on it), and ORT's symbolic inference writes no file where it runs."""
    import onnx

    import onnx_lnfold

    monkeypatch.chdir(tmp_path)
    g = Graph()
    h = g.node("Custom", [g.linear(g.input("x", ["b", "s", 8]), 8, 16, "proj")], domain="custom.domain")
    g.output(g.ln(h, 16, "ln"))
    model = g.model()
    model.opset_import.append(onnx.helper.make_opsetid("custom.domain", 1))
    before = model.SerializeToString()
    onnx_lnfold.fold(model, verify=False)
    assert model.SerializeToString() == before
    assert list(tmp_path.iterdir()) == []


def test_a_node_whose_outputs_only_shape_nodes_read_passes_no_change_on():
    """TorchScript's `inputs_embeds[:, :, -1].shape`: a Gather along the normalized axis whose
    output only Shape reads. Centering the embeddings changes its values, never its shape."""
    g = Graph()
    ids = g.input("ids", ["b", "s"], elem_type=7)
    emb = g.node("Gather", [g.const("table", (32, 16)), ids], name="embed")
    last = g.node("Gather", [emb, g.const("minus1", value=np.int64(-1))], name="last", axis=2)
    seq = g.node("Gather", [g.node("Shape", [last]), g.const("one", value=np.int64(1))])
    pos = g.node("Range", [g.const("zero", value=np.int64(0)), seq, g.const("step", value=np.int64(1))])
    h = g.node("Add", [emb, g.node("Gather", [g.const("positions", (32, 16)), pos])])
    g.output(g.ln(h, 16, "ln"))
    fold_checked(g.model(), folded=1)


def test_a_gather_along_the_axis_read_by_anything_else_still_blocks():
    g = Graph()
    emb = g.node("Gather", [g.const("table", (32, 16)), g.input("ids", ["b", "s"], elem_type=7)], name="embed")
    last = g.node("Gather", [emb, g.const("minus1", value=np.int64(-1))], name="last", axis=2)
    g.output(last)
    g.output(g.ln(emb, 16, "ln"))
    result = fold_checked(g.model(), folded=0, kept=1)
    assert "gathers along the normalized axis" in result.plan.kept[0].reason


def test_a_stream_sum_no_weight_edit_reaches_is_centered_once():
    """Wav2Vec2's encoder input: `proj + GELU(grouped conv(proj))`. The GELU output cannot be
    centered, and centering `proj` would change the grouped conv's input; one explicit centering
    of the sum unlocks every LN downstream."""
    g = Graph()
    proj = g.linear(g.input("x", ["b", "s", 8]), 8, 16, "proj")
    conv_in = g.node("Transpose", [proj], perm=[0, 2, 1])
    conv = g.node("Conv", [conv_in, g.const("pos.weight", (16, 4, 3))], name="pos", group=4, pads=[1, 1])
    gelu = g.node("Transpose", [g.node("Gelu", [conv])], perm=[0, 2, 1])
    h = g.node("Add", [proj, gelu], name="stream")
    h1 = g.node("Add", [h, g.linear(g.ln(h, 16, "ln0"), 16, 16, "fc")], name="res")
    g.output(g.ln(h1, 16, "ln1"))
    result = fold_checked(g.model(opset=20), folded=2, auxiliary_centering=True)
    (centering,) = result.plan.centerings
    assert centering.tensor == "stream_out" and len(centering.required_by) == 2


@pytest.mark.parametrize("op", ["Unsqueeze", "Flatten"])
def test_axis_moves_through_unsqueeze_and_flatten_whatever_the_other_dims(op):
    """The other dims are unknown (no inference names them): the axis moves by index arithmetic."""
    import onnx

    g = Graph()
    h = g.node("Custom", [g.linear(g.input("x", ["b", "s", 8]), 8, 16, "proj")], domain="custom.domain")
    h = g.node("Identity", [h])  # declared rank 3, dims unknown
    if op == "Unsqueeze":
        moved = g.node("Unsqueeze", [h, g.ints("axes", [1])])
        back = g.node("Squeeze", [moved, g.ints("axes2", [1])])
    else:
        back = g.node("Flatten", [h], axis=2)  # [b*s, 16]
    g.output(g.ln(back, 16, "ln"))
    model = g.model()
    model.opset_import.append(onnx.helper.make_opsetid("custom.domain", 1))
    model.graph.value_info.append(onnx.helper.make_tensor_value_info(h, onnx.TensorProto.FLOAT, [None, None, None]))
    import onnx_lnfold

    (kept,) = onnx_lnfold.fold(model, verify=False).plan.kept
    assert "custom.domain" in kept.reason, kept.reason  # followed up to the custom op


def test_one_weight_centered_two_ways_gets_the_same_names_every_run():
    """A weight read by two MatMuls, one behind a layer scale, is centered as two copies. Their
    names were handed out in the iteration order of a set of IR objects, which changes from run
    to run (found by tools/fold_digests.py): which copy was `W.centered` varied."""
    g = Graph()
    x = g.input("x", ["b", "s", 8])
    w = g.const("W", (8, 16))
    plain = g.node("MatMul", [x, w], name="a_plain")
    scaled = g.node("Mul", [g.node("MatMul", [x, w], name="b_scaled"), g.const("ls", (16,))], name="ls")
    g.output(g.ln(g.node("Add", [plain, scaled]), 16, "ln"))
    model = g.model()
    names = set()
    for _ in range(12):  # each analysis loads the model afresh: new objects, new set order
        plan = onnx_lnfold.analyze(model)
        names.add(tuple((e.uses, e.new_name, e.weights is not None) for e in plan.edits))
    assert names == {((("a_plain:1",), "W.centered", False), (("b_scaled:1",), "W.centered_2", True))}
    fold_checked(model, folded=1)


def test_parts_of_one_tensor_add_up_only_by_blocks_of_one_length():
    """Two changes of one tensor (q's and k's heads of a fused projection) add up to one change
    by blocks; by blocks of two lengths, or whole beside by blocks, they do not (docs/DESIGN.md
    section 2.4)."""
    from onnx_lnfold.shapes.parts import WHOLE, Part

    q, k = Part(16, frozenset({0, 3})), Part(16, frozenset({1, 4}))
    assert q.union(k) == Part(16, frozenset({0, 1, 3, 4}))
    assert q.union(Part(16)) == Part(16)
    assert q.union(Part(8)) is None and q.union(WHOLE) is None
    rows = WHOLE.with_where({3: frozenset({0})}).union(WHOLE.with_where({3: frozenset({1}), 2: frozenset({0})}))
    assert rows == WHOLE.with_where({3: frozenset({0, 1})})  # positions asked of one only are dropped


def test_a_new_carry_op_is_one_entry_in_the_table(monkeypatch):
    """docs/DESIGN.md section 8: an op that passes a zero mean through is one entry in the carry
    table. Pad with zeros along the sequence axis does (each new row is zero); without an entry it
    stops the proof, with one the LN behind it folds, exactly."""
    from onnx_lnfold.carry import rules
    from onnx_lnfold.carry.elementwise import UnaryRule

    def model():
        g = Graph()
        x = g.input("x", [2, 3, 8])
        h = g.linear(x, 8, 8, "proj")
        h = g.node("Pad", [h, g.ints("pads", [0, 1, 0, 0, 0, 0])])
        g.output(g.ln(h, 8, "ln"))
        return g.model()

    assert "Pad" not in rules.RULES
    kept = fold_checked(model(), folded=0, kept=1)
    assert kept.plan.kept[0].code == "not-carried"
    monkeypatch.setitem(rules.RULES, "Pad", UnaryRule())  # input 0's axes are the output's
    fold_checked(model(), folded=1)


def _written_out_gelu(g: Graph, x: str) -> str:
    """GELU as an exporter writes it op by op: (x * 0.5) * (1 + Erf(x / sqrt 2))."""
    half = g.node("Mul", [x, g.const("half", value=np.float32(0.5))], name="gelu_half")
    erf = g.node("Erf", [g.node("Div", [x, g.const("root2", value=np.float32(2**0.5))])])
    return g.node("Mul", [half, g.node("Add", [erf, g.const("one", value=np.float32(1.0))])], name="node_gelu_2")


def test_a_written_out_gelu_is_named_as_the_gelu():
    """The Mul that ends a GELU written out op by op is named as that GELU, not as a Mul by some
    varying tensor: into the LN it is a nonlinearity, and a stream fed into it meets one."""
    g = Graph()
    g.output(g.ln(_written_out_gelu(g, _stream(g)), 16, "ln"))
    result = fold_checked(g.model(), folded=0, kept=1)
    (kept,) = result.plan.kept
    assert kept.code == "varying-factor"
    assert "the GELU written out op by op, ending in Mul 'node_gelu_2' (x * f(x)) is nonlinear" in kept.reason
    # A product of two unrelated tensors is no activation.
    g = Graph()
    h = g.node("Mul", [_stream(g), g.input("gate", ["b", "s", 16])])
    g.output(g.ln(h, 16, "ln"))
    assert "GELU" not in fold_checked(g.model(), folded=0, kept=1).plan.kept[0].reason
