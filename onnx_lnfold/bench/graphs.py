"""Chains of one node kind: what the calibration times per kind (and the CUDA sweep per kernel).

A chain is `repeat` nodes, each reading the previous node's output, so nothing is dead and no node
reads a graph input twice; x is [1, rows, hidden] with `rows` symbolic, so one session serves every
token count. With `residual_chain` (the CUDA sweep's kernels) the residual forms also carry the
running sum from node to node and output it; without (the calibration, as the cost rule prices
them) a Skip form reads the graph input `skip` and writes no sum, as ORT's fusion of an Add read once.

Kinds: `ln`, `sln` (the normalizations), `skip_ln`, `skip_sln` (their Skip forms), `add+ln`,
`add+sln` (a residual Add, then the norm), `add` (the residual Add of two [rows, hidden]), `bias_add`
(+ a constant row: beta's Add), `center` (x - ReduceMean(x), an explicit centering), `copy` (Neg).

The layout kinds (`CHANNELS_FIRST`) read x as [1, hidden, rows], as a speech or TTS stream runs
where a norm is not over the last axis: `strided_center` (x - ReduceMean(x) over axis 1),
`strided_ln` (the nine nodes of a decomposed LN over axis 1, `decomposed_ln`), `transpose`
([1, hidden, rows] <-> [1, rows, hidden]; an even chain ends in x's layout).
"""

from __future__ import annotations

import numpy as np

from onnx_lnfold.core.ops import LAYER_NORM, MS_DOMAIN, RMS_NORM, SKIP_LAYER_NORM, SKIP_RMS_NORM

EPS = 1e-5
RESIDUAL = ("add+ln", "add+sln", "skip_ln", "skip_sln", "add")  # kinds that read `skip`
CHANNELS_FIRST = ("strided_center", "strided_ln", "transpose")  # kinds whose x is [1, hidden, rows]


def decomposed_ln(x: str, y: str, axis: int | str, tag: str = "") -> list:
    """LayerNorm as exporters write it over `axis` (an int: ReduceMean's attribute, up to opset 17;
    a name: its axes input, from opset 18): ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div, Mul,
    Add, reading the constants `two`, `eps`, `gamma_col` and `beta_col` (gamma and beta shaped to
    broadcast over the axis); `tag` names the node outputs apart in a chain."""
    from onnx import helper

    def node(op, inputs, output, **attrs):
        return helper.make_node(op, inputs, [output], **attrs)

    def mean(i, o):
        return node("ReduceMean", [i, axis], o) if isinstance(axis, str) else node("ReduceMean", [i], o, axes=[axis])

    m, c, p, v, ve, s, n, g = (f"{name}{tag}" for name in ("m", "c", "p", "v", "ve", "s", "n", "g"))
    return [mean(x, m), node("Sub", [x, m], c), node("Pow", [c, "two"], p),
            mean(p, v), node("Add", [v, "eps"], ve), node("Sqrt", [ve], s),
            node("Div", [c, s], n), node("Mul", [n, "gamma_col"], g), node("Add", [g, "beta_col"], y)]


def chain_model(kind: str, hidden: int, dtype: str, repeat: int, residual_chain: bool = True) -> bytes:
    from onnx import TensorProto, helper, numpy_helper

    np_dtype = np.dtype(dtype)
    elem = TensorProto.FLOAT16 if np_dtype == np.float16 else TensorProto.FLOAT
    rng = np.random.default_rng(hidden)
    inits = [numpy_helper.from_array((1 + 0.1 * rng.standard_normal(hidden)).astype(np_dtype), "gamma"),
             numpy_helper.from_array((0.1 * rng.standard_normal(hidden)).astype(np_dtype), "beta"),
             numpy_helper.from_array(np.array([-1], np.int64), "axes"),
             numpy_helper.from_array(np.array([1], np.int64), "axis1"),
             numpy_helper.from_array((1 + 0.1 * rng.standard_normal((hidden, 1))).astype(np_dtype), "gamma_col"),
             numpy_helper.from_array((0.1 * rng.standard_normal((hidden, 1))).astype(np_dtype), "beta_col"),
             numpy_helper.from_array(np.array(2.0, np_dtype), "two"),
             numpy_helper.from_array(np.array(EPS, np_dtype), "eps")]
    residual = kind in RESIDUAL
    shape = [1, hidden, "rows"] if kind in CHANNELS_FIRST else [1, "rows", hidden]
    chained = residual and residual_chain and kind != "add"  # the running sum goes on from node to node
    inputs = [helper.make_tensor_value_info("x", elem, shape)]
    if residual:
        inputs.append(helper.make_tensor_value_info("skip", elem, shape))

    def ln(i, o):
        return helper.make_node(LAYER_NORM.op_type, [i, "gamma", "beta"], [o], axis=-1, epsilon=EPS)

    def sln(i, o):
        return helper.make_node(RMS_NORM.op_type, [i, "gamma"], [o], axis=-1, epsilon=EPS)

    nodes, x, r = [], "x", "skip"
    for i in range(repeat):
        y = f"y{i}"
        if kind == "copy":
            nodes.append(helper.make_node("Neg", [x], [y]))
        elif kind == "ln":
            nodes.append(ln(x, y))
        elif kind == "sln":
            nodes.append(sln(x, y))
        elif kind in ("add+ln", "add+sln"):
            nodes.append(helper.make_node("Add", [x, r], [f"r{i}"]))
            nodes.append(ln(f"r{i}", y) if kind == "add+ln" else sln(f"r{i}", y))
        elif kind in ("skip_ln", "skip_sln"):
            op = SKIP_LAYER_NORM if kind == "skip_ln" else SKIP_RMS_NORM
            extra = ["beta"] if kind == "skip_ln" else []
            outputs = [y, "", "", f"r{i}"] if chained else [y]
            nodes.append(helper.make_node(op.op_type, [x, r, "gamma", *extra], outputs, domain=op.domain, epsilon=EPS))
        elif kind == "add":
            nodes.append(helper.make_node("Add", [x, r], [y]))
        elif kind == "bias_add":
            nodes.append(helper.make_node("Add", [x, "beta"], [y]))
        elif kind == "center":
            nodes.append(helper.make_node("ReduceMean", [x, "axes"], [f"m{i}"], keepdims=1))
            nodes.append(helper.make_node("Sub", [x, f"m{i}"], [y]))
        elif kind == "strided_center":
            nodes.append(helper.make_node("ReduceMean", [x, "axis1"], [f"m{i}"], keepdims=1))
            nodes.append(helper.make_node("Sub", [x, f"m{i}"], [y]))
        elif kind == "strided_ln":
            nodes.extend(decomposed_ln(x, y, "axis1", tag=str(i)))
        elif kind == "transpose":
            nodes.append(helper.make_node("Transpose", [x], [y], perm=[0, 2, 1]))
        else:
            raise ValueError(kind)
        x, r = y, (f"r{i}" if chained else r)
    if kind == "transpose" and repeat % 2:
        shape = [shape[0], shape[2], shape[1]]
    outputs = [helper.make_tensor_value_info(x, elem, shape)]
    if chained:
        outputs.append(helper.make_tensor_value_info(r, elem, [1, "rows", hidden]))
    used = {i for n in nodes for i in n.input}
    graph = helper.make_graph(nodes, f"{kind}_x{repeat}", inputs, outputs, [t for t in inits if t.name in used])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(MS_DOMAIN, 1)])
    m.ir_version = 9
    return m.SerializeToString()
