"""LN forms and emitted forms: decomposed LNs, SkipLayerNormalization, residual fusion,
explicit centering, the ONNX target (docs/DESIGN.md sections 3-5)."""

import numpy as np
import onnx
import pytest

import onnx_lnfold

from graphs import Graph, decomposed_ln, fold_checked, moments_ln, ops


@pytest.mark.parametrize("square", ["Pow", "Mul"])
@pytest.mark.parametrize("divide", ["Div", "Reciprocal"])
@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("opset", [13, 18])
def test_decomposed_layer_norm_variants_fold(square, divide, affine, opset):
    g = Graph()
    h = g.linear(g.input("x", ["b", "s", 8]), 8, 16, "proj")
    g.output(decomposed_ln(g, h, 16, "ln", square, divide, affine, opset))
    result = fold_checked(g.model(opset=opset), folded=1)
    (decision,) = result.plan.decisions
    assert decision.op_type == "decomposed LayerNorm" and decision.epsilon == pytest.approx(1e-6)
    counts = ops(result.model_proto)
    assert counts["SimplifiedLayerNormalization"] == 1
    assert not {"ReduceMean", "Sqrt", "Pow", "Reciprocal", "Div"} & set(counts)


def _moments_model(eps: float = 1e-6, **how) -> onnx.ModelProto:
    g = Graph()
    h = g.linear(g.input("x", ["b", "s", 8]), 8, 16, "proj")
    g.output(moments_ln(g, h, 16, "ln", eps=eps, **how))
    return g.model()


# Every operation the form may be written with left behind would be a part not recognized.
_MOMENTS_OPS = {"ReduceMean", "ReduceSum", "ReduceSumSquare", "Max", "Sqrt", "Reciprocal", "Pow", "Div", "Expand", "Unsqueeze", "Reshape"}


@pytest.mark.parametrize(
    "order, inverse",
    [(o, i) for o in ("gamma_after", "gamma_in", "affine", "affine_no_beta") for i in ("Reciprocal", "Div1", "Pow")]
    + [("gamma_after", "divide")],
)
@pytest.mark.parametrize("clamp", [None, "before", "after"])
def test_layer_norm_as_moments_folds_in_every_order(order, inverse, clamp):
    """jax2tf/tf2onnx's LayerNorm, var = E[x^2] - E[x]^2 [clamped by Max(., 0) before or after
    epsilon], in each order of its last steps: one SimplifiedLayerNormalization with the
    pattern's epsilon, exact through ONNX Runtime."""
    result = fold_checked(_moments_model(eps=3e-6, order=order, inverse=inverse, clamp=clamp), folded=1)
    (decision,) = result.plan.decisions
    assert decision.op_type == "LayerNorm as E[x^2]-E[x]^2" and decision.epsilon == pytest.approx(3e-6)
    counts = ops(result.model_proto)
    assert counts["SimplifiedLayerNormalization"] == 1 and not _MOMENTS_OPS & set(counts)
    (rms,) = [n for n in result.model_proto.graph.node if n.op_type == "SimplifiedLayerNormalization"]
    assert onnx.helper.get_attribute_value(rms.attribute[1]) == pytest.approx(3e-6)


@pytest.mark.parametrize(
    "reduce, square",
    [("ReduceMean", "Mul"), ("ReduceMean", "Pow"), ("ReduceSum", "Mul"), ("ReduceSum", "Pow"),
     ("ReduceSum", "ReduceSumSquare"), ("ReduceSum+Unsqueeze", "Mul"), ("ReduceSum+Unsqueeze", "ReduceSumSquare")],
)
def test_layer_norm_as_moments_with_sums_and_dropped_axes_folds(reduce, square):
    """Sums times 1/n, reductions that drop the axis and the Reshape + Expand (or Unsqueeze) that
    give it back, x*x as Mul, Pow or ReduceSumSquare."""
    result = fold_checked(_moments_model(reduce=reduce, square=square), folded=1)
    assert not _MOMENTS_OPS & set(ops(result.model_proto))


def test_layer_norm_as_moments_with_a_positive_clamp_is_no_layer_norm():
    """Max(v, c) with c > 0 is not v on zero-mean input: not an LN, nothing folds."""
    model = _moments_model(clamp="before")
    for init in model.graph.initializer:
        if init.name == "ln.zero":
            init.CopyFrom(onnx.numpy_helper.from_array(np.array(1e-3, np.float32), "ln.zero"))
    assert onnx_lnfold.fold(model).plan.decisions == []


def test_layer_norm_as_moments_over_a_middle_axis_is_recognized_and_kept():
    """As Magika's first LN: over axis 1 of 3, which RMSNorm ops (trailing axes) cannot do."""
    g = Graph()
    h = g.linear(g.input("x", ["b", 16, 8]), 8, 5, "proj")
    g.output(moments_ln(g, h, 16, "ln", axis=1))
    (decision,) = fold_checked(g.model(), folded=0, kept=1).plan.decisions
    assert (decision.code, decision.stage, decision.axis) == ("not-last-axis", "form", 1)


@pytest.mark.parametrize(
    "read, moves, what",
    [
        ("ln/mean_out", True, "the mean"),
        ("ln/mean_reshape_out", True, "the mean"),
        ("ln/mean_squared_out", True, "the squared mean"),
        ("ln/ex2_out", True, "E[x^2]"),
        ("ln/variance_out", False, "the variance"),
        ("ln/rsqrt_out", False, "1/std"),
        ("ln/center_out", False, "the centered input"),
    ],
)
def test_layer_norm_as_moments_with_an_intermediate_read_elsewhere_is_kept(read, moves, what):
    """An intermediate read elsewhere keeps the pattern (`intermediate-read`). Those a shift of
    the input moves (the mean and its copies, E[x^2]) also stop it removing a shift: the LN that
    shares its input stays; those a shift leaves alone (the variance, x - m) do not."""
    g = Graph()
    h = g.linear(g.input("x", ["b", "s", 8]), 8, 16, "proj")
    g.output(g.ln(h, 16, "plain"))
    g.output(moments_ln(g, h, 16, "ln", reduce="ReduceSum"))
    g.output(read)
    result = onnx_lnfold.fold(g.model(), fold_costly=True)  # 'plain' is a graph output: its beta stays an Add
    kept = result.plan.decision_for("ln/mean_sum")
    assert kept.code == "intermediate-read" and kept.stage == "form"
    assert kept.reason.startswith(f"its intermediate '{read}' ({what}) is a graph output")
    assert ("centering the input would change it" in kept.reason) == moves
    assert result.plan.decision_for("plain").folded != moves


def test_decomposed_layer_norm_is_a_sink_for_other_lns():
    """The stream feeds a kept decomposed LN too: its mean subtraction removes the shift."""
    g = Graph()
    x = g.input("x", ["b", "s", 8])
    h = g.linear(x, 8, 16, "proj")
    g.output(g.ln(h, 16, "ln"))
    side = g.node("Add", [h, g.node("Relu", [g.linear(x, 8, 16, "side")])])
    g.output(decomposed_ln(g, side, 16, "dec"))
    result = fold_checked(g.model(), folded=1, kept=1)
    assert result.plan.decision_for("ln").folded


def test_decomposed_pattern_with_a_shared_intermediate_is_kept():
    g = Graph()
    h = g.linear(g.input("x", ["b", "s", 8]), 8, 16, "proj")
    out = decomposed_ln(g, h, 16, "dec")
    g.output(out)
    g.output("dec/mean_out")  # the mean is used elsewhere: RMSNorm would not compute it
    result = onnx_lnfold.fold(g.model())
    (decision,) = result.plan.decisions
    assert not decision.folded and "its mean 'dec/mean_out' is a graph output" in decision.reason


def _skip_ln(g: Graph, a: str, b: str, d: int, name: str, bias=True, sum_out=False):
    ins = [a, b, g.const(f"{name}.gamma", (d,)), g.const(f"{name}.beta", (d,))]
    if bias:
        ins.append(g.const(f"{name}.bias", (d,)))
    outs = g.node("SkipLayerNormalization", ins, n_out=4 if sum_out else 1, name=name, domain="com.microsoft", epsilon=1e-5)
    return outs


def test_skip_layer_norm_folds_with_its_bias_centered():
    g = Graph()
    x = g.input("x", ["b", "s", 8])
    y, _, _, total = _skip_ln(g, g.linear(x, 8, 16, "a", bias=False), g.linear(x, 8, 16, "b"), 16, "sln", sum_out=True)
    g.output(y)
    g.output(g.ln(total, 16, "ln2"))
    model = g.model(ms_domain=True)
    model.graph.node[-2].output[1] = model.graph.node[-2].output[2] = ""
    result = fold_checked(model, folded=2)
    decision = result.plan.decision_for("sln")
    assert decision.rewrite == "com.microsoft::SkipSimplifiedLayerNormalization"
    assert {e.tensor: e.role for e in result.plan.edits}["sln.bias"] == "SkipLayerNormalization bias"
    assert ops(result.model_proto)["SkipSimplifiedLayerNormalization"] == 1


def _first_block(g: Graph):
    """x -> embed linear (h0) -> ln1 -> mlp -> residual Add (h1)."""
    h0 = g.linear(g.input("x", ["b", "s", 8]), 8, 16, "embed")
    return g.node("Add", [h0, g.linear(g.ln(h0, 16, "ln1"), 16, 16, "mlp")], name="residual")


def test_residual_sum_read_by_a_graph_output_blocks_the_stream():
    g = Graph()
    h1 = _first_block(g)
    g.output(g.ln(h1, 16, "ln2"))
    g.output(g.node("Neg", [h1], name="reads_the_sum"))  # the sum, negated, is a graph output
    result = onnx_lnfold.fold(g.model())
    assert not result.plan.folded


def test_residual_add_becomes_skip_simplified_and_keeps_a_shared_sum():
    g = Graph()
    h1 = _first_block(g)
    h2 = g.node("Add", [h1, g.linear(g.ln(h1, 16, "ln2"), 16, 16, "mlp2")], name="residual2")
    g.output(g.ln(h2, 16, "ln3"))
    model = g.model()
    # auto: ORT would have fused only the last residual Add (read by ln3 alone), and on its CPU EP
    # the fused op costs more than that Add and SimplifiedLayerNormalization: none is taken in.
    auto = fold_checked(model, folded=3)
    assert [d.residual_add for d in auto.plan.folded] == [None, None, None]
    result = onnx_lnfold.fold(model, fuse_residual="always")
    assert result.plan.decision_for("ln2").residual_add == "residual"
    skip = [n for n in result.model_proto.graph.node if n.op_type == "SkipSimplifiedLayerNormalization"]
    assert len(skip) == 2
    with_sum = [n for n in skip if len(n.output) == 4]
    assert len(with_sum) == 1 and with_sum[0].output[3] == "residual_out"  # the sum keeps its name


def _relu_stem_model() -> onnx.ModelProto:
    """A pre-LN stream that starts at a Relu output: no weight edit can center it."""
    g = Graph()
    x = g.input("x", ["b", "s", 8])
    h0 = g.node("Relu", [g.linear(x, 8, 16, "stem")], name="act")
    h1 = g.node("Add", [h0, g.linear(g.ln(h0, 16, "ln1"), 16, 16, "mlp")])
    g.output(g.ln(h1, 16, "ln_f"))
    return g.model()


def test_explicit_centering_unlocks_a_stream_no_weight_can_center():
    result = fold_checked(_relu_stem_model(), folded=2, auxiliary_centering=True)
    (centering,) = result.plan.centerings
    assert centering.tensor == "act_out" and centering.axis == 2 and centering.required_by == ("ln1", "ln_f")
    assert ops(result.model_proto)["ReduceMean"] == 1


def test_explicit_centering_that_unlocks_one_ln_is_not_worth_it():
    g = Graph()
    h = g.node("Relu", [g.linear(g.input("x", ["b", "s", 8]), 8, 16, "stem")], name="act")
    g.output(g.ln(h, 16, "ln"))
    result = fold_checked(g.model(), folded=0, kept=1)
    assert "Relu 'act' does not carry a zero mean" in result.plan.kept[0].reason
    assert not result.plan.centerings


def test_explicit_centering_can_be_disabled():
    result = onnx_lnfold.fold(_relu_stem_model(), auxiliary_centering=False)
    assert not result.plan.folded and not result.plan.centerings


def test_onnx_target_emits_rms_normalization_that_passes_the_checker():
    g = Graph()
    h = g.linear(g.input("x", ["b", "s", 8]), 8, 16, "proj")
    g.output(g.ln(g.node("Add", [h, g.linear(g.input("y", ["b", "s", 8]), 8, 16, "p2")]), 16, "ln"), ["b", "s", 16])
    model = g.model(opset=23)
    model.ir_version = 11
    result = onnx_lnfold.fold(model, target="onnx")
    assert result.plan.decision_for("ln").rewrite == "RMSNormalization"
    folded = result.model_proto
    onnx.checker.check_model(folded, full_check=True)
    assert ops(folded) .get("RMSNormalization") == 1 and "SkipSimplifiedLayerNormalization" not in ops(folded)
    assert result.report.verification.status == "passed"


def test_onnx_target_converts_older_opsets():
    """Converted to opset 23 first (tests/load/test_opset.py has the committed models and the refusals)."""
    g = Graph()
    g.output(g.ln(g.linear(g.input("x", ["b", "s", 8]), 8, 16, "proj"), 16, "ln"))
    result = onnx_lnfold.fold(g.model(opset=18), target="onnx", fold_costly=True)
    assert result.plan.converted_from == 18 and result.model.opset_imports[""] == 23
    assert ops(result.model_proto).get("RMSNormalization") == 1 and result.report.verification.status == "passed"


def test_channels_first_layer_norm_through_transposes():
    g = Graph()
    x = g.input("x", ["b", 3, 8, 8])
    y = g.node("Conv", [x, g.const("cw", (16, 3, 3, 3)), g.const("cb", (16,))], pads=[1, 1, 1, 1])
    t = g.node("Transpose", [y], perm=[0, 2, 3, 1])
    n = g.ln(t, 16, "ln")
    g.output(g.node("Transpose", [n], perm=[0, 3, 1, 2]))
    fold_checked(g.model(), folded=1)


def _if_model(expose_stream: bool = False) -> onnx.ModelProto:
    """An If whose branches normalize a linear layer (weight from the outer graph) of the input."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    inits = [
        numpy_helper.from_array(rng.normal(0.3, 1, (8, 16)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.normal(1, 0.2, 16).astype(np.float32), "gamma"),
        numpy_helper.from_array(rng.normal(0, 0.2, 16).astype(np.float32), "beta"),
    ]

    def branch(name, op):
        nodes = [
            helper.make_node("MatMul", ["x", "w"], [f"{name}_h"], name=f"{name}/matmul"),
            helper.make_node("LayerNormalization", [f"{name}_h", "gamma", "beta"], [f"{name}_n"], name=f"{name}/ln", axis=-1),
            helper.make_node(op, [f"{name}_n"], [f"{name}_y"], name=f"{name}/act"),
        ]
        out = f"{name}_h" if expose_stream and name == "then" else f"{name}_y"
        return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(out, TensorProto.FLOAT, ["b", 16])])

    node = helper.make_node("If", ["cond"], ["y"], then_branch=branch("then", "Relu"), else_branch=branch("else", "Neg"), name="if")
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 8]), helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 16])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    return model


def _run_both_branches(original, folded):
    from onnx_lnfold.verify.sessions import compare, run_model

    x = np.random.default_rng(0).normal(size=(3, 8)).astype(np.float32)
    for cond in (True, False):
        feeds = {"x": x, "cond": np.array(cond)}
        for diff in compare(run_model(original.SerializeToString(), feeds), run_model(folded.SerializeToString(), feeds)):
            assert diff.rel_diff < 1e-5, (cond, diff)


def test_layer_norms_inside_if_branches_fold_where_exact():
    model = _if_model()
    # (their betas stay Adds: folded as asked, fold_costly)
    result = onnx_lnfold.fold(model, inputs={"x": np.ones((2, 8), np.float32), "cond": np.array(True)}, fold_costly=True)
    assert {d.node for d in result.plan.folded} == {"then/ln", "else/ln"}
    assert [(e.tensor, e.untie) for e in result.plan.edits] == [("w", False)]
    _run_both_branches(model, result.model_proto)


def test_layer_norm_in_a_branch_whose_stream_is_a_branch_output_is_kept():
    model = _if_model(expose_stream=True)
    result = onnx_lnfold.fold(model, inputs={"x": np.ones((2, 8), np.float32), "cond": np.array(False)}, fold_costly=True)
    # The else branch's use of the weight gets a centered copy; the then branch keeps the original.
    assert {d.node for d in result.plan.folded} == {"else/ln"}
    assert "would change, and it is a graph output" in result.plan.decision_for("then/ln").reason
    (edit,) = result.plan.edits
    assert edit.untie and edit.uses == ("else/matmul:1",)
    _run_both_branches(model, result.model_proto)


def test_layer_norm_inside_a_model_local_function_is_reported():
    from onnx import TensorProto, helper

    fn = helper.make_function(
        "local", "ln_fn", ["x", "g"], ["y"], [helper.make_node("LayerNormalization", ["x", "g"], ["y"], axis=-1)],
        [helper.make_opsetid("", 18)],
    )
    graph = helper.make_graph(
        [helper.make_node("ln_fn", ["x", "g"], ["y"], domain="local")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        [onnx.numpy_helper.from_array(np.full(4, 1.5, np.float32), "g")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("local", 1)], functions=[fn])
    plan = onnx_lnfold.fold(model).plan
    (decision,) = plan.decisions
    assert decision.status == "kept" and "model-local function 'local::ln_fn'" in decision.reason


def test_skip_layer_norm_sum_that_is_a_graph_output_blocks_its_bias_edit():
    """Centering the bias shifts output 3 (the residual sum): here a graph output."""
    g = Graph()
    x = g.input("x", ["b", "s", 8])
    y, _, _, total = _skip_ln(g, g.linear(x, 8, 16, "a", bias=False), g.linear(x, 8, 16, "b"), 16, "sln", sum_out=True)
    g.output(y)
    g.output(total)
    model = g.model(ms_domain=True)
    model.graph.node[-1].output[1] = model.graph.node[-1].output[2] = ""
    result = fold_checked(model, folded=0, kept=1)
    assert result.plan.kept[0].reason == "tensor 'sln_out3' would change, and it is a graph output"


def test_a_new_form_is_one_class_in_forms(monkeypatch):
    """docs/DESIGN.md section 8: a new LN form is one `LnForm` in `forms.FORMS`; recognition, the
    proof, the sinks and the rewrite all ask it. Here a made-up `com.example::MyLayerNorm` (a
    LayerNormalization under another name), registered for this test only, folds end to end."""
    from onnx_lnfold.carry.engine import Requirement
    from onnx_lnfold.core.blocked import Blocked
    from onnx_lnfold.forms import FORMS, LnCandidate, LnForm, LnKind, recognize
    from onnx_lnfold.verify.sessions import compare, run_model

    class MyLayerNormForm(LnForm):
        kind = LnKind.LAYER_NORM
        op_type = "MyLayerNorm"

        def match(self, node, name, shapes):
            if (node.domain, node.op_type) != ("com.example", "MyLayerNorm"):
                return None
            axis = shapes.rank(node.inputs[0]) - 1
            epsilon = node.attributes.get_float("epsilon", 1e-5)
            cand = LnCandidate(self, node, name, node.outputs[0], node.inputs[1], node.inputs[2], axis, epsilon)
            cand.nodes, cand.terms, cand.sink_uses = (node,), (Requirement(0, axis),), ((node, 0),)
            return cand

        def absorbs(self, cand, node, index, axis, shapes):
            if node is not cand.node:
                return None
            return {} if index == 0 and axis == cand.axis else Blocked("normalization-parameter", "gamma or beta")

    monkeypatch.setattr(recognize, "FORMS", (*FORMS, MyLayerNormForm()))

    def model(op: str, domain: str) -> onnx.ModelProto:
        g = Graph()
        x = g.input("x", ["b", "s", 8])
        h0 = g.linear(x, 8, 16, "embed")
        n1 = g.node(op, [h0, g.const("g1", (16,)), g.const("b1", (16,))], name="ln1", domain=domain, epsilon=1e-5)
        h1 = g.node("Add", [h0, g.linear(n1, 16, 16, "mlp")], name="residual")
        g.output(g.node(op, [h1, g.const("g2", (16,)), g.const("b2", (16,))], name="ln2", domain=domain, epsilon=1e-5))
        proto = g.model()
        proto.opset_import.append(onnx.helper.make_opsetid("com.example", 1))
        # ONNX shape inference does not know the made-up op: its output's shape is declared.
        proto.graph.value_info.append(onnx.helper.make_tensor_value_info(n1, onnx.TensorProto.FLOAT, ["b", "s", 16]))
        return proto

    # ln2's beta stays an Add (a graph output): folded as asked
    result = onnx_lnfold.fold(model("MyLayerNorm", "com.example"), verify=False, fold_costly=True)
    assert [(d.node, d.folded) for d in result.plan.decisions] == [("ln1", True), ("ln2", True)]
    folded = result.model_proto
    counts = ops(folded)
    assert "MyLayerNorm" not in counts
    assert counts["SimplifiedLayerNormalization"] == 2 and "SkipSimplifiedLayerNormalization" not in counts
    # with --fuse-residual always, ln2 takes in the residual Add it reads, as a LayerNormalization would
    always = ops(onnx_lnfold.fold(model("MyLayerNorm", "com.example"), verify=False, fold_costly=True,
                                  fuse_residual="always").model_proto)
    assert always["SimplifiedLayerNormalization"] == always["SkipSimplifiedLayerNormalization"] == 1
    # ONNX Runtime cannot run the made-up op, so the reference is the same graph written with
    # LayerNormalization (same seed, same constants).
    reference = model("LayerNormalization", "")
    feeds = {"x": np.random.default_rng(1).normal(size=(2, 5, 8)).astype(np.float32)}
    (diff,) = compare(run_model(reference.SerializeToString(), feeds), run_model(folded.SerializeToString(), feeds))
    assert diff.rel_diff < 1e-5
