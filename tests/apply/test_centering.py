"""The arithmetic of an edit (`apply.centering`) and the block reader under it (`io.tensor_io`).

Blocks are made tiny here so that every tensor spans many of them, with a ragged last one: the
results must equal a whole-tensor float64 reference, whatever the block size, axis and storage.
"""

import io

import ml_dtypes
import numpy as np
import onnx_ir as ir
import pytest

from onnx_lnfold.apply.centering import CenteredTensor, bias_plus_beta, exact_float64
from onnx_lnfold.core.errors import LnFoldError
from onnx_lnfold.io.tensor_io import row_blocks

RNG = np.random.default_rng(7)


def _external(tmp_path, array: np.ndarray, name="w", pad=24) -> ir.ExternalTensor:
    """`array` stored at a non-zero offset of a data file, as an exporter writes it."""
    path = tmp_path / f"{name}.data"
    path.write_bytes(b"\x7f" * pad + array.astype(array.dtype.newbyteorder("<")).tobytes() + b"\x7f" * 8)
    return ir.ExternalTensor(
        path.name, pad, array.nbytes, ir.DataType.from_numpy(array.dtype), shape=ir.Shape(array.shape), name=name, base_dir=str(tmp_path)
    )


def _reference(array: np.ndarray, axis, weights=None) -> np.ndarray:
    wide = array.astype(np.float64)
    if axis is None:
        return np.zeros_like(array)
    if weights is None:
        return (wide - wide.mean(axis=axis, keepdims=True)).astype(array.dtype)
    shape = [1] * array.ndim
    shape[axis] = len(weights)
    w = np.asarray(weights, dtype=np.float64).reshape(shape)
    return (wide - (wide * w).mean(axis=axis, keepdims=True) / w).astype(array.dtype)


def _streamed(tensor: ir.TensorProtocol, block_bytes: int) -> np.ndarray:
    out = np.empty(tuple(tensor.shape), dtype=tensor.dtype.numpy())
    for rows, block in row_blocks(tensor, block_bytes):
        out[rows] = block
    return out


@pytest.mark.parametrize("stored", ["memory", "external"])
@pytest.mark.parametrize(
    ("shape", "axis"),
    [((37, 16), 1), ((37, 16), -1), ((37, 16), 0), ((5, 7, 9), 2), ((5, 7, 9), 0), ((5, 7, 9), 1), ((41,), 0), ((41,), -1), ((6, 4), None)],
)
def test_centered_tensor_matches_a_whole_tensor_reference(tmp_path, stored, shape, axis):
    array = (RNG.standard_normal(shape) + 0.3).astype(np.float32)
    source = ir.Tensor(array, name="w") if stored == "memory" else _external(tmp_path, array)
    expected = _reference(array, axis)
    for block_bytes in (1, 100, 1 << 20):  # one row a block, a few rows, the whole tensor
        centered = CenteredTensor(source, axis, "w.centered")
        np.testing.assert_array_equal(_streamed(centered, block_bytes), expected)
    np.testing.assert_array_equal(CenteredTensor(source, axis, "w").numpy(), expected)
    if axis is not None:
        assert np.abs(expected.astype(np.float64).mean(axis=axis)).max() < 1e-6


@pytest.mark.parametrize("axis", [0, 1])
def test_affine_chain_centering_makes_the_scaled_tensor_zero_mean(axis):
    array = RNG.standard_normal((9, 6)).astype(np.float32)
    weights = list(RNG.uniform(0.5, 2.0, size=array.shape[axis]) * RNG.choice([-1, 1], size=array.shape[axis]))
    centered = CenteredTensor(ir.Tensor(array), axis, "w", weights)
    got = _streamed(centered, 24)  # one row a block
    np.testing.assert_array_equal(got, _reference(array, axis, weights))
    shape = [1, 1]
    shape[axis] = len(weights)
    scaled = got.astype(np.float64) * np.reshape(weights, shape)
    assert np.abs(scaled.mean(axis=axis)).max() < 1e-6


def test_scalar_and_empty_tensors():
    scalar = CenteredTensor(ir.Tensor(np.array(2.5, dtype=np.float32)), 0, "s")
    assert scalar.numpy().shape == () and scalar.numpy() == 0
    empty = CenteredTensor(ir.Tensor(np.zeros((0, 4), dtype=np.float32)), 1, "e")
    assert empty.numpy().shape == (0, 4)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float64])
def test_other_float_types_round_once_from_float64(tmp_path, dtype):
    array = (RNG.standard_normal((12, 10)) * 3).astype(dtype)
    centered = CenteredTensor(_external(tmp_path, array), 1, "w")
    got = _streamed(centered, 40)
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got.astype(np.float64), _reference(array, 1).astype(np.float64))


def test_tofile_streams_the_same_little_endian_bytes(tmp_path):
    array = RNG.standard_normal((300, 70)).astype(np.float32)
    centered = CenteredTensor(_external(tmp_path, array), 1, "w")
    sink = io.BytesIO()
    centered.tofile(sink)
    assert sink.getvalue() == _reference(array, 1).astype("<f4").tobytes()
    assert "CenteredTensor" in repr(centered)  # no recursion through its own lazy function


def test_a_centered_tensor_is_read_back_through_its_own_blocks(tmp_path):
    """beta @ W where W itself was centered: the product sees the centered values."""
    w = RNG.standard_normal((20, 8)).astype(np.float32)
    beta = RNG.standard_normal(20)
    centered = CenteredTensor(_external(tmp_path, w), 1, "w")
    bias = bias_plus_beta(None, beta, centered, dtype=ir.DataType.FLOAT, name="b")
    expected = beta @ _reference(w, 1).astype(np.float64)
    np.testing.assert_allclose(bias.numpy(), expected.astype(np.float32), rtol=1e-6)


@pytest.mark.parametrize("trans", [False, True])
@pytest.mark.parametrize("with_bias", [False, True])
def test_bias_plus_beta_is_float64_and_lazy(tmp_path, trans, with_bias):
    w = RNG.standard_normal((48, 24) if not trans else (24, 48)).astype(np.float32)
    beta = RNG.standard_normal(48)
    b = RNG.standard_normal(24).astype(np.float32)
    weight = _external(tmp_path, w)
    tensor = bias_plus_beta(ir.Tensor(b) if with_bias else None, beta, weight, trans=trans, scale=0.5, dtype=ir.DataType.FLOAT, name="b")
    assert isinstance(tensor, ir.LazyTensor) and tuple(tensor.shape) == (24,)
    product = w.astype(np.float64) @ beta if trans else beta @ w.astype(np.float64)  # beta @ W.T == W @ beta
    expected = 0.5 * product + (b.astype(np.float64) if with_bias else 0)
    np.testing.assert_allclose(tensor.numpy(), expected.astype(np.float32), rtol=1e-6)  # summed in another order


def test_an_exact_bias_plus_beta_reuses_the_product_of_a_weight_it_did_not_compute(tmp_path, monkeypatch):
    """Once written, its exact value does not read a plain W again (the product was float64 from
    the stored values); over a W this module centered it does, for the unrounded values."""
    from onnx_lnfold.apply import centering

    w = RNG.standard_normal((48, 24)).astype(np.float32)
    beta, b = RNG.standard_normal(48), RNG.standard_normal(24).astype(np.float32)
    weight, source = _external(tmp_path, w), _external(tmp_path, w)
    plain = bias_plus_beta(ir.Tensor(b), beta, weight, scale=0.5, dtype=ir.DataType.FLOAT, name="b")
    over_centered = bias_plus_beta(None, beta, CenteredTensor(source, 1, "w"), dtype=ir.DataType.FLOAT, name="c")
    plain.numpy(), over_centered.numpy()  # written
    from onnx_lnfold.io import tensor_io

    reads = []
    rows = tensor_io.row_blocks
    recorded = lambda tensor, *a: reads.append(tensor) or rows(tensor, *a)  # noqa: E731
    monkeypatch.setattr(centering, "row_blocks", recorded)
    monkeypatch.setattr(tensor_io, "row_blocks", recorded)  # read to be widened (`float64_row_blocks`)
    np.testing.assert_allclose(plain.exact_float64(), 0.5 * (beta @ w.astype(np.float64)) + b, rtol=1e-12)
    assert not any(t is weight for t in reads)  # the bias alone
    w64 = w.astype(np.float64)
    np.testing.assert_allclose(over_centered.exact_float64(), beta @ (w64 - w64.mean(axis=1, keepdims=True)), rtol=1e-12)
    assert any(t is source for t in reads)


@pytest.mark.parametrize("block, blocks", [(None, None), (4, [0, 2])])
def test_exact_rows_of_a_centered_table_are_its_exact_values_at_those_rows(tmp_path, block, blocks):
    """An embedding table's gathered rows, centered alone (ids of any shape, negative ones counting
    from the end), are the whole table's exact values there; a mean over the rows gives None."""
    table = RNG.standard_normal((30, 12)).astype(np.float32)
    centered = CenteredTensor(_external(tmp_path, table), 1, "wte", block=block, blocks=blocks)
    ids = np.array([[0, 29, -1], [7, 7, 3]])
    rows = centered.exact_float64_rows(ids)
    assert rows.shape == (2, 3, 12)
    np.testing.assert_array_equal(rows, np.take(centered.exact_float64(), ids, axis=0))
    assert CenteredTensor(_external(tmp_path, table), 0, "t").exact_float64_rows(ids) is None


def test_in_memory_tensors_are_cut_into_views():
    array = RNG.standard_normal((7, 3)).astype(np.float32)
    blocks = list(row_blocks(ir.Tensor(array), 12))
    assert len(blocks) == 7
    np.testing.assert_array_equal(np.concatenate([b for _, b in blocks]), array)


def test_data_file_shorter_than_the_tensor_is_a_clear_error(tmp_path):
    array = RNG.standard_normal((64, 8)).astype(np.float32)
    tensor = _external(tmp_path, array, pad=0)
    (tmp_path / "w.data").write_bytes((tmp_path / "w.data").read_bytes()[:1000])
    with pytest.raises(LnFoldError, match="the file ends before the tensor does"):
        CenteredTensor(tensor, 1, "w").tofile(io.BytesIO())


def test_exact_float64_of_an_external_weight_reads_it_without_keeping_a_map(tmp_path):
    """The float64 twin reads an untouched weight (the W of a bias that took a beta) by blocks from
    its file: no memory map is left open, whose pages would stay as long as the model lives."""
    array = RNG.standard_normal((37, 16)).astype(np.float32)
    tensor = _external(tmp_path, array)
    np.testing.assert_array_equal(exact_float64(tensor), array.astype(np.float64))
    assert tensor.raw is None
