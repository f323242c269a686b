"""A key projection's share of beta, which the attention's Softmax removes (docs/DESIGN.md section 4).

When a folded LN feeds an attention's key projection `k = LN(x) W` (a MatMul or Gemm without a
bias, such as Whisper's `k_proj`), dropping beta there changes every key by the same row
`c = beta W`: `k_j' = k_j - c` for every key position j. Each score `q . k_j` then changes by
`-q . c`, a number that depends on the query but not on j; Softmax over the key axis removes any
shift constant along that axis (`softmax(s + t) = softmax(s)`). So the attention's output is the
same, and beta's share in the key projection can be dropped instead of paid for as an Add.

The proof is structural, on the path the shifted keys take, and every tensor on it must be read
by that path alone (a Shape reads only its shape; anything else, a graph output such as a KV cache's
`present` key included, would see the shifted keys). A shift is tracked by the axes along which it
is uniform (the same at every index): at the projection, every axis but the channels.

- `Reshape`: an axis it keeps whole (`shapes.reshape.reshaped_axis`: every element keeps its index along
  it) stays uniform; and where the shift varies only within the trailing dims, holding a block of P
  elements, an output ending in dims of product P keeps every dim before them uniform (row-major
  order puts each block back whole: the head split `[B*T, H*Dh] -> [B, T, H, Dh]`).
- `Transpose`: the axes move. `Mul`/`Div` by a constant scalar: nothing changes.
- `MatMul` with the keys as the right operand, the shift uniform along its last axis (the key
  positions): each score changes by `q . c`, uniform along the scores' last axis.
- then `Mul`/`Div` by a constant scalar, `Add`/`Sub` of a tensor the keys do not reach (a mask:
  nothing else reads the path, so nothing else depends on it), `Reshape`/`Transpose` that keep the
  key axis whole and last (BART's `[B*H, T, S] <-> [B, H, T, S]` around its mask);
- `Softmax`/`LogSoftmax` over the last axis: removed. A Softmax over another axis, a Concat with
  past keys (they would carry another shift, or none: a cache filled by the original model, or keys
  computed by another model), anything else: refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import onnx_ir as ir

from onnx_lnfold.core.ir import const_scalar, constant_of, is_standard, node_label, normalize_axis, reads_only_shape
from onnx_lnfold.shapes.reshape import reshaped_axis, shape_entries
from onnx_lnfold.shapes.table import ShapeTable

_MAX_STEPS = 16
_SCALING = ("Mul", "Div")
_SOFTMAX = ("Softmax", "LogSoftmax")


@dataclass(frozen=True)
class _Shift:
    rank: int
    uniform: frozenset[int]  # the axes the shift is the same along
    scores: bool = False  # past the scores MatMul: must reach a Softmax over the last axis


def _only_reader(value: ir.Value) -> tuple[ir.Node, int] | str:
    if value.is_graph_output():
        return f"'{value.name}' is a graph output"
    readers = [(node, index) for node, index in value.uses() if not reads_only_shape(node)]
    if len(readers) != 1:
        names = ", ".join(node_label(node) for node, _ in readers) or "nothing"
        return f"'{value.name}' is read by {names}"
    return readers[0]


def _trailing_block(value: ir.Value, node: ir.Node, size: int, shapes: ShapeTable) -> int | None:
    """How many trailing dims of the Reshape's output hold exactly `size` elements."""
    dims: list = list(shapes.shape(value) or ())
    entries = shape_entries(node.inputs[1], shapes) if len(node.inputs) > 1 else None
    if entries is not None and (not dims or len(dims) == len(entries)):
        # the target's constants stand where inference could not name a dim
        dims = [e if isinstance(e, int) and e > 0 else (dims[i] if dims else None) for i, e in enumerate(entries)]
    product = 1
    for k, dim in enumerate(reversed(dims), start=1):
        if not isinstance(dim, int):
            return None
        product *= dim
        if product == size:
            return k
        if product > size:
            return None
    return None


def _reshaped(node: ir.Node, shift: _Shift, out_rank: int, shapes: ShapeTable) -> frozenset[int]:
    """The output axes a Reshape keeps the shift uniform along."""
    kept = {reshaped_axis(node, shapes, a, forward=True) for a in shift.uniform}
    uniform = {a for a in kept if a is not None}
    varying = [a for a in range(shift.rank) if a not in shift.uniform]
    dims = shapes.shape(node.inputs[0])
    if varying and dims is not None:
        block_dims = dims[varying[0]:]
        if all(isinstance(d, int) for d in block_dims):
            suffix = _trailing_block(node.outputs[0], node, math.prod(block_dims), shapes)
            if suffix is not None:
                uniform |= set(range(out_rank - suffix))
    return frozenset(uniform)


def _step(node: ir.Node, index: int, shift: _Shift, shapes: ShapeTable) -> _Shift | str | None:
    """The shift on `node`'s output, None when the node removes it, or why it cannot be followed."""
    op = node.op_type if is_standard(node) else f"{node.domain}::{node.op_type}"
    out = node.outputs[0]
    out_rank = shapes.rank(out)
    if out_rank is None:
        return f"the rank of '{out.name}' is unknown"
    last = shift.rank - 1
    if op == "Reshape" and index == 0:
        uniform = _reshaped(node, shift, out_rank, shapes)
        if shift.scores and out_rank - 1 not in uniform:
            return f"{node_label(node)} does not keep the key axis whole and last"
        return _Shift(out_rank, uniform, shift.scores)
    if op == "Transpose" and index == 0:
        perm = list(node.attributes.get_ints("perm", list(range(shift.rank))[::-1]))
        uniform = frozenset(perm.index(a) for a in shift.uniform)
        if shift.scores and out_rank - 1 not in uniform:
            return f"{node_label(node)} moves the key axis"
        return _Shift(out_rank, uniform, shift.scores)
    if op in _SCALING and (op == "Mul" or index == 0) and const_scalar(node.inputs[1 - index]) is not None:
        offset = out_rank - shift.rank  # a scalar of higher rank adds leading axes of size 1
        return _Shift(out_rank, frozenset(range(offset)) | {a + offset for a in shift.uniform}, shift.scores)
    if op == "MatMul" and index == 1 and not shift.scores:
        if shift.rank < 2 or last not in shift.uniform:
            return f"{node_label(node)} reads the keys with their shift varying along its last axis"
        return _Shift(out_rank, frozenset({out_rank - 1}), scores=True)
    if shift.scores and op in ("Add", "Sub"):
        return _Shift(out_rank, frozenset({out_rank - 1}), scores=True)
    if shift.scores and op in _SOFTMAX and index == 0:
        axis = node.attributes.get_int("axis", -1 if _opset(node) >= 13 else 1)
        if normalize_axis(axis, out_rank) != out_rank - 1:
            return f"{node_label(node)} normalizes over axis {axis}, not the key axis (the last)"
        return None
    if shift.scores:
        return f"{node_label(node)} reads the shifted attention scores (only a mask Add and a Softmax over the key " \
               "axis are followed after the scores MatMul)"
    # Not yet at a scores MatMul: nothing says this projection makes attention keys at all (an MLP's
    # up-projection reaches its activation here).
    return f"{node_label(node)} reads the shifted projection output, which reaches no attention Softmax (only " \
           "reshapes, transposes and scalar scaling into a scores MatMul, then a mask Add and a Softmax over " \
           "the key axis are followed)"


def _opset(node: ir.Node) -> int:
    if node.version is not None:
        return node.version
    graph = node.graph
    imports = getattr(graph, "opset_imports", None) or {}
    return imports.get("", imports.get("ai.onnx", 0))


def softmax_removes(projection: ir.Node, shapes: ShapeTable) -> str | None:
    """None when a shift of `projection`'s output that is the same row for every token is removed
    by a Softmax over the key axis of the attention it feeds (the proof in the module docstring);
    else why not, in words."""
    weight = constant_of(projection.inputs[1]) if len(projection.inputs) > 1 else None
    rank = shapes.rank(projection.outputs[0])
    if weight is None or rank is None or rank < 1:
        return f"{node_label(projection)}: weight or output rank unknown"
    shift: _Shift | str | None = _Shift(rank, frozenset(range(rank - 1)))
    value = projection.outputs[0]
    for _ in range(_MAX_STEPS):
        reader = _only_reader(value)
        if isinstance(reader, str):
            return reader
        node, index = reader
        shift = _step(node, index, shift, shapes)  # type: ignore[arg-type]
        if shift is None:
            return None
        if isinstance(shift, str):
            return shift
        value = node.outputs[0]
        if len(node.outputs) > 1 and any(o.uses() or o.is_graph_output() for o in node.outputs[1:]):
            return f"{node_label(node)} has other outputs in use"
    return f"no Softmax within {_MAX_STEPS} nodes of {node_label(projection)}"
