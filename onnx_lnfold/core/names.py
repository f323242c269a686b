"""Names: readable labels for nodes, and fresh tensor names that collide with nothing."""

from __future__ import annotations

import onnx_ir as ir

from onnx_lnfold.core.ir import graphs_of, nodes_within


def display_names(graph: ir.Graph) -> dict[ir.Node, str]:
    """Unique, readable names for every node, subgraphs included (exporters sometimes leave
    names empty)."""
    names: dict[ir.Node, str] = {}
    seen: set[str] = set()
    for i, node in enumerate(nodes_within(graph)):
        name = node.name or f"{node.op_type}_{i}"
        if name in seen:
            name = f"{name}#{i}"
        seen.add(name)
        names[node] = name
    return names


def taken_names(graph: ir.Graph) -> set[str]:
    """Every tensor and node name in use in the graph and its subgraphs (If/Loop/Scan bodies):
    their inputs, initializers and node outputs too. ONNX names are one namespace across a
    model, and a body resolves a name to its own tensor first, so a new main-graph tensor named
    like a body's input or initializer would be read as that one there."""
    names: set[str] = set()
    for node in nodes_within(graph):
        names |= {o.name for o in node.outputs if o.name}
        if node.name:
            names.add(node.name)
    for sub in graphs_of(graph):
        names |= {v.name for v in sub.inputs if v.name}
        names |= {v.name for v in sub.outputs if v.name}
        names |= set(sub.initializers)
    return names


def fresh_name(base: str, taken: set[str]) -> str:
    """`base`, or `base_2`, `base_3`, ...: the first not in `taken` (which it joins)."""
    name, i = base, 1
    while name in taken:
        i += 1
        name = f"{base}_{i}"
    taken.add(name)
    return name


# An explicit centering `x - ReduceMean(x)` is two nodes, `<x>/center/mean` and `<x>/center/sub`
# (`apply.apply_plan`); ONNX Runtime's session keeps their names, which is how what reads its
# graph finds them (`ort_fusions.session_layout`, `bench.session_graph`).
CENTERING_STEM = "center"
CENTERING_NODES = {"ReduceMean": "mean", "Sub": "sub"}  # op -> the name's last part


def centering_node_name(tensor: str, op: str) -> str:
    """The name the centering of `tensor` gives its node of `op` where no other name was taken."""
    return f"{tensor}/{CENTERING_STEM}/{CENTERING_NODES[op]}"
