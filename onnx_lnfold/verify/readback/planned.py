"""What the plan changes, read from the bound plan and the model just before `apply_plan` (the
plan's IR objects are then intact): each node as it was, and each change as plain data, by name
(`PlannedChanges`). What a folded LN writes is its rewrite's `Emission` (`decide.emission`), the
record the rewrite builds its nodes from, turned into names here (`PlannedNorm`, `PlannedBeta`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import onnx_ir as ir

from onnx_lnfold.analysis.bound import BoundPlan
from onnx_lnfold.apply.orphans import orphaned_constants
from onnx_lnfold.decide.emission import Axes, EmittedNode, Filled, Produced, Source
from onnx_lnfold.verify.readback.scopes import NodeAsWas, Scopes, as_was, attribute_value, opset_of, stored_tensors


@dataclass(frozen=True)
class Named:
    """A tensor an emitted node reads, by name; `name` None: a bias that took a share of beta
    (renamed where copied), whose values that share's check reads back."""

    name: str | None


# What an emitted node reads, as the read-back checks it; None: an optional input left out.
PlannedSource = Named | Filled | Axes | Produced | None


@dataclass(frozen=True)
class PlannedNode:
    """One node of a folded LN's emission, by name."""

    op: str  # domain::op_type, as `scopes.op_of` writes it
    inputs: tuple[PlannedSource, ...]
    attributes: tuple[tuple[str, object], ...]  # (name, `attribute_value`), a ReduceMean's axes aside (`Axes`)
    # per output: the original's name it takes over, "" where it is not computed, None for a fresh name
    outputs: tuple[str | None, ...]


@dataclass(frozen=True)
class PlannedNorm:
    """One folded LN as the plan rewrites it: the nodes of its emission, the last computing `out`."""

    graph: int  # where it is (`Scopes`)
    ln: str
    out: str  # the LN's output: the name the emission's last tensor takes
    nodes: tuple[PlannedNode, ...]


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
    # (LN, node, input) of the emitted node that reads this bias instead (a Skip op that takes in the
    # bias Add), where one does
    read_by: tuple[str, int, int] | None = None


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
    # the constants (scoped names) that only the replaced nodes read, which the fold does not write
    # (`apply.orphans`): each may be gone, with its Constant node where it has one
    orphans: set[str] = field(default_factory=set)


def _rank(value: ir.Value | None) -> int | None:
    return len(value.shape) if value is not None and value.shape is not None else None


def _planned_node(spec: EmittedNode, source: Callable[[Source], PlannedSource]) -> PlannedNode:
    outputs = tuple(o.takes.name or "" if o.takes is not None else "" if o.stem is None else None for o in spec.outputs)
    attributes = tuple((a.name, attribute_value(a)) for a in spec.attributes)
    return PlannedNode(f"{spec.domain}::{spec.op_type}", tuple(map(source, spec.inputs)), attributes, outputs)


def planned_changes(model: ir.Model, bound: BoundPlan) -> PlannedChanges:
    """What `apply_plan(model, bound)` is to change, read before it runs."""
    scopes = Scopes(model)
    key = scopes.key
    nodes = {key(node): as_was(node) for graph in scopes.graphs for node in graph}
    substitutions: dict[tuple[str, int], str] = {}
    for b in bound.edits:
        if b.edit.untie and b.edit.new_name:
            for node, index in b.uses:
                substitutions[(key(node), index)] = b.edit.new_name
    for c in bound.centerings:
        for node, index in c.uses:
            substitutions[(key(node), index)] = c.centering.new_name
    changes = PlannedChanges(
        nodes,
        stored_tensors(scopes),
        substitutions,
        set(),
        [v.name or "" for v in model.graph.outputs],
        [v.name or "" for v in model.graph.inputs],
        opset_of(model),
    )
    changes.orphans = {f"{scopes.of(v)}:{v.name}" for v in orphaned_constants(bound)}
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

    emissions = [(f.decision.node, f.rewrite.emission) for f in bound.folds]
    # the bias slots a share of beta goes into, and the emitted node input that reads each slot
    share_slots = {(key(s.slot[0]), s.slot[1]) for _, e in emissions for s in e.shares if s.how == "bias"}
    slot_readers = {
        (key(source[0]), source[1]): (ln, k, j)
        for ln, e in emissions
        for k, spec in enumerate(e.nodes)
        for j, source in enumerate(spec.inputs)
        if isinstance(source, tuple)
    }

    def source(given: Source) -> PlannedSource:
        if isinstance(given, tuple):  # an input slot of the original graph
            node, index = given
            return Named(None if (key(node), index) in share_slots else read(node, index))
        if isinstance(given, ir.Value):
            return Named(given.name or "")
        return given

    for fold in bound.folds:
        d, r = fold.decision, fold.rewrite
        cand = r.cand
        changes.removed |= {key(n) for n in r.replaced}
        planned = tuple(_planned_node(spec, source) for spec in r.emission.nodes)
        changes.norms.append(PlannedNorm(scopes.of(cand.node), d.node, cand.out.name or "", planned))
        for share in r.emission.shares:
            node, slot = share.consumer, share.slot
            bias = slot[0].inputs[slot[1]] if share.how == "bias" else None  # type: ignore[index]
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
                    share.trans,
                    share.scale,
                    share.rows,
                    key(node) if share.how == "new_add" else None,
                    slot_readers.get((key(slot[0]), slot[1])) if slot is not None else None,
                )
            )
    return changes
