"""Chains of one node kind: what the calibration times per kind (and the CUDA sweep per kernel).

A chain is `repeat` nodes, each reading the previous node's output, so nothing is dead and no node
reads a graph input twice; x is [1, rows, hidden] with `rows` symbolic, so one session serves every
token count. With `residual_chain` (the CUDA sweep's kernels) the residual forms also carry the
running sum from node to node and output it; without (the calibration, as the cost rule prices
them) a Skip form reads the graph input `skip` and writes no sum, as ORT's fusion of an Add read once.

Kinds: `ln`, `sln` (the normalizations), `skip_ln`, `skip_sln` (their Skip forms), `add+ln`,
`add+sln` (a residual Add, then the norm), `add` (the residual Add of two [rows, hidden]), `bias_add`
(+ a constant row: beta's Add), `center` (x - ReduceMean(x), an explicit centering), `copy` (Neg).
"""

from __future__ import annotations

import numpy as np

from onnx_lnfold.core.ops import LAYER_NORM, MS_DOMAIN, RMS_NORM, SKIP_LAYER_NORM, SKIP_RMS_NORM

EPS = 1e-5
RESIDUAL = ("add+ln", "add+sln", "skip_ln", "skip_sln", "add")  # kinds that read `skip`


def chain_model(kind: str, hidden: int, dtype: str, repeat: int, residual_chain: bool = True) -> bytes:
    from onnx import TensorProto, helper, numpy_helper

    np_dtype = np.dtype(dtype)
    elem = TensorProto.FLOAT16 if np_dtype == np.float16 else TensorProto.FLOAT
    rng = np.random.default_rng(hidden)
    inits = [numpy_helper.from_array((1 + 0.1 * rng.standard_normal(hidden)).astype(np_dtype), "gamma"),
             numpy_helper.from_array((0.1 * rng.standard_normal(hidden)).astype(np_dtype), "beta"),
             numpy_helper.from_array(np.array([-1], np.int64), "axes")]
    residual = kind in RESIDUAL
    chained = residual and residual_chain and kind != "add"  # the running sum goes on from node to node
    inputs = [helper.make_tensor_value_info("x", elem, [1, "rows", hidden])]
    if residual:
        inputs.append(helper.make_tensor_value_info("skip", elem, [1, "rows", hidden]))

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
        else:
            raise ValueError(kind)
        x, r = y, (f"r{i}" if chained else r)
    outputs = [helper.make_tensor_value_info(x, elem, [1, "rows", hidden])]
    if chained:
        outputs.append(helper.make_tensor_value_info(r, elem, [1, "rows", hidden]))
    used = {i for n in nodes for i in n.input}
    graph = helper.make_graph(nodes, f"{kind}_x{repeat}", inputs, outputs, [t for t in inits if t.name in used])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(MS_DOMAIN, 1)])
    m.ir_version = 9
    return m.SerializeToString()
