"""What folding the float model before quantizing would fold, for a quantized model (docs/DESIGN.md
section 2.6): the fold leaves every quantized unit whole, so LNs stay that the float model's fold
would fold.

The float model is recovered from the file where its quantization can be undone exactly:
`DequantizeLinear` of a constant (per-tensor or per-axis, no blocks) or of a `Gather` or
`Transpose` of one (per-tensor) becomes the float constant it computes (a tied table one constant);
an activation's `QuantizeLinear -> DequantizeLinear` is bypassed; an integer constant read through
`Cast -> Mul` by a constant scale becomes the product; `DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul` by the two scales'
product becomes a `MatMul` of the dequantized weight, and `MatMulNBits` a `MatMul` of its
unpacked blocks. Anything else quantized gives the copy up (`NotRecovered`): a count of a guessed
float model would be no fact. The copy is a clone; the model being folded is never changed, and
the copy is not made where its float weights would take more than `FLOAT_COPY_BYTES` of memory.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common

from onnx_lnfold.analysis.plan import CenteringPlan
from onnx_lnfold.analysis.planner import Planner
from onnx_lnfold.core.ir import constant_of
from onnx_lnfold.core.quantized import quantized_ops
from onnx_lnfold.ort_fusions.weightless import clone_model

logger = logging.getLogger(__name__)

# The most memory the float copy's dequantized weights may take (a larger model is not recovered).
FLOAT_COPY_BYTES = 4 << 30
_QUANTIZED_TYPES = frozenset(
    {ir.DataType.INT8, ir.DataType.UINT8, ir.DataType.INT16, ir.DataType.UINT16, ir.DataType.INT32}
    | {ir.DataType.INT4, ir.DataType.UINT4}
)


class NotRecovered(Exception):
    """The float model cannot be recovered exactly: the message says what stands in the way."""


@dataclass(frozen=True)
class FloatFirst:
    """The fold's count on the float copy against the count here; or why there is no copy."""

    folded: int | None
    layer_norms: int | None
    folded_here: int
    layer_norms_here: int
    unrecovered: str | None = None


def _array(value: ir.Value | None) -> np.ndarray | None:
    tensor = constant_of(value)
    return None if tensor is None else tensor.numpy()


def _producer(value: ir.Value | None, op_type: str) -> ir.Node | None:
    node = value.producer() if value is not None else None
    return node if node is not None and node.op_type == op_type and node.domain in ("", "ai.onnx") else None


def _dequantized(node: ir.Node, q: np.ndarray) -> np.ndarray:
    """`DequantizeLinear(q, scale, zero_point)` as ONNX Runtime computes it, in float32."""
    scale = _array(node.inputs[1])
    zero = _array(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] is not None else np.zeros((), q.dtype)
    if scale is None or zero is None or scale.dtype != np.float32:
        raise NotRecovered(f"DequantizeLinear '{node.name}' has no constant float32 scale and zero point")
    if node.attributes.get_int("block_size", 0):
        raise NotRecovered(f"DequantizeLinear '{node.name}' is blocked (block_size)")
    if scale.size != 1:  # per axis: one scale (and zero point) per slice along `axis`
        shape = [1] * q.ndim
        shape[node.attributes.get_int("axis", 1) % q.ndim] = -1
        scale = scale.reshape(shape)
        zero = zero.reshape(shape) if zero.size != 1 else zero.reshape(())
    else:
        scale, zero = scale.reshape(()), zero.reshape(())
    return ((q.astype(np.int64) - zero.astype(np.int64)).astype(np.float32) * scale).astype(np.float32)


def _constant(graph: ir.Graph, name: str, array: np.ndarray) -> ir.Value:
    """A float32 initializer `<name>_float`; the one already made where the same tensor (a tied
    table read by a Gather and a Transpose) was dequantized before, to the same values."""
    made = graph.initializers.get(f"{name}_float")
    if made is not None:
        if made.const_value is None or not np.array_equal(made.const_value.numpy(), array):
            raise NotRecovered(f"'{name}' is dequantized to different values")
        return made
    value = ir.Value(name=f"{name}_float", const_value=ir.tensor(array, name=f"{name}_float"))
    value.shape, value.type = ir.Shape(array.shape), ir.TensorType(ir.DataType.FLOAT)
    graph.register_initializer(value)
    return value


def _node(graph: ir.Graph, at: ir.Node, op_type: str, inputs: list[ir.Value], like: ir.Value) -> ir.Value:
    """A float op `op_type` before `at`, its output named and typed after `like`, the value it replaces."""
    name = f"{like.name or at.name}_float"
    node = ir.Node("", op_type, inputs, name=name, num_outputs=1)
    node.outputs[0].name, node.outputs[0].shape, node.outputs[0].type = name, like.shape, like.type
    graph.insert_before(at, node)
    return node.outputs[0]


# Ops that only move their first input's values: per-tensor dequantization commutes with them.
_MOVES = ("Gather", "Transpose")


def _undo_dequantize(graph: ir.Graph, node: ir.Node) -> ir.Value:
    source = node.inputs[0]
    quantize = _producer(source, "QuantizeLinear")
    if quantize is not None:  # an activation's QDQ pair: the float tensor it stood for
        return quantize.inputs[0]
    q = _array(source)
    if q is not None:
        return _constant(graph, node.outputs[0].name or node.name, _dequantized(node, q))
    move = next(filter(None, (_producer(source, op) for op in _MOVES)), None)
    table = _array(move.inputs[0]) if move is not None else None
    scale = _array(node.inputs[1])
    if table is not None and scale is not None and scale.size == 1 and len(source.uses()) == 1:  # type: ignore[union-attr]
        # Per-tensor dequantization commutes with moving values: move the dequantized constant's.
        move.replace_input_with(0, _constant(graph, move.inputs[0].name, _dequantized(node, table)))  # type: ignore[union-attr,arg-type]
        source.type = node.outputs[0].type  # type: ignore[union-attr]
        return source  # type: ignore[return-value]
    raise NotRecovered(f"DequantizeLinear '{node.name}' reads no constant, no moved constant and no QuantizeLinear")


def _undo_cast_scale(graph: ir.Graph, node: ir.Node) -> ir.Value | None:
    """The Mul of `Cast(integer constant) * constant scale` as one float constant; None: no such Mul."""
    for i, value in enumerate(node.inputs[:2]):
        cast = _producer(value, "Cast")
        ints = _array(cast.inputs[0]) if cast is not None else None
        scale = _array(node.inputs[1 - i])
        if ints is None or scale is None or not np.issubdtype(ints.dtype, np.integer):
            continue
        if cast.attributes.get_int("to") == ir.DataType.FLOAT and scale.dtype == np.float32:  # type: ignore[union-attr]
            return _constant(graph, node.outputs[0].name or node.name, ints.astype(np.float32) * scale)
    return None


def _undo_matmul_integer(graph: ir.Graph, node: ir.Node) -> tuple[ir.Node, ir.Value]:
    """`DynamicQuantizeLinear(x) -> MatMulInteger(., W) -> Cast -> Mul(x_scale * w_scale)` as
    `MatMul(x, W dequantized)`: the Mul it replaces, and the MatMul's output."""
    quantize = _producer(node.inputs[0], "DynamicQuantizeLinear")
    weights = _array(node.inputs[1])
    uses = node.outputs[0].uses()
    cast = uses[0].node if len(uses) == 1 and uses[0].node.op_type == "Cast" else None
    scaled = cast.outputs[0].uses() if cast is not None else []
    mul = scaled[0].node if len(scaled) == 1 and scaled[0].node.op_type == "Mul" else None
    product = _producer(mul.inputs[1 - scaled[0].idx], "Mul") if mul is not None else None
    ok = quantize is not None and weights is not None and product is not None and len(node.inputs) == 4
    ok = ok and cast.attributes.get_int("to") == ir.DataType.FLOAT  # type: ignore[union-attr]
    ok = ok and node.inputs[2] is quantize.outputs[2] and quantize.outputs[1] in product.inputs  # type: ignore[union-attr]
    w_scale = _array(next((v for v in product.inputs if v is not quantize.outputs[1]), None)) if ok else None  # type: ignore[union-attr]
    w_zero = _array(node.inputs[3]) if ok else None
    if w_scale is None or w_zero is None or w_scale.dtype != np.float32 or w_scale.size not in (1, weights.shape[-1]):  # type: ignore[union-attr]
        raise NotRecovered(f"MatMulInteger '{node.name}' is no DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul")
    floats = (weights.astype(np.int64) - w_zero.astype(np.int64)).astype(np.float32) * w_scale.astype(np.float32)  # type: ignore[union-attr]
    weight = _constant(graph, node.inputs[1].name or node.name, floats.astype(np.float32))  # type: ignore[union-attr]
    return mul, _node(graph, node, "MatMul", [quantize.inputs[0], weight], mul.outputs[0])  # type: ignore[union-attr,list-item]


def unpacked_nbits(node: ir.Node) -> np.ndarray:
    """`MatMulNBits`'s weight [K, N] in float32 (ONNX Runtime's layout: B uint8 [N, blocks, blob],
    two 4-bit values a byte, low nibble first; scales [N * blocks]; zero points packed the same,
    8 where absent)."""
    at = {a: node.attributes.get_int(a) for a in ("K", "N", "bits", "block_size")}
    packed, scales = _array(node.inputs[1]), _array(node.inputs[2])
    given_zeros = node.inputs[3] if len(node.inputs) > 3 else None
    zeros = _array(given_zeros)
    extra = [v for v in node.inputs[4:] if v is not None]
    if at["bits"] != 4 or packed is None or scales is None or scales.dtype != np.float32 or extra:
        raise NotRecovered(f"MatMulNBits '{node.name}' is not 4 bits with constant float32 scales and no bias")
    if given_zeros is not None and (zeros is None or zeros.dtype != np.uint8):
        raise NotRecovered(f"MatMulNBits '{node.name}' has zero points that are no constant uint8")
    k, n, block = at["K"], at["N"], at["block_size"]
    blocks = -(-k // block)  # type: ignore[operator]
    if packed.shape != (n, blocks, block // 2) or scales.size != n * blocks:  # type: ignore[operator]
        raise NotRecovered(f"MatMulNBits '{node.name}' has weights or scales of another layout")
    q = np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(n, blocks * block)  # type: ignore[operator]
    if zeros is None:
        zero = np.full((n, blocks), 8, np.int64)
    else:
        nibbles = np.stack([zeros & 0x0F, zeros >> 4], axis=-1).reshape(n, -1)
        zero = nibbles[:, :blocks].astype(np.int64)
    scale = scales.reshape(n, blocks)
    floats = (q.astype(np.int64).reshape(n, blocks, block) - zero[..., None]).astype(np.float32) * scale[..., None]  # type: ignore[misc]
    return np.ascontiguousarray(floats.reshape(n, -1)[:, :k].T)


def _float_bytes(graph: ir.Graph) -> int:
    """At most the bytes of the float32 weights dequantized from `graph`'s integer initializers
    (two values a byte where packed for MatMulNBits)."""
    total = 0
    for value in graph.initializers.values():
        tensor = value.const_value
        if tensor is not None and tensor.dtype in _QUANTIZED_TYPES:
            packed = any(use.node.op_type == "MatMulNBits" and use.idx == 1 for use in value.uses())
            total += 4 * tensor.size * (2 if packed else 1)
    return total


def float_copy(model: ir.Model) -> ir.Model:
    """A float copy of the quantized `model`, as far as it is recovered exactly (module docstring);
    raises `NotRecovered` where it is not."""
    needed = _float_bytes(model.graph)
    if needed > FLOAT_COPY_BYTES:
        raise NotRecovered(
            f"its float weights would take {needed / 2**30:.1f} GiB of memory, over {FLOAT_COPY_BYTES >> 30} GiB"
        )
    copy = clone_model(model)
    graph = copy.graph
    for node in list(graph):
        op, replaced, new = node.op_type, node, None
        if op == "DequantizeLinear":
            new = _undo_dequantize(graph, node)
        elif op == "Mul":
            new = _undo_cast_scale(graph, node)
        elif op == "MatMulInteger":
            replaced, new = _undo_matmul_integer(graph, node)
        elif op == "MatMulNBits" and node.domain == "com.microsoft":
            weight = _constant(graph, node.inputs[1].name or node.name, unpacked_nbits(node))  # type: ignore[union-attr]
            new = _node(graph, node, "MatMul", [node.inputs[0], weight], node.outputs[0])  # type: ignore[list-item]
        if new is not None:
            ir.convenience.replace_all_uses_with(replaced.outputs[0], new, replace_graph_outputs=True)
    onnx_ir.passes.common.RemoveUnusedNodesPass()(copy)
    left = quantized_ops(graph)
    if left:
        raise NotRecovered(
            "no exact float form is known for its " + ", ".join(f"{n} {op}" for op, n in sorted(left.items()))
        )
    return copy


def float_first(planner: Planner, plan: CenteringPlan) -> FloatFirst | None:
    """The fold's count on the float copy of `planner`'s (quantized) model, planned as `planner`
    plans (`Planner.alike`, no fusion check), against `plan`'s; or why there is no copy. A failure
    of the copy's analysis is logged and says nothing."""
    here = (len(plan.folded), len(plan.decisions))
    try:
        copy = float_copy(planner.model)
    except NotRecovered as error:
        return FloatFirst(None, None, *here, unrecovered=str(error))
    try:
        there = planner.alike(copy).plan({}).plan
    except Exception as error:  # the analysis of the copy failed: no count
        logger.info("The fold of the float copy was not counted: %s: %s", type(error).__name__, error)
        return None
    return FloatFirst(len(there.folded), len(there.decisions), *here)


def float_first_facts(first: FloatFirst | None) -> dict[str, Any] | None:
    """The JSON report's `float_first`: both counts, or why the float model was not recovered."""
    return None if first is None else asdict(first)


__all__ = [
    "FLOAT_COPY_BYTES",
    "FloatFirst",
    "NotRecovered",
    "float_copy",
    "float_first",
    "float_first_facts",
    "unpacked_nbits",
]
