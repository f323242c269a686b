"""bfloat16 models, verified through float32 shadows: ONNX Runtime's CPU provider lacks most bf16
kernels, so both models are compared with every bf16 tensor, type and Cast widened to float32.
That checks the graph transformation exactly, with the folded model's centered weights as they were
rounded to bf16; how far that rounding leaves each centered weight from a zero mean is reported
beside it (`bfloat16_rounding`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir

from onnx_lnfold._plan import CenteringPlan

_BF16 = onnx.TensorProto.BFLOAT16
_FLOAT = onnx.TensorProto.FLOAT
_DTYPE_ATTRIBUTES = {"to", "dtype", "output_dtype"}


def _widen_tensor(tensor: onnx.TensorProto) -> None:
    if tensor.data_type != _BF16:
        return
    values = onnx.numpy_helper.to_array(tensor).astype(np.float32)
    tensor.CopyFrom(onnx.numpy_helper.from_array(values, tensor.name))


def _widen_type(type_proto: onnx.TypeProto) -> None:
    kind = type_proto.WhichOneof("value")
    if kind in ("tensor_type", "sparse_tensor_type"):
        inner = getattr(type_proto, kind)
        if inner.elem_type == _BF16:
            inner.elem_type = _FLOAT
    elif kind in ("sequence_type", "optional_type"):
        _widen_type(getattr(type_proto, kind).elem_type)
    elif kind == "map_type":
        _widen_type(type_proto.map_type.value_type)


def _widen_graph(graph: onnx.GraphProto) -> None:
    for tensor in graph.initializer:
        _widen_tensor(tensor)
    for info in (*graph.input, *graph.output, *graph.value_info):
        _widen_type(info.type)
    _widen_nodes(graph.node)


def _widen_nodes(nodes) -> None:
    """Cast targets, constant tensors and subgraphs of `nodes` (a graph's or a function's)."""
    for node in nodes:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.INT and attr.name in _DTYPE_ATTRIBUTES and attr.i == _BF16:
                attr.i = _FLOAT
            elif attr.type == onnx.AttributeProto.TENSOR:
                _widen_tensor(attr.t)
            elif attr.type == onnx.AttributeProto.TENSORS:
                for t in attr.tensors:
                    _widen_tensor(t)
            elif attr.type == onnx.AttributeProto.GRAPH:
                _widen_graph(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    _widen_graph(g)


def float32_shadow(model: bytes | str | Path) -> bytes:
    """The model with every bfloat16 tensor, value type and Cast target widened to float32."""
    proto = onnx.load_from_string(model) if isinstance(model, bytes) else onnx.load(str(model))
    _widen_graph(proto.graph)
    for function in proto.functions:
        _widen_nodes(function.node)
    return proto.SerializeToString()


def widen_feeds(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: v.astype(np.float32) if v.dtype.name == "bfloat16" else v for k, v in feeds.items()}


def has_bfloat16(model: ir.Model) -> bool:
    """Whether any tensor of the model, subgraphs included, is bfloat16 (or a Cast makes one)."""
    bf16 = ir.DataType.BFLOAT16
    graphs = [model.graph, *(g for node in ir.traversal.RecursiveGraphIterator(model.graph) for g in _subgraphs(node))]
    for graph in graphs:
        if any(v.dtype == bf16 for v in (*graph.inputs, *graph.outputs, *graph.initializers.values())):
            return True
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        if any(v is not None and v.dtype == bf16 for v in node.outputs):
            return True
        if node.op_type == "Cast" and node.attributes.get_int("to", 0) == bf16:
            return True
    return False


def _subgraphs(node: ir.Node):
    for attr in node.attributes.values():
        if attr.type == ir.AttributeType.GRAPH:
            yield attr.as_graph()
        elif attr.type == ir.AttributeType.GRAPHS:
            yield from attr.as_graphs()


def bfloat16_rounding(model: ir.Model, plan: CenteringPlan) -> list[str]:
    """How far rounding to bf16 left each centered weight from a zero mean along its axis:
    the float32 shadow checks the transformation, this is what the narrow type adds to it."""
    initializers = dict(model.graph.initializers)
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        for graph in _subgraphs(node):
            initializers.update(graph.initializers)
    worst: tuple[float, str] | None = None
    for edit in plan.edits:
        value = initializers.get(edit.new_name if edit.untie else edit.tensor)
        if value is None or value.const_value is None or value.dtype != ir.DataType.BFLOAT16 or edit.weights:
            continue
        array = value.const_value.numpy().astype(np.float64)
        scale = float(np.abs(array).max()) if array.size else 0.0
        if scale == 0.0:
            continue
        leftover = np.abs(array) if edit.axis is None else np.abs(array.mean(axis=edit.axis))
        relative = float(leftover.max()) / scale
        if worst is None or relative > worst[0]:
            worst = (relative, value.name or "")
    if worst is None:
        return []
    return [
        f"bfloat16 rounding of the centered weights: mean left along the centered axis up to {worst[0]:.3g} "
        f"of the weight's max |w| ('{worst[1]}'); the float32 shadows above include it"
    ]
