"""Decomposed LNs whose intermediates have other readers or are graph outputs: kept with a reason
(`intermediate-read`), and still absorbing a shift unless their mean is read."""

from __future__ import annotations

import pytest

from graphs import Graph, decomposed_ln, fold_checked

_INTERMEDIATE = {
    "dec/mean_out": "the mean",
    "dec/sub_out": "the centered input",
    "dec/pow_out": "the squared deviations",
    "dec/var_out": "the variance",
    "dec/add_eps_out": "the variance plus epsilon",
    "dec/sqrt_out": "the standard deviation",
    "dec/recip_out": "1/std",
}


@pytest.mark.parametrize("tensor", list(_INTERMEDIATE))
@pytest.mark.parametrize("how", ["reader", "output"])
def test_decomposed_ln_with_a_shared_intermediate_is_kept_with_a_reason(tensor, how):
    """Before: the 1/std of a Reciprocal form with another reader crashed the rewrite (ValueError
    'still being used by other nodes': exit 3); any other shared intermediate hid the LN (no
    decision, no reason). Now it is reported, kept, and the reason names the tensor."""
    g = Graph()
    h = g.linear(g.input("x", ["b", "s", 4]), 4, 8, "p")
    g.output(decomposed_ln(g, h, 8, "dec", divide="Reciprocal" if tensor == "dec/recip_out" else "Div"))
    g.output(tensor if how == "output" else g.node("Neg", [tensor], name="reader"))
    result = fold_checked(g.model(), folded=0, kept=1)
    (decision,) = result.plan.kept
    assert decision.op_type == "decomposed LayerNorm" and f"'{tensor}'" in decision.reason
    assert ("is a graph output" if how == "output" else "is read outside the pattern") in decision.reason
    if tensor != "dec/mean_out":
        assert _INTERMEDIATE[tensor] in decision.reason


@pytest.mark.parametrize("tensor", ["dec/sub_out", "dec/mean_out"])
def test_kept_decomposed_ln_still_absorbs_a_shift_unless_its_mean_is_read(tensor):
    """A kept pattern removes the shift of its input as long as its mean is its own: another LN
    on the same stream folds. A mean read elsewhere would see the shift: nothing on the stream
    may change, and that LN says which tensor blocks it."""
    g = Graph()
    h = g.linear(g.input("x", ["b", "s", 4]), 4, 8, "p")
    g.output(decomposed_ln(g, h, 8, "dec"))
    g.output(g.node("Neg", [tensor], name="reader"))
    g.output(g.ln(h, 8, "ln"))
    if tensor == "dec/sub_out":
        fold_checked(g.model(), folded=1, kept=1)
    else:
        result = fold_checked(g.model(), folded=0, kept=2)
        decision = result.plan.decision_for("ln")
        assert decision.blocking_tensor and f"'{decision.blocking_tensor}' would change" in decision.reason
