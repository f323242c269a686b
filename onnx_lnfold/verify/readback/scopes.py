"""The graphs of a model as the read-back keys them, on both sides (the model as it was, the fold
as written): a node by its graph and first output, a stored tensor by its graph and name, and
each node as plain data (`NodeAsWas`) to compare."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import onnx_ir as ir

from onnx_lnfold.core.ir import bodies, constant_of, graphs_of

_SKIPPED_ATTRIBUTES = (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)


class Scopes:
    """The graphs of a model, numbered as `ir.Model.graphs` walks them (the main graph 0; the rewrite
    adds none and moves none), and which graph each subgraph reads outer names from. A name is
    unique within a graph, not across an If's branches: keys are scoped, 'graph:name'."""

    def __init__(self, model: ir.Model):
        self.graphs = graphs_of(model)
        self.index = {id(g): i for i, g in enumerate(self.graphs)}
        self.parent: dict[int, int] = {}
        for i, graph in enumerate(self.graphs):
            for node in graph:
                for sub in bodies(node):
                    if id(sub) in self.index:
                        self.parent[self.index[id(sub)]] = i

    def of(self, node_or_value) -> int:
        graph = node_or_value.graph
        if graph is None and isinstance(node_or_value, ir.Value) and node_or_value.producer() is not None:
            graph = node_or_value.producer().graph
        return self.index.get(id(graph), 0)

    def key(self, node: ir.Node) -> str:
        """A node's key: its graph and first named output (SSA: unique in the graph), else its name."""
        graph = self.index.get(id(node.graph), 0)
        for out in node.outputs:  # a loop, not a generator: keyed for every node of both models
            if out.name:
                return f"{graph}:{out.name}"
        return f"{graph}:#{node.name}"

    def outward(self, graph: int):
        """`graph`, then the graphs whose names it may read, innermost first."""
        while True:
            yield graph
            if graph not in self.parent:
                return
            graph = self.parent[graph]

    def find(self, table: dict, graph: int, name: str):
        """The entry of `table` for `name` as read from `graph` (scoped keys), or None."""
        for g in self.outward(graph):
            if f"{g}:{name}" in table:
                return table[f"{g}:{name}"]
        return None


class NodeAsWas(NamedTuple):  # a tuple: made for every node of both models
    op: str  # domain::op_type
    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attributes: tuple


def attribute_value(attr: ir.Attr):
    """An attribute's value, comparable: floats as the file stores them (float32), tensors as
    (dtype, shape, bytes), a subgraph as "graph" (its nodes are compared on their own)."""
    if attr.type in _SKIPPED_ATTRIBUTES:
        return "graph"
    if attr.type == ir.AttributeType.TENSOR:
        tensor = attr.as_tensor()
        return (int(tensor.dtype), tuple(tensor.shape), tensor.tobytes())
    if attr.type == ir.AttributeType.TENSORS:
        return tuple((int(t.dtype), tuple(t.shape), t.tobytes()) for t in attr.value)
    if attr.type == ir.AttributeType.FLOAT:
        return float(np.float32(attr.value))
    if attr.type == ir.AttributeType.FLOATS:
        return tuple(float(np.float32(v)) for v in attr.value)
    value = attr.value
    return tuple(value) if isinstance(value, (list, tuple)) else value


def op_of(node: ir.Node) -> str:
    return f"{node.domain or ''}::{node.op_type}"


def input_names(node: ir.Node) -> list[str]:
    return [v.name or "" if v is not None else "" for v in node.inputs]


def as_was(node: ir.Node) -> NodeAsWas:
    op_type = node.op_type
    held = node.attributes
    attributes = (
        tuple(
            (name, "constant" if op_type == "Constant" else attribute_value(attr))  # its tensor: `check_unchanged`
            for name, attr in sorted(held.items())
        )
        if held
        else ()
    )
    return NodeAsWas(
        op_of(node), node.name or "", tuple(input_names(node)), tuple([v.name or "" for v in node.outputs]), attributes
    )


def stored_tensors(scopes: Scopes) -> dict[str, ir.TensorProtocol]:
    """Every stored tensor of the model's graphs (initializers, Constant outputs), by scoped name."""
    found: dict[str, ir.TensorProtocol] = {}
    for g, graph in enumerate(scopes.graphs):
        for value in graph.initializers.values():
            if value.name and value.const_value is not None:
                found[f"{g}:{value.name}"] = value.const_value
        for node in graph:
            if node.op_type == "Constant" and node.outputs and node.outputs[0].name:
                tensor = constant_of(node.outputs[0])
                if tensor is not None:
                    found[f"{g}:{node.outputs[0].name}"] = tensor
    return found


def opset_of(model: ir.Model) -> int | None:
    return model.opset_imports.get("", model.opset_imports.get("ai.onnx"))


def same_axis(written: int, planned: int | None, rank: int | None) -> bool:
    if planned is None or rank is None:
        return written == planned
    return written % rank == planned % rank
