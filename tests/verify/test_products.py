"""The float64 twins' streamed products (verify.oracle.part_reads) and OpenBLAS's thread count while
the passes run side by side (verify.oracle.blas_threads)."""

from __future__ import annotations

import threading

import numpy as np
import onnx
import onnx_ir as ir
import pytest

from onnx_lnfold.apply.centering import CenteredTensor
from onnx_lnfold.verify.oracle import blas_threads, part_reads


def _matmul() -> onnx.NodeProto:
    return onnx.helper.make_node("MatMul", ["x", "w"], ["y"])


@pytest.mark.parametrize("block_bytes", [1 << 10, 3000, 1 << 20])  # many blocks, a short last one, one block
def test_streamed_product_is_the_float64_product_of_every_set(monkeypatch, block_bytes):
    monkeypatch.setattr(part_reads, "STREAM_BYTES", block_bytes)
    rng = np.random.default_rng(1)
    weight = rng.standard_normal((37, 23), dtype=np.float32)
    sets = [{"x": rng.standard_normal((2, 5, 37))}, {"x": rng.standard_normal((3, 37))}]
    got = part_reads.streamed_matmul(_matmul(), ir.Tensor(weight), sets)
    assert got is not None and len(got) == 2
    for out, feeds in zip(got, sets):
        want = feeds["x"] @ weight.astype(np.float64)
        assert out.shape == want.shape
        np.testing.assert_allclose(out, want, rtol=1e-13, atol=1e-13)


def test_streamed_exact_product_is_that_of_the_centered_weight(monkeypatch):
    monkeypatch.setattr(part_reads, "STREAM_BYTES", 1 << 10)
    rng = np.random.default_rng(2)
    weight = rng.standard_normal((29, 11), dtype=np.float32)
    centered = CenteredTensor(ir.Tensor(weight, name="w"), 1, "w")
    rows = rng.standard_normal((4, 29))
    (got,) = part_reads.streamed_exact_matmul(_matmul(), centered, [{"x": rows}])
    wide = weight.astype(np.float64)
    np.testing.assert_allclose(got, rows @ (wide - wide.mean(axis=1, keepdims=True)), rtol=1e-12, atol=1e-13)


def test_streamed_product_declines_activations_that_are_not_float64_rows():
    weight = ir.Tensor(np.ones((4, 3), dtype=np.float32))
    assert part_reads.streamed_matmul(_matmul(), weight, [{"x": np.ones((2, 4), dtype=np.float32)}]) is None
    assert part_reads.streamed_matmul(_matmul(), weight, [{"x": np.ones((2, 5))}]) is None


def test_blas_threads_lowered_within_and_restored_after():
    found = blas_threads._loaded_openblas()
    if found is None:
        pytest.skip("numpy's BLAS here is not an OpenBLAS this module finds")
    get, set_ = found
    before = get()
    set_(2)
    try:
        with blas_threads.blas_threads_at_most(1):
            seen = []
            worker = threading.Thread(target=lambda: seen.append(get()))  # as a pass's worker sees it
            worker.start()
            worker.join()
            assert get() == 1 and seen == [1]
        assert get() == 2
        with blas_threads.blas_threads_at_most(4):  # never raised
            assert get() == 2
    finally:
        set_(before)
