"""The arithmetic of an edit: a weight minus its mean along one axis, and a bias plus beta pushed
through a weight (b + beta @ W). Both read their weight a block of rows at a time
(`io.tensor_io.row_blocks`) and work in float64, rounding once back to the tensor's dtype.

Both also hand out their float64 values before that rounding (`exact_float64()`): verification
builds a float64 twin of the fold with them, in which an exact fold differs from the original by
float64 rounding alone (docs/DESIGN.md section 6). `exact_float64(tensor)` reads any tensor so.

Both are lazy: nothing is computed until the model is written (or verified). A centered weight
then streams its blocks straight to the file, so a multi-GB weight never exists whole in memory;
the reads and arithmetic run in the writer threads, beside the kernel's copies of the untouched
weights.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import onnx_ir as ir

from onnx_lnfold.io.tensor_io import BLOCK_BYTES, Rows, float64_row_blocks, raw_dtype, row_blocks, rows_per_block


def _broadcast(weights: Sequence[float], ndim: int, axis: int) -> np.ndarray:
    shape = [1] * ndim
    shape[axis] = len(weights)
    return np.asarray(weights, dtype=np.float64).reshape(shape)


class CenteredTensor(ir.LazyTensor):
    """`source` minus its mean along `axis`; with `weights` (an affine chain), `source` minus
    mean(source * weights) / weights, so that source * weights becomes zero-mean (no weight is
    zero: the analysis refuses that chain). `axis=None` gives zeros (a scalar-shaped producer
    whose only centered value is 0).

    With `block`, the axis is cut into consecutive blocks of that many entries and each block in
    `blocks` (None: every one) loses its own mean; the others are left as they are (a q/k
    projection centered head by head, docs/DESIGN.md section 2.4)."""

    def __init__(
        self,
        source: ir.TensorProtocol,
        axis: int | None,
        name: str,
        weights: Sequence[float] | None = None,
        block: int | None = None,
        blocks: Sequence[int] | None = None,
    ):
        super().__init__(self._materialize, dtype=source.dtype, shape=ir.Shape(source.shape), name=name)
        self._source = source
        # Rows are read a block of them at a time (axis 0): a mean along axis 0 needs a first
        # pass over all of them.
        self._axis = None if axis is None else axis % max(len(source.shape), 1)
        self._weights = weights
        self._block = block
        self._blocks = blocks

    def __repr__(self) -> str:  # LazyTensor's would print its function, a method of this very object
        return f"{self._repr_base()}(source={self._source!r}, axis={self._axis}, name={self.name!r})"

    def _mean_over_rows(self, block_bytes: int) -> np.ndarray:
        """The float64 mean along axis 0 (of source * weights), summed block by block."""
        total = None
        for rows, wide in float64_row_blocks(self._source, block_bytes):
            if self._weights is not None:
                wide *= _broadcast(self._weights[rows], wide.ndim, 0)
            part = wide.sum(axis=0, keepdims=True)
            total = part if total is None else total + part
        assert total is not None
        return total / self._source.shape[0]

    def _float64_blocks(self, block_bytes: int) -> Iterator[tuple[Rows, np.ndarray]]:
        """The centered (rows, block) pairs in float64, before any rounding; a block may be a
        reused buffer (`row_blocks`)."""
        shape = tuple(self._source.shape)
        if not shape:  # a scalar: its own mean
            yield ..., np.zeros((), dtype=np.float64)
            return
        if shape[0] == 0:
            return
        axis = self._axis
        if axis is not None and self._block is not None:
            yield from self._blocked_float64(shape, axis, block_bytes)
            return
        if axis is None:
            step = rows_per_block(shape, 8, block_bytes)
            for start in range(0, shape[0], step):
                yield slice(start, start + step), np.zeros((min(step, shape[0] - start), *shape[1:]))
            return
        row_mean = self._mean_over_rows(block_bytes) if axis == 0 else None
        for rows, wide in float64_row_blocks(self._source, block_bytes):
            if self._weights is None:
                mean = row_mean if row_mean is not None else wide.mean(axis=axis, keepdims=True)
                wide -= mean
            else:
                w = _broadcast(self._weights[rows] if axis == 0 else self._weights, wide.ndim, axis)
                mean = row_mean if row_mean is not None else (wide * w).mean(axis=axis, keepdims=True)
                wide -= mean / w
            yield rows, wide

    def row_blocks(self, block_bytes: int = BLOCK_BYTES) -> Iterator[tuple[Rows, np.ndarray]]:
        """The centered tensor's (rows, block) pairs, in order; each block is a reused buffer."""
        dtype = raw_dtype(self.dtype)
        out = None
        for rows, wide in self._float64_blocks(block_bytes):
            if not wide.ndim:  # a scalar
                yield rows, wide.astype(dtype)
                continue
            if out is None or out.shape[0] < wide.shape[0]:
                out = np.empty(wide.shape, dtype=dtype)
            target = out[: wide.shape[0]]
            target[...] = wide  # the one rounding, float64 -> the weight's dtype
            yield rows, target

    def _blocked_float64(self, shape: tuple, axis: int, block_bytes: int) -> Iterator[tuple[Rows, np.ndarray]]:
        """`_float64_blocks` for a centering in blocks along `axis`: each chosen block minus its
        own (weighted) mean, in float64."""
        size = self._block
        assert size is not None and shape[axis] % size == 0
        count = shape[axis] // size
        chosen = np.zeros(count, dtype=bool)
        chosen[list(self._blocks) if self._blocks is not None else slice(None)] = True
        weights = np.asarray(self._weights, dtype=np.float64) if self._weights is not None else None

        def split(array: np.ndarray) -> np.ndarray:  # the axis as (count, size)
            return array.reshape(array.shape[:axis] + (count, size) + array.shape[axis + 1 :])

        def along(vector: np.ndarray, ndim: int) -> np.ndarray:  # a per-entry vector, split like the axis
            return split(_broadcast(vector, ndim, axis))

        means = None
        if axis == 0:  # the blocks run across rows: their means need every row first
            sums = np.zeros((count, *shape[1:]), dtype=np.float64)
            for rows, wide in float64_row_blocks(self._source, block_bytes):
                if weights is not None:
                    wide *= _broadcast(weights[rows], wide.ndim, 0)
                np.add.at(sums, np.arange(rows.start, rows.start + len(wide)) // size, wide)
            means = sums / size
            means[~chosen] = 0.0
        for rows, wide in float64_row_blocks(self._source, block_bytes):
            if axis == 0:
                index = np.arange(rows.start, rows.start + len(wide)) // size
                shift = means[index]  # type: ignore[index]
                if weights is not None:
                    shift = shift / _broadcast(weights[rows], wide.ndim, 0)
                yield rows, wide - shift
            else:
                blocked = split(wide)
                scaled = blocked * along(weights, wide.ndim) if weights is not None else blocked
                mask = chosen.reshape((1,) * axis + (count, 1) + (1,) * (wide.ndim - axis - 1))
                mean = scaled.mean(axis=axis + 1, keepdims=True) * mask
                if weights is not None:
                    mean = mean / along(weights, wide.ndim)
                yield rows, (blocked - mean).reshape(wide.shape)

    def exact_float64(self) -> np.ndarray:
        """The centered values in float64, before rounding to the weight's dtype."""
        out = np.empty(tuple(self.shape), dtype=np.float64)
        for rows, wide in self._float64_blocks(BLOCK_BYTES):
            out[rows] = wide
        return out

    def exact_float64_blocks(self, block_bytes: int = BLOCK_BYTES) -> Iterator[tuple[Rows, np.ndarray]]:
        """`exact_float64` a block of rows at a time, (rows, block) in order: a weight streamed
        through a product is never held whole in float64."""
        return self._float64_blocks(block_bytes)

    def exact_float64_rows(self, indices: np.ndarray) -> np.ndarray | None:
        """`np.take(self.exact_float64(), indices, axis=0)` with only those rows read and centered
        (an embedding table's few gathered rows); None where the mean runs over the rows (axis 0)."""
        if self._axis is None or self._axis == 0:
            return None
        indices = np.asarray(indices)
        rows = np.take(np.asarray(self._source.numpy()), indices.reshape(-1), axis=0)  # the table's rank
        gathered = CenteredTensor(ir.Tensor(rows), self._axis, self.name or "", self._weights, self._block, self._blocks)
        return gathered.exact_float64().reshape(*indices.shape, *rows.shape[1:])

    def _materialize(self) -> ir.Tensor:
        out = np.empty(tuple(self.shape), dtype=np.dtype(self.dtype.numpy()))
        for rows, block in self.row_blocks():
            out[rows] = block
        return ir.Tensor(out, dtype=self.dtype, name=self.name)

    def tofile(self, file) -> None:
        """Stream the centered bytes (little-endian, as ONNX stores them) to a binary file."""
        for _, block in self.row_blocks():
            file.write(memoryview(block.reshape(-1).view(np.uint8)))


class RowMeans(ir.LazyTensor):
    """The mean of `source` along `axis`, that axis kept at size 1: what centering `source`
    subtracts. A tied embedding table's Gathers read `source - means`, which ONNX Runtime folds
    into the centered table at session start (docs/DESIGN.md section 3.1)."""

    def __init__(self, source: ir.TensorProtocol, axis: int, name: str):
        dims = list(source.shape)
        self._axis = axis % len(dims)
        dims[self._axis] = 1
        super().__init__(self._materialize, dtype=source.dtype, shape=ir.Shape(dims), name=name)
        self._source = source

    def __repr__(self) -> str:
        return f"{self._repr_base()}(source={self._source!r}, axis={self._axis}, name={self.name!r})"

    def exact_float64(self) -> np.ndarray:
        """The means in float64, before rounding to the source's dtype."""
        if self._axis == 0:
            total = None
            for _, block in row_blocks(self._source):
                part = block.astype(np.float64).sum(axis=0, keepdims=True)
                total = part if total is None else total + part
            assert total is not None
            return total / self._source.shape[0]
        out = np.empty(tuple(self.shape), dtype=np.float64)
        for rows, block in row_blocks(self._source):
            out[rows] = block.mean(axis=self._axis, dtype=np.float64, keepdims=True)
        return out

    def _materialize(self) -> ir.Tensor:
        values = self.exact_float64().astype(np.dtype(self.dtype.numpy()))
        return ir.Tensor(values, dtype=self.dtype, name=self.name)


def exact_float64(tensor: ir.TensorProtocol) -> np.ndarray:
    """`tensor`'s values in float64: for a tensor this module computed, before its rounding."""
    own = getattr(tensor, "exact_float64", None)
    if own is not None:
        return own()
    # Read by blocks of rows from its file, not mapped: a map's pages would stay in the process's
    # memory for as long as the tensor lives.
    out = np.empty(tuple(tensor.shape), dtype=np.float64)
    for rows, block in row_blocks(tensor):
        out[rows] = block
    return out


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


class BiasPlusBeta(ir.LazyTensor):
    """bias + scale * (beta @ W) (beta @ W.T with `trans`), or without a bias just the second
    term; computed once, when first read. W as written (a centered W rounded to its dtype): the
    folded model computes with that W. `exact_float64` uses the unrounded values throughout."""

    def __init__(
        self,
        bias: ir.TensorProtocol | None,
        beta: np.ndarray,
        weight: ir.TensorProtocol,
        *,
        trans: bool,
        scale: float,
        dtype: ir.DataType,
        name: str,
    ):
        if bias is not None:
            shape = tuple(bias.shape)
        else:
            shape = (weight.shape[0] if trans else weight.shape[1],)
        super().__init__(self._materialize, dtype=dtype, shape=ir.Shape(shape), name=name, cache=True)
        self._bias, self._beta, self._weight, self._trans, self._scale = bias, beta, weight, trans, scale
        self._delta: np.ndarray | None = None  # scale * (beta @ W) in float64, where W is no computed tensor

    def __repr__(self) -> str:  # LazyTensor's would print its function, a method of this very object
        return f"{self._repr_base()}(weight={self._weight!r}, trans={self._trans}, name={self.name!r})"

    def _materialize(self) -> ir.Tensor:
        delta = self._scale * _times_weight(self._beta, self._weight, self._trans)
        if not hasattr(self._weight, "exact_float64"):  # W as written is W exactly: kept for `exact_float64`
            self._delta = delta
        if self._bias is None:
            return ir.Tensor(delta.astype(self.dtype.numpy()), dtype=self.dtype, name=self.name)
        data = np.asarray(self._bias.numpy())
        summed = (data.astype(np.float64) + delta.reshape(data.shape)).astype(data.dtype)
        return ir.Tensor(summed, dtype=self.dtype, name=self.name)

    def exact_float64(self) -> np.ndarray:
        delta = self._delta
        if delta is None:  # not written yet, or W computed here: its unrounded values
            weight = exact_float64(self._weight)
            delta = self._scale * (weight @ self._beta if self._trans else self._beta @ weight)
        if self._bias is None:
            return delta
        bias = exact_float64(self._bias)
        return bias + delta.reshape(bias.shape)


def bias_plus_beta(
    bias: ir.TensorProtocol | None,
    beta: np.ndarray,
    weight: ir.TensorProtocol,
    *,
    trans: bool = False,
    scale: float = 1.0,
    dtype: ir.DataType,
    name: str,
) -> BiasPlusBeta:
    """bias + scale * (beta @ W) (beta @ W.T with `trans`), or without a bias just the second
    term; computed once, when first read."""
    return BiasPlusBeta(bias, beta, weight, trans=trans, scale=scale, dtype=dtype, name=name)
