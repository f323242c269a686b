"""Values, not just structure (docs/DESIGN.md section 2.5): a tensor the graph fixes to zero or one
(`core.values`) is read as such by the zero-mean proof, the beta placement and the explicit
centerings: TorchScript's `LayerNorm(bias=False)` / `elementwise_affine=False` (an all-zero beta, an
all-one gamma) and `zeros_like` queries (DETR's decoder)."""

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import numpy_helper

import onnx_lnfold
from onnx_lnfold.core.values import fill_of, is_zero
from onnx_lnfold.decide.targets import once_centered

from graphs import Graph, assert_equivalent, ops


def _value(model: onnx.ModelProto, name: str) -> ir.Value:
    graph = ir.serde.deserialize_model(model).graph
    for inp in graph.inputs:
        if inp.name == name:
            return inp
    for node in graph:
        for out in node.outputs:
            if out.name == name:
                return out
    return graph.initializers[name]


def _constant_node(g: Graph, name: str, array) -> str:
    return g.node("Constant", [], name=name, value=numpy_helper.from_array(np.asarray(array)))


def test_fill_of_sees_through_the_ops_exporters_write_around_a_constant():
    g = Graph()
    x = g.input("x", ["b", "s", 8])
    shape = g.node("Shape", [x])
    zeros = g.node("ConstantOfShape", [shape], name="zeros_like")  # TorchScript's zeros_like: value defaults to 0
    fives = g.node("ConstantOfShape", [shape], name="fives", value=numpy_helper.from_array(np.array([5.0], np.float32)))
    expanded = g.node("Expand", [g.const("zero", value=np.float32(0.0)), shape], name="expanded")  # dynamo's
    cast = g.node("Cast", [g.node("Unsqueeze", [_constant_node(g, "bool_false", False), g.ints("ax", [0])])], name="cast", to=1)
    ones = g.node("Reshape", [g.const("ones", value=np.ones((8,), np.float32)), g.ints("shp", [1, 8])], name="ones")
    times_zero = g.node("Mul", [x, g.const("zero_b", value=np.float32(0.0))], name="times_zero")
    sum_ = g.node("Add", [expanded, zeros], name="sum")
    varied = g.node("Add", [x, zeros], name="varied")
    for out in (zeros, fives, expanded, cast, ones, times_zero, sum_, varied):
        g.output(out)
    model = g.model()
    v = {name: _value(model, name) for name in (zeros, fives, expanded, cast, ones, times_zero, sum_, varied)}
    assert is_zero(v[zeros]) and is_zero(v[expanded]) and is_zero(v[cast]) and is_zero(v[sum_])
    assert fill_of(v[fives]) == 5.0 and fill_of(v[ones]) == 1.0 and not is_zero(v[ones])
    # x * 0 is 0 only where x is finite: a proof may read it so, a dropped beta may not.
    assert not is_zero(v[times_zero]) and is_zero(v[times_zero], exact=False)
    assert fill_of(v[varied], exact=False) is None and fill_of(_value(model, x)) is None


def _post_norm_block(beta: str, gamma: str = "random", d: int = 16) -> onnx.ModelProto:
    """A pre-LN block whose LN output feeds a residual Add (beta cannot go into a bias there):
    `y = LN(h) + proj(LN(h))`, then a final LN. `beta`: "zero" (an initializer of zeros), "constant
    node" (a Constant node of zeros, as TorchScript writes it), "computed" (ConstantOfShape of the
    width), "random"; `gamma` "ones" for an LN with no affine at all."""
    g = Graph()
    x = g.input("x", ["b", "s", d])
    h = g.linear(x, d, d, "proj_in")

    def ln(inp: str, name: str) -> str:
        scale = g.const(f"{name}.gamma", value=np.ones((d,), np.float32)) if gamma == "ones" else g.const(f"{name}.gamma", (d,))
        if beta == "zero":
            bias = g.const(f"{name}.beta", value=np.zeros((d,), np.float32))
        elif beta == "constant node":
            bias = _constant_node(g, f"{name}/beta_const", np.zeros((d,), np.float32))
        elif beta == "computed":
            bias = g.node("ConstantOfShape", [g.ints(f"{name}.width", [d])], name=f"{name}/beta_zeros")
        else:
            bias = g.const(f"{name}.beta", (d,))
        return g.node("LayerNormalization", [inp, scale, bias], name=name, axis=-1, epsilon=1e-5)

    n = ln(h, "ln1")
    y = g.node("Add", [n, g.linear(n, d, d, "proj")], name="residual")
    g.output(ln(y, "ln2"))
    return g.model()


@pytest.mark.parametrize("beta", ["zero", "constant node", "computed"])
def test_a_zero_beta_is_no_beta(beta):
    """An LN whose beta is all zero folds by default where a real beta would keep it (`costs-more`:
    its beta would stay an Add over the stream), and writes no Add of it, under --fold-costly too."""
    result = onnx_lnfold.fold(_post_norm_block(beta))
    plan = result.plan
    assert [d.status for d in plan.decisions] == ["folded", "folded"], [d.reason for d in plan.decisions]
    assert [d.beta for d in plan.decisions] == ["none", "none"]
    counts = ops(result.model_proto)
    assert counts["Add"] == 3  # the two biases and the residual: no Add(x, 0)
    assert counts.get("LayerNormalization", 0) == 0 and counts["SimplifiedLayerNormalization"] == 2
    assert result.report.verification.status == "passed"
    assert_equivalent(_post_norm_block(beta), result.model_proto, rtol=1e-5)
    costly = onnx_lnfold.fold(_post_norm_block(beta), fold_costly=True, verify=False)
    assert ops(costly.model_proto)["Add"] == 3


def test_a_real_beta_feeding_the_residual_stays_for_its_cost():
    """The control: the same block with a random beta keeps its first LN (`costs-more`)."""
    plan = onnx_lnfold.analyze(_post_norm_block("random"))
    assert plan.decisions[0].code == "costs-more"


@pytest.mark.parametrize("target", ["ort", "onnx", "primitive"])
def test_an_ln_without_affine_folds_on_every_target(target):
    """elementwise_affine=False: gamma ones, beta zeros. No beta is written on any target. The
    primitive form keeps its Mul by the ones: ONNX Runtime fuses the six ops into
    SimplifiedLayerNormalization only with that Mul (measured: without it the five ops stay)."""
    model = _post_norm_block("constant node", gamma="ones")
    result = onnx_lnfold.fold(model, target=target)
    assert len(result.plan.folded) == 2 and result.report.verification.status == "passed"
    counts = ops(result.model_proto)
    assert counts["Add"] == 3 + 2 * (target == "primitive")  # primitive: its epsilon Adds
    if target == "primitive":
        assert counts["Mul"] == 2
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        optimized = onnx.load_from_string(
            _optimized(result.model_proto.SerializeToString(), options)
        )
        fused = ops(optimized)
        assert fused.get("SimplifiedLayerNormalization") == 2 and "Pow" not in fused


def _optimized(model: bytes, options) -> bytes:
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        options.optimized_model_filepath = str(Path(tmp) / "opt.onnx")
        options.log_severity_level = 3
        ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
        return Path(options.optimized_model_filepath).read_bytes()


def _decoder_with_zero_queries(zeros: str, d: int = 16) -> onnx.ModelProto:
    """DETR's decoder: the target starts as `zeros_like(query_pos)`; each layer adds an attention
    output to it and normalizes. `zeros`: "constant of shape" (TorchScript), "expand" (dynamo with a
    dynamic batch), "times zero" (`query_pos * 0`)."""
    g = Graph()
    query_pos = g.input("query_pos", ["b", 10, d])
    memory = g.input("memory", ["b", 12, d])
    if zeros == "constant of shape":
        tgt = g.node("ConstantOfShape", [g.node("Shape", [query_pos])], name="zeros_like",
                     value=numpy_helper.from_array(np.array([0.0], np.float32)))
    elif zeros == "expand":
        tgt = g.node("Expand", [g.const("zero", value=np.float32(0.0)), g.node("Shape", [query_pos])], name="zeros_like")
    else:
        tgt = g.node("Mul", [query_pos, g.const("zero", value=np.float32(0.0))], name="zeros_like")
    for layer in range(2):
        q = g.node("Add", [tgt, query_pos], name=f"l{layer}/with_pos")
        scores = g.node("MatMul", [q, g.node("Transpose", [memory], perm=[0, 2, 1])], name=f"l{layer}/scores")
        attn = g.node("MatMul", [g.node("Softmax", [scores], axis=-1), memory], name=f"l{layer}/attend")
        tgt = g.node("Add", [tgt, g.linear(attn, d, d, f"l{layer}/out")], name=f"l{layer}/residual")
        tgt = g.ln(tgt, d, f"l{layer}/ln")
    g.output(tgt)
    return g.model()


@pytest.mark.parametrize("zeros", ["constant of shape", "expand", "times zero"])
def test_zeros_like_queries_need_no_centering(zeros):
    """The first LN reads `zeros + projection`: zero-mean once the projection is centered, with no
    explicit centering of the zeros (before: a ReduceMean + Sub of them, or of their sum)."""
    model = _decoder_with_zero_queries(zeros)
    result = onnx_lnfold.fold(model, fold_costly=True)
    first = result.plan.decisions[0]
    assert first.status == "folded" and first.reason == f"input is zero-mean {once_centered(2)}"
    # The one centering is of the post-norm stream after the first LN (DETR's decoder is post-LN).
    assert [c.tensor for c in result.plan.centerings] == ["l0/ln_out"]
    assert ops(result.model_proto)["ReduceMean"] == 1
    assert result.report.verification.status == "passed"
    assert_equivalent(model, result.model_proto, rtol=1e-5, sequence_length=10, sequence_length2=10)


def test_a_zero_beta_constant_node_is_removed_with_its_ln():
    """TorchScript writes a bias-free LN's beta as a Constant node: once no Add reads it, the
    node goes too (nothing dead is left in the written graph)."""
    result = onnx_lnfold.fold(_post_norm_block("constant node"), verify=False)
    assert "Constant" not in ops(result.model_proto)
    assert ops(_post_norm_block("constant node"))["Constant"] == 2


@pytest.mark.parametrize("content", ["zeros", "last differs", "first past the first look differs", "random"])
def test_the_fill_of_an_external_weight_is_read_and_its_map_closed(tmp_path, content):
    """A weight in external data is memory-mapped to be read: the map is closed once its fill is
    known, or its pages would stay in the process's memory as long as the model lives (every
    weight the proofs asked about, in a multi-GB model)."""
    array = np.zeros((300, 2000), dtype=np.float32)  # several stretches compared in turn
    if content == "last differs":
        array[-1, -1] = 1.0
    elif content.startswith("first past"):
        array.reshape(-1)[1024] = 1.0
    elif content == "random":
        array = np.random.default_rng(0).standard_normal(array.shape).astype(np.float32)
    (tmp_path / "w.data").write_bytes(array.tobytes())
    tensor = ir.ExternalTensor(
        "w.data", 0, array.nbytes, ir.DataType.FLOAT, shape=ir.Shape(array.shape), name="w", base_dir=str(tmp_path)
    )
    value = ir.Value(name="w", shape=ir.Shape(array.shape), type=ir.TensorType(ir.DataType.FLOAT), const_value=tensor)
    ir.Graph([], [value], nodes=[], initializers=[value])
    assert fill_of(value) == (0.0 if content == "zeros" else None)
    assert tensor.raw is None


def _pass_chain(length: int, top: str) -> list[ir.Value]:
    """`top` (a zero constant, a graph input, a Mul by zero) then `length` ops that pass it on."""
    x = ir.Value(name="x", shape=ir.Shape([4]), type=ir.TensorType(ir.DataType.FLOAT))
    zero = ir.Value(name="zero", const_value=ir.tensor(np.zeros(4, np.float32)))
    graph = ir.Graph([x], [], nodes=[], initializers=[zero])
    start = {"zero": zero, "input": x}.get(top)
    if start is None:
        start = ir.node("Mul", [x, zero], graph=graph).outputs[0]
    chain = [start]
    ops = ["Identity", "Reshape", "Dropout", "Unsqueeze", "Squeeze", "Identity"]
    for i in range(length):
        chain.append(ir.node(ops[i % len(ops)], [chain[-1]], graph=graph).outputs[0])
    graph.outputs.append(chain[-1])
    return chain


@pytest.mark.parametrize("top", ["zero", "input", "mul"])
def test_the_walk_kept_in_a_memo_reads_what_the_walk_from_each_tensor_does(top):
    """Identity-like ops are walked at most 16 deep; a memo shared by many queries (the zero-mean
    proof's) must give each tensor the answer of its own walk, whatever was asked before it."""
    chain = _pass_chain(40, top)
    alone = [(fill_of(v), fill_of(v, exact=False)) for v in chain]
    for order in (chain, chain[::-1], chain[::3] + chain[1::3] + chain[2::3]):
        memo: dict = {}
        kept = {v: (fill_of(v, memo=memo), fill_of(v, exact=False, memo=memo)) for v in order}
        assert [kept[v] for v in chain] == alone
    expected = {"zero": 0.0, "input": None, "mul": None}[top]
    assert alone[16][0] == expected and alone[17][0] is None and alone[40] == (None, None)
    if top == "mul":
        assert alone[15][1] == 0.0 and alone[16][1] is None  # the Mul is one step deeper than the zero it reads


def test_a_memo_walk_on_a_long_chain_does_not_recurse():
    chain = _pass_chain(30_000, "zero")
    memo: dict = {}
    assert [is_zero(v, memo=memo) for v in chain].count(True) == 17
    assert is_zero(chain[-1], memo={}) is False


def test_a_cycle_of_identities_is_no_fill():
    zero = ir.Value(name="zero", const_value=ir.tensor(np.zeros(4, np.float32)))
    first = ir.node("Identity", [zero])
    second = ir.node("Identity", [first.outputs[0]])
    first.replace_input_with(0, second.outputs[0])  # invalid, but must not hang
    for value in (first.outputs[0], second.outputs[0]):
        assert fill_of(value) is None and fill_of(value, memo={}) is None
