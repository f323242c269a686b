"""Read a constant tensor front to back, a block of rows (along axis 0) at a time.

Centering and the beta fold read each weight they touch once, in order. For external data,
plain `read` calls into one reused buffer are several times faster than touching a memory map
page by page (each first touch is a page fault), and only one block is ever held: the mapped
pages of a multi-GB weight never pile up in the process's RSS.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import EllipsisType

import numpy as np
import onnx_ir as ir

from onnx_lnfold._errors import LnFoldError

# About this many bytes a block: enough that a read call's overhead vanishes, few enough that the
# block, its float64 copy and the output stay in cache from read to write. Measured on the 2.4 GB
# benchmark model (2 cores): 1 MB blocks write the centered weights 3x faster than 4 MB blocks,
# whose output has left the cache before the kernel copies it into the page cache.
BLOCK_BYTES = 1 << 20

# Which rows a block holds: a slice of axis 0, or `...` for a scalar (its one block is all of it).
Rows = slice | EllipsisType


def rows_per_block(shape: tuple[int, ...], itemsize: int, block_bytes: int = BLOCK_BYTES) -> int:
    row = itemsize * int(np.prod(shape[1:], dtype=np.int64))
    return max(1, block_bytes // max(row, 1))


def _raw_dtype(tensor: ir.TensorProtocol) -> np.dtype | None:
    """The little-endian numpy dtype the tensor's bytes are stored as, or None when its elements
    are not whole bytes (4-bit types are packed)."""
    try:
        dtype = np.dtype(tensor.dtype.numpy())
        bits = tensor.dtype.bitwidth
    except (TypeError, ValueError):  # strings and other types with no fixed width
        return None
    if dtype.itemsize * 8 != bits:
        return None
    return dtype.newbyteorder("<")


def _read_into(file, view: np.ndarray, where: str) -> None:
    target = memoryview(view.reshape(-1).view(np.uint8))
    done = 0
    while done < len(target):
        n = file.readinto(target[done:])
        if not n:
            raise LnFoldError(f"{where}: external data ends before the tensor does")
        done += n


def row_blocks(tensor: ir.TensorProtocol, block_bytes: int = BLOCK_BYTES) -> Iterator[tuple[Rows, np.ndarray]]:
    """(rows, block) pairs covering `tensor` in order; block == tensor[rows].

    A block may be a reused buffer: use it before asking for the next one. A tensor that can
    produce its own rows (a centered weight not yet written) is asked for them.
    """
    own = getattr(tensor, "row_blocks", None)
    if own is not None:
        yield from own(block_bytes)
        return
    shape = tuple(tensor.shape)
    if not shape:
        yield ..., np.asarray(tensor.numpy())
        return
    dtype = _raw_dtype(tensor)
    if not isinstance(tensor, ir.ExternalTensor) or dtype is None:
        data = np.asarray(tensor.numpy())
        step = rows_per_block(shape, data.itemsize, block_bytes)
        for start in range(0, shape[0], step):
            yield slice(start, start + step), data[start : start + step]
        return
    step = rows_per_block(shape, dtype.itemsize, block_bytes)
    buffer = np.empty((min(step, shape[0]), *shape[1:]), dtype=dtype)
    with open(tensor.path, "rb", buffering=0) as file:
        file.seek(tensor.offset or 0)
        for start in range(0, shape[0], step):
            view = buffer[: min(step, shape[0] - start)]
            _read_into(file, view, f"{tensor.path} ({tensor.name})")
            yield slice(start, start + len(view)), view
