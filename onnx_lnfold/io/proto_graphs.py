"""The graphs of an ONNX proto: a graph and the bodies (If/Loop/Scan) its nodes hold, at any depth.

Walked with a stack, not recursion: a file may nest bodies as deep as protobuf parses it."""

from __future__ import annotations

from collections.abc import Iterator

import onnx


def bodies(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    """The graphs `node`'s attributes hold (an If's branches, a Loop's or Scan's body)."""
    return [g for attr in node.attribute for g in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs)]


def graphs_within(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """`graph` first, then every body inside it, at any depth."""
    stack = [graph]
    while stack:
        current = stack.pop()
        yield current
        for node in current.node:
            if node.attribute:  # most nodes have none: no call made for them
                stack.extend(bodies(node))


def nodes_within(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """Every node of `graph` and of the bodies inside it, at any depth."""
    for current in graphs_within(graph):
        yield from current.node
