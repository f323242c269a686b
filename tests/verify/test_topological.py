"""The order `verify.oracle.cut.topological` gives nodes: by waves, each in the graph's order, the
nodes that never run after them in theirs; in time near-linear in the nodes (Kahn's algorithm),
and the same order as the one-pass-per-wave scan it replaced, kept here as the reference, with
the former `cut`, whose block bounds scanned to the graph's end."""

from __future__ import annotations

import random

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnx_lnfold.verify.oracle.cut import (
    Block,
    Cut,
    body_reads,
    cut,
    in_running_order,
    node_reads,
    runs_in_order,
    tensor_bytes,
    topological,
)


def _by_rescans(nodes: list[onnx.NodeProto], known: set[str]) -> list[int]:
    """The former implementation: each pass takes every waiting node whose reads are known."""
    known = set(known) | {""}
    ordered: list[int] = []
    waiting = list(range(len(nodes)))
    while waiting:
        ready = [i for i in waiting if all(n in known for n in nodes[i].input) and body_reads(nodes[i]) <= known]
        if not ready:
            return ordered + waiting
        taken = set(ready)
        waiting = [i for i in waiting if i not in taken]
        for i in ready:
            ordered.append(i)
            known.update(nodes[i].output)
    return ordered


def _cut_by_scans(graph: onnx.GraphProto, block_bytes: int) -> Cut:
    """The former `cut`: the rescanning sort, and each block's bounds by a scan to the graph's end."""
    nodes = list(graph.node)
    weights = {t.name: tensor_bytes(t) for t in graph.initializer}
    order = _by_rescans(nodes, {i.name for i in graph.input} | set(weights))
    count = len(order)
    reads = [node_reads(nodes[i]) for i in order]
    constants = [
        sum(tensor_bytes(a.t) for a in nodes[i].attribute if a.type == onnx.AttributeProto.TENSOR)
        if nodes[i].op_type == "Constant"
        else 0
        for i in order
    ]
    own = [size + sum(weights[n] for n in set(names) if n in weights) for size, names in zip(constants, reads)]
    made = {name: -1 for name in (i.name for i in graph.input) if name not in weights}
    for position, i in enumerate(order):
        made.update((name, position) for name in nodes[i].output if name)
    last = {}
    for position, names in enumerate(reads):
        for name in names:
            if name in made:
                last[name] = position
    for o in graph.output:
        if o.name in made:
            last[o.name] = count
    # Tensors live at boundary b (between positions b - 1 and b): made before b, read at b or later.
    change = [0] * (count + 2)
    for name, position in last.items():
        change[made[name] + 1] += 1
        change[position + 1] -= 1
    live, running = [], 0
    for b in range(count + 1):
        running += change[b]
        live.append(running)

    bounds, total, start = [0], 0, 0
    cumulative = [0]
    for size in own:
        total += size
        cumulative.append(total)
    while True:
        first = next((b for b in range(start + 1, count) if cumulative[b] - cumulative[start] >= block_bytes), None)
        if first is None:
            break
        window = [b for b in range(first, count) if cumulative[b] - cumulative[start] <= 2 * block_bytes] or [first]
        start = min(window, key=lambda b: live[b])
        bounds.append(start)
    bounds.append(count)

    blocks = []
    for begin, end in zip(bounds, bounds[1:]):
        inside = {name for position in range(begin, end) for name in nodes[order[position]].output}
        block_reads = [name for position in range(begin, end) for name in reads[position]]
        inputs = dict.fromkeys(n for n in block_reads if n in made and n not in inside)
        outputs = [n for n in dict.fromkeys(inside) if n in last and last[n] >= end]
        used = tuple(dict.fromkeys(n for n in block_reads if n in weights and n not in made))
        size = sum(weights[n] for n in used) + sum(constants[begin:end])
        blocks.append(Block(begin, end, tuple(inputs), tuple(outputs), used, size))
    return Cut(tuple(order), tuple(blocks))


def _node(inputs, outputs, op="Add") -> onnx.NodeProto:
    return helper.make_node(op, list(inputs), list(outputs))


def test_a_chain_written_backwards_runs_forwards():
    nodes = [_node([f"t{i}"], [f"t{i + 1}"], "Identity") for i in range(5)][::-1]
    assert topological(nodes, {"t0"}) == [4, 3, 2, 1, 0]


def test_a_diamond_runs_by_waves_in_the_graphs_order():
    # x -> a, x -> b, (a, b) -> c; c listed first, b before a
    nodes = [_node(["a", "b"], ["c"]), _node(["x"], ["b"], "Relu"), _node(["x"], ["a"], "Neg")]
    assert topological(nodes, {"x"}) == [1, 2, 0]


def test_a_wave_waits_for_the_one_before_even_when_a_later_node_could_run():
    # n0 reads what n1 makes; n2 reads only x: wave 0 is n1, n2, then n0
    nodes = [_node(["m"], ["y"], "Relu"), _node(["x"], ["m"], "Neg"), _node(["x"], ["z"], "Abs")]
    assert topological(nodes, {"x"}) == [1, 2, 0]


def test_a_cycle_and_an_undefined_name_follow_in_their_order():
    nodes = [
        _node(["q"], ["p"], "Relu"),  # cycle p <-> q
        _node(["x"], ["a"], "Neg"),
        _node(["p"], ["q"], "Relu"),
        _node(["nowhere"], ["b"], "Relu"),
        _node(["a"], ["c"], "Relu"),
    ]
    assert topological(nodes, {"x"}) == [1, 4, 0, 2, 3]
    assert topological(nodes, {"x"}) == _by_rescans(nodes, {"x"})


def test_a_name_read_twice_and_made_twice():
    nodes = [_node(["a", "a"], ["b"]), _node(["x"], ["a"], "Neg"), _node(["b"], ["a"], "Neg"), _node(["", "a"], ["c"])]
    assert topological(nodes, {"x"}) == _by_rescans(nodes, {"x"}) == [1, 0, 3, 2]


def test_a_subgraph_waits_for_the_outer_names_it_reads():
    then = helper.make_graph([_node(["late"], ["o"], "Identity")], "then", [], [helper.make_tensor_value_info("o", 1, None)])
    other = helper.make_graph([_node(["x"], ["o2"], "Identity")], "else", [], [helper.make_tensor_value_info("o2", 1, None)])
    branch = helper.make_node("If", ["x"], ["y"], then_branch=then, else_branch=other)
    nodes = [branch, _node(["x"], ["late"], "Neg")]
    assert topological(nodes, {"x"}) == _by_rescans(nodes, {"x"}) == [1, 0]


def _random_graph(rng: random.Random, count: int) -> tuple[list[onnx.NodeProto], set[str]]:
    known = {f"in{i}" for i in range(rng.randint(1, 3))}
    names = sorted(known)
    nodes = []
    for i in range(count):
        reads = rng.sample(names, min(len(names), rng.randint(0, 3)))
        if rng.random() < 0.05:
            reads.append(rng.choice(["undefined", ""]))
        out = [f"v{i}"] + ([f"w{i}"] if rng.random() < 0.2 else [])
        if rng.random() < 0.03 and names:
            out.append(rng.choice(names))  # a name made twice (or a graph input made again)
        nodes.append(_node(reads, out))
        names += out
    if rng.random() < 0.3 and count > 2:  # a cycle: an early node reads a later one's output
        i, j = sorted(rng.sample(range(count), 2))
        nodes[i].input.append(nodes[j].output[0])
    order = list(range(count))
    if rng.random() < 0.7:
        rng.shuffle(order)
    return [nodes[i] for i in order], known


def test_the_order_is_the_former_ones_on_random_graphs():
    rng = random.Random(20250601)
    for _ in range(300):
        nodes, known = _random_graph(rng, rng.randint(0, 40))
        assert topological(nodes, known) == _by_rescans(nodes, known)


def _runs(nodes: list[onnx.NodeProto], known: set[str], order: list[int]) -> bool:
    """Whether each node, in `order`, reads only names known before it."""
    known = set(known) | {""}
    for i in order:
        if not set(node_reads(nodes[i])) <= known:
            return False
        known.update(nodes[i].output)
    return True


def test_a_graph_in_running_order_keeps_it_and_any_other_is_sorted():
    rng = random.Random(20261206)
    seen = {True: 0, False: 0}
    for _ in range(300):
        nodes, known = _random_graph(rng, rng.randint(0, 40))
        in_order = runs_in_order(nodes, known)
        seen[in_order] += 1
        assert in_order == _runs(nodes, known, list(range(len(nodes))))
        order = in_running_order(nodes, known)
        assert order == (list(range(len(nodes))) if in_order else topological(nodes, known))
    assert min(seen.values()) > 20  # both kinds drawn


class _CountedNode:
    """A node that counts how often the sort reads its names: the sort's work, which a clock
    on shared cores measures only roughly."""

    reads = 0

    def __init__(self, node: onnx.NodeProto):
        self._node = node
        self.attribute = node.attribute

    @property
    def input(self):
        _CountedNode.reads += 1
        return self._node.input

    @property
    def output(self):
        _CountedNode.reads += 1
        return self._node.output


def test_a_long_chain_is_sorted_in_near_linear_time():
    def reads_to_sort(n):
        # the chain listed last node first: the former scan took one pass per node
        nodes = [_CountedNode(_node([f"t{i}"], [f"t{i + 1}"], "Identity")) for i in range(n)][::-1]
        _CountedNode.reads = 0
        order = topological(nodes, {"t0"})
        assert order == list(range(n - 1, -1, -1))
        return _CountedNode.reads

    assert reads_to_sort(2_000) <= 2 * 2_000  # each node's inputs once, its outputs once
    assert reads_to_sort(40_000) == 20 * reads_to_sort(2_000)


def test_a_long_chain_is_cut_without_recursion():
    nodes = [_node([f"t{i}"], [f"t{i + 1}"], "Identity") for i in range(30_000)]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("t0", 1, [1])], [helper.make_tensor_value_info("t30000", 1, [1])]
    )
    found = cut(graph, 1 << 20)
    assert found.order == tuple(range(30_000)) and len(found.blocks) == 1
    assert found.blocks[0].inputs == ("t0",) and found.blocks[0].outputs == ("t30000",)


def test_the_cut_is_the_former_ones_on_random_graphs():
    rng = random.Random(1)
    for _ in range(200):
        count = rng.randint(1, 50)
        inits = [
            numpy_helper.from_array(np.zeros(rng.choice([0, 1, 5, 50, 400]), np.float32), f"w{i}")
            for i in range(rng.randint(0, 20))
        ]
        names, nodes = ["x"], []
        for i in range(count):
            if rng.random() < 0.1:
                value = numpy_helper.from_array(np.zeros(rng.randint(1, 300), np.float32))
                nodes.append(helper.make_node("Constant", [], [f"v{i}"], value=value))
            else:
                reads = [rng.choice(names)] + ([rng.choice(inits).name] if inits and rng.random() < 0.6 else [])
                nodes.append(_node(reads, [f"v{i}"]))
            names.append(f"v{i}")
        if rng.random() < 0.5:
            rng.shuffle(nodes)
        outputs = [helper.make_tensor_value_info(n, 1, None) for n in (names[-1], rng.choice(names))]
        graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, None)], outputs, initializer=inits)
        for block_bytes in (0, 1, 100, 500, 2000, 10**9):
            assert cut(graph, block_bytes) == _cut_by_scans(graph, block_bytes)
