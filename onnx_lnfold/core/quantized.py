"""The quantized ops a fold leaves whole (docs/DESIGN.md section 2.6), each named once.

ONNX Runtime runs a quantized graph as units: a QDQ node unit (DequantizeLinear -> op ->
QuantizeLinear) becomes one QLinear op or QGemm, an NPU execution provider takes it as one
integer kernel, and its fusions take `DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul (->
Add of a bias)` into MatMulIntegerToFloat / DynamicQuantizeMatMul
(onnxruntime/core/optimizer/matmul_integer_to_float.cc, dynamic_quantize_matmul_fusion.cc) and
`MatMulNBits -> Add of a bias` into one MatMulNBits (matmul_nbits_fusion.cc). A centering written
inside such a unit splits it, and an integer weight cannot be centered without requantizing, which
is not exact: the fold centers neither, and an LN whose fold would need it stays ("quantized").
"""

from __future__ import annotations

from collections import Counter

import onnx_ir as ir

from onnx_lnfold.core.ir import constant_of, nodes_within

# What a reason says of a quantized op on the way to an LN.
QUANTIZED_WHY = (
    "a centering there would split a quantized unit ONNX Runtime runs as one op, and its integer weights "
    "cannot be centered without requantizing, which is not exact (fold the float model before quantizing)"
)
QUANTIZE_OPS = frozenset({"QuantizeLinear", "DynamicQuantizeLinear"})
DEQUANTIZE_OPS = frozenset({"DequantizeLinear"})
# Integer matmuls whose int32 output ORT's fusion reads through a Cast and a scale Mul.
INTEGER_MATMULS = frozenset({"MatMulInteger", "ConvInteger"})
# Quantized ops whose ORT fusion takes a following Add of a constant in as its bias.
BIAS_TAKING = frozenset({"MatMulNBits", "MatMulIntegerToFloat", "DynamicQuantizeMatMul"})
# Every op that marks a graph as quantized: ONNX's and ONNX Runtime's (com.microsoft) quantized ops.
QUANTIZED_OPS = (
    QUANTIZE_OPS
    | DEQUANTIZE_OPS
    | INTEGER_MATMULS
    | BIAS_TAKING
    | frozenset(
        {
            "QLinearMatMul",
            "QLinearConv",
            "QLinearAdd",
            "QLinearMul",
            "QLinearGlobalAveragePool",
            "QLinearSoftmax",
            "QLinearSigmoid",
            "QLinearLeakyRelu",
            "QLinearConcat",
            "QLinearWhere",
            "QGemm",
            "QAttention",
            "QEmbedLayerNormalization",
            "QOrderedMatMul",
            "QOrderedLayerNormalization",
            "DynamicQuantizeLSTM",
            "GatherBlockQuantized",
        }
    )
)


def _op(value: ir.Value | None) -> str | None:
    node = value.producer() if value is not None else None
    return node.op_type if node is not None else None


def is_quantized_node(node: ir.Node) -> bool:
    """A quantized op, or the Cast of an integer matmul's output (part of the fusion that reads it)."""
    if node.op_type in QUANTIZED_OPS:
        return True
    return node.op_type == "Cast" and bool(node.inputs) and _op(node.inputs[0]) in INTEGER_MATMULS


# How `quantized_ops` names a Cast of integer weights to float: dequantization written as plain ops.
IN_GRAPH_DEQUANTIZATION = "Cast of integer weights to float"
_INTEGER_WEIGHTS = frozenset({ir.DataType.INT8, ir.DataType.UINT8, ir.DataType.INT4, ir.DataType.UINT4})


def quantized_ops(graph: ir.Graph) -> Counter:
    """The quantized ops of `graph` and its subgraphs, by op type; a Cast of constant integer weights
    to float (weights dequantized in the graph, `Cast -> Mul` by a scale) as `IN_GRAPH_DEQUANTIZATION`."""
    found: Counter = Counter()
    for node in nodes_within(graph):
        if node.op_type in QUANTIZED_OPS:
            found[node.op_type] += 1
        elif node.op_type == "Cast" and node.inputs and _integer_weights(node.inputs[0]):
            found[IN_GRAPH_DEQUANTIZATION] += 1
    return found


def _integer_weights(value: ir.Value | None) -> bool:
    tensor = constant_of(value)
    return tensor is not None and tensor.dtype in _INTEGER_WEIGHTS


def inside_units(graph: ir.Graph) -> set[ir.Value]:
    """The tensors inside a quantized unit, where no centering may be written: a DequantizeLinear's
    output, a QuantizeLinear's input, an integer matmul's output with its Cast and scale Mul, and
    the output of a quantized op whose fusion takes in the Add of a bias that reads it."""
    inside: set[ir.Value] = set()
    for node in nodes_within(graph):
        op, outputs = node.op_type, [v for v in node.outputs if v is not None]
        if op in DEQUANTIZE_OPS or op in INTEGER_MATMULS or (op == "Cast" and is_quantized_node(node)):
            inside.update(outputs)
        elif op in QUANTIZE_OPS and node.inputs and node.inputs[0] is not None:
            inside.add(node.inputs[0])
        elif op == "Mul" and _scales_integer_matmul(node):
            inside.update(outputs)
        elif op in BIAS_TAKING:
            inside.update(v for v in outputs if any(_is_bias_add(use.node) for use in v.uses()))
    return inside


def _is_bias_add(node: ir.Node) -> bool:
    return node.op_type == "Add" and any(constant_of(v) is not None for v in node.inputs)


def bias_taken_in(add: ir.Node) -> bool:
    """Whether ONNX Runtime's quantized fusion takes `add` (an Add of a constant bias) in as its
    bias: it reads a quantized op of `BIAS_TAKING`, or an integer matmul's scale Mul."""
    for value in add.inputs:
        node = value.producer() if value is not None else None
        if node is None:
            continue
        if node.op_type in BIAS_TAKING:
            return True
        if node.op_type == "Mul" and _scales_integer_matmul(node):
            return True
    return False


def _scales_integer_matmul(mul: ir.Node) -> bool:
    """A Mul of the Cast of an integer matmul's output: its scale, in ORT's MatMulIntegerToFloat fusion."""
    return any(_op(v) == "Cast" and is_quantized_node(v.producer()) for v in mul.inputs if v is not None)  # type: ignore[arg-type]
