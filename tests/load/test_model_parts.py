"""What a model holds beside its graph that the fold cannot keep (sparse initializers, training
info): refused with one line, never dropped silently."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx_lnfold

from graphs import Graph
from helpers import run_cli


def _small_model() -> onnx.ModelProto:
    g = Graph()
    h = g.linear(g.input("x", ["b", "s", 4]), 4, 8, "p")
    g.output(g.ln(h, 8, "ln"))
    return g.model()


def _with_sparse_initializer() -> onnx.ModelProto:
    model = _small_model()
    values = numpy_helper.from_array(np.array([1.5, -2.0], np.float32), "sp")
    indices = numpy_helper.from_array(np.array([1, 3], np.int64), "sp_idx")
    model.graph.sparse_initializer.append(helper.make_sparse_tensor(values, indices, [8]))
    model.graph.node.append(helper.make_node("Add", ["ln_out", "sp"], ["plus_sparse"], name="add_sparse"))
    model.graph.output.append(helper.make_tensor_value_info("plus_sparse", TensorProto.FLOAT, None))
    return model


def _with_training_info() -> onnx.ModelProto:
    model = _small_model()
    info = onnx.TrainingInfoProto()
    step = helper.make_node("Identity", ["p.weight"], ["p.weight.next"])
    info.algorithm.CopyFrom(
        helper.make_graph([step], "step", [], [helper.make_tensor_value_info("p.weight.next", TensorProto.FLOAT, None)])
    )
    binding = info.update_binding.add()
    binding.key, binding.value = "p.weight", "p.weight.next"
    model.training_info.append(info)
    return model


@pytest.mark.parametrize("make, what", [(_with_sparse_initializer, "sparse_initializer"), (_with_training_info, "training_info")])
def test_parts_the_model_cannot_keep_are_refused(tmp_path, make, what):
    """Before: onnx_ir dropped them on the way in. A sparse initializer's readers then read
    nothing (the CLI ended 'verification failed', exit 1; the API returned a model that does not
    load); training_info vanished from a model written with exit 0. Now: one line, exit 2,
    nothing written (and LnFoldError from the API)."""
    src = tmp_path / "in.onnx"
    onnx.save(make(), src)
    out = tmp_path / "out.onnx"
    code, stdout, stderr = run_cli(src, "-o", out)
    assert code == 2 and what in stderr and len(stderr.strip().splitlines()) == 1, stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.onnx"]
    with pytest.raises(onnx_lnfold.LnFoldError, match=what):
        onnx_lnfold.fold(make())
