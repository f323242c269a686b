"""Build small ONNX graphs in code for the rule tests, and check folds through ONNX Runtime."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import onnx_lnfold
from onnx_lnfold._inputs import synthesize_inputs
from onnx_lnfold._verify import compare, run_model

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
    are about what can fold exactly: they fold the LNs the cost rule would keep too
    (`fold_costly=True`) unless they ask otherwise; tests/test_beta_placement.py tests that rule."""
    options.setdefault("fold_costly", True)
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
