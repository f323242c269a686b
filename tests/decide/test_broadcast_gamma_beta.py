"""gamma and beta of shape [1] (broadcast along the axis), with and without a residual Add to
fuse: the rewrite keeps them valid for each emitted op (ONNX Runtime's Skip kernels insist on a
full-width gamma)."""

from __future__ import annotations

import pytest

import onnx_lnfold

from graphs import Graph, decomposed_ln, fold_checked

RMS = "SimplifiedLayerNormalization"


SKIP_RMS = "com.microsoft::SkipSimplifiedLayerNormalization"


@pytest.mark.parametrize("param_shape", [(1,), ()])
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("consumer", [False, True])
def test_broadcast_gamma_and_beta(param_shape, residual, consumer):
    """gamma/beta of one element, broadcast over the normalized axis. Before: with a residual
    Add the LN became SkipSimplifiedLayerNormalization, whose kernel rejects such a gamma ('Last
    dimension of gamma and input does not match': VerificationFailed, exit 1); with a linear
    consumer, beta @ W failed on the shape (SerdeError, exit 3). Now: the plain RMSNorm (which
    broadcasts its scale) and beta broadcast to a row before it goes into the bias."""
    g = Graph()
    x = g.input("x", [2, "s", 4])
    h = g.linear(x, 4, 8, "p")
    if residual:
        h = g.node("Add", [h, g.linear(x, 4, 8, "q")], name="residual")
    y = g.node("LayerNormalization", [h, g.const("gamma", param_shape), g.const("beta", param_shape)], name="ln", axis=-1)
    g.output(g.linear(y, 8, 3, "head") if consumer else y)
    result = fold_checked(g.model(), folded=1)
    (decision,) = result.plan.folded
    assert decision.rewrite == RMS
    assert decision.beta == ("consumers" if consumer else "add")


@pytest.mark.parametrize("gamma_shape", [(1,), (1, 1, 8)])
def test_decomposed_ln_gamma_the_skip_kernel_rejects(gamma_shape):
    """A decomposed LN's gamma may be [1] or [1, 1, d]. Before, with --fuse-residual always:
    SkipSimplifiedLayerNormalization with that gamma ('gamma is expected to have 1 dimension,
    got 3'), VerificationFailed. The kernel takes a 1-D gamma of the hidden size only."""
    g = Graph()
    x = g.input("x", [2, "s", 4])
    h = g.node("Add", [g.linear(x, 4, 8, "p"), g.linear(x, 4, 8, "q")], name="residual")
    out = decomposed_ln(g, h, 8, "dec", affine=False)
    out = g.node("Mul", [out, g.const("gamma", gamma_shape)], name="dec/gamma")
    g.output(g.node("Add", [out, g.const("beta", (8,))], name="dec/beta"))
    result = onnx_lnfold.fold(g.model(), fuse_residual="always", fold_costly=True)
    (decision,) = result.plan.folded
    assert decision.rewrite == RMS and result.report.verification.status == "passed"


def test_full_gamma_still_fuses_the_residual():
    """The control: a gamma of the hidden size keeps the fused Skip op."""
    g = Graph()
    x = g.input("x", [2, "s", 4])
    h = g.node("Add", [g.linear(x, 4, 8, "p"), g.linear(x, 4, 8, "q")], name="residual")
    g.output(g.ln(h, 8, "ln"))
    (decision,) = fold_checked(g.model(), folded=1, fuse_residual="always").plan.folded
    assert decision.rewrite == SKIP_RMS
