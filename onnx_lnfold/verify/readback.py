"""The read-back: every tensor and node in which the folded model, as written, differs from the
model it was folded from is accounted for by the plan, and checked (docs/DESIGN.md section 6).

`planned_changes` is taken from the bound plan and the model just before `apply_plan` (the plan's IR
objects are then intact): each node as it was, and what the plan changes (`PlannedChanges`).
`read_back` then reads the folded model from its file and walks it:

- each folded LN's rewrite: the op planned, reading the planned inputs (x, or input and skip, and
  the skip bias), gamma the LN's own scale (or ones where it had none), epsilon the LN's, the
  normalized axis the LN's, the residual sum under its name; the `primitive` target's six ops with
  their constants; beta's Add where it stays one;
- each explicit centering: `Sub(x, ReduceMean(x))` over the planned axis, keepdims;
- each centered weight (`verify.tensor_checks.check_centered`), each table derived at load (its Sub and its
  row means), each bias that took a beta (recomputed from the original, `check_bias_with_beta`);
- every other node as it was (op, attributes, inputs, where the plan has a use read a centered
  tensor that one), every other constant byte for byte the original's, every removed node one the
  plan removes, the graph inputs, outputs and opset as they were.

The first thing that differs and that the plan does not account for refuses the fold, named.
Tensors are read a block of rows at a time, external data unmapped once read.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator
from dataclasses import dataclass, field, replace

import numpy as np
import onnx
import onnx_ir as ir

from onnx_lnfold.analysis.bound import BoundPlan
from onnx_lnfold.core.ir import attr_or_input_ints, constant_of
from onnx_lnfold.core.ops import PRIMITIVE_OPS
from onnx_lnfold.decide.targets import PRIMITIVE_RMS_OP, SKIP_RMS_OP, bias_slot
from onnx_lnfold.load.model import load_path
from onnx_lnfold.verify import tensor_checks
from onnx_lnfold.verify.oracle.paced import drain
from onnx_lnfold.verify.sessions import ModelBytesOrPath

logger = logging.getLogger(__name__)

_SKIPPED_ATTRIBUTES = (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)


# --------------------------------------------------------------------------- what the plan changes
@dataclass(frozen=True)
class NodeAsWas:
    op: str  # domain::op_type
    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attributes: tuple


@dataclass(frozen=True)
class PlannedNorm:
    """One folded LN as the plan rewrites it."""

    graph: int  # where it is (`_Scopes`)
    ln: str
    op: str  # the plan's `LnDecision.rewrite`
    out: str  # the LN's output: the name the rewrite's last tensor takes
    inputs: tuple[str, ...]  # x, or input and skip
    skip_bias: str | None
    scale: str | None  # gamma's name; None: a scale of ones of `ones` entries
    ones: int | None
    epsilon: float
    axis: int | None  # the normalized axis, non-negative where the rank is known
    rank: int | None
    beta: str  # "none", "add" or "consumers"
    bias: str | None  # beta's name
    residual_sum: str | None  # Skip: the residual sum's name, where something else reads it
    skip_bias_takes_beta: bool = False  # the skip bias took another LN's beta: `_check_beta` reads it


@dataclass(frozen=True)
class PlannedBeta:
    """One linear consumer's share of a folded LN's beta: `bias + scale * beta @ W`."""

    graph: int
    ln: str
    beta: str
    node: str  # the key of the node whose input `index` holds the bias
    index: int
    bias: str | None  # the bias as the original had it (None: created)
    bias_edit: tuple | None  # the bias's own centering (axis, weights, block, blocks), if the plan has one
    weight: str  # W's name as the plan leaves it (centered in place, or its untied copy)
    trans: bool
    scale: float
    rows: int
    created_after: str | None  # a created Add after this MatMul (its output key)
    skip_of: str | None = None  # the LN whose Skip op takes this bias in (its bias Add folded away)


@dataclass(frozen=True)
class PlannedCentering:
    graph: int
    tensor: str
    axis: int
    rank: int | None
    new_name: str


@dataclass(frozen=True)
class PlannedEdit:
    graph: int
    tensor: str
    written: str
    axis: int | None
    weights: tuple[float, ...] | None
    block: int | None
    blocks: tuple[int, ...] | None
    means: str | None  # a table derived at load: its row means' name


@dataclass
class PlannedChanges:
    """What the folded model may differ in from `nodes` and `constants` (the model as it was)."""

    nodes: dict[str, NodeAsWas]
    constants: dict[str, ir.TensorProtocol]
    substitutions: dict[tuple[str, int], str]  # (node key, input index) -> the tensor read instead
    removed: set[str]  # keys of the nodes the rewrites replace
    outputs: list[str]  # the graph's output names
    inputs: list[str] = field(default_factory=list)  # the graph's input names
    opset: int | None = None  # the default domain's opset
    norms: list[PlannedNorm] = field(default_factory=list)
    betas: list[PlannedBeta] = field(default_factory=list)
    centerings: list[PlannedCentering] = field(default_factory=list)
    edits: list[PlannedEdit] = field(default_factory=list)
    # keys of the Constant nodes holding a folded LN's gamma or beta: the rewrite drops the ones it
    # no longer reads (a zero beta as TorchScript writes it), so each may be gone if nothing reads it
    released: set[str] = field(default_factory=set)



class _Scopes:
    """The graphs of a model, numbered as `ir.Model.graphs` walks them (the main graph 0; the rewrite
    adds none and moves none), and which graph each subgraph reads outer names from. A name is
    unique within a graph, not across an If's branches: keys are scoped, 'graph:name'."""

    def __init__(self, model: ir.Model):
        self.graphs = list(model.graphs())
        self.index = {id(g): i for i, g in enumerate(self.graphs)}
        self.parent: dict[int, int] = {}
        for i, graph in enumerate(self.graphs):
            for node in graph:
                for attr in node.attributes.values():
                    inner = [attr.value] if attr.type == ir.AttributeType.GRAPH else list(attr.value) if attr.type == ir.AttributeType.GRAPHS else []
                    for sub in inner:
                        if id(sub) in self.index:
                            self.parent[self.index[id(sub)]] = i

    def of(self, node_or_value) -> int:
        graph = node_or_value.graph
        if graph is None and isinstance(node_or_value, ir.Value) and node_or_value.producer() is not None:
            graph = node_or_value.producer().graph
        return self.index.get(id(graph), 0)

    def key(self, node: ir.Node) -> str:
        """A node's key: its graph and first named output (SSA: unique in the graph), else its name."""
        return f"{self.of(node)}:" + next((o.name for o in node.outputs if o.name), f"#{node.name}")

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


def _attribute_value(attr: ir.Attr):
    if attr.type in _SKIPPED_ATTRIBUTES:
        return "graph"
    if attr.type == ir.AttributeType.TENSOR:
        tensor = attr.as_tensor()
        return (int(tensor.dtype), tuple(tensor.shape), tensor.tobytes())
    if attr.type == ir.AttributeType.TENSORS:
        return tuple((int(t.dtype), tuple(t.shape), t.tobytes()) for t in attr.value)
    value = attr.value
    return tuple(value) if isinstance(value, (list, tuple)) else value


def _as_was(node: ir.Node) -> NodeAsWas:
    attributes = tuple(
        (name, "constant" if node.op_type == "Constant" else _attribute_value(attr))  # its tensor: `check_unchanged`
        for name, attr in sorted(node.attributes.items())
    )
    return NodeAsWas(
        f"{node.domain or ''}::{node.op_type}",
        node.name or "",
        tuple(v.name or "" if v is not None else "" for v in node.inputs),
        tuple(v.name or "" for v in node.outputs),
        attributes,
    )


def _constants(scopes: _Scopes) -> dict[str, ir.TensorProtocol]:
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


def _opset(model: ir.Model) -> int | None:
    return model.opset_imports.get("", model.opset_imports.get("ai.onnx"))


def _rank(value: ir.Value | None) -> int | None:
    return len(value.shape) if value is not None and value.shape is not None else None


def planned_changes(model: ir.Model, bound: BoundPlan) -> PlannedChanges:
    """What `apply_plan(model, bound)` is to change, read before it runs."""
    scopes = _Scopes(model)
    key = scopes.key
    nodes = {key(node): _as_was(node) for graph in scopes.graphs for node in graph}
    substitutions: dict[tuple[str, int], str] = {}
    for b in bound.edits:
        if b.edit.untie and b.edit.new_name:
            for node, index in b.uses:
                substitutions[(key(node), index)] = b.edit.new_name
    for c in bound.centerings:
        for node, index in c.uses:
            substitutions[(key(node), index)] = c.centering.new_name
    changes = PlannedChanges(
        nodes, _constants(scopes), substitutions, set(), [v.name or "" for v in model.graph.outputs],
        [v.name or "" for v in model.graph.inputs], _opset(model),
    )
    by_tensor = {(scopes.of(b.value), b.edit.tensor): b.edit for b in bound.edits}
    for b in bound.edits:
        e = b.edit
        written = e.new_name if e.untie and e.new_name else e.tensor
        changes.edits.append(
            PlannedEdit(scopes.of(b.value), e.tensor, written, e.axis, e.weights, e.block, e.blocks, e.means_name)
        )
    for b in bound.centerings:
        c, x = b.centering, b.value
        changes.centerings.append(PlannedCentering(scopes.of(x), x.name or c.tensor, c.axis, _rank(x), c.new_name))

    def read(node: ir.Node, index: int) -> str:
        return substitutions.get((key(node), index), node.inputs[index].name or "")

    # (node key, index) of each Skip op's bias, by the LN that takes it in
    skip_slots = {
        (key(f.rewrite.site.skip_bias[0]), f.rewrite.site.skip_bias[1]): f.decision.node
        for f in bound.folds
        if f.rewrite.site.skip_bias is not None
    }

    for fold in bound.folds:
        d, r = fold.decision, fold.rewrite
        cand, site = r.cand, r.site
        changes.removed |= {key(n) for n in r.replaced}
        for param in (cand.scale, cand.bias):
            producer = param.producer() if param is not None else None
            if producer is not None and producer.op_type == "Constant":
                changes.released.add(key(producer))
        old_sum = site.old_sum
        keep_sum = old_sum is not None and (old_sum.is_graph_output() or any(n not in r.replaced for n, _ in old_sum.uses()))
        # Every folded LN normalizes its last axis (the forms keep the others): where no shape is
        # declared, the analysis's own non-negative axis gives the rank.
        rank = _rank(cand.x) or _rank(cand.out) or (cand.axis + 1 if cand.axis is not None else None)
        changes.norms.append(
            PlannedNorm(
                scopes.of(cand.node),
                d.node,
                r.op,
                cand.out.name or "",
                tuple(read(n, i) for n, i in site.inputs),
                read(*site.skip_bias) if site.skip_bias is not None else None,
                cand.scale.name if cand.scale is not None else None,
                cand.ones_scale[0] if cand.scale is None and cand.ones_scale else None,
                d.epsilon,
                cand.axis,
                rank,
                r.beta.how,
                cand.bias.name if cand.bias is not None else None,
                old_sum.name if keep_sum and old_sum is not None else None,
            )
        )
        for s in r.beta.sites if r.beta.how == "consumers" else ():
            if s.how == "softmax":
                continue
            node = s.node
            gemm = node.op_type == "Gemm"
            trans = gemm and bool(node.attributes.get_int("transB", 0))
            scale = node.attributes.get_float("alpha", 1.0) / node.attributes.get_float("beta", 1.0) if gemm else 1.0
            weight = constant_of(node.inputs[1])
            rows = int(weight.shape[1] if trans else weight.shape[0])  # type: ignore[union-attr]
            if gemm:
                slot, created = (node, 2), None
            elif s.how == "created":
                slot, created = None, key(node)
            else:
                slot, created = bias_slot(node), None
                assert slot is not None, node.name
            bias = slot[0].inputs[slot[1]] if slot is not None and len(slot[0].inputs) > slot[1] else None
            edit = by_tensor.get((scopes.of(bias), bias.name)) if bias is not None else None
            centered = None
            if edit is not None and (not edit.untie or read(*slot) == edit.new_name):  # type: ignore[misc]
                centered = (edit.axis, edit.weights, edit.block, edit.blocks)
            changes.betas.append(
                PlannedBeta(
                    scopes.of(node),
                    d.node,
                    cand.bias.name or "",  # type: ignore[union-attr]
                    key(slot[0]) if slot is not None else "",
                    slot[1] if slot is not None else -1,
                    bias.name if bias is not None else None,
                    centered,
                    read(node, 1),
                    trans,
                    scale,
                    rows,
                    created,
                    skip_slots.get((key(slot[0]), slot[1])) if slot is not None else None,
                )
            )
    taking = {b.skip_of for b in changes.betas if b.skip_of is not None}
    changes.norms = [replace(n, skip_bias_takes_beta=True) if n.ln in taking else n for n in changes.norms]
    return changes


# --------------------------------------------------------------------------- reading the fold back
@dataclass
class ReadBack:
    checked: int = 0  # the planned changes read back: tensors edited, nodes rewritten or inserted
    unchanged: int = 0  # tensors found byte for byte the original's
    problem: str = ""  # the first difference the plan does not account for, named


@dataclass(frozen=True)
class _TensorCheck:
    position: tuple[str, int]  # where the written tensor's values are: file and offset ("", -1 in the model)
    nbytes: int
    run: Callable[[], None]


def _file_position(tensor: ir.TensorProtocol) -> tuple[str, int]:
    if isinstance(tensor, ir.ExternalTensor):
        return str(tensor.location), int(tensor.offset or 0)
    return "", -1


class _Differs(Exception):
    """A difference from the plan: its message is the reason the fold is refused."""


def _model(source: ModelBytesOrPath) -> ir.Model:
    return ir.from_proto(onnx.load_from_string(source)) if isinstance(source, bytes) else load_path(source)


class _Folded:
    """The folded model as written: its nodes by key, producers and stored tensors by scoped name,
    and which of them a planned change has claimed."""

    def __init__(self, model: ir.Model):
        self.model = model
        self.scopes = _Scopes(model)
        self.nodes: dict[str, ir.Node] = {}
        self.producer: dict[str, ir.Node] = {}
        for g, graph in enumerate(self.scopes.graphs):
            for node in graph:
                self.nodes[self.scopes.key(node)] = node
                for out in node.outputs:
                    if out.name:
                        self.producer[f"{g}:{out.name}"] = node
        self.constants = _constants(self.scopes)
        self.claimed_nodes: set[str] = set()
        self.claimed_tensors: set[str] = set()
        # The checks that read tensors' values, run after the structure in the order of the file
        # (`_TensorCheck`): each tensor's pages read once, in step with the check's other passes.
        self.tensor_checks: list[_TensorCheck] = []

    def later(self, written: ir.TensorProtocol, check: Callable[[], None]) -> None:
        """Run `check` (which raises `_Differs`) with the tensor checks, at `written`'s place."""
        self.tensor_checks.append(_TensorCheck(_file_position(written), int(written.nbytes or 0), check))

    def node_making(self, graph: int, name: str, what: str) -> ir.Node:
        node = self.scopes.find(self.producer, graph, name)
        if node is None:
            raise _Differs(f"{what}: nothing in the folded model computes '{name}'")
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
            raise _Differs(f"{what}: '{name}' is not a constant of the folded model")
        self.claimed_tensors.add(scoped)
        producer = self.producer.get(scoped)
        if producer is not None and producer.op_type == "Constant":
            self.claim(producer)
        return self.constants[scoped]


def _op(node: ir.Node) -> str:
    return f"{node.domain or ''}::{node.op_type}"


def _qualified(op: str) -> str:
    """The plan's op spelling ('com.microsoft::SkipSimplifiedLayerNormalization', 'RMSNormalization')
    as `_op` writes it."""
    return op if "::" in op else f"::{op}"


def _names(node: ir.Node) -> list[str]:
    return [v.name or "" if v is not None else "" for v in node.inputs]


def _same_axis(written: int, planned: int | None, rank: int | None) -> bool:
    if planned is None or rank is None:
        return written == planned
    return written % rank == planned % rank


def _check_norm(folded: _Folded, n: PlannedNorm) -> int:
    """The rewrite of one LN as planned."""
    what = f"the RMSNorm of '{n.ln}'"
    final = folded.node_making(n.graph, n.out, what)
    y_name = n.out
    if n.beta == "add":
        if _op(final) != "::Add" or len(final.inputs) != 2 or _names(final)[1] != n.bias:
            raise _Differs(f"{what}: '{n.out}' is not the RMSNorm's output plus beta '{n.bias}' ({_op(final)} {_names(final)})")
        folded.claim(final)
        y_name = _names(final)[0]
        final = folded.node_making(n.graph, y_name, what)
    if n.op == PRIMITIVE_RMS_OP:
        return _check_primitive(folded, n, final, what)
    if _op(final) != _qualified(n.op):
        raise _Differs(f"{what}: '{y_name}' is computed by {_op(final)}, not {_qualified(n.op)}")
    folded.claim(final)
    inputs = _names(final)
    expected = list(n.inputs)
    scale_at = len(expected)
    if inputs[:scale_at] != expected:
        raise _Differs(f"{what} reads {inputs[:scale_at]}, not the planned {expected}")
    _check_scale(folded, n, inputs[scale_at] if len(inputs) > scale_at else "", what)
    if n.skip_bias is not None and (
        len(inputs) < scale_at + 2 or (inputs[scale_at + 1] != n.skip_bias and not n.skip_bias_takes_beta)
    ):
        raise _Differs(f"{what} does not read the skip bias '{n.skip_bias}'")
    if n.skip_bias is None and len(inputs) > scale_at + 1 and inputs[scale_at + 1]:
        raise _Differs(f"{what} reads a bias '{inputs[scale_at + 1]}' the plan does not give it")
    epsilon = final.attributes.get_float("epsilon", 1e-5)
    if np.float32(epsilon) != np.float32(n.epsilon):
        raise _Differs(f"{what}: epsilon {epsilon:g}, where the LN's is {n.epsilon:g}")
    if n.op != SKIP_RMS_OP:
        axis = final.attributes.get_int("axis", -1)
        if not _same_axis(axis, n.axis, n.rank):
            raise _Differs(f"{what}: axis {axis}, where the LN normalizes axis {n.axis}")
        if final.attributes.get_int("stash_type", 1) != 1:
            raise _Differs(f"{what}: stash_type {final.attributes.get_int('stash_type', 1)}, not 1 (float32)")
    outputs = [o.name or "" for o in final.outputs]
    if n.residual_sum is not None and (len(outputs) < 4 or outputs[3] != n.residual_sum):
        raise _Differs(f"{what} does not give the residual sum '{n.residual_sum}' (its outputs {outputs})")
    return 1


def _check_scale(folded: _Folded, n: PlannedNorm, name: str, what: str) -> None:
    """gamma is the LN's own scale (its bytes: the unchanged-tensor pass), or ones where it had none."""
    if n.scale is not None:
        if name != n.scale:
            raise _Differs(f"{what}: its scale is '{name}', not the LN's gamma '{n.scale}'")
        return
    ones = np.asarray(folded.tensor(n.graph, name, f"{what}'s scale of ones").numpy())
    if ones.shape != (n.ones,) or not np.all(ones == 1):
        raise _Differs(f"{what}: its scale '{name}' is not {n.ones} ones")


def _check_primitive(folded: _Folded, n: PlannedNorm, mul: ir.Node, what: str) -> int:
    """Pow(x, 2) -> ReduceMean(-1, keepdims) -> Add(epsilon) -> Sqrt -> Div(x, .) -> Mul(., gamma)."""
    pow_, reduce_mean, add, sqrt, div, times = PRIMITIVE_OPS

    def expect(node: ir.Node, op: str) -> ir.Node:
        if _op(node) != f"::{op}":
            raise _Differs(f"{what}: {op} expected, {_op(node)} found ('{folded.scopes.key(node)}')")
        folded.claim(node)
        return node

    def making(name: str, op: str) -> ir.Node:
        return expect(folded.node_making(n.graph, name, what), op)

    def value(name: str) -> np.ndarray:
        return np.asarray(folded.tensor(n.graph, name, what).numpy())

    expect(mul, times)
    (x,) = n.inputs
    normalized, scale = _names(mul)
    _check_scale(folded, n, scale, what)
    d = making(normalized, div)
    if _names(d)[0] != x:
        raise _Differs(f"{what}: divides '{_names(d)[0]}', not '{x}'")
    a = making(_names(making(_names(d)[1], sqrt))[0], add)
    epsilon = value(_names(a)[1])
    if epsilon.size != 1 or epsilon.reshape(-1)[0] != epsilon.dtype.type(n.epsilon):
        raise _Differs(f"{what}: epsilon {epsilon.reshape(-1)[:1]}, where the LN's is {n.epsilon:g}")
    r = making(_names(a)[0], reduce_mean)
    axes = attr_or_input_ints(r, "axes", 1)
    if axes is None or len(axes) != 1 or not _same_axis(axes[0], n.axis, n.rank) or r.attributes.get_int("keepdims", 1) != 1:
        raise _Differs(f"{what}: the mean of squares is over axes {axes}, where the LN normalizes axis {n.axis}")
    if len(r.inputs) > 1 and r.inputs[1] is not None:
        value(_names(r)[1])
    p = making(_names(r)[0], pow_)
    two = value(_names(p)[1])
    if _names(p)[0] != x or two.size != 1 or two.reshape(-1)[0] != 2:
        raise _Differs(f"{what}: squares '{_names(p)[0]}' to the power {two.reshape(-1)[:1]}, not '{x}' to 2")
    return 1


def _check_centering(folded: _Folded, c: PlannedCentering) -> int:
    what = f"the explicit centering of '{c.tensor}'"
    sub = folded.node_making(c.graph, c.new_name, what)
    if _op(sub) != "::Sub" or _names(sub)[0] != c.tensor:
        raise _Differs(f"{what}: '{c.new_name}' is {_op(sub)} {_names(sub)}, not '{c.tensor}' - its mean")
    mean = folded.node_making(c.graph, _names(sub)[1], what)
    if _op(mean) != "::ReduceMean" or _names(mean)[0] != c.tensor or mean.attributes.get_int("keepdims", 1) != 1:
        raise _Differs(f"{what}: '{_names(sub)[1]}' is not ReduceMean('{c.tensor}') with keepdims")
    axes = attr_or_input_ints(mean, "axes", 1)
    if axes is None or len(axes) != 1 or not _same_axis(axes[0], c.axis, c.rank):
        raise _Differs(f"{what}: the mean is over axes {axes}, not the planned axis {c.axis}")
    if len(mean.inputs) > 1 and mean.inputs[1] is not None:
        folded.tensor(c.graph, _names(mean)[1], what)
    folded.claim(sub)
    folded.claim(mean)
    return 1


def _check_edit(folded: _Folded, changes: PlannedChanges, e: PlannedEdit) -> int:
    original = changes.constants.get(f"{e.graph}:{e.tensor}")
    if original is None:
        raise _Differs(f"the edit of '{e.tensor}': no such constant in the original")
    if e.means:
        what = f"the table '{e.written}' derived at load"
        sub = folded.node_making(e.graph, e.written, what)
        if _op(sub) != "::Sub" or _names(sub) != [e.tensor, e.means]:
            raise _Differs(f"{what}: it is {_op(sub)} {_names(sub)}, not '{e.tensor}' - '{e.means}'")
        folded.claim(sub)
        problem = tensor_checks.check_row_means(original, folded.tensor(e.graph, e.means, what), e.axis or 0)
        if problem:
            raise _Differs(f"the row means '{e.means}' of '{e.tensor}' {problem}")
        return 1
    scoped = folded.scoped(e.graph, e.written)
    took_beta = any(b.bias == e.tensor and b.graph == e.graph and b.bias_edit for b in changes.betas)
    if scoped is None and took_beta:  # a Constant node's bias, copied with its beta: read back there
        return 0
    if scoped is None:
        raise _Differs(f"the centered '{e.written}' is not a constant of the folded model")
    if scoped in folded.claimed_tensors:  # a bias centered and given a beta: read back with its beta
        return 0
    written = folded.tensor(e.graph, e.written, "")

    def check() -> None:
        problem = tensor_checks.check_centered(original, written, e.axis, e.weights, e.block, e.blocks)
        if problem:
            along = "made zero" if e.axis is None else f"centered along axis {e.axis}" + (" in blocks" if e.block else "")
            raise _Differs(f"the written '{e.written}' is not '{e.tensor}' {along}: it {problem}")

    folded.later(written, check)
    return 1


def _check_beta(folded: _Folded, changes: PlannedChanges, b: PlannedBeta) -> int:
    what = f"the share of '{b.ln}''s beta in its consumer's bias"
    if b.created_after is not None:
        name = b.created_after.split(":", 1)[1]
        add = folded.node_making(b.graph, name, what)
        if _op(add) != "::Add" or len(add.inputs) != 2:
            raise _Differs(f"{what}: '{name}' is not the MatMul's output plus a created bias")
        matmul = folded.node_making(b.graph, _names(add)[0], what)
        was = changes.nodes.get(b.created_after)
        if was is None or _op(matmul) != was.op or tuple(_names(matmul)) != tuple(
            changes.substitutions.get((b.created_after, i), n) for i, n in enumerate(was.inputs)
        ):
            raise _Differs(f"{what}: '{_names(add)[0]}' is not the MatMul that computed '{name}'")
        folded.claim(add)
        folded.claim(matmul)
        bias_name = _names(add)[1]
    elif b.skip_of is not None:  # the bias Add became the Skip op's bias input
        norm = next(n for n in changes.norms if n.ln == b.skip_of)
        skip = folded.node_making(norm.graph, norm.out, what)
        if norm.beta == "add":
            skip = folded.node_making(norm.graph, _names(skip)[0], what)
        if _op(skip) != _qualified(norm.op) or len(skip.inputs) < len(norm.inputs) + 2:
            raise _Differs(f"{what}: the Skip op of '{b.skip_of}' reads no bias")
        bias_name = _names(skip)[len(norm.inputs) + 1]
    else:
        node = folded.nodes.get(b.node)
        if node is None or len(node.inputs) <= b.index or node.inputs[b.index] is None:
            raise _Differs(f"{what}: the node '{b.node}' has no bias input {b.index}")
        bias_name = _names(node)[b.index]
    written = folded.tensor(b.graph, bias_name, what)
    beta = changes.constants.get(f"{b.graph}:{b.beta}") or folded.scopes.find(changes.constants, b.graph, b.beta)
    weight = folded.constants.get(folded.scoped(b.graph, b.weight) or "")
    if beta is None or weight is None:
        raise _Differs(f"{what}: beta '{b.beta}' or the weight '{b.weight}' is not a constant")

    def check() -> None:
        row = np.broadcast_to(np.asarray(beta.numpy()).astype(np.float64).reshape(-1), (b.rows,))
        delta, bound = tensor_checks.beta_through(np.ascontiguousarray(row), weight, b.trans)
        base = np.zeros_like(delta)
        if b.bias is not None:
            original = np.asarray(folded.scopes.find(changes.constants, b.graph, b.bias).numpy())
            base = (tensor_checks.centered_float64(original, *b.bias_edit) if b.bias_edit else original.astype(np.float64)).reshape(-1)
        problem = tensor_checks.check_bias_with_beta(base, b.scale * delta, abs(b.scale) * bound, written)
        if problem:
            raise _Differs(f"{what}: '{bias_name}' {problem}")

    folded.later(weight, check)  # the weight is what it reads most of
    return 1


def _check_rest(folded: _Folded, changes: PlannedChanges) -> ReadBack:
    """Every node and tensor no planned change claimed: as it was."""
    done = ReadBack()
    beta_slots = {(b.node, b.index) for b in changes.betas if b.created_after is None}
    for key, node in folded.nodes.items():
        if key in folded.claimed_nodes:
            continue
        was = changes.nodes.get(key)
        if was is None:
            raise _Differs(f"the node '{key}' ({_op(node)}) is not in the original and the plan does not insert it")
        now = _as_was(node)
        if now.op != was.op or now.outputs != was.outputs or now.attributes != was.attributes:
            raise _Differs(f"the node '{key}' ({now.op}) differs from the original's ({was.op}) in its op, outputs or attributes")
        expected = tuple(changes.substitutions.get((key, i), name) for i, name in enumerate(was.inputs))
        if now.inputs == expected:
            continue
        # a bias input the plan gave a beta (a Gemm's C it may have created): read back by `_check_beta`
        resized = was.op == "::Gemm" and len(expected) == 2 and len(now.inputs) == 3 and (key, 2) in beta_slots
        differing = [i for i, (a, b) in enumerate(zip(now.inputs, expected)) if a != b]
        if (len(now.inputs) != len(expected) and not resized) or any((key, i) not in beta_slots for i in differing):
            raise _Differs(f"the node '{key}' reads {list(now.inputs)}, where the plan has it read {list(expected)}")
    gone = set(changes.nodes) - set(folded.nodes) - changes.removed
    dead = gone & {f"{e.graph}:{e.tensor}" for e in changes.edits}  # an edited constant's node, untied away
    # a released gamma or beta may be gone where no node of any graph reads its name
    read = {name for node in folded.nodes.values() for name in _names(node)} | set(changes.outputs)
    dead |= {k for k in gone & changes.released if not set(changes.nodes[k].outputs) & read}
    if gone - dead:
        key = sorted(gone - dead)[0]
        raise _Differs(f"the node '{key}' ({changes.nodes[key].op}) is gone, and the plan does not remove it")
    for scoped, tensor in folded.constants.items():
        if scoped in folded.claimed_tensors:
            continue
        name = scoped.split(":", 1)[1]
        original = changes.constants.get(scoped)
        if original is None:
            raise _Differs(f"the tensor '{name}' is not in the original and the plan does not add it")
        folded.later(tensor, _unchanged_check(name, original, tensor))
        done.unchanged += 1
    return done


def _unchanged_check(name: str, original: ir.TensorProtocol, written: ir.TensorProtocol) -> Callable[[], None]:
    def check() -> None:
        problem = tensor_checks.check_unchanged(original, written)
        if problem:
            raise _Differs(f"the tensor '{name}' {problem}, and no edit of the plan accounts for it")

    return check


def read_back(folded: ModelBytesOrPath, changes: PlannedChanges) -> ReadBack:
    """Account for every difference between the model as it was (`changes`) and `folded`, as
    written: the number of planned changes read back, or the first difference the plan does not
    account for."""
    return drain(read_back_steps(folded, changes))


def read_back_steps(folded: ModelBytesOrPath, changes: PlannedChanges) -> Generator[float, None, ReadBack]:
    """`read_back` a tensor at a time: the structure first, then the tensor checks in the order of
    the file, yielding the share of their bytes read after each (the check advances its passes over
    a file together, `verify.oracle.paced`). A difference in the structure is reported before one
    in the values."""
    model = _model(folded)
    view = _Folded(model)
    checked = 0
    try:
        if [v.name or "" for v in model.graph.outputs] != changes.outputs:
            raise _Differs(f"the graph outputs are {[v.name for v in model.graph.outputs]}, not the original's {changes.outputs}")
        if [v.name or "" for v in model.graph.inputs] != changes.inputs:
            raise _Differs(f"the graph inputs are {[v.name for v in model.graph.inputs]}, not the original's {changes.inputs}")
        if _opset(model) != changes.opset:
            raise _Differs(f"the model is at opset {_opset(model)}, not the original's {changes.opset}")
        for b in changes.betas:  # first: a bias centered and given a beta is read back here
            checked += _check_beta(view, changes, b)
        for n in changes.norms:
            checked += _check_norm(view, n)
        for c in changes.centerings:
            checked += _check_centering(view, c)
        for e in changes.edits:
            checked += _check_edit(view, changes, e)
        rest = _check_rest(view, changes)
        total, done = max(sum(c.nbytes for c in view.tensor_checks), 1), 0
        for tensor_check in sorted(view.tensor_checks, key=lambda c: c.position):
            tensor_check.run()
            done += tensor_check.nbytes
            yield done / total
    except _Differs as e:
        return ReadBack(checked, 0, str(e))
    rest.checked = checked
    return rest
