"""Reading the IR the way every step of the fold reads it: true constants, axes written as an
attribute (older opsets) or as a constant input (newer), and the labels reasons name nodes by.

Attributes with a default are read with onnx-ir's own `node.attributes.get_int/get_float/get_ints`.
Whole-model walks (`graphs_of`, `nodes_within`) give what onnx-ir's `Model.graphs()` and
`RecursiveGraphIterator` give, in their order, looking into a node's attributes only where it has
any: a fold walks its model some forty times, and those visit each node through generic mapping
views, which on a graph of 200,000 nodes cost more than the walk itself (docs/LIMITS.md).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import onnx_ir as ir

STANDARD_DOMAINS = ("", "ai.onnx")

FLOAT_TYPES = frozenset({ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16, ir.DataType.DOUBLE})
NARROW_FLOAT_TYPES = frozenset({ir.DataType.FLOAT16, ir.DataType.BFLOAT16})
_INT_TYPES = frozenset({ir.DataType.INT64, ir.DataType.INT32})


def bodies(node: ir.Node) -> list[ir.Graph]:
    """The graphs `node`'s attributes hold (If/Loop/Scan bodies), in attribute order."""
    found: list[ir.Graph] = []
    if node.attributes:
        for attr in node.attributes.values():
            if attr.is_ref():
                continue
            if attr.type == ir.AttributeType.GRAPH:
                found.append(attr.value)
            elif attr.type == ir.AttributeType.GRAPHS:
                found.extend(attr.value)
    return found


def nodes_within(graph: ir.Graph | ir.Function) -> Iterator[ir.Node]:
    """Every node of `graph` and of its bodies at any depth, each body's right after the node
    holding it: `ir.traversal.RecursiveGraphIterator(graph)`."""
    for node in graph:
        yield node
        if node.attributes:
            for body in bodies(node):
                yield from nodes_within(body)


def graphs_of(model: ir.Model | ir.Graph) -> list[ir.Graph]:
    """The main graph (or `model` itself, a graph) and every body at any depth, each once:
    `Model.graphs()`."""
    graph = model.graph if isinstance(model, ir.Model) else model
    found: dict[ir.Graph, None] = {graph: None}

    def enter(g: ir.Graph) -> None:
        for node in g:
            if node.attributes:
                for body in bodies(node):
                    found.setdefault(body)
                    enter(body)

    enter(graph)
    return list(found)


def is_standard(node: ir.Node) -> bool:
    """An op of the default ONNX domain."""
    return node.domain in STANDARD_DOMAINS


def reads_only_shape(node: ir.Node) -> bool:
    """Shape or Size: reads its input's shape, never its values."""
    return is_standard(node) and node.op_type in ("Shape", "Size")


def node_label(node: ir.Node) -> str:
    return f"{node.op_type} '{node.name}'" if node.name else node.op_type


def const_tensor(value: ir.Value) -> ir.TensorProtocol | None:
    """`onnx_ir.convenience.get_const_tensor(value)` without its one write: it names a Constant
    node's `value` tensor after the node's output, so a read would change the model read (a
    Constant the export left unnamed written back named)."""
    producer = value.producer()
    if value.const_value is None and producer is not None and producer.op_type == "Constant":
        attr = producer.attributes.get("value")
        if (
            len(producer.attributes) == 1
            and attr is not None
            and not attr.is_ref()
            and attr.type == ir.AttributeType.TENSOR
        ):
            return attr.as_tensor()
    return ir.convenience.get_const_tensor(value)  # value_float(s), value_int(s): a new tensor


def constant_of(value: ir.Value | None) -> ir.TensorProtocol | None:
    """The value's tensor if it is a true constant: an initializer that is not a graph input (an
    input can be overridden at run time), or the output of a Constant node."""
    if value is None or value.is_graph_input():
        return None
    if value.const_value is not None and value.is_initializer():
        return value.const_value
    producer = value.producer()
    if producer is not None and producer.op_type == "Constant" and is_standard(producer):
        return const_tensor(value)
    return None


def release_tensor(tensor: ir.TensorProtocol | None) -> None:
    """Close the memory map of an external tensor already read (its pages count in RSS); a later
    read maps the file again. Any other tensor is left as it is."""
    if isinstance(tensor, ir.ExternalTensor):
        try:
            tensor.release()
        except BufferError:  # someone still holds an array on the map: it stays open
            pass


def set_constant_value(value: ir.Value, tensor: ir.TensorProtocol) -> None:
    """Give a constant (an initializer or a Constant node's output) a new tensor: the Constant node
    then holds it as its only attribute, so a value_float or value_ints it had cannot disagree."""
    producer = value.producer()
    if producer is not None and producer.op_type == "Constant":
        for key in list(producer.attributes):
            del producer.attributes[key]
        producer.attributes["value"] = ir.AttrTensor("value", tensor)
    value.const_value = tensor


def const_scalar(value: ir.Value | None) -> float | None:
    """A one-element constant (any shape) as a float; None if `value` is not one."""
    if value is None or value.is_graph_input():
        return None
    tensor = const_tensor(value)
    if tensor is None or tensor.size != 1:
        return None
    return float(np.asarray(tensor.numpy()).reshape(-1)[0])


def const_ints(value: ir.Value | None) -> list[int] | None:
    """A constant int32/int64 tensor as a flat list (a Reshape target, Slice bounds, axes)."""
    if value is None or value.is_graph_input():
        return None
    tensor = const_tensor(value)
    if tensor is None or tensor.dtype not in _INT_TYPES:
        return None
    return [int(v) for v in np.asarray(tensor.numpy()).reshape(-1)]


def attr_or_input_ints(node: ir.Node, attr_name: str, input_index: int) -> list[int] | None:
    """Ints given as an attribute (older opsets) or as a constant input (newer): [] when given
    neither way, None when the input is there but not a constant."""
    attr = node.attributes.get(attr_name)
    if attr is not None:
        return list(attr.as_ints())
    if input_index < len(node.inputs) and node.inputs[input_index] is not None:
        return const_ints(node.inputs[input_index])
    return []


def weight_bytes(model: ir.Model) -> int:
    """Bytes of every initializer, those of If/Loop/Scan bodies included (read from the tensors'
    headers: external data is not loaded)."""
    return sum(
        v.const_value.nbytes for g in graphs_of(model) for v in g.initializers.values() if v.const_value is not None
    )


def normalize_axis(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis
