"""Names: readable labels for nodes, and fresh tensor names that collide with nothing."""

from __future__ import annotations

import onnx_ir as ir


def display_names(graph: ir.Graph) -> dict[ir.Node, str]:
    """Unique, readable names for every node, subgraphs included (exporters sometimes leave
    names empty)."""
    names: dict[ir.Node, str] = {}
    seen: set[str] = set()
    for i, node in enumerate(ir.traversal.RecursiveGraphIterator(graph)):
        name = node.name or f"{node.op_type}_{i}"
        if name in seen:
            name = f"{name}#{i}"
        seen.add(name)
        names[node] = name
    return names


def taken_names(graph: ir.Graph) -> set[str]:
    """Every tensor and node name in use in the graph and its subgraphs."""
    names = {v.name for v in graph.inputs if v.name}
    names |= set(graph.initializers)
    for node in ir.traversal.RecursiveGraphIterator(graph):
        names |= {o.name for o in node.outputs if o.name}
        if node.name:
            names.add(node.name)
    return names


def fresh_name(base: str, taken: set[str]) -> str:
    """`base`, or `base_2`, `base_3`, ...: the first not in `taken` (which it joins)."""
    name, i = base, 1
    while name in taken:
        i += 1
        name = f"{base}_{i}"
    taken.add(name)
    return name
