"""The float64 twin (`verify.oracle.reference.Float64Model`) on a wide graph: thousands of tensors
live at once. The bytes it holds are kept up to date as tensors come and go, not summed again over
every live tensor after each node, and a node is given its inputs, not a copy of every live tensor
(both made the evaluation quadratic in the width)."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from onnx_lnfold.verify.oracle import reference
from onnx_lnfold.verify.oracle.reference import Float64Model


def _wide(branches: int):
    nodes = [helper.make_node("Relu", ["x"], ["r"])]
    nodes += [helper.make_node("Identity", ["r"], [f"i{k}"]) for k in range(branches)]
    nodes.append(helper.make_node("Sum", [f"i{k}" for k in range(branches)], ["y"]))
    graph = helper.make_graph(
        nodes, "wide", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_a_wide_graph_is_evaluated_without_summing_every_live_tensor_per_node(monkeypatch):
    calls = []
    counted = reference._bytes
    monkeypatch.setattr(reference, "_bytes", lambda values: calls.append(len(values)) or counted(values))
    x = np.arange(-3, 3, dtype=np.float32).reshape(2, 3)
    twin = Float64Model(_wide(3000))
    (first, second) = twin.run_many([{"x": x}, {"x": -x}])
    assert np.array_equal(first["y"], 3000 * np.maximum(x, 0).astype(np.float64))
    assert np.array_equal(second["y"], 3000 * np.maximum(-x, 0).astype(np.float64))
    assert len(calls) == 2  # once per input set, before the first node
    # at most 3001 tensors of 6 float64 live per set (r and its copies, then the copies and y)
    assert twin.peak_bytes == 2 * 3001 * 6 * 8
