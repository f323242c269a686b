"""The arithmetic of an edit: a weight minus its mean along one axis, and a bias plus beta pushed
through a weight (b + beta @ W). Both read their weight a block of rows at a time
(`_tensor_io.row_blocks`) and work in float64, rounding once back to the tensor's dtype.

Both are lazy: nothing is computed until the model is written (or verified). A centered weight
then streams its blocks straight to the file, so a multi-GB weight never exists whole in memory;
the reads and arithmetic run in the writer threads, beside the kernel's copies of the untouched
weights.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import onnx_ir as ir

from onnx_lnfold._tensor_io import BLOCK_BYTES, Rows, raw_dtype, row_blocks, rows_per_block


def _broadcast(weights: Sequence[float], ndim: int, axis: int) -> np.ndarray:
    shape = [1] * ndim
    shape[axis] = len(weights)
    return np.asarray(weights, dtype=np.float64).reshape(shape)


class CenteredTensor(ir.LazyTensor):
    """`source` minus its mean along `axis`; with `weights` (an affine chain), `source` minus
    mean(source * weights) / weights, so that source * weights becomes zero-mean (no weight is
    zero: the analysis refuses that chain). `axis=None` gives zeros (a scalar-shaped producer
    whose only centered value is 0)."""

    def __init__(self, source: ir.TensorProtocol, axis: int | None, name: str, weights: Sequence[float] | None = None):
        super().__init__(self._materialize, dtype=source.dtype, shape=ir.Shape(source.shape), name=name)
        self._source = source
        # Blocks are rows (axis 0): a mean along axis 0 needs a first pass over all of them.
        self._axis = None if axis is None else axis % max(len(source.shape), 1)
        self._weights = weights

    def __repr__(self) -> str:  # LazyTensor's would print its function, a method of this very object
        return f"{self._repr_base()}(source={self._source!r}, axis={self._axis}, name={self.name!r})"

    def _mean_over_rows(self, block_bytes: int) -> np.ndarray:
        """The float64 mean along axis 0 (of source * weights), summed block by block."""
        total = None
        for rows, block in row_blocks(self._source, block_bytes):
            wide = block.astype(np.float64)
            if self._weights is not None:
                wide *= _broadcast(self._weights[rows], wide.ndim, 0)
            part = wide.sum(axis=0, keepdims=True)
            total = part if total is None else total + part
        assert total is not None
        return total / self._source.shape[0]

    def row_blocks(self, block_bytes: int = BLOCK_BYTES) -> Iterator[tuple[Rows, np.ndarray]]:
        """The centered tensor's (rows, block) pairs, in order; each block is a reused buffer."""
        shape = tuple(self._source.shape)
        dtype = raw_dtype(self.dtype)
        if not shape:  # a scalar: its own mean
            yield ..., np.zeros((), dtype=dtype)
            return
        if shape[0] == 0:
            return
        axis = self._axis
        if axis is None:
            step = rows_per_block(shape, dtype.itemsize, block_bytes)
            zeros = np.zeros((min(step, shape[0]), *shape[1:]), dtype=dtype)
            for start in range(0, shape[0], step):
                yield slice(start, start + step), zeros[: min(step, shape[0] - start)]
            return
        row_mean = self._mean_over_rows(block_bytes) if axis == 0 else None
        out = None
        for rows, block in row_blocks(self._source, block_bytes):
            if out is None or out.shape[0] < block.shape[0]:
                out = np.empty(block.shape, dtype=dtype)
            target = out[: block.shape[0]]
            if self._weights is None:
                # float64 mean, float64 subtraction, one rounding back
                mean = row_mean if row_mean is not None else block.mean(axis=axis, dtype=np.float64, keepdims=True)
                np.subtract(block, mean, out=target, casting="same_kind")
            else:
                w = _broadcast(self._weights[rows] if axis == 0 else self._weights, block.ndim, axis)
                wide = block.astype(np.float64)
                mean = row_mean if row_mean is not None else (wide * w).mean(axis=axis, keepdims=True)
                target[...] = wide - mean / w
            yield rows, target

    def _materialize(self) -> ir.Tensor:
        out = np.empty(tuple(self.shape), dtype=np.dtype(self.dtype.numpy()))
        for rows, block in self.row_blocks():
            out[rows] = block
        return ir.Tensor(out, dtype=self.dtype, name=self.name)

    def tofile(self, file) -> None:
        """Stream the centered bytes (little-endian, as ONNX stores them) to a binary file."""
        for _, block in self.row_blocks():
            file.write(memoryview(block.reshape(-1).view(np.uint8)))


def _times_weight(beta: np.ndarray, weight: ir.TensorProtocol, trans: bool) -> np.ndarray:
    """beta @ W (beta @ W.T with `trans`) in float64, W read a block of rows at a time."""
    shape = tuple(weight.shape)
    out = np.zeros(shape[0] if trans else shape[1], dtype=np.float64)
    for rows, block in row_blocks(weight):
        wide = block.astype(np.float64)
        if trans:
            out[rows] = wide @ beta
        else:
            out += beta[rows] @ wide
    return out


def bias_plus_beta(
    bias: ir.TensorProtocol | None,
    beta: np.ndarray,
    weight: ir.TensorProtocol,
    *,
    trans: bool = False,
    scale: float = 1.0,
    dtype: ir.DataType,
    name: str,
) -> ir.LazyTensor:
    """bias + scale * (beta @ W) (beta @ W.T with `trans`), or without a bias just the second
    term; computed once, when first read."""
    if bias is not None:
        shape = tuple(bias.shape)
    else:
        shape = (weight.shape[0] if trans else weight.shape[1],)

    def compute() -> ir.Tensor:
        delta = scale * _times_weight(beta, weight, trans)
        if bias is None:
            return ir.Tensor(delta.astype(dtype.numpy()), dtype=dtype, name=name)
        data = np.asarray(bias.numpy())
        summed = (data.astype(np.float64) + delta.reshape(data.shape)).astype(data.dtype)
        return ir.Tensor(summed, dtype=dtype, name=name)

    return ir.LazyTensor(compute, dtype=dtype, shape=ir.Shape(shape), name=name, cache=True)
