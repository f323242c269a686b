"""The tensor checks of the read-back (`verify.readback`), in float64, a block of rows at a time.

Each returns a failure reason ("" when the written tensor is what the plan asked for):

- `check_centered`: a weight the plan centers, of any kind (the axis whole or in blocks, with the
  per-channel weights of an affine chain, made zero), recomputed from the original;
- `check_row_means`: the row means a table derived at load subtracts (`table - means`);
- `check_bias_with_beta`: a bias that took a folded LN's beta, recomputed from the original:
  the bias (centered, where the plan centers it) plus `beta @ W`, W as written;
- `check_unchanged`: any other tensor, byte for byte the original's.

Each entry recomputed in float64 must be the written one rounded to nearest: within half a unit in
its last place, plus what another order of float64 sums can change (`_off`). A tolerance relative to
the row's largest entry instead lets a float16 weight shift by a tenth of that entry's rounding
unit, which moves every small entry by many of theirs. What the proof of the fold rests on (the LN
input is then zero-mean) is structural; these show that the tensors that proof asked for are the
ones written.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import ml_dtypes
import numpy as np
import onnx_ir as ir

from onnx_lnfold.core.ir import release_tensor
from onnx_lnfold.io.tensor_io import raw_dtype, row_blocks

_BLOCK = 1 << 20  # float64 elements per block read
_FLOATS = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64), np.dtype(ml_dtypes.bfloat16))
_FLOAT64_NOISE = 16 * float(np.finfo(np.float64).eps)  # per term summed: the order of a float64 sum


def _ulp(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """The spacing of `dtype` at each of `values` (float64): a unit in the last place."""
    info = ml_dtypes.finfo(dtype)
    eps, tiny = float(info.eps), float(info.smallest_normal)
    _, exponent = np.frexp(np.abs(values))
    return np.maximum(np.ldexp(eps, exponent - 1), eps * tiny)


def _off(expected: np.ndarray, written: np.ndarray, noise: np.ndarray | float, dtype: np.dtype) -> float:
    """The worst |written - expected| in units of what one rounding to nearest allows: half a unit in
    the last place of the expected value, plus `noise` (float64 sums taken in another order). Over 1:
    not that value rounded. Entries equal to the expected value rounded are within it; only the
    others are measured."""
    rounded = expected.astype(dtype)
    differ = rounded != written
    if not differ.any():
        return 0.0
    e, w = expected[differ], written[differ].astype(np.float64)
    allowed = 0.5 * _ulp(e, dtype) + (noise[differ] if isinstance(noise, np.ndarray) else noise)
    return float((np.abs(w - e) / allowed).max())


def _as_rows(array: np.ndarray, axis: int) -> np.ndarray:
    """`array` with `axis` last and the others flattened: (rows, n)."""
    moved = np.moveaxis(array, axis, -1)
    n = moved.shape[-1]
    return moved.reshape(-1, n) if moved.ndim != 2 else moved


def _shape_problem(original: ir.TensorProtocol, written: ir.TensorProtocol) -> str:
    if tuple(original.shape) != tuple(written.shape) or original.dtype != written.dtype:
        return (
            f"is {written.dtype.name.lower()} {list(written.shape)} where the original is "
            f"{original.dtype.name.lower()} {list(original.shape)}"
        )
    return ""


def _off_by(
    original: np.ndarray,
    written: np.ndarray,
    axis: int | None,
    weights: Sequence[float] | None = None,
    block: int | None = None,
    blocks: Sequence[int] | None = None,
) -> float:
    """How far `written` is from `original` centered along `axis` (of `original * weights`; in
    blocks of `block` entries, those of `blocks` only; the others as they were), each entry against
    its expected value recomputed in float64 and rounded once (`_off`), a block of rows at a time."""
    if axis is None or original.ndim == 0:
        return _off(np.zeros(written.size), written.reshape(-1), 0.0, written.dtype)
    a, w = _as_rows(original, axis), _as_rows(written, axis)
    dtype = written.dtype
    rows, n = a.shape
    size = block or n
    count = n // size
    chosen = np.zeros(count, dtype=bool)
    chosen[list(blocks) if blocks is not None else slice(None)] = True
    scale_by = np.asarray(weights, dtype=np.float64).reshape(count, size) if weights is not None else None
    mask = chosen[:, None]
    step = max(1, _BLOCK // max(n, 1))
    worst = 0.0
    for start in range(0, rows, step):
        expected = a[start : start + step].astype(np.float64, order="C")  # the original, centered in place below
        blocked = expected.reshape(-1, count, size)
        scaled = blocked if scale_by is None else blocked * scale_by
        mean = scaled.mean(axis=2, keepdims=True) * mask
        top = max(float(scaled.max(initial=0.0)), -float(scaled.min(initial=0.0)))
        del scaled
        blocked -= mean if scale_by is None else mean / scale_by
        # one bound for the rows read together: the float64 noise is far below any rounding unit
        smallest = 1.0 if scale_by is None else float(np.abs(scale_by).min())
        noise = (size + 1) * _FLOAT64_NOISE * top / smallest
        worst = max(worst, _off(expected, np.asarray(w[start : start + step]), noise, dtype))
    return worst


def _row_groups(tensor: ir.TensorProtocol, n: int, step: int) -> Iterator[np.ndarray]:
    """`tensor` as rows of its last axis (`n` entries each), `step` rows at a time in order (the
    last group may hold fewer), read by blocks of rows (`row_blocks`): the groups `_off_by` takes
    of the whole tensor. A group is a reused buffer: use it before asking for the next."""
    group = np.empty((step, n), dtype=raw_dtype(tensor.dtype))
    held = 0
    for _, block in row_blocks(tensor):
        rows = np.asarray(block).reshape(-1, n)
        while len(rows):
            take = min(step - held, len(rows))
            group[held : held + take] = rows[:take]
            held, rows = held + take, rows[take:]
            if held == step:
                yield group
                held = 0
    if held:
        yield group[:held]


def check_centered(
    original: ir.TensorProtocol,
    written: ir.TensorProtocol,
    axis: int | None,
    weights: Sequence[float] | None = None,
    block: int | None = None,
    blocks: Sequence[int] | None = None,
) -> str:
    """"" when `written` is `original` centered as the plan says, rounded once to its type (each
    entry within half a unit in its last place of the float64 value); else by how much it is not."""
    problem = _shape_problem(original, written)
    if problem:
        return problem
    shape, dtype = tuple(written.shape), raw_dtype(written.dtype)
    if axis is not None and shape and 0 not in shape and axis % len(shape) == len(shape) - 1 and dtype in _FLOATS:
        # Along the last axis, as weights are centered: the rows are read in turn from both files,
        # never mapped (a map's pages would stay until the tensor is released: two whole tables).
        n = shape[-1]
        step = max(1, _BLOCK // max(n, 1))
        pairs = zip(_row_groups(original, n, step), _row_groups(written, n, step))
        off = max((_off_by(a, w, 1, weights, block, blocks) for a, w in pairs), default=0.0)
    else:
        a, w = np.asarray(original.numpy()), np.asarray(written.numpy())
        if w.dtype not in _FLOATS:
            return f"is of type {w.dtype}, not a float"
        off = _off_by(a, w, None if axis is None else axis % max(a.ndim, 1), weights, block, blocks)
        del a, w
        release_tensor(original)  # unmapped once read: kept maps hold their pages
        release_tensor(written)
    if off > 1.0:
        return f"is off by {off:.3g} times what one rounding allows"
    return ""


def check_row_means(original: ir.TensorProtocol, means: ir.TensorProtocol, axis: int) -> str:
    """"" when `means` is `original`'s mean along `axis` (kept at size 1), rounded once to its type."""
    axis %= max(len(original.shape), 1)
    dims = list(original.shape)
    dims[axis] = 1
    if tuple(means.shape) != tuple(dims):
        return f"has shape {list(means.shape)} where the means along axis {axis} have {dims}"
    parts, largest = [], None
    for _, part in row_blocks(original):
        wide = part.astype(np.float64)
        if axis == 0:
            parts = [wide.sum(axis=0, keepdims=True) + (parts[0] if parts else 0.0)]
            top = np.abs(wide).max(axis=0, keepdims=True)
            largest = top if largest is None else np.maximum(largest, top)
        else:
            parts.append(wide.mean(axis=axis, keepdims=True))
            top = np.abs(wide).max(axis=axis, keepdims=True)
            largest = top if largest is None else np.concatenate([largest, top])
    release_tensor(original)
    expected = parts[0] / original.shape[0] if axis == 0 else np.concatenate(parts)
    written = np.asarray(means.numpy())
    noise = (original.shape[axis] + 1) * _FLOAT64_NOISE * largest  # type: ignore[operator]
    off = _off(expected, written, np.broadcast_to(noise, expected.shape), written.dtype)
    if off > 1.0:
        return f"is off the row means by {off:.3g} times what one rounding allows"
    return ""


def centered_float64(values: np.ndarray, axis: int | None, weights=None, block=None, blocks=None) -> np.ndarray:
    """`values` (a small tensor: a bias) centered as a plan edit says, in float64."""
    wide = values.astype(np.float64)
    if axis is None:
        return np.zeros_like(wide)
    if wide.ndim == 0:
        return np.zeros_like(wide)
    axis %= wide.ndim
    moved = np.moveaxis(wide, axis, -1).copy()
    n = moved.shape[-1]
    size = block or n
    count = n // size
    w = np.asarray(weights, dtype=np.float64) if weights is not None else np.ones(n)
    split = (moved * w).reshape(*moved.shape[:-1], count, size)
    mean = split.mean(axis=-1, keepdims=True)
    chosen = np.zeros(count, dtype=bool)
    chosen[list(blocks) if blocks is not None else slice(None)] = True
    mean = np.where(chosen[:, None], mean, 0.0)
    moved -= np.broadcast_to(mean, split.shape).reshape(moved.shape) / w
    return np.moveaxis(moved, -1, axis)


def beta_through(beta: np.ndarray, weight: ir.TensorProtocol, trans: bool) -> tuple[np.ndarray, np.ndarray]:
    """beta @ W (W @ beta with `trans`) in float64, W read a block of rows at a time; and |beta| @ |W|,
    which bounds what another order of the sums changes."""
    shape = tuple(weight.shape)
    out = np.zeros(shape[0] if trans else shape[1], dtype=np.float64)
    bound = np.zeros_like(out)
    for rows, part in row_blocks(weight):
        wide = part.astype(np.float64)
        if trans:
            out[rows] = wide @ beta
            bound[rows] = np.abs(wide) @ np.abs(beta)
        else:
            out += beta[rows] @ wide
            bound += np.abs(beta[rows]) @ np.abs(wide)
    release_tensor(weight)
    return out, bound


def check_bias_with_beta(base: np.ndarray, delta: np.ndarray, bound: np.ndarray, written: ir.TensorProtocol) -> str:
    """"" when `written` is the bias `base` (float64; centered where the plan centers it, then
    rounded to its type as the fold writes it first) plus `delta` (its share of beta, beta @ W),
    rounded once more; `bound` bounds the float64 noise of `delta`."""
    values = np.asarray(written.numpy())
    if values.size != delta.size:
        return f"has shape {list(values.shape)} where the bias plus beta @ W has {list(delta.shape)}"
    if values.dtype not in _FLOATS:
        return f"is of type {values.dtype}, not a float"
    expected = base.astype(values.dtype).astype(np.float64) + delta
    noise = (bound.size + 1) * _FLOAT64_NOISE * bound + _FLOAT64_NOISE * np.abs(expected)
    off = _off(expected, values.reshape(-1), noise, values.dtype)
    if off > 1.0:
        return f"is off the original bias plus beta @ W by {off:.3g} times what one rounding allows"
    return ""


def _bytes(array: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)


def check_unchanged(original: ir.TensorProtocol, written: ir.TensorProtocol) -> str:
    """"" when `written` holds `original`'s bytes; read a block of rows at a time from both."""
    problem = _shape_problem(original, written)
    if problem:
        return problem
    try:
        for (_, a), (_, b) in zip(row_blocks(original), row_blocks(written)):
            if a.dtype == object or b.dtype == object:  # strings
                same = np.array_equal(a, b)
            else:  # bytes: a NaN is its own payload, -0.0 is not 0.0
                same = a.shape == b.shape and np.array_equal(_bytes(a), _bytes(b))
            if not same:
                return "differs from the original"
    finally:
        release_tensor(original)
        release_tensor(written)
    return ""
