"""What the check feeds a model it synthesizes inputs for: the batch retried at 1 where an export
bakes it in, values in a parameter input's domain, and inputs beyond the budget refused before
anything is allocated."""

from __future__ import annotations

import onnx
import pytest

import onnx_lnfold
from onnx_lnfold.feeds.sets import RETRY_BATCH, verification_input_sets

from graphs import Graph


def _baked_batch(batch_shape=("batch", "seq", 8)) -> onnx.ModelProto:
    """Declares the batch dynamic, but a Reshape bakes in batch 1 (as some exports do)."""
    g = Graph()
    x = g.input("x", list(batch_shape))
    baked = g.node("Reshape", [g.linear(x, 8, 8, "proj"), g.ints("shape1", [1, -1, 8])])
    h = g.node("Add", [baked, g.linear(x, 8, 8, "side", bias=False)])
    g.output(g.linear(g.ln(h, 8, "ln"), 8, 4, "head"))
    return g.model()


def test_a_batch_baked_in_is_found_and_said():
    result = onnx_lnfold.fold(_baked_batch())
    verification = result.report.verification
    assert verification.status == "passed" and len(result.plan.folded) == 1
    assert verification.input_shapes == {"x": [1, 8, 8]}
    assert f"checked at batch {RETRY_BATCH}" in " ".join(verification.notes)
    assert "batch 1" in "\n".join(result.report.format_text().splitlines())


def test_no_retry_where_no_dim_takes_the_batch():
    # the batch fixed at 1 by the graph: the sets are as before, with no retry to try
    sets = verification_input_sets(onnx_lnfold_ir(_baked_batch((1, "seq", 8))))
    assert all(not s.at_retry_batch for s in sets)
    sets = verification_input_sets(onnx_lnfold_ir(_baked_batch()))
    assert [tuple(s.at_retry_batch[0]["x"].shape) for s in sets if s.at_retry_batch] == [(1, 8, 8), (1, 5, 8)]


def onnx_lnfold_ir(proto: onnx.ModelProto):
    import onnx_ir as ir

    return ir.from_proto(proto)
