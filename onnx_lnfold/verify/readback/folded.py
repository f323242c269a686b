"""The folded model as written, as the read-back walks it (`Folded`): its nodes by key, producers
and stored tensors by scoped name, which of them a planned change has claimed, and the checks of
tensor values, run after the structure in the order of the file."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import onnx
import onnx_ir as ir

from onnx_lnfold.load.model import load_path
from onnx_lnfold.verify.readback.scopes import Scopes, stored_tensors
from onnx_lnfold.verify.sessions import ModelBytesOrPath


class Differs(Exception):
    """A difference from the plan: its message is the reason the fold is refused."""


@dataclass(frozen=True)
class TensorCheck:
    position: tuple[str, int]  # where the written tensor's values are: file and offset ("", -1 in the model)
    nbytes: int
    run: Callable[[], None]


def _file_position(tensor: ir.TensorProtocol) -> tuple[str, int]:
    if isinstance(tensor, ir.ExternalTensor):
        return str(tensor.location), int(tensor.offset or 0)
    return "", -1


def model_of(source: ModelBytesOrPath | ir.Model) -> ir.Model:
    """The model `source` holds; an `ir.Model` is taken as it is (read from the file already)."""
    if isinstance(source, ir.Model):
        return source
    return ir.from_proto(onnx.load_from_string(source)) if isinstance(source, bytes) else load_path(source)


class Folded:
    """The folded model as written: its nodes by key, producers and stored tensors by scoped name,
    and which of them a planned change has claimed."""

    def __init__(self, model: ir.Model):
        self.model = model
        self.scopes = Scopes(model)
        self.nodes: dict[str, ir.Node] = {}
        self.producer: dict[str, ir.Node] = {}
        for g, graph in enumerate(self.scopes.graphs):
            for node in graph:
                self.nodes[self.scopes.key(node)] = node
                for out in node.outputs:
                    if out.name:
                        self.producer[f"{g}:{out.name}"] = node
        self.constants = stored_tensors(self.scopes)
        self.claimed_nodes: set[str] = set()
        self.claimed_tensors: set[str] = set()
        # Each folded LN's emitted nodes as found, by LN and node index (`rewrites.check_norm`).
        self.emitted: dict[str, dict[int, ir.Node]] = {}
        # The checks that read tensors' values, run after the structure in the order of the file
        # (`TensorCheck`): each tensor's pages read once, in step with the check's other passes.
        self.tensor_checks: list[TensorCheck] = []

    def later(self, written: ir.TensorProtocol, check: Callable[[], None]) -> None:
        """Run `check` (which raises `Differs`) with the tensor checks, at `written`'s place."""
        self.tensor_checks.append(TensorCheck(_file_position(written), int(written.nbytes or 0), check))

    def node_making(self, graph: int, name: str, what: str) -> ir.Node:
        node = self.scopes.find(self.producer, graph, name)
        if node is None:
            raise Differs(f"{what}: nothing in the folded model computes '{name}'")
        return node

    def claim(self, node: ir.Node) -> None:
        self.claimed_nodes.add(self.scopes.key(node))

    def scoped(self, graph: int, name: str) -> str | None:
        """The scoped key of the stored tensor `name` as read from `graph`."""
        return next((f"{g}:{name}" for g in self.scopes.outward(graph) if f"{g}:{name}" in self.constants), None)

    def tensor(self, graph: int, name: str, what: str) -> ir.TensorProtocol:
        """The stored tensor `name` (read from `graph`), claimed: its check is the caller's."""
        scoped = self.scoped(graph, name)
        if scoped is None:
            raise Differs(f"{what}: '{name}' is not a constant of the folded model")
        self.claimed_tensors.add(scoped)
        producer = self.producer.get(scoped)
        if producer is not None and producer.op_type == "Constant":
            self.claim(producer)
        return self.constants[scoped]
