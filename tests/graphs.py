"""Build small ONNX graphs in code for the rule tests, and check folds through ONNX Runtime."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import onnx_lnfold
from onnx_lnfold.feeds.synthesize import synthesize_inputs
from onnx_lnfold.verify.sessions import compare, run_model

F = TensorProto.FLOAT


class Graph:
    """A graph under construction. Constants are random and off any init value (no 0s, no 1s)."""

    def __init__(self, seed: int = 0, dtype: type = np.float32):
        self.rng = np.random.default_rng(seed)
        self.dtype = dtype
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self._n = 0

    def input(self, name: str, shape, elem_type: int | None = None) -> str:
        elem_type = elem_type if elem_type is not None else helper.np_dtype_to_tensor_dtype(np.dtype(self.dtype))
        self.inputs.append(helper.make_tensor_value_info(name, elem_type, shape))
        return name

    def const(self, name: str, shape=None, value=None, dtype=None) -> str:
        arr = np.asarray(value) if value is not None else self.rng.normal(0.3, 1.0, size=shape)
        if dtype is None and arr.dtype.kind == "f":
            arr = arr.astype(self.dtype)
        elif dtype is not None:
            arr = arr.astype(dtype)
        self.inits.append(numpy_helper.from_array(arr, name))
        return name

    def ints(self, name: str, values) -> str:
        return self.const(name, value=np.asarray(values, dtype=np.int64))

    def node(self, op: str, inputs: list[str], n_out: int = 1, name: str | None = None, domain: str = "", **attrs):
        self._n += 1
        name = name or f"{op.lower()}_{self._n}"
        outs = [f"{name}_out{i}" if n_out > 1 else f"{name}_out" for i in range(n_out)]
        self.nodes.append(helper.make_node(op, inputs, outs, name=name, domain=domain, **attrs))
        return outs if n_out > 1 else outs[0]

    def ln(self, x: str, d: int, name: str, axis: int = -1, bias: bool = True, n_out: int = 1, **attrs) -> str:
        gamma = self.const(f"{name}.gamma", (d,))
        ins = [x, gamma] + ([self.const(f"{name}.beta", (d,))] if bias else [])
        return self.node("LayerNormalization", ins, n_out=n_out, name=name, axis=axis, epsilon=1e-5, **attrs)

    def linear(self, x: str, k: int, n: int, name: str, bias: bool = True) -> str:
        y = self.node("MatMul", [x, self.const(f"{name}.weight", (k, n))], name=f"{name}/matmul")
        if bias:
            y = self.node("Add", [y, self.const(f"{name}.bias", (n,))], name=f"{name}/bias")
        return y

    def output(self, name: str, shape=None, elem_type: int | None = None) -> None:
        elem_type = elem_type if elem_type is not None else helper.np_dtype_to_tensor_dtype(np.dtype(self.dtype))
        self.outputs.append(helper.make_tensor_value_info(name, elem_type, shape))

    def model(self, opset: int = 18, ms_domain: bool = False) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, "test", self.inputs, self.outputs, self.inits)
        opsets = [helper.make_opsetid("", opset)]
        if ms_domain:
            opsets.append(helper.make_opsetid("com.microsoft", 1))
        model = helper.make_model(graph, opset_imports=opsets)
        model.ir_version = 9
        return model


def decomposed_ln(g: Graph, x: str, d: int, name: str, square="Pow", divide="Div", affine=True, opset=18) -> str:
    """A LayerNorm over the last axis written out as exporters do (opset 13 or 18 ReduceMean),
    with `square` Pow or Mul, `divide` Div or Reciprocal+Mul, with or without gamma/beta."""
    axes = g.ints(f"{name}.axes", [-1])
    if opset >= 18:
        mean = g.node("ReduceMean", [x, axes], name=f"{name}/mean")
    else:
        mean = g.node("ReduceMean", [x], name=f"{name}/mean", axes=[-1])
    diff = g.node("Sub", [x, mean], name=f"{name}/sub")
    if square == "Pow":
        sq = g.node("Pow", [diff, g.const(f"{name}.two", value=np.float32(2.0))], name=f"{name}/pow")
    else:
        sq = g.node("Mul", [diff, diff], name=f"{name}/square")
    if opset >= 18:
        var = g.node("ReduceMean", [sq, g.ints(f"{name}.axes2", [-1])], name=f"{name}/var")
    else:
        var = g.node("ReduceMean", [sq], name=f"{name}/var", axes=[-1])
    eps = g.node("Constant", [], name=f"{name}/eps_const", value=onnx.numpy_helper.from_array(np.array(1e-6, np.float32)))
    root = g.node("Sqrt", [g.node("Add", [var, eps], name=f"{name}/add_eps")], name=f"{name}/sqrt")
    if divide == "Div":
        n = g.node("Div", [diff, root], name=f"{name}/div")
    else:
        n = g.node("Mul", [diff, g.node("Reciprocal", [root], name=f"{name}/recip")], name=f"{name}/mul_recip")
    if affine:
        n = g.node("Mul", [n, g.const(f"{name}.gamma", (d,))], name=f"{name}/gamma")
        n = g.node("Add", [n, g.const(f"{name}.beta", (d,))], name=f"{name}/beta")
    return n


def ops(proto: onnx.ModelProto) -> dict[str, int]:
    counts: dict[str, int] = {}
    for node in proto.graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


def assert_equivalent(original: onnx.ModelProto, folded: onnx.ModelProto, rtol: float = 1e-4, **sizes) -> float:
    """Independent of fold()'s own check: compare on two input sets of different dynamic sizes."""
    import onnx_ir as ir

    spec = ir.serde.deserialize_model(original)
    worst = 0.0
    for seed, seq in ((1, sizes.get("sequence_length", 8)), (2, sizes.get("sequence_length2", 5))):
        feeds = synthesize_inputs(spec, batch_size=sizes.get("batch_size", 2), sequence_length=seq, seed=seed)
        ref = run_model(original.SerializeToString(), feeds)
        got = run_model(folded.SerializeToString(), feeds)
        for diff in compare(ref, got):
            assert diff.rel_diff <= rtol, f"{diff.name}: relative diff {diff.rel_diff:.3g} > {rtol}"
            worst = max(worst, diff.rel_diff)
    return worst


def fold_checked(
    model: onnx.ModelProto, folded: int, kept: int = 0, rtol: float = 1e-4, **options
) -> onnx_lnfold.FoldResult:
    """Fold, assert the exact counts, and check equivalence through ONNX Runtime. The rule tests
    are about what weight edits can fold exactly: they fold the LNs the cost rule would keep too
    (`fold_costly=True`; tests/decide/test_beta_placement.py tests that rule) and insert no explicit
    centering (which makes any stream zero-mean; its tests ask for it) unless they ask otherwise."""
    options.setdefault("fold_costly", True)
    options.setdefault("auxiliary_centering", False)
    result = onnx_lnfold.fold(model, **options)
    plan = result.plan
    assert len(plan.folded) == folded, [(d.node, d.reason) for d in plan.decisions]
    assert len(plan.kept) == kept, [(d.node, d.reason) for d in plan.decisions]
    for d in plan.kept:
        assert d.reason, d
    if folded:
        assert result.report.verification.status == "passed", result.report.verification
        assert_equivalent(model, result.model_proto, rtol=rtol)
    return result


def moments_ln(
    g: Graph,
    x: str,
    d: int,
    name: str,
    *,
    reduce: str = "ReduceMean",
    square: str = "Mul",
    clamp: str | None = "before",
    inverse: str = "Reciprocal",
    order: str = "gamma_in",
    eps: float = 1e-6,
    axis: int = -1,
) -> str:
    """A LayerNorm over the last axis of a rank-3 `x` written as jax2tf / tf2onnx do, with the
    variance as E[x^2] - E[x]^2:

    - `reduce`: "ReduceMean" (keepdims=1), or "ReduceSum" (keepdims=0, times 1/d, the axis given
      back by Reshape + Expand as tf2onnx writes it), or "ReduceSum+Unsqueeze";
    - `square`: x*x as "Mul", "Pow", or "ReduceSumSquare" (with ReduceSum only);
    - `clamp`: Max(v, 0) "before" or "after" epsilon is added, or None;
    - `inverse`: 1/sqrt as "Reciprocal", "Div1" (1 / sqrt), "Pow" (-0.5), or "divide" ((x - m) / sqrt);
    - `order`: "gamma_after" ((x - m) * r * gamma + beta), "gamma_in" ((x - m) * (r * gamma) +
      beta), "affine" (x * (r * gamma) + (beta - m * (r * gamma))), "affine_no_beta";
    - `axis`: -1, or 1 with "ReduceMean" (gamma and beta of shape [d, 1]).
    """
    keep = reduce == "ReduceMean"
    axes = g.ints(f"{name}.axes", [axis])

    def mean_of(value: str, what: str) -> str:
        if keep:
            return g.node("ReduceMean", [value, axes], name=f"{name}/{what}")
        if what == "ex2" and square == "ReduceSumSquare":
            total = g.node("ReduceSumSquare", [x, axes], name=f"{name}/{what}_sum", keepdims=0)
        else:
            total = g.node("ReduceSum", [value, axes], name=f"{name}/{what}_sum", keepdims=0)
        return g.node("Mul", [total, g.const(f"{name}.{what}_inv_n", value=np.float32(1.0 / d))], name=f"{name}/{what}")

    def restore(value: str, what: str) -> str:  # the reduced axis back, as the reductions dropped it
        if keep:
            return value
        if reduce.endswith("Unsqueeze"):
            return g.node("Unsqueeze", [value, g.ints(f"{name}.{what}_axes", [2])], name=f"{name}/{what}_unsqueeze")
        shaped = g.node("Reshape", [value, g.ints(f"{name}.{what}_shape", [0, 0, 1])], name=f"{name}/{what}_reshape")
        lead = g.node("Shape", [x], name=f"{name}/{what}_shape_of", start=0, end=2)
        target = g.node("Concat", [lead, g.ints(f"{name}.{what}_one", [1])], name=f"{name}/{what}_target", axis=0)
        return g.node("Expand", [shaped, target], name=f"{name}/{what}_expand")

    if square == "Pow":
        sq = g.node("Pow", [x, g.const(f"{name}.two", value=np.float32(2.0))], name=f"{name}/square")
    else:
        sq = g.node("Mul", [x, x], name=f"{name}/square") if square == "Mul" else x
    m = mean_of(x, "mean")
    ex2 = mean_of(sq, "ex2")
    m2 = g.node("Mul", [m, m], name=f"{name}/mean_squared")
    v = g.node("Sub", [ex2, m2], name=f"{name}/variance")
    zero = g.const(f"{name}.zero", value=np.float32(0.0))
    if clamp == "before":
        v = g.node("Max", [zero, v], name=f"{name}/clamp")
    v = restore(v, "var")
    v = g.node("Add", [v, g.const(f"{name}.eps", value=np.float32(eps))], name=f"{name}/add_eps")
    if clamp == "after":
        v = g.node("Max", [v, zero], name=f"{name}/clamp")
    param = (d,) if axis == -1 else (d, 1)
    gamma, beta = g.const(f"{name}.gamma", param), g.const(f"{name}.beta", param)
    if inverse == "Pow":
        r = g.node("Pow", [v, g.const(f"{name}.minus_half", value=np.float32(-0.5))], name=f"{name}/rsqrt")
    else:
        root = g.node("Sqrt", [v], name=f"{name}/sqrt")
        if inverse == "Reciprocal":
            r = g.node("Reciprocal", [root], name=f"{name}/rsqrt")
        elif inverse == "Div1":
            r = g.node("Div", [g.const(f"{name}.one", value=np.float32(1.0)), root], name=f"{name}/rsqrt")
    m_b = restore(m, "mean")
    if inverse == "divide":
        n = g.node("Div", [g.node("Sub", [x, m_b], name=f"{name}/center"), root], name=f"{name}/normalize")
        n = g.node("Mul", [n, gamma], name=f"{name}/gamma")
        return g.node("Add", [n, beta], name=f"{name}/beta")
    if order == "gamma_after":
        n = g.node("Mul", [g.node("Sub", [x, m_b], name=f"{name}/center"), r], name=f"{name}/normalize")
        n = g.node("Mul", [n, gamma], name=f"{name}/gamma")
        return g.node("Add", [n, beta], name=f"{name}/beta")
    q = g.node("Mul", [r, gamma], name=f"{name}/gamma")
    if order == "gamma_in":
        n = g.node("Mul", [g.node("Sub", [x, m_b], name=f"{name}/center"), q], name=f"{name}/normalize")
        return g.node("Add", [n, beta], name=f"{name}/beta")
    xq = g.node("Mul", [x, q], name=f"{name}/x_times")
    mq = g.node("Mul", [m_b, q], name=f"{name}/mean_times")
    if order == "affine_no_beta":
        return g.node("Sub", [xq, mq], name=f"{name}/normalize")
    return g.node("Add", [xq, g.node("Sub", [beta, mq], name=f"{name}/shift")], name=f"{name}/normalize")


def bert_attention_block(d: int = 16, heads: int = 2) -> onnx.ModelProto:
    """x -> Linear -> LN (decomposed, opset 12) -> BERT self-attention with its residual, written as
    ONNX Runtime's session AttentionFusion (`attention_fusion.cc`) matches it: Q, K, V MatMul + Add
    + Reshape + Transpose, the mask path `Unsqueeze(1) -> Unsqueeze(2) -> Cast -> Sub(1, .) ->
    Mul(-10000)`, Softmax over axis 3, and the LN output added back. That fusion starts from a
    LayerNormalization (ONNX Runtime's LayerNormFusion makes one of the pattern first), so folding
    the LN costs it."""
    g = Graph(seed=5)
    x = g.input("x", ["b", "s", d])
    mask = g.input("mask", ["b", "s"], TensorProto.INT64)
    ln = decomposed_ln(g, g.linear(x, d, d, "proj"), d, "ln", opset=12)

    def head(name: str, perm: list[int]) -> str:
        y = g.node("Reshape", [g.linear(ln, d, d, name), g.ints(f"{name}.shape", [0, 0, heads, d // heads])], name=f"{name}/reshape")
        return g.node("Transpose", [y], name=f"{name}/transpose", perm=perm)

    q, k, v = head("q", [0, 2, 1, 3]), head("k", [0, 2, 3, 1]), head("v", [0, 2, 1, 3])
    scores = g.node("Div", [g.node("MatMul", [q, k], name="qk"), g.const("sqrt_h", value=np.float32(np.sqrt(d // heads)))], name="qk_div")
    m = g.node("Unsqueeze", [g.node("Unsqueeze", [mask], name="mask_u1", axes=[1])], name="mask_u2", axes=[2])
    m = g.node("Cast", [m], name="mask_cast", to=TensorProto.FLOAT)
    m = g.node("Sub", [g.const("one", value=np.float32(1.0)), m], name="mask_sub")
    m = g.node("Mul", [m, g.const("minus_10000", value=np.float32(-10000.0))], name="mask_mul")
    probs = g.node("Softmax", [g.node("Add", [scores, m], name="mask_add")], name="softmax", axis=3)
    context = g.node("Transpose", [g.node("MatMul", [probs, v], name="qkv")], name="context_transpose", perm=[0, 2, 1, 3])
    context = g.node("Reshape", [context, g.ints("context.shape", [0, 0, d])], name="context_reshape")
    g.output(g.node("Add", [g.linear(context, d, d, "o"), ln], name="residual"))
    return g.model(opset=12)


def gelu_stem_stream(d: int = 16) -> onnx.ModelProto:
    """x -> Linear -> GELU as the TorchScript exporter writes it, `x * (erf(x / sqrt 2) + 1) * 0.5`
    -> + position table -> a pre-LN residual block -> a final LN. No weight edit centers a GELU
    output, so the stream is centered explicitly right after it (two LNs unlocked)."""
    g = Graph(seed=7)
    h = g.linear(g.input("x", ["b", "s", 8]), 8, d, "stem")
    erf = g.node("Erf", [g.node("Div", [h, g.const("sqrt2", value=np.float32(np.sqrt(2.0)))], name="gelu/div")], name="gelu/erf")
    product = g.node("Mul", [h, g.node("Add", [erf, g.const("one", value=np.float32(1.0))], name="gelu/add")], name="gelu/mul")
    h = g.node("Mul", [product, g.const("half", value=np.float32(0.5))], name="gelu/half")
    h = g.node("Add", [h, g.const("positions", (d,))], name="positions")
    h = g.node("Add", [h, g.linear(g.ln(h, d, "ln0"), d, d, "mlp0")], name="residual0")
    g.output(g.ln(h, d, "ln_final"))
    return g.model(opset=17)


def assert_fold_count(plan, folded: int, total: int) -> None:
    """`folded` of `total` LNs fold; when not, the message lists the kept ones with their reasons."""
    assert len(plan.decisions) == total
    assert len(plan.folded) == folded, [(d.node, d.reason) for d in plan.kept]
