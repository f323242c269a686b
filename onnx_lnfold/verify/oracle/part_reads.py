"""How the float64 twin (`verify.oracle.reference.Float64Model`) reads a node's weight in part, never
whole in float64: a MatMul's 2-D weight streamed through the product by blocks of rows, a Gather's
table only at the rows it gathers (`PART_READERS`); and the product of every input set's
activations by a weight held whole, as one product (`stacked_matmul`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from onnx_lnfold.io.tensor_io import float64_row_blocks


def widened(array: np.ndarray) -> np.ndarray:
    """`array` in float64 where it is a float (bfloat16 included), else as it is."""
    kind = array.dtype.kind
    return array.astype(np.float64) if kind == "f" or array.dtype.name == "bfloat16" else array


# Rows of a weight widened and multiplied at a time: a few MB, which OpenBLAS multiplies by few
# rows faster than larger blocks (benchmarks/float64_products.py).
STREAM_BYTES = 4 << 20


def streamed_matmul(node: onnx.NodeProto, tensor, sets: list[dict[str, Any]]) -> list | None:
    """`stacked_matmul` with the weight read from its file by blocks of rows, each widened to
    float64 and multiplied in as it comes (the product summed over the blocks): the weight is never
    held whole, in its type or in float64. None where the activations are not float64 rows of it."""
    return _matmul_by_rows(node, tuple(tensor.shape), float64_row_blocks(tensor, STREAM_BYTES), sets)


def streamed_exact_matmul(node: onnx.NodeProto, tensor, sets: list[dict[str, Any]]) -> list | None:
    """`streamed_matmul` of a weight the fold computed, at its exact values, computed a block of
    rows at a time (`exact_float64_blocks`); None where it cannot give them so (it is then computed
    whole)."""
    blocks = getattr(tensor, "exact_float64_blocks", None)
    if blocks is None:
        return None
    return _matmul_by_rows(node, tuple(tensor.shape), blocks(STREAM_BYTES), sets)


def _matmul_by_rows(node: onnx.NodeProto, shape: tuple, blocks, sets: list[dict[str, Any]]) -> list | None:
    """The product of each set's activations by a 2-D weight of `shape` given as float64 (rows,
    block) pairs in order, summed over the blocks; None where the activations are not float64 rows
    of it."""
    depth, width = (int(d) for d in shape)
    lefts = [results.get(node.input[0]) for results in sets]
    if any(not isinstance(a, np.ndarray) or a.ndim < 2 or a.shape[-1] != depth or a.dtype != np.float64 for a in lefts):
        return None
    rows = _stacked_rows(lefts, depth)
    # One product buffer for every block: a fresh one costs its pages' zeroing twice (the kernel's
    # and OpenBLAS's own, as it clears its output) per block.
    product, part_product = np.zeros((rows.shape[0], width)), np.empty((rows.shape[0], width))
    for part, block in blocks:
        np.matmul(rows[:, part], block, out=part_product)
        product += part_product
    return _split_rows(product, lefts)


def _stacked_rows(lefts: list[np.ndarray], depth: int) -> np.ndarray:
    """Every set's activations as rows of `depth` entries, one set after another."""
    return np.concatenate([a.reshape(-1, depth) for a in lefts]) if len(lefts) > 1 else lefts[0].reshape(-1, depth)


def _split_rows(product: np.ndarray, lefts: list[np.ndarray]) -> list[np.ndarray]:
    """The rows of a product of `_stacked_rows(lefts)`, given back to each set in its own shape."""
    out, start = [], 0
    for a in lefts:
        count = math.prod(a.shape[:-1])
        out.append(product[start : start + count].reshape(*a.shape[:-1], product.shape[-1]))
        start += count
    return out


def _row_indices(node: onnx.NodeProto, sets: list[dict[str, Any]]) -> list[np.ndarray] | None:
    """Each set's indices of a Gather along axis 0; None where it gathers along another axis or its
    indices are not integers at hand."""
    axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
    indices = [results.get(node.input[1]) for results in sets]
    if axis != 0 or any(not isinstance(i, np.ndarray) or i.dtype.kind not in "iu" for i in indices):
        return None
    return indices  # type: ignore[return-value]


def gathered_rows(node: onnx.NodeProto, tensor, sets: list[dict[str, Any]]) -> list | None:
    """A Gather along axis 0 of a float table on every input set, only the rows its indices name read
    (the table mapped, its pages read where gathered) and widened to float64: an embedding table's few
    rows, not the whole table in float64. None where `_row_indices` has none."""
    indices = _row_indices(node, sets)
    if indices is None:
        return None
    table = np.asarray(tensor.numpy())
    return [widened(np.take(table, i, axis=0)) for i in indices]  # negative indices count from the end, as in ONNX


def gathered_exact_rows(node: onnx.NodeProto, tensor, sets: list[dict[str, Any]]) -> list | None:
    """`gathered_rows` of a table the fold computed, at its exact values (`exact_float64_rows`: only
    the rows gathered are computed); None where it cannot give them so (the table is then computed whole)."""
    indices = _row_indices(node, sets)
    exact_rows = getattr(tensor, "exact_float64_rows", None)
    if indices is None or exact_rows is None:
        return None
    rows = [exact_rows(i) for i in indices]
    return None if any(r is None for r in rows) else rows


def stacked_matmul(node: onnx.NodeProto, weights: dict[str, np.ndarray], sets: list[dict[str, Any]]) -> list | None:
    """A MatMul of activations by a 2-D weight, on every input set as one product of the rows of
    all (the weight streamed through memory once, not once a set, and one 2-D product instead of a
    batch of them); None where the node is not that."""
    if node.op_type != "MatMul" or node.domain not in ("", "ai.onnx") or node.input[1] not in weights:
        return None
    weight = weights[node.input[1]]
    lefts = [results.get(node.input[0]) for results in sets]
    if weight.ndim != 2 or any(
        not isinstance(a, np.ndarray) or a.ndim < 2 or a.shape[-1] != weight.shape[0] or a.dtype != weight.dtype
        for a in lefts
    ):
        return None
    rows = _stacked_rows(lefts, weight.shape[0])
    # As (weight^T rows^T)^T: OpenBLAS streams a wide weight by few rows 2-3x faster that way round.
    return _split_rows(np.ascontiguousarray((weight.T @ rows.T).T), lefts)


@dataclass(frozen=True)
class PartReader:
    weight: int  # the input that is the weight
    takes_rank: Callable[[int], bool]  # the weight ranks it reads in part
    read: Callable[..., list | None]  # (node, weight tensor, sets) -> each set's output, or None
    # The same for a weight the fold computed, from its exact values (None: it is computed whole).
    read_exact: Callable[..., list | None] | None = None


# The nodes whose weight `Float64Model._read_in_part` reads in part, and how: a MatMul's 2-D weight
# streamed through the product by blocks of rows (of a weight the fold centered, its exact values
# computed a block at a time: `CenteredTensor.exact_float64_blocks`); a Gather's table, only the rows it gathers (of a
# table the fold centered, those rows' exact values: `CenteredTensor.exact_float64_rows`).
PART_READERS = {
    "MatMul": PartReader(1, lambda rank: rank == 2, streamed_matmul, streamed_exact_matmul),
    "Gather": PartReader(0, lambda rank: rank >= 1, gathered_rows, gathered_exact_rows),
}
