"""The graph an ONNX Runtime session runs (its optimized model), read for a comparison of an
original and its fold: which nodes are normalization work (`norm_roles`), and which the fold
changed and which both run (`split_nodes`). Outside what it prices, a fold leaves that graph as
it was (docs/DESIGN.md section 10): the nodes both run are the same kernels on the same shapes,
and what moves their time is the machine."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import onnx

from onnx_lnfold.core.names import CENTERING_NODES, CENTERING_STEM
from onnx_lnfold.core.ops import NORMALIZATION_TYPES


def read(optimized_model: str | Path) -> onnx.GraphProto:
    return onnx.load(str(optimized_model), load_external_data=False).graph


def norm_roles(graph: onnx.GraphProto) -> dict[str, str]:
    """node name -> 'norm_op' / 'residual_add' / 'beta_add' / 'centering' in a session's graph."""
    nodes = list(graph.node)
    consts = {i.name for i in graph.initializer}
    consts |= {o for n in nodes if n.op_type == "Constant" for o in n.output}
    producer = {o: n for n in nodes for o in n.output}
    norms = [n for n in nodes if n.op_type in NORMALIZATION_TYPES]
    roles = {n.name: "norm_op" for n in norms}
    norm_outputs = {n.output[0] for n in norms}
    for n in norms:
        for x in n.input[:2]:  # data input and, for the Skip variants, the skip input
            p = producer.get(x)
            if p is not None and p.op_type == "Add":
                roles.setdefault(p.name, "residual_add")
    for n in nodes:  # an explicit centering the fold inserted is normalization work
        stem, _, part = n.name.rpartition(f"/{CENTERING_STEM}/")
        if stem and CENTERING_NODES.get(n.op_type) == part:
            roles[n.name] = "centering"
    for n in nodes:
        if n.op_type == "Add" and n.name not in roles and len(n.input) == 2:
            a, b = n.input
            if (a in norm_outputs and b in consts) or (b in norm_outputs and a in consts):
                roles[n.name] = "beta_add"
    return roles


def split_nodes(nodes: dict[str, dict[str, str]], roles: dict[str, dict[str, str]]) -> tuple[set[str], dict]:
    """(the shared nodes' names, per variant the op counts of the nodes it alone runs) of the
    sessions' graphs of "original" and "folded": `nodes[v]` name -> op, `roles[v]` its
    `norm_roles`. A node is shared when it is outside both normalization groups and the other graph
    runs a node of its name and op (ONNX Runtime keeps a node's name through the optimizations both
    graphs go through); a node alone is one outside its group that the other graph does not run."""
    other = {"original": nodes["folded"], "folded": nodes["original"]}
    matched = {v: {name for name, op in nodes[v].items() if other[v].get(name) == op} for v in nodes}
    shared = {name for name in matched["original"] if name not in roles["original"] and name not in roles["folded"]}
    alone = {v: dict(sorted(Counter(op for name, op in nodes[v].items()
                                    if name not in matched[v] and name not in roles[v]).items())) for v in nodes}
    return shared, alone
