"""Weightless copies of a model, for ONNX Runtime's own fusion code (docs/DESIGN.md section 10).

A weightless copy is the graph with every small constant as it is and every large one an
external-data reference to the start of one sparse, zero-filled file: the file is made with
`truncate`, so it costs no disk and no copy, and no weight is read to make the copy. ONNX Runtime
(the session and the transformers optimizer) reads the zeros.

What the fusions read from constants (measured on every committed model and on the models of
`models/make/export_fusion_models.py`, docs/DESIGN.md section 10): the shapes of every weight, the
values of scalars (GELU's sqrt(2), 0.5 and 1, an LN's epsilon and exponent, attention's mask
constants) and of integer tensors (shapes, axes, Slice bounds, position ids). So tensors up to
`KEEP_BYTES` and integer or boolean tensors up to `KEEP_INTEGER_BYTES` keep their values; the
optimizer's own decisions and node counts are the same on the weightless copy as on the model.

The copies are clones (`clone_model`): the caller's model and its tensors are never changed.
"""

from __future__ import annotations

import heapq
import shutil
from collections.abc import Callable
from functools import partial
from pathlib import Path

import onnx_ir as ir

from onnx_lnfold.core.ir import bodies, graphs_of, nodes_within
from onnx_lnfold.io import scratch

# The size up to which ONNX Runtime's optimizer keeps a tensor inside the model it writes
# (`optimize_by_onnxruntime`'s external_data_file_threshold): scalars and short vectors.
KEEP_BYTES = 1024
# Shapes, axes, indices, position ids, masks: values fusions compare; never weights.
KEEP_INTEGER_BYTES = 1 << 20
INTEGER_TYPES = frozenset(
    {ir.DataType.INT64, ir.DataType.INT32, ir.DataType.UINT64, ir.DataType.UINT32, ir.DataType.BOOL}
)
ZEROS_FILE = "zeros.bin"


def _keeps(tensor: ir.TensorProtocol) -> bool:
    if tensor.dtype == ir.DataType.STRING:
        return True  # strings cannot be external data
    limit = KEEP_INTEGER_BYTES if tensor.dtype in INTEGER_TYPES else KEEP_BYTES
    return tensor.nbytes <= limit


class WeightlessFolder:
    """A temporary folder holding the zero-filled file and the weightless models written there;
    removed on `close()` (or leaving a `with` block)."""

    def __init__(self) -> None:
        self.path = scratch.make("weightless")
        self._zeros = self.path / ZEROS_FILE
        self._zeros.touch()
        self._size = 0
        self.stripped_bytes = 0  # bytes of the constants replaced by zeros, over every strip

    def __enter__(self) -> WeightlessFolder:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)

    def reserve(self, nbytes: int) -> None:
        """Make the zero file at least `nbytes` long."""
        if nbytes > self._size:
            with open(self._zeros, "r+b") as f:
                f.truncate(nbytes)  # sparse: no disk blocks, reads as zeros
            self._size = nbytes

    def _zeros_like(self, tensor: ir.TensorProtocol, name: str) -> ir.ExternalTensor:
        nbytes = tensor.nbytes
        self.reserve(nbytes)
        self.stripped_bytes += nbytes
        shape = ir.Shape(list(tensor.shape))
        return ir.ExternalTensor(ZEROS_FILE, 0, nbytes, tensor.dtype, shape=shape, name=name, base_dir=self.path)

    def _stripped(self, tensor: ir.TensorProtocol, name: str) -> ir.TensorProtocol:
        if not _keeps(tensor):
            return self._zeros_like(tensor, name)
        if isinstance(tensor, ir.ExternalTensor):  # its file is beside the original, not here
            return ir.Tensor(tensor.numpy(), dtype=tensor.dtype, name=name)
        return tensor

    def strip(self, model: ir.Model) -> None:
        """Replace, in `model` (a clone: its tensors may be shared, they are not touched), every
        constant `_keeps` does not keep by zeros of the same type and shape: initializers and
        Constant values of every graph, bodies and functions included. Lazy tensors (the fold's
        centered weights) are replaced without being computed."""
        self._put_stand_ins(model)

    def _put_stand_ins(self, model: ir.Model) -> list[Callable[[], None]]:
        """`strip`'s replacements made in `model`, and what undoes each."""
        undo: list[Callable[[], None]] = []
        graphs = [*graphs_of(model), *model.functions.values()]
        for graph in graphs:
            if isinstance(graph, ir.Graph):
                for value in graph.initializers.values():
                    tensor = value.const_value
                    if tensor is None:
                        continue
                    stripped = self._stripped(tensor, value.name or tensor.name or "")
                    if stripped is not tensor:
                        value.const_value = stripped
                        undo.append(partial(setattr, value, "const_value", tensor))
            for node in graph:
                for key, attr in list(node.attributes.items()):
                    if attr.is_ref() or attr.type != ir.AttributeType.TENSOR or attr.value is None:
                        continue
                    name = attr.value.name or (node.outputs[0].name if node.outputs else "") or ""
                    stripped = self._stripped(attr.value, name)
                    if stripped is attr.value:
                        continue
                    node.attributes[key] = ir.AttrTensor(key, stripped)
                    undo.append(partial(node.attributes.__setitem__, key, attr))
                    if node.op_type == "Constant" and node.outputs and node.outputs[0].const_value is not None:
                        output = node.outputs[0]
                        undo.append(partial(setattr, output, "const_value", output.const_value))
                        output.const_value = stripped
        return undo

    def write(self, model: ir.Model, name: str) -> Path:
        """`model` (stripped) as `name` in this folder; its external references resolve here."""
        path = self.path / name
        path.write_bytes(ir.to_proto(model).SerializeToString())
        return path

    def write_stripped(self, model: ir.Model, name: str) -> Path:
        """`model` as `strip` would leave a clone of it, written as `name` without a clone: its
        constants are swapped for their stand-ins while it is serialized, and put back before
        this returns (a clone of a large graph takes longer than its serialization)."""
        undo = self._put_stand_ins(model)
        try:
            return self.write(model, name)
        finally:
            for step in reversed(undo):
                step()


def outer_reads(node: ir.Node) -> list[ir.Value]:
    """The values of the enclosing graphs that a node's If/Loop/Scan bodies read."""
    reads = []
    for body in bodies(node):
        inner = {v for n in nodes_within(body) for v in n.outputs}
        inner |= set(body.inputs) | set(body.initializers.values())
        for n in nodes_within(body):
            reads += [v for v in n.inputs if v is not None and v not in inner]
    return reads


def topological_nodes(graph: ir.Graph) -> list[ir.Node]:
    """The graph's nodes in a topological order, the graph's own where it allows (Kahn's
    algorithm, ties by position); the graph is not changed."""
    nodes = list(graph)
    position = {node: i for i, node in enumerate(nodes)}
    waits: dict[ir.Node, set[ir.Node]] = {}
    for node in nodes:
        producers = {v.producer() for v in (*node.inputs, *outer_reads(node)) if v is not None}
        waits[node] = {p for p in producers if p in position and p is not node}
    readers: dict[ir.Node, list[ir.Node]] = {node: [] for node in nodes}
    for node, needs in waits.items():
        for producer in needs:
            readers[producer].append(node)
    # the ready nodes in a heap by position (re-sorting a list after each node was quadratic where
    # many are ready at once, as an export's Constant nodes are)
    ready = [position[n] for n in nodes if not waits[n]]
    heapq.heapify(ready)
    order: list[ir.Node] = []
    while ready:
        node = nodes[heapq.heappop(ready)]
        order.append(node)
        for reader in readers[node]:
            waits[reader].discard(node)
            if not waits[reader]:
                heapq.heappush(ready, position[reader])
    if len(order) != len(nodes):
        raise ValueError("the graph has a cycle")
    return order


def in_topological_order(graph: ir.Graph) -> bool:
    """Whether every node of `graph` comes after the nodes of `graph` it reads (what
    `topological_nodes` would keep as it is), in one pass."""
    nodes = set(graph)
    before: set[ir.Node] = set()
    for node in graph:
        for value in (*node.inputs, *outer_reads(node)):
            producer = value.producer() if value is not None else None
            if producer is not None and producer is not node and producer in nodes and producer not in before:
                return False
        before.add(node)
    return True


def clone_model(model: ir.Model) -> ir.Model:
    """`model.clone()` (tensors shared, nothing else), also for a main graph whose nodes are not
    in topological order (the fp16 converter appends its Casts at the end), which onnx-ir's
    cloner refuses: that one is cloned in a topological order and put back in its own, which the
    names the analysis gives unnamed nodes follow."""
    graph = model.graph
    if in_topological_order(graph):
        return model.clone()
    order = topological_nodes(graph)
    view = ir.GraphView(
        graph.inputs,
        graph.outputs,
        nodes=order,
        initializers=list(graph.initializers.values()),
        doc_string=graph.doc_string,
        opset_imports=dict(graph.opset_imports),
        name=graph.name,
        metadata_props=dict(graph.metadata_props),
    )
    cloned = view.clone()
    twin = dict(zip(order, cloned))
    for node in list(cloned):
        cloned.remove(node)
    cloned.extend(twin[node] for node in graph)
    return ir.Model(
        cloned,
        ir_version=model.ir_version,
        producer_name=model.producer_name,
        producer_version=model.producer_version,
        domain=model.domain,
        model_version=model.model_version,
        doc_string=model.doc_string,
        functions=[func.clone() for func in model.functions.values()],
        metadata_props=dict(model.metadata_props),
    )


def weightless_clone(model: ir.Model, folder: WeightlessFolder) -> ir.Model:
    """A stripped clone of `model`."""
    clone = clone_model(model)
    folder.strip(clone)
    return clone


__all__ = [
    "INTEGER_TYPES",
    "KEEP_BYTES",
    "KEEP_INTEGER_BYTES",
    "ZEROS_FILE",
    "WeightlessFolder",
    "clone_model",
    "in_topological_order",
    "outer_reads",
    "topological_nodes",
    "weightless_clone",
]
