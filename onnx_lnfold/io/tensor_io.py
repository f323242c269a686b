"""Weights that stay in their file until used, and a reader of any tensor by blocks of rows.

`FileRegionTensor` is a tensor whose bytes lie in a byte range of a file (the initializers of a
model file read without their data, see `io.proto_read`). `row_blocks` reads a tensor front to
back, a block of rows (along axis 0) at a time: centering and the beta fold read each weight they
touch once, in order. From a file, plain `read` calls into one reused buffer are several times
faster than touching a memory map page by page (each first touch is a page fault), and only one
block is ever held: the pages of a multi-GB weight never pile up in the process's RSS.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from types import EllipsisType

import numpy as np
import onnx_ir as ir

from onnx_lnfold.core.errors import InvalidInput

# About this many bytes a block: enough that a read call's overhead vanishes, few enough that the
# block, its float64 copy and the output stay in cache from read to write (larger blocks' output
# has left the cache before the kernel copies it into the page cache; python -m
# benchmarks.large_model measures the write).
BLOCK_BYTES = 1 << 20

# Which rows a block holds: a slice of axis 0, or `...` for a scalar (its one block is all of it).
Rows = slice | EllipsisType


def rows_per_block(shape: tuple[int, ...], itemsize: int, block_bytes: int = BLOCK_BYTES) -> int:
    row = itemsize * int(np.prod(shape[1:], dtype=np.int64))
    return max(1, block_bytes // max(row, 1))


def raw_dtype(dtype: ir.DataType) -> np.dtype | None:
    """The little-endian numpy dtype `dtype`'s elements are stored as, or None when they are not
    whole bytes (4-bit types are packed) or have no fixed width (strings)."""
    try:
        numpy_dtype = np.dtype(dtype.numpy())
        bits = dtype.bitwidth
    except (TypeError, ValueError):
        return None
    if numpy_dtype.itemsize * 8 != bits:
        return None
    return numpy_dtype.newbyteorder("<")


def file_stamp(st: os.stat_result) -> tuple[int, int, int, int]:
    """What identifies a file's content for as long as nobody writes to it."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _stamp(path: str) -> tuple[int, int, int, int]:
    return file_stamp(os.stat(path))


class FileRegionTensor(ir.LazyTensor):
    """A tensor stored as `length` little-endian bytes at `offset` of the file at `path`; read
    when used, never kept. The file must not change meanwhile: a read of a file that has (another
    inode, size or modification time) raises instead of returning other bytes."""

    def __init__(
        self,
        path: str | os.PathLike,
        offset: int,
        length: int,
        dtype: ir.DataType,
        shape: ir.Shape,
        name: str,
        doc_string: str | None = None,
        metadata_props: dict[str, str] | None = None,
        stamp: tuple[int, int, int, int] | None = None,
    ):
        """`stamp`: `file_stamp` of the file as it was when the offsets were read from it (taken
        now when not given: then the caller vouches that the file has not changed since)."""
        super().__init__(self._load, dtype=dtype, shape=shape, name=name, doc_string=doc_string, metadata_props=metadata_props)
        self.path = os.fspath(path)
        self.offset = offset
        self.length = length
        self._stamp = stamp if stamp is not None else _stamp(self.path)

    @classmethod
    def of(
        cls, like: ir.TensorProtocol, path: str | os.PathLike, offset: int, name: str, stamp: tuple[int, int, int, int] | None = None
    ) -> FileRegionTensor:
        """The tensor `like` describes (dtype, shape, doc string, metadata), whose bytes lie at
        `offset` of `path`."""
        return cls(
            path,
            offset,
            like.nbytes,
            like.dtype,
            ir.Shape(like.shape),
            name,
            doc_string=like.doc_string,
            metadata_props=dict(like.metadata_props),
            stamp=stamp,
        )

    def __repr__(self) -> str:  # LazyTensor's would print its function, a method of this very object
        return f"{self._repr_base()}(path={self.path!r}, offset={self.offset}, length={self.length}, name={self.name!r})"

    def check(self) -> None:
        try:
            same = _stamp(self.path) == self._stamp
        except OSError:
            same = False
        if not same:
            raise InvalidInput(f"{self.path}: the file changed after the model was read from it; load the model again")

    def _load(self) -> ir.Tensor:
        self.check()
        array = np.empty(tuple(self.shape), dtype=raw_dtype(self.dtype))
        with open(self.path, "rb", buffering=0) as file:
            file.seek(self.offset)
            _read_into(file, array, f"{self.path} ({self.name})")
        return ir.Tensor(array, dtype=self.dtype, name=self.name)

    def tofile(self, file) -> None:
        """Copy the bytes to a binary file: in the kernel where both are regular files."""
        self.check()
        with open(self.path, "rb", buffering=0) as source:
            copy = getattr(os, "copy_file_range", None)
            if copy is not None and hasattr(file, "fileno"):
                file.flush()
                done, start = 0, file.tell()
                try:
                    while done < self.length:
                        n = copy(source.fileno(), file.fileno(), self.length - done, self.offset + done, start + done)
                        if n == 0:
                            raise InvalidInput(f"{self.path}: the file ends before tensor '{self.name}' does")
                        done += n
                    file.seek(start + done)
                    return
                except OSError:  # another file system, or no support: copy through memory
                    file.seek(start)
            source.seek(self.offset)
            left = self.length
            while left:
                chunk = source.read(min(left, BLOCK_BYTES))
                if not chunk:
                    raise InvalidInput(f"{self.path}: the file ends before tensor '{self.name}' does")
                file.write(chunk)
                left -= len(chunk)


def _read_into(file, view: np.ndarray, where: str) -> None:
    target = memoryview(view.reshape(-1).view(np.uint8))
    done = 0
    while done < len(target):
        n = file.readinto(target[done:])
        if not n:
            raise InvalidInput(f"{where}: the file ends before the tensor does")
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
    dtype = raw_dtype(tensor.dtype)
    if isinstance(tensor, FileRegionTensor):
        tensor.check()
    elif not isinstance(tensor, ir.ExternalTensor) or dtype is None:
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


def float64_row_blocks(tensor: ir.TensorProtocol, block_bytes: int = BLOCK_BYTES) -> Iterator[tuple[Rows, np.ndarray]]:
    """`row_blocks` widened to float64, every block in one reused buffer (fresh memory costs its
    pages' zeroing, block after block): use a block before asking for the next."""
    widened: np.ndarray | None = None
    for rows, block in row_blocks(tensor, block_bytes):
        if not block.ndim:  # a scalar
            yield rows, block.astype(np.float64)
            continue
        if widened is None or widened.shape[0] < block.shape[0]:
            widened = np.empty(block.shape, dtype=np.float64)
        wide = widened[: block.shape[0]]
        wide[...] = block
        yield rows, wide
