"""Constants whose type cannot hold a centering: integer tables reaching an LN through Cast, fp16
weights computed in fp32. Each stays with a reason and blocks nothing else; an fp16 model still
folds."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto

from graphs import Graph, fold_checked


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64])
@pytest.mark.parametrize("scaled", [False, True])
def test_integer_table_through_cast_is_kept_with_a_reason(dtype, scaled):
    """Before: the table was 'centered' in its integer type, which the writer could not even
    serialize (SerdeError: an internal error, exit 3). An integer cannot hold its centered
    values: the LN stays, and the reason names the table and its type."""
    g = Graph()
    table = g.const("E", value=np.random.default_rng(0).integers(-50, 50, size=(20, 8)).astype(dtype))
    h = g.node("Cast", [g.node("Gather", [table, g.input("ids", [2, "s"], TensorProto.INT64)])], to=TensorProto.FLOAT)
    if scaled:
        h = g.node("Mul", [h, g.const("scale", value=np.float32(0.02))])
    h = g.node("Add", [h, g.linear(g.input("x", [2, "s", 4]), 4, 8, "p")])
    g.output(g.ln(h, 8, "ln"))
    result = fold_checked(g.model(), folded=0, kept=1)
    (decision,) = result.plan.kept
    assert decision.blocking_tensor == "E"
    assert f"constant 'E' is {np.dtype(dtype).name.upper()}" in decision.reason


def test_integer_table_does_not_block_the_float_part():
    """The same stream with a float table folds: the refusal is about the integer type only."""
    g = Graph()
    h = g.node("Gather", [g.const("E", (20, 8)), g.input("ids", [2, "s"], TensorProto.INT64)])
    h = g.node("Add", [g.node("Cast", [h], to=TensorProto.FLOAT), g.linear(g.input("x", [2, "s", 4]), 4, 8, "p")])
    g.output(g.ln(h, 8, "ln"))
    fold_checked(g.model(), folded=1)


def test_fp16_weights_cast_to_fp32_are_kept_with_a_reason():
    """Weights stored in fp16 and cast to fp32 for the compute (mixed-precision storage), with an
    fp32 output. Before: folded and reported 'passed' under the fp16 tolerance (1e-2) the fp16
    initializers brought, while the fp32 output was 2.8e-4 off (relative): centered in fp16, the
    weight keeps a mean of its rounding. Now the LN stays, and the reason names the Cast."""
    g = Graph()
    x = g.input("x", [2, "s", 4])
    w = g.node("Cast", [g.const("W16", (4, 64), dtype=np.float16)], to=TensorProto.FLOAT, name="widen")
    h = g.node("Add", [g.node("MatMul", [x, w]), g.const("b", (64,))])
    g.output(g.ln(h, 64, "ln"))
    result = fold_checked(g.model(), folded=0, kept=1, auxiliary_centering=False)  # the proof's own refusal, no centering
    (decision,) = result.plan.kept
    assert "Cast 'widen' of FLOAT16 constant 'W16' to FLOAT" in decision.reason


def test_fp16_model_still_folds():
    """The control: weights and LN in fp16 fold, within fp16 tolerance."""
    g = Graph(dtype=np.float16)
    h = g.linear(g.input("x", [2, "s", 4]), 4, 64, "p")
    g.output(g.ln(h, 64, "ln"))
    fold_checked(g.model(), folded=1, rtol=1e-2)
