"""What is not a last-axis kernel is priced as ONNX Runtime runs it (docs/DESIGN.md section 4.1):
an explicit centering over a non-last axis (a strided reduction), a decomposed LN the session leaves
decomposed over a strided axis after cancelling the Transposes around it, and the Transposes a fold
brings back; and an image or audio model with a dynamic batch is priced per item."""

from __future__ import annotations

import onnx_ir as ir

import onnx_lnfold
from onnx_lnfold.decide import costs
from onnx_lnfold.decide.pricing import PER_ITEM, centering_kind
from onnx_lnfold.shapes.table import ShapeTable

from graphs import Graph, decomposed_ln

C = 64


def _voice_block(opset: int):
    """A VITS-style block: Conv over [1, C, time], `Transpose, LN over the last axis, Transpose`
    (the LN over the channels, as Piper's voices write it), a 1x1 Conv after."""
    g = Graph(seed=21)
    x = g.input("x", [1, C, "time"])
    y = g.node("Conv", [x, g.const("conv.weight", (C, C, 3)), g.const("conv.bias", (C,))], name="conv", pads=[1, 1])
    t = g.node("Transpose", [y], name="t1", perm=[0, 2, 1])
    n = decomposed_ln(g, t, C, "ln", opset=opset)
    back = g.node("Transpose", [n], name="t2", perm=[0, 2, 1])
    g.output(g.node("Conv", [back, g.const("proj.weight", (C, C, 1)), g.const("proj.bias", (C,))], name="proj"))
    return g.model(opset=opset)


def test_a_decomposed_ln_the_session_runs_strided_is_priced_as_its_nodes():
    """ORT's transpose optimizer cancels the Transposes through the decomposed LN (opset 13: axes
    as an attribute), so its LayerNormalization fusion never happens: the LN runs as 9 nodes over
    the channels. The rule prices that (and the two Transposes the fold brings back), not one
    LayerNormalization kernel. At opset 18 the session fuses the same LN: one kernel, kept."""
    model = _voice_block(13)
    seen = onnx_lnfold.analyze(model, input_shapes={"x": (1, C, 200)})
    blind = onnx_lnfold.analyze(model, input_shapes={"x": (1, C, 200)}, keep_ort_fusions=False)
    [decision] = seen.decisions
    assert decision.folded, decision.reason
    assert "9 nodes over a non-last axis" in decision.cost_note and "a Transpose + a Transpose" in decision.cost_note
    [unseen] = blind.decisions  # without ONNX Runtime's graph: one LayerNormalization kernel
    assert unseen.code == "costs-more" and "9 nodes" not in unseen.reason
    [fused] = onnx_lnfold.analyze(_voice_block(18), input_shapes={"x": (1, C, 200)}).decisions
    assert fused.code == "costs-more" and "9 nodes" not in fused.reason


def test_the_fold_of_a_strided_decomposed_ln_is_exact_and_brings_the_transposes_back(tmp_path):
    import onnxruntime as ort

    from graphs import assert_equivalent

    model = _voice_block(13)
    result = onnx_lnfold.fold(model, input_shapes={"x": (1, C, 200)})
    assert len(result.plan.folded) == 1 and result.report.verification.status == "passed"
    assert_equivalent(model, result.model_proto, rtol=1e-4)
    counts = []
    for name, proto in (("original", model), ("folded", result.model_proto)):
        options = ort.SessionOptions()
        options.optimized_model_filepath = str(tmp_path / f"{name}.onnx")
        ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
        import onnx

        counts.append(sum(n.op_type == "Transpose" for n in onnx.load(tmp_path / f"{name}.onnx").graph.node))
    assert counts == [0, 2]  # what the rule priced: OrtLayout.transposes


def test_a_centering_over_a_non_last_axis_is_a_strided_centering():
    g = Graph()
    x = g.input("x", ["b", C, 1500])
    y = g.node("Neg", [x], name="y")
    g.output(g.node("Neg", [g.node("Unsqueeze", [y, g.ints("ax", [3])], name="u")], name="z"))
    model = ir.from_proto(g.model())
    shapes = ShapeTable(model)
    y_value = next(n for n in model.graph if n.name == "y").outputs[0]
    u_value = next(n for n in model.graph if n.name == "u").outputs[0]
    assert centering_kind(y_value, 1, shapes) == "StridedCentering"
    assert centering_kind(y_value, 2, shapes) == "Centering"
    assert centering_kind(u_value, 2, shapes) == "Centering"  # only a dim of 1 after it
    # The built-in table measured both: over a non-last axis it costs more, at every measured width.
    table = costs.builtin_table()
    for width in (64, 384, 1024):
        assert table.cost("StridedCentering", 1500, width) > table.cost("Centering", 1500, width)


def test_a_table_without_the_layout_kinds_prices_them_as_before():
    """A table calibrated before the layout kinds were measured still loads: a strided centering is
    priced as a centering, a strided decomposed LN as a LayerNormalization, a Transpose at nothing."""
    data = costs.builtin_table().to_dict()
    for kind in costs.LAYOUT_KINDS:
        del data["costs"][kind]
    table = costs.CostTable.from_dict(data, "old.json")
    assert table.cost("StridedCentering", 1500, 384) == table.cost("Centering", 1500, 384)
    assert table.cost("StridedDecomposedLayerNorm", 1500, 384) == table.cost("LayerNormalization", 1500, 384)
    assert table.cost("Transpose", 1500, 384) == 0.0 and table.spread("Transpose", 1500, 384) == 0.0


def test_an_image_model_with_a_dynamic_batch_is_priced_per_item():
    """[batch, 197, d] with the batch dynamic: 197 tokens, from the graph, not the 8192 default;
    the plan's data says which (`priced_tokens`, `priced_by_default`)."""
    g = Graph(seed=3)
    n = g.ln(g.linear(g.input("x", ["batch", 197, C]), C, C, "embed"), C, "ln")
    g.output(g.linear(n, C, C, "head"))
    decision = onnx_lnfold.analyze(g.model()).decision_for("ln")
    assert decision.priced_at == f"at 197 tokens ({PER_ITEM})"
    assert (decision.priced_tokens, decision.priced_by_default) == (197, False)
    text = Graph(seed=3)
    n = text.ln(text.linear(text.input("x", ["batch", "seq", C]), C, C, "embed"), C, "ln")
    text.output(text.linear(n, C, C, "head"))
    default = onnx_lnfold.analyze(text.model()).decision_for("ln")
    assert (default.priced_tokens, default.priced_by_default) == (8192, True)
    assert default.to_dict()["priced_by_default"] is True
