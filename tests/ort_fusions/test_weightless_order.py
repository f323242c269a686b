"""`ort_fusions.weightless.topological_nodes`: Kahn's algorithm, ties by the graph's own order, the same
order as the list re-sorted after each node it replaced, in time near-linear in the nodes."""

from __future__ import annotations

import random

import numpy as np
import onnx_ir as ir

from onnx_lnfold.ort_fusions.weightless import clone_model, in_topological_order, outer_reads, topological_nodes


def _by_resorting(graph: ir.Graph) -> list[ir.Node]:
    nodes = list(graph)
    position = {node: i for i, node in enumerate(nodes)}
    waits = {}
    for node in nodes:
        producers = {v.producer() for v in (*node.inputs, *outer_reads(node)) if v is not None}
        waits[node] = {p for p in producers if p in position and p is not node}
    readers = {node: [] for node in nodes}
    for node, needs in waits.items():
        for producer in needs:
            readers[producer].append(node)
    ready = sorted((n for n in nodes if not waits[n]), key=position.__getitem__, reverse=True)
    order = []
    while ready:
        node = ready.pop()
        order.append(node)
        for reader in readers[node]:
            waits[reader].discard(node)
            if not waits[reader]:
                ready.append(reader)
        ready.sort(key=position.__getitem__, reverse=True)
    return order


def _random_graph(rng: random.Random, count: int) -> ir.Graph:
    x = ir.Value(name="x", shape=ir.Shape([2]), type=ir.TensorType(ir.DataType.FLOAT))
    graph = ir.Graph([x], [], nodes=[])
    values, nodes = [x], []
    for i in range(count):
        if rng.random() < 0.3:
            node = ir.node("Constant", [], attributes={"value": ir.tensor(np.zeros(2, np.float32))}, name=f"c{i}")
        else:
            node = ir.node("Add", [rng.choice(values), rng.choice(values)], name=f"n{i}")
        nodes.append(node)
        values.append(node.outputs[0])
    rng.shuffle(nodes)
    graph.extend(nodes)
    graph.outputs.append(values[-1])
    return graph


def test_the_order_is_the_former_ones_on_shuffled_graphs():
    rng = random.Random(7)
    for _ in range(50):
        graph = _random_graph(rng, rng.randint(1, 60))
        assert topological_nodes(graph) == _by_resorting(graph)


def test_many_ready_nodes_and_a_clone_in_the_graphs_own_order():
    graph = _random_graph(random.Random(3), 20_000)
    model = ir.Model(graph, ir_version=10)
    order = topological_nodes(graph)
    assert len(order) == 20_000 and len(set(order)) == 20_000
    clone = clone_model(model)
    assert [n.name for n in clone.graph] == [n.name for n in graph]


def test_a_graph_is_in_order_where_the_sort_would_keep_it_as_it_is():
    """`clone_model` sorts only a graph out of order, told in one pass (`in_topological_order`)."""
    rng = random.Random(11)
    outcomes = set()
    for _ in range(100):
        graph = _random_graph(rng, rng.randint(1, 12))
        if rng.random() < 0.5:  # some in order: the sort's own
            ordered = topological_nodes(graph)
            for node in list(graph):
                graph.remove(node)
            graph.extend(ordered)
        in_order = list(graph) == topological_nodes(graph)
        assert in_topological_order(graph) == in_order
        outcomes.add(in_order)
    assert outcomes == {True, False}
