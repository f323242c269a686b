"""Cutting a model's main graph into blocks where few tensors are live, as plain data.

A model larger than the memory at hand is run block by block (`verify.oracle.blockwise`): each block a
sub-model holding only its own weights, fed the tensors that cross the cut before it. Good cuts
are where few tensors are live: between transformer layers, the residual stream and what every
layer reads (masks, positions). `cut` walks the nodes in an order that runs, counts the tensors
live at each boundary, and closes a block once it holds about `block_bytes` of weights, at the
boundary with the fewest live tensors among the next ones (up to twice `block_bytes`).

Weights are initializers (each block carries those its nodes read, a weight read in two blocks
is in both) and Constant nodes (their outputs cross a cut like any tensor).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

import onnx


@dataclass(frozen=True)
class Block:
    """Nodes `order[start:stop]` of a `Cut`: the tensors they read that earlier blocks or the graph's
    inputs make (`inputs`), those they make that later blocks or the graph's outputs read
    (`outputs`), and the bytes of the initializers they read (`weight_bytes`)."""

    start: int
    stop: int
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    weights: tuple[str, ...]
    weight_bytes: int


@dataclass(frozen=True)
class Cut:
    """`order`: the graph's node indices in an order that runs; `blocks` cover it in turn."""

    order: tuple[int, ...]
    blocks: tuple[Block, ...]

    @property
    def largest_block_bytes(self) -> int:
        return max((b.weight_bytes for b in self.blocks), default=0)


def tensor_bytes(tensor: onnx.TensorProto) -> int:
    """The bytes of `tensor`'s values, from its type and dims (its data may be elsewhere)."""
    if tensor.data_type in (onnx.TensorProto.STRING, onnx.TensorProto.UNDEFINED):
        return 0
    itemsize = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    return math.prod(tensor.dims) * itemsize


def body_reads(node: onnx.NodeProto) -> set[str]:
    """The outer-scope names a node's subgraphs read (at any depth)."""
    reads: set[str] = set()
    for attr in node.attribute:
        graphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
        for g in graphs:
            defined = {i.name for i in g.input} | {t.name for t in g.initializer}
            for inner in g.node:
                reads.update(n for n in inner.input if n and n not in defined)
                reads.update(n for n in body_reads(inner) if n not in defined)
                defined.update(inner.output)
    return reads


def node_reads(node: onnx.NodeProto) -> list[str]:
    """Every name `node` reads: its inputs, then what its subgraphs read from outside."""
    return [n for n in node.input if n] + sorted(body_reads(node))


def runs_in_order(nodes: list[onnx.NodeProto], known: set[str]) -> bool:
    """Whether every node of `nodes` reads only `known` names and what the nodes before it make:
    the order an export writes, checked in one pass, where `topological` sorts."""
    known = set(known) | {""}
    for node in nodes:
        if not known.issuperset(node.input) or (node.attribute and not known.issuperset(body_reads(node))):
            return False
        known.update(node.output)
    return True


def in_running_order(nodes: list[onnx.NodeProto], known: set[str]) -> list[int]:
    """Indices of `nodes` in an order that runs: theirs where it does (`runs_in_order`), else
    `topological`'s."""
    return list(range(len(nodes))) if runs_in_order(nodes, known) else topological(nodes, known)


def topological(nodes: list[onnx.NodeProto], known: set[str]) -> list[int]:
    """Indices of `nodes` in an order that runs (ONNX Runtime sorts them; converters that append
    nodes, as the fp16 converter's input Casts, rely on that); where none runs (a cycle, a name
    nothing defines) the rest follow in their order, for the evaluator to say which.

    The order is by waves: first every node that reads only `known` names, in their order; then
    every node that reads only those and what the first wave made, in their order; and so on.
    Kahn's algorithm over names: each node counts the distinct names it still waits for, each name
    lists the nodes that wait for it, and the first wave to make a name releases them; linear in
    the nodes and their reads, but for sorting each wave."""
    known = set(known) | {""}
    waiting_for = [0] * len(nodes)
    readers: dict[str, list[int]] = {}
    wave: list[int] = []
    for i, node in enumerate(nodes):
        names = {n for n in node.input if n not in known}
        names.update(n for n in body_reads(node) if n not in known)
        waiting_for[i] = len(names)
        for name in names:
            readers.setdefault(name, []).append(i)
        if not names:
            wave.append(i)
    ordered: list[int] = []
    while wave:
        ordered.extend(wave)
        following: list[int] = []
        for i in wave:
            for name in nodes[i].output:
                for reader in readers.pop(name, ()):
                    waiting_for[reader] -= 1
                    if not waiting_for[reader]:
                        following.append(reader)
        following.sort()
        wave = following
    if len(ordered) < len(nodes):
        ordered += [i for i, count in enumerate(waiting_for) if count]
    return ordered


def cut(graph: onnx.GraphProto, block_bytes: int) -> Cut:
    """`graph`'s nodes in blocks of about `block_bytes` of weights each (one block when they hold
    less), cut where few tensors are live."""
    nodes = list(graph.node)
    weights = {t.name: tensor_bytes(t) for t in graph.initializer}
    order = topological(nodes, {i.name for i in graph.input} | set(weights))
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
    # `cumulative` never falls: the first boundary past `block_bytes` and the window up to twice
    # it are found by bisection, each block in time of its window, not of the rest of the graph.
    while True:
        first = bisect.bisect_left(cumulative, cumulative[start] + block_bytes, start + 1, count)
        if first >= count:
            break
        stop = bisect.bisect_right(cumulative, cumulative[start] + 2 * block_bytes, first, count)
        start = min(range(first, max(stop, first + 1)), key=live.__getitem__)
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
