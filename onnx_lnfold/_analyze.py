"""The analysis: which LayerNorms can become RMSNorm, and which constants to center. Mutates nothing.

Two passes, following FOLDING.md sections 2 and 3:

1. **Trace** (backward, per LN): prove the LN input zero-mean along its axis by walking up through
   carry ops to constant leaves (`_Leaf`: one *use* of a constant, centered along one axis).
2. **Side effects** (forward, global): every tensor that the union of all leaves changes must reach
   only mean-invariant consumers (an LN over that axis) through carry ops, and never be a graph
   output. A violation blocks every LN whose leaves reach it; the check repeats on what remains.
   LNs that stay LayerNormalization still absorb shifts, so blocking one never invalidates another.

The result is a `CenteringPlan`; `apply_plan` carries it out.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from onnx_lnfold import _carry
from onnx_lnfold._carry import node_label
from onnx_lnfold._plan import FOLDED, KEPT, CenteringEdit, CenteringPlan, LnDecision
from onnx_lnfold._names import display_names, fresh_name, taken_names
from onnx_lnfold._recognize import LnCandidate, find_layer_norms
from onnx_lnfold._shapes import ShapeTable

logger = logging.getLogger(__name__)

RMS_OP = "SimplifiedLayerNormalization"

_NORMALIZATIONS = {
    "LayerNormalization",
    "SkipLayerNormalization",
    "SimplifiedLayerNormalization",
    "SkipSimplifiedLayerNormalization",
    "RMSNormalization",
    "EmbedLayerNormalization",
}


@dataclass(frozen=True)
class _Leaf:
    """One use of a constant that must be centered, and the tensors that change because of it."""

    value: ir.Value
    axis: int | None
    node: ir.Node
    index: int
    seeds: tuple[tuple[ir.Value, int], ...]  # (changed output of `node`, its shift axis)


@dataclass(frozen=True)
class _Blocked:
    reason: str
    tensor: str | None


_Trace = "frozenset[_Leaf] | _Blocked"


def constant_of(value: ir.Value) -> ir.TensorProtocol | None:
    """The value's tensor if it is a true constant (an initializer that is not a graph input)."""
    if value.is_graph_input():
        return None
    if value.const_value is not None and value.is_initializer():
        return value.const_value
    producer = value.producer()
    if producer is not None and producer.op_type == "Constant" and producer.domain in ("", "ai.onnx"):
        return ir.convenience.get_const_tensor(value)
    return None


class _Tracer:
    """Backward zero-mean proofs, memoized per (tensor, axis). Iterative: streams are deep."""

    def __init__(self, shapes: ShapeTable):
        self.shapes = shapes
        self.memo: dict[tuple[ir.Value, int], frozenset[_Leaf] | _Blocked] = {}

    def zero_mean(self, value: ir.Value, axis: int) -> frozenset[_Leaf] | _Blocked:
        stack = [(value, axis)]
        while stack:
            key = stack[-1]
            if key in self.memo:
                stack.pop()
                continue
            result = self._step(*key)
            if isinstance(result, list):  # dependencies still to prove
                stack.extend(result)
                continue
            self.memo[key] = result
            stack.pop()
        return self.memo[(value, axis)]

    def _step(self, value: ir.Value, axis: int):
        if value.is_graph_input():
            if value.is_initializer():
                return _Blocked(
                    f"weight '{value.name}' is a graph input: it can be overridden at run time, "
                    "so it is not a constant",
                    value.name,
                )
            return _Blocked(f"tensor '{value.name}' is a graph input: its mean depends on the data", value.name)
        node = value.producer()
        if node is None:
            return _Blocked(f"tensor '{value.name}' is a constant on the stream itself", value.name)
        if node.op_type in _NORMALIZATIONS:
            return _Blocked(
                f"tensor '{value.name}' is the output of {node_label(node)}, whose gamma*n+beta "
                "has a data-dependent mean",
                value.name,
            )
        reqs = _carry.backward(node, value.index(), axis, self.shapes)
        if isinstance(reqs, str):
            return _Blocked(f"tensor '{value.name}' comes from a node that breaks the chain: {reqs}", value.name)
        leaves: set[_Leaf] = set()
        pending = []
        for req in reqs:
            inp = node.inputs[req.index]
            if inp is None:
                continue
            if inp.is_graph_input() and inp.is_initializer():
                return _Blocked(
                    f"weight '{inp.name}' of {node_label(node)} is a graph input: it can be overridden "
                    "at run time, so it is not a constant",
                    inp.name,
                )
            if constant_of(inp) is not None:
                leaf = self._leaf(node, req, value, axis)
                if isinstance(leaf, _Blocked):
                    return leaf
                leaves.add(leaf)
                continue
            if req.axis is None:
                return _Blocked(
                    f"tensor '{inp.name}' enters {node_label(node)} constant along the normalized axis; "
                    "it is not a constant, so its mean cannot be removed by editing weights",
                    inp.name,
                )
            sub = self.memo.get((inp, req.axis))
            if sub is None:
                pending.append((inp, req.axis))
            elif isinstance(sub, _Blocked):
                return sub
            else:
                leaves |= sub
        return pending if pending else frozenset(leaves)

    def _leaf(self, node: ir.Node, req: _carry.Requirement, out: ir.Value, out_axis: int):
        if req.axis is None:
            seeds = ((out, out_axis),)
        else:
            moved = _carry.forward(node, req.index, req.axis, self.shapes)
            if isinstance(moved, str):  # the two directions of _carry disagree: refuse, never guess
                return _Blocked(f"internal: cannot follow the shift of '{node.inputs[req.index].name}': {moved}", None)
            seeds = tuple((node.outputs[k], a) for k, a in sorted(moved.items()) if node.outputs[k] is not None)
        return _Leaf(node.inputs[req.index], req.axis, node, req.index, seeds)


@dataclass
class _Violation:
    reason: str
    tensor: str
    sources: int  # bitmask over leaves


def _side_effects(leaves: list[_Leaf], shapes: ShapeTable) -> list[_Violation]:
    """Propagate every leaf's shift forward; report each place it is not absorbed."""
    changed: dict[ir.Value, list] = {}  # value -> [axis, source mask]
    touched: dict[ir.Node, dict[int, int]] = {}  # node -> {changed input index: mask}
    violations: dict[tuple[str, str], _Violation] = {}
    queue: deque[ir.Value] = deque()
    broken: set[ir.Node] = set()  # nodes that already refused a shift (one reason per node is enough)

    def violate(reason: str, tensor: str, mask: int) -> None:
        v = violations.setdefault((tensor, reason), _Violation(reason, tensor, 0))
        v.sources |= mask

    def mark(value: ir.Value, axis: int, mask: int) -> None:
        entry = changed.get(value)
        if entry is None:
            changed[value] = [axis, mask]
            queue.append(value)
        elif entry[0] != axis:
            violate(f"tensor '{value.name}' would shift along two different axes", value.name, mask | entry[1])
        elif entry[1] | mask != entry[1]:
            entry[1] |= mask
            queue.append(value)

    for i, leaf in enumerate(leaves):
        touched.setdefault(leaf.node, {})
        touched[leaf.node][leaf.index] = touched[leaf.node].get(leaf.index, 0) | (1 << i)
        for value, axis in leaf.seeds:
            mark(value, axis, 1 << i)

    while queue:
        value = queue.popleft()
        axis, mask = changed[value]
        if value.is_graph_output():
            violate(f"tensor '{value.name}' would change, and it is a graph output", value.name, mask)
        for node, index in value.uses():
            uses = touched.setdefault(node, {})
            uses[index] = uses.get(index, 0) | mask
            moved = _carry.absorbs(node, index, axis, shapes)
            if moved is None:
                moved = _carry.forward(node, index, axis, shapes)
            if isinstance(moved, str):
                violate(f"tensor '{value.name}' would change, and {moved}", value.name, mask)
                broken.add(node)
                continue
            for k, out_axis in moved.items():
                if k < len(node.outputs) and node.outputs[k] is not None:
                    mark(node.outputs[k], out_axis, mask)

    for node, uses in touched.items():
        if len(uses) > 1 and node.op_type not in _carry.JOINTLY_LINEAR and node not in broken:
            mask = 0
            for m in uses.values():
                mask |= m
            names = ", ".join(f"'{node.inputs[i].name}'" for i in sorted(uses))
            violate(
                f"{node_label(node)} would see several of its inputs ({names}) change at once",
                node.inputs[min(uses)].name or "",
                mask,
            )
    return list(violations.values())


_ROLES = {
    ("MatMul", 1): "MatMul weight",
    ("Gemm", 1): "Gemm weight",
    ("Gemm", 2): "Gemm bias",
    ("Conv", 1): "Conv weight",
    ("Conv", 2): "Conv bias",
    ("Gather", 0): "embedding table",
}


def _role(node: ir.Node, index: int) -> str:
    role = _ROLES.get((node.op_type, index))
    if role:
        return role
    if node.op_type in ("Add", "Sub", "Sum"):
        return "added constant"
    return f"{node.op_type} input {index}"


def _edits(
    leaves: list[tuple[_Leaf, str]], names: dict[ir.Node, str], taken: set[str]
) -> list[CenteringEdit]:
    """Group leaves by (constant, axis); untie a group unless it covers every use of the constant."""
    groups: dict[tuple[ir.Value, int | None], list[tuple[_Leaf, str]]] = {}
    for leaf, ln in leaves:
        groups.setdefault((leaf.value, leaf.axis), []).append((leaf, ln))
    per_value: dict[ir.Value, int] = {}
    for value, _ in groups:
        per_value[value] = per_value.get(value, 0) + 1
    edits = []
    for (value, axis), members in groups.items():
        uses = sorted({(leaf.node, leaf.index) for leaf, _ in members}, key=lambda u: (names[u[0]], u[1]))
        all_uses = set(value.uses())
        untie = per_value[value] > 1 or set(uses) != all_uses or value.is_graph_output()
        tensor = constant_of(value)
        assert tensor is not None
        nbytes = int(np.prod(tensor.shape.dims, dtype=np.int64) * tensor.dtype.itemsize)
        suffix = ".centered" if axis is not None else ".zeroed"
        edits.append(
            CenteringEdit(
                tensor=value.name or "",
                axis=axis,
                role=_role(uses[0][0], uses[0][1]),
                uses=tuple(f"{names[n]}:{i}" for n, i in uses),
                untie=untie,
                new_name=fresh_name(f"{value.name}{suffix}", taken) if untie else None,
                copy_bytes=nbytes if untie else 0,
                required_by=tuple(sorted({ln for _, ln in members})),
                _value=value,
                _uses=tuple(uses),
            )
        )
    edits.sort(key=lambda e: (e.tensor, -1 if e.axis is None else e.axis, e.uses))
    return edits


def beta_placement(cand: LnCandidate) -> str:
    """Where a folded LN's beta goes: 'none', into the 'consumers' biases, or an explicit 'add'.

    Folding into consumers needs every consumer to be a linear layer with a constant weight whose
    bias we can edit: MatMul followed only by an Add of a constant, or Gemm (transA=0).
    """
    if cand.bias is None:
        return "none"
    out = cand.node.outputs[0]
    if constant_of(cand.bias) is None or out.is_graph_output() or not out.uses():
        return "add"
    for node, index in out.uses():
        if index != 0 or constant_of(node.inputs[1]) is None:
            return "add"
        if node.op_type == "Gemm":
            if node.attributes.get("transA") is not None and node.attributes["transA"].as_int():
                return "add"
            if len(node.inputs) > 2 and node.inputs[2] is not None and constant_of(node.inputs[2]) is None:
                return "add"
            continue
        if node.op_type != "MatMul" or node.outputs[0].is_graph_output():
            return "add"
        b = constant_of(node.inputs[1])
        if b is None or len(b.shape) != 2:
            return "add"
        after = node.outputs[0].uses()
        if len(after) != 1:
            return "add"
        add, _ = after[0]
        if add.op_type != "Add" or len(add.inputs) != 2:
            return "add"
        other = add.inputs[1] if add.inputs[0] is node.outputs[0] else add.inputs[0]
        bias = constant_of(other) if other is not None else None
        if bias is None or tuple(bias.shape.dims) not in ((b.shape[1],), (1, b.shape[1])):
            return "add"
    return "consumers"


def analyze(model: ir.Model, shapes: ShapeTable | None = None) -> CenteringPlan:
    """Decide, for every LayerNorm of `model`, whether it folds; mutate nothing."""
    graph = model.graph
    shapes = shapes or ShapeTable(model)
    names = display_names(graph)
    candidates = find_layer_norms(graph, shapes, names)
    tracer = _Tracer(shapes)

    blocked: dict[LnCandidate, _Blocked] = {}
    active: dict[LnCandidate, frozenset[_Leaf]] = {}
    for cand in candidates:
        if cand.form_problem:
            blocked[cand] = _Blocked(cand.form_problem, None)
            continue
        traced = tracer.zero_mean(cand.x, cand.axis)  # type: ignore[arg-type]
        if isinstance(traced, _Blocked):
            blocked[cand] = traced
        else:
            active[cand] = traced

    while active:
        leaves = sorted({leaf for ls in active.values() for leaf in ls}, key=lambda l: (names[l.node], l.index))
        index = {leaf: i for i, leaf in enumerate(leaves)}
        violations = _side_effects(leaves, shapes)
        if not violations:
            break
        for cand, ls in list(active.items()):
            mask = 0
            for leaf in ls:
                mask |= 1 << index[leaf]
            hit = [v for v in violations if v.sources & mask]
            if hit:
                first = min(hit, key=lambda v: (v.tensor, v.reason))
                blocked[cand] = _Blocked(first.reason, first.tensor)
                del active[cand]
                logger.debug("%s blocked: %s", cand.name, first.reason)

    edits = _edits(
        [(leaf, cand.name) for cand, ls in active.items() for leaf in ls], names, taken_names(graph)
    )
    decisions = []
    for cand in candidates:
        if cand in active:
            n = sum(1 for e in edits if cand.name in e.required_by)
            decisions.append(
                LnDecision(
                    node=cand.name,
                    op_type=cand.node.op_type,
                    status=FOLDED,
                    reason=f"input is zero-mean once {n} constant(s) are centered",
                    axis=cand.axis,
                    epsilon=cand.epsilon,
                    rewrite=RMS_OP,
                    beta=beta_placement(cand),  # type: ignore[arg-type]
                    _node=cand.node,
                )
            )
        else:
            why = blocked[cand]
            decisions.append(
                LnDecision(
                    node=cand.name,
                    op_type=cand.node.op_type,
                    status=KEPT,
                    reason=why.reason,
                    axis=cand.axis,
                    epsilon=cand.epsilon,
                    blocking_tensor=why.tensor,
                    _node=cand.node,
                )
            )
    return CenteringPlan(decisions=decisions, edits=edits)
