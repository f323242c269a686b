"""The analysis: which LayerNorms can become RMSNorm, and what to center. Mutates nothing.

Following docs/DESIGN.md sections 2 and 3:

1. **Trace** (backward, per LN): prove the LN input zero-mean along its axis by walking up through
   carry ops to leaves (`_Leaf`): one *use* of a constant, centered along one axis, or, for
   auxiliary centering, one use of a tensor no weight edit can center (an LN or GELU output),
   which then reads `x - ReduceMean(x)` instead.
2. **Side effects** (forward, global): every tensor that the union of all leaves changes must reach
   only mean-invariant consumers (an LN over that axis) through carry ops, and never be a graph
   output. A violation blocks every LN whose leaves reach it; the check repeats on what remains.
   LNs that stay LayerNorm still absorb shifts, so blocking one never invalidates another.
3. **Cost** of auxiliary centering: one ReduceMean + Sub per root, while each folded LN saves one
   mean reduction. A root is kept only when it unlocks at least `AUX_MIN_UNLOCKED` LNs; roots
   that do not pay are denied and the analysis reruns without them.

The result is a `CenteringPlan`; `apply_plan` carries it out.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass
from typing import Optional

import numpy as np
import onnx_ir as ir

from onnx_lnfold import _carry
from onnx_lnfold._ir import FLOAT_TYPES, NARROW_FLOAT_TYPES, constant_of, node_label
from onnx_lnfold._blocked import Blocked
from onnx_lnfold._errors import LnFoldError
from onnx_lnfold._fusions import embed_layer_norm_costs
from onnx_lnfold._names import display_names, fresh_name, taken_names
from onnx_lnfold._pipeline_order import order_advice
from onnx_lnfold._plan import FOLDED, KEPT, AuxCentering, CenteringEdit, CenteringPlan, LnDecision
from onnx_lnfold._recognize import DECOMPOSED, LnCandidate, find_in_functions, find_layer_norms
from onnx_lnfold._shapes import ShapeTable
from onnx_lnfold._targets import check_target, choose_rewrite

logger = logging.getLogger(__name__)

# An explicit centering costs about one mean reduction; each LN it unlocks saves one.
AUX_MIN_UNLOCKED = 2

_NORMALIZATIONS = {
    "LayerNormalization",
    "SkipLayerNormalization",
    "SimplifiedLayerNormalization",
    "SkipSimplifiedLayerNormalization",
    "RMSNormalization",
    "EmbedLayerNormalization",
}


# Per-channel weights along the tracked axis (None: uniform). A tensor "zero-mean with weights w"
# means `tensor * w` is zero-mean: what a layer scale `Mul(linear, w)` asks of its linear layer.
Weights = Optional[tuple]


def _weigh(weights: Weights, factor: np.ndarray, divide: bool = False) -> Weights:
    """weights * factor (or / factor), None when the result is uniform along the axis."""
    base = np.ones_like(factor) if weights is None else np.asarray(weights)
    # Dividing by a zero entry (a Mul that zeroes a channel of a shifted tensor, followed
    # forward) gives inf: a non-uniform weight, which no LN absorbs; conservative, as wanted.
    with np.errstate(divide="ignore"):
        out = base / factor if divide else base * factor
    if np.allclose(out, out[0], rtol=1e-9, atol=0):
        return None
    return tuple(float(v) for v in out)


_SKIP_NORMALIZATIONS = {"SkipLayerNormalization", "SkipSimplifiedLayerNormalization"}


def _skip_sum_terms(node: ir.Node, shapes: ShapeTable, axis: int) -> list[_carry.Requirement] | None:
    """What must be zero-mean for a Skip*Normalization's sum (output 3) to be: all its addends."""
    bias_index = 4 if node.op_type == "SkipLayerNormalization" else 3
    skip_rank = shapes.rank(node.inputs[1])
    if skip_rank is None:
        return None
    terms = [_carry.Requirement(0, axis), _carry.Requirement(1, skip_rank - 1)]
    if len(node.inputs) > bias_index and node.inputs[bias_index] is not None:
        terms.append(_carry.Requirement(bias_index, 0))
    return terms


@dataclass(frozen=True)
class _Leaf:
    """One use to center, and the tensors that change because of it.

    `aux=False`: `value` is a constant, edited (or an edited copy) along `axis`.
    `aux=True`: `value` is a computed tensor; the use reads `value - ReduceMean(value, axis)`.
    """

    value: ir.Value
    axis: int | None
    node: ir.Node
    index: int
    seeds: tuple[tuple[ir.Value, int, Weights], ...]  # (changed output of `node`, its shift axis, weights)
    aux: bool = False
    weights: Weights = None  # center `value * weights` (an affine chain), not `value`


class _Tracer:
    """Backward zero-mean proofs, memoized per (tensor, axis). Iterative: streams are deep."""

    def __init__(
        self,
        shapes: ShapeTable,
        sinks: dict[tuple[ir.Node, int], int],
        aux_denied: set[ir.Value] | None,
        pattern_outputs: dict[ir.Value, str] | None = None,
        junctions: frozenset[ir.Value] = frozenset(),
    ):
        self.shapes = shapes
        self.junctions = junctions  # stream sums to center explicitly rather than prove (see _junction_roots)
        self.sinks = sinks
        self.aux_denied = aux_denied  # None: auxiliary centering off
        # Outputs of LNs written as a pattern of ops, with their labels: they stop a proof as an
        # LN op's output does. Walking into the pattern instead would name a tensor inside it as
        # the obstacle, one that explicit centering cannot use and that folding the LN removes.
        self.pattern_outputs = pattern_outputs or {}
        self.memo: dict[tuple[ir.Value, int, Weights], frozenset[_Leaf] | Blocked] = {}

    def prove(self, node: ir.Node, reqs: tuple[_carry.Requirement, ...] | list[_carry.Requirement]):
        """Leaves making every required input of `node` zero-mean, or why not."""
        while True:
            result = self._collect(node, reqs, None, None)
            if not isinstance(result, list):
                return result
            for value, axis, weights in result:
                self.zero_mean(value, axis, weights)

    def zero_mean(self, value: ir.Value, axis: int, weights: Weights = None) -> frozenset[_Leaf] | Blocked:
        stack = [(value, axis, weights)]
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
        return self.memo[(value, axis, weights)]

    def _step(self, value: ir.Value, axis: int, weights: Weights):
        if value in self.junctions:
            return Blocked("centered-explicitly", f"tensor '{value.name}' is centered explicitly", value.name, value)
        if value.is_graph_input():
            if value.is_initializer():
                return Blocked(
                    "weight-is-input",
                    f"weight '{value.name}' is a graph input: it can be overridden at run time, "
                    "so it is not a constant",
                    value.name,
                    value,
                )
            return Blocked(
                "graph-input", f"tensor '{value.name}' is a graph input: its mean depends on the data", value.name, value
            )
        node = value.producer()
        if node is None:
            return Blocked("constant-on-stream", f"tensor '{value.name}' is a constant on the stream itself", value.name)
        if node.op_type in _SKIP_NORMALIZATIONS and node.domain == "com.microsoft" and value.index() == 3:
            # Output 3 is the residual sum input + skip (+ bias): a carry, not a normalization.
            terms = _skip_sum_terms(node, self.shapes, axis)
            if terms is None:
                return Blocked(
                    "unknown-shape", f"the rank of the skip input of {node_label(node)} is unknown", value.name, value
                )
            return self._collect(node, terms, (value, axis), weights)
        if node.op_type in _NORMALIZATIONS or value in self.pattern_outputs:
            label = self.pattern_outputs.get(value) or node_label(node)
            return Blocked(
                "normalization-output",
                f"tensor '{value.name}' is the output of {label}, whose gamma*n+beta has a data-dependent mean",
                value.name,
                value,
            )
        if node.op_type == "Cast":
            widened = self._widened(node)
            if widened is not None:
                return Blocked("widened-narrow-constant", f"tensor '{value.name}' is {widened}", value.name, value)
        reqs = _carry.backward(node, value.index(), axis, self.shapes)
        if isinstance(reqs, Blocked):
            return reqs.reworded(
                f"tensor '{value.name}' comes from a node that breaks the chain: {reqs.reason}", value.name, value
            )
        if weights is not None and node.op_type == "Slice":
            return Blocked("scaled-slice", f"tensor '{value.name}' is a Slice of a scaled stream (not supported)", value.name)
        return self._collect(node, reqs, (value, axis), weights)

    def _widened(self, cast: ir.Node) -> str | None:
        """Why a Cast of an fp16/bf16 constant to a wider float stops a proof, or None. The
        constant would be centered in its narrow type, and the mean its rounding leaves is far
        above the wide type's noise: fp16 weights computed in fp32 came out 3e-4 to 5e-4 off (relative)
        where an fp32 fold is 1e-6 off. (A computed fp16 stream widened for an fp32 LN, as the
        fp16 converter leaves LNs, carries fp16 noise of its own: not refused here.)"""
        src = self.shapes.dtype(cast.inputs[0])
        dst = self.shapes.dtype(cast.outputs[0])
        if src in NARROW_FLOAT_TYPES and dst is not None and dst not in NARROW_FLOAT_TYPES and constant_of(cast.inputs[0]) is not None:
            return (
                f"{node_label(cast)} of {src.name} constant '{cast.inputs[0].name}' to {dst.name}: centered in "
                f"{src.name}, it would leave a mean far above {dst.name} rounding"
            )
        return None

    def _collect(self, node: ir.Node, reqs, out: tuple[ir.Value, int] | None, weights: Weights):
        leaves: set[_Leaf] = set()
        pending = []
        for req in reqs:
            inp = node.inputs[req.index] if req.index < len(node.inputs) else None
            if inp is None:
                continue
            req_weights = weights
            if req.factor is not None:
                assert out is not None
                factor = _carry.axis_vector(node, req.factor, self.shapes.rank(out[0]) or 0, out[1], self.shapes)
                if factor is None or not np.all(factor != 0):
                    return Blocked(
                        "zero-scale-entry",
                        f"{node_label(node)} scales the stream by '{node.inputs[req.factor].name}', "
                        "which has a zero entry: no weight edit can center the product",
                        node.inputs[req.factor].name,
                    )
                req_weights = _weigh(weights, factor)
            if inp.is_graph_input() and inp.is_initializer():
                return Blocked(
                    "weight-is-input",
                    f"weight '{inp.name}' of {node_label(node)} is a graph input: it can be overridden "
                    "at run time, so it is not a constant",
                    inp.name,
                )
            tensor = constant_of(inp)
            if tensor is not None:
                if tensor.dtype not in FLOAT_TYPES:
                    # An integer table (read through a Cast) cannot hold its centered values:
                    # rounding them back to integers would not be exact.
                    return Blocked(
                        "integer-constant",
                        f"constant '{inp.name}' is {tensor.dtype.name}: its centered values are not integers, "
                        "so it cannot be centered in place",
                        inp.name,
                    )
                if req.axis is None and req_weights is not None:
                    return Blocked(
                        "scaled-broadcast",
                        f"constant '{inp.name}' is broadcast along a scaled axis; it cannot be centered",
                        inp.name,
                    )
                leaf = self._leaf(node, req, out, weights, req_weights)
                if isinstance(leaf, Blocked):
                    return leaf
                leaves.add(leaf)
                continue
            if req.axis is None:
                return Blocked(
                    "constant-along-axis",
                    f"tensor '{inp.name}' enters {node_label(node)} constant along the normalized axis; "
                    "it is not a constant, so its mean cannot be removed by editing weights",
                    inp.name,
                )
            sub = self.memo.get((inp, req.axis, req_weights))
            if sub is None:
                pending.append((inp, req.axis, req_weights))
            elif isinstance(sub, Blocked):
                if sub.at is not inp or req_weights is not None or not self._aux_allowed(inp):
                    return sub
                leaf = self._leaf(node, req, out, weights, None, aux=True)
                if isinstance(leaf, Blocked):
                    return sub
                leaves.add(leaf)
            else:
                leaves |= sub
        return pending if pending else frozenset(leaves)

    def _aux_allowed(self, value: ir.Value) -> bool:
        if self.aux_denied is None or value in self.aux_denied:
            return False
        # fp16/bf16 roots only for LNs of their own precision (`_mixed_precision_roots`).
        return self.shapes.dtype(value) in FLOAT_TYPES

    def _leaf(self, node, req, out, out_weights: Weights, weights: Weights, aux: bool = False):
        """A leaf at input `req.index` of `node`. The change it makes is a shift at the node's
        outputs once multiplied by `out_weights` (those asked of the output being proven)."""
        inp = node.inputs[req.index]
        absorbed = _absorbed(node, req.index, req.axis, self.shapes, self.sinks) if req.axis is not None else None
        if isinstance(absorbed, dict):
            seeds: tuple[tuple[ir.Value, int, Weights], ...] = tuple(
                (node.outputs[k], a, out_weights) for k, a in sorted(absorbed.items()) if node.outputs[k] is not None
            )
        elif req.axis is None:
            assert out is not None
            seeds = ((out[0], out[1], out_weights),)
        else:
            moved = absorbed if absorbed is not None else _carry.forward(node, req.index, req.axis, self.shapes)
            if isinstance(moved, Blocked):  # the two directions of _carry disagree: refuse, never guess
                return Blocked("internal", f"internal: cannot follow the shift of '{inp.name}': {moved.reason}")
            seeds = tuple(
                (node.outputs[k], a, out_weights) for k, a in sorted(moved.items()) if node.outputs[k] is not None
            )
        return _Leaf(inp, req.axis, node, req.index, seeds, aux, weights)


def _absorbed(node: ir.Node, index: int, axis: int, shapes: ShapeTable, sinks) -> dict[int, int] | Blocked | None:
    """What a normalization does with a shift arriving at input `index`: {outputs still carrying it}
    ({} when fully absorbed; SkipLayerNorm's sum carries it on), a reason it cannot, or None when
    `node` is not a normalization. Decomposed LNs are known by their `sinks` uses."""
    moved = _carry.absorbs(node, index, axis, shapes)
    if moved is None and (node, index) in sinks:
        if sinks[(node, index)] != axis:
            return Blocked("normalizes-other-axis", f"it feeds {node_label(node)}, a LayerNorm over another axis")
        return {}
    return moved


@dataclass
class _Violation:
    blocked: Blocked  # its source is the tensor that would change
    sources: int  # bitmask over leaves


def _side_effects(leaves: list[_Leaf], shapes: ShapeTable, sinks: set[tuple[ir.Node, int]]) -> list[_Violation]:
    """Propagate every leaf's shift forward; report each place it is not absorbed."""
    changed: dict[ir.Value, list] = {}  # value -> [axis, source mask, weights]
    touched: dict[ir.Node, dict[int, int]] = {}  # node -> {changed input index: mask}
    violations: dict[tuple[str, str], _Violation] = {}  # keyed by (tensor, reason)
    queue: deque[ir.Value] = deque()
    broken: set[ir.Node] = set()  # nodes that already refused a shift (one reason per node is enough)

    def violate(code: str, reason: str, tensor: str, mask: int) -> None:
        v = violations.setdefault((tensor, reason), _Violation(Blocked(code, reason, tensor), 0))
        v.sources |= mask

    def mark(value: ir.Value, axis: int, mask: int, weights: Weights) -> None:
        entry = changed.get(value)
        if entry is None:
            changed[value] = [axis, mask, weights]
            queue.append(value)
        elif entry[0] != axis or entry[2] != weights:
            violate(
                "incompatible-changes",
                f"tensor '{value.name}' would change in two incompatible ways (different axes or per-channel weights)",
                value.name,
                mask | entry[1],
            )
        elif entry[1] | mask != entry[1]:
            entry[1] |= mask
            queue.append(value)

    for i, leaf in enumerate(leaves):
        touched.setdefault(leaf.node, {})
        touched[leaf.node][leaf.index] = touched[leaf.node].get(leaf.index, 0) | (1 << i)
        for value, axis, weights in leaf.seeds:
            mark(value, axis, 1 << i, weights)

    while queue:
        value = queue.popleft()
        axis, mask, weights = changed[value]
        if value.is_graph_output():
            violate("graph-output", f"tensor '{value.name}' would change, and it is a graph output", value.name, mask)
        for node, index in value.uses():
            uses = touched.setdefault(node, {})
            uses[index] = uses.get(index, 0) | mask
            absorbed = _absorbed(node, index, axis, shapes, sinks)
            if absorbed is not None:
                if weights is not None:
                    moved = Blocked(
                        "non-uniform-change", f"it feeds {node_label(node)}, and its change is not uniform along the axis"
                    )
                else:
                    moved = absorbed
            else:
                moved = _carry.forward(node, index, axis, shapes)
                if weights is not None and node.op_type == "Slice":
                    moved = Blocked("scaled-slice", f"it feeds {node_label(node)} while scaled per channel")
            if isinstance(moved, Blocked):
                violate(moved.code, f"tensor '{value.name}' would change, and {moved.reason}", value.name, mask)
                broken.add(node)
                continue
            out_weights = weights
            if node.op_type == "Mul" and moved:
                out_rank = shapes.rank(node.outputs[0]) or 0
                factor = _carry.axis_vector(node, 1 - index, out_rank, moved[0], shapes)
                if factor is not None:
                    out_weights = _weigh(weights, factor, divide=True)
            for k, out_axis in moved.items():
                if k < len(node.outputs) and node.outputs[k] is not None:
                    mark(node.outputs[k], out_axis, mask, out_weights)

    for node, uses in touched.items():
        if len(uses) > 1 and node.op_type not in _carry.JOINTLY_LINEAR and node not in broken:
            if all((node, i) in sinks for i in uses):
                continue
            mask = 0
            for m in uses.values():
                mask |= m
            names = ", ".join(f"'{node.inputs[i].name}'" for i in sorted(uses))
            violate(
                "several-inputs-change",
                f"{node_label(node)} would see several of its inputs ({names}) change at once",
                node.inputs[min(uses)].name or "",
                mask,
            )
    return list(violations.values())


_ROLES = {
    **{(op, index): role for op, rule in _carry.RULES.items() for index, role in rule.roles.items()},
    ("SkipLayerNormalization", 4): "SkipLayerNormalization bias",
}


def _role(node: ir.Node, index: int) -> str:
    role = _ROLES.get((node.op_type, index))
    if role:
        return role
    if node.op_type in ("Add", "Sub", "Sum"):
        return "added constant"
    return f"{node.op_type} input {index}"


def _sorted_uses(members, names) -> list[tuple[ir.Node, int]]:
    return sorted({(leaf.node, leaf.index) for leaf, _ in members}, key=lambda u: (names[u[0]], u[1]))


# What to do with an embedding table that other uses need unchanged (a tied LM head): "untie"
# centers a copy of the table (no nodes; the file grows by the table, +31% for GPT-2 124M);
# "center" centers the Gather's output, `x - ReduceMean(x)` (no copy; two nodes per run: the
# normalization time saved fell from 23% to 21% on gpt2_small and from 22% to 14% on GPT-2 124M,
# means over the configurations of benchmarks/results at e73fb10 (centered) and bc5f8fd
# (untied)). "auto" unties when the other uses read the table only through a Transpose:
# ONNX Runtime constant-folds that Transpose into a copy of its own, so the untied copy costs
# file bytes but no memory at run time (GPT-2 124M: 869 MB after session creation either way);
# otherwise it centers.
TIED_WEIGHTS = ("auto", "center", "untie")


def _read_only_through_transpose(value: ir.Value, centered_uses: list[tuple[ir.Node, int]]) -> bool:
    centered = set(centered_uses)
    others = [u.node for u in value.uses() if (u.node, u.idx) not in centered]
    return bool(others) and not value.is_graph_output() and all(n.op_type == "Transpose" for n in others)


def _gather_outputs(members: list[tuple[_Leaf, str]]) -> list[tuple[ir.Value, int]] | None:
    """The (output, axis) of each Gather whose table the leaves center, when centering those
    outputs is the same as centering the table for them: every leaf is a Gather's table (rows
    gathered, so a row's mean is removed either way), unweighted, changing just that output."""
    outputs: dict[ir.Value, int] = {}
    for leaf, _ in members:
        node = leaf.node
        if node.op_type != "Gather" or leaf.index != 0 or leaf.weights is not None or leaf.axis is None:
            return None
        if len(leaf.seeds) != 1 or leaf.seeds[0][0] is not node.outputs[0] or leaf.seeds[0][2] is not None:
            return None
        outputs[node.outputs[0]] = leaf.seeds[0][1]
    return sorted(outputs.items(), key=lambda item: item[0].name or "")


def _aux_centering(
    value: ir.Value,
    axis: int,
    uses: list[tuple[ir.Node, int]],
    required_by: tuple[str, ...],
    names: dict[ir.Node, str],
    taken: set[str],
    instead_of_untie: str | None = None,
    saved_bytes: int = 0,
) -> AuxCentering:
    """`value - ReduceMean(value, axis)`, read by `uses` instead of `value`."""
    return AuxCentering(
        tensor=value.name or "",
        axis=axis,
        uses=tuple(f"{names[n]}:{i}" for n, i in uses),
        new_name=fresh_name(f"{value.name}.centered", taken),
        required_by=required_by,
        _value=value,
        _uses=tuple(uses),
        instead_of_untie=instead_of_untie,
        saved_bytes=saved_bytes,
    )


def _edits(
    leaves: list[tuple[_Leaf, str]], names: dict[ir.Node, str], taken: set[str], tied_weights: str = "auto"
) -> tuple[list[CenteringEdit], list[AuxCentering]]:
    """Group leaves by (tensor, axis). Constants: untie a group unless it covers every use (or,
    for a tied embedding table, center the Gather outputs instead)."""
    groups: dict[tuple[ir.Value, int | None, bool, Weights], list[tuple[_Leaf, str]]] = {}
    for leaf, ln in leaves:
        groups.setdefault((leaf.value, leaf.axis, leaf.aux, leaf.weights), []).append((leaf, ln))
    per_value: dict[ir.Value, int] = {}
    for value, _, aux, _ in groups:
        if not aux:
            per_value[value] = per_value.get(value, 0) + 1
    edits, centerings = [], []
    for (value, axis, aux, weights), members in groups.items():
        uses = _sorted_uses(members, names)
        required_by = tuple(sorted({ln for _, ln in members}))
        if aux:
            centerings.append(_aux_centering(value, axis, uses, required_by, names, taken))  # type: ignore[arg-type]
            continue
        untie = per_value[value] > 1 or set(uses) != set(value.uses()) or value.is_graph_output()
        tensor = constant_of(value)
        assert tensor is not None
        nbytes = int(np.prod(tensor.shape.dims, dtype=np.int64) * tensor.dtype.itemsize)
        gathered, note = None, None
        if untie and tied_weights != "untie":
            gathered = _gather_outputs(members)
            if gathered and tied_weights == "auto" and _read_only_through_transpose(value, uses):
                gathered = None
                note = (
                    "its other uses read it through a Transpose, which ONNX Runtime folds into a copy of its "
                    "own: no extra memory at run time; --tied-weights center avoids the copy for two nodes per run"
                )
        if gathered:
            for out, out_axis in gathered:
                readers = sorted(((u.node, u.idx) for u in out.uses()), key=lambda u: (names[u[0]], u[1]))
                centerings.append(
                    _aux_centering(out, out_axis, readers, required_by, names, taken, instead_of_untie=value.name, saved_bytes=nbytes)
                )
            continue
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
                required_by=required_by,
                weights=weights,
                note=note,
                _value=value,
                _uses=tuple(uses),
            )
        )
    edits.sort(key=lambda e: (e.tensor, -1 if e.axis is None else e.axis, e.uses))
    centerings.sort(key=lambda c: (c.tensor, c.axis))
    return edits, centerings


def _leaf_order(leaf: _Leaf, names: dict[ir.Node, str]) -> tuple:
    axis = -1 if leaf.axis is None else leaf.axis
    return (names[leaf.node], leaf.index, leaf.aux, axis, leaf.weights is not None, leaf.weights or ())


def _fold_set(
    candidates: list[LnCandidate],
    shapes: ShapeTable,
    sinks: set[tuple[ir.Node, int]],
    names: dict[ir.Node, str],
    aux_denied: set[ir.Value] | None,
    junctions: frozenset[ir.Value] = frozenset(),
) -> tuple[dict[LnCandidate, frozenset[_Leaf]], dict[LnCandidate, Blocked]]:
    """Trace every candidate, then drop those whose edits have side effects, until none do."""
    patterns = {cand.out: f"the LayerNorm pattern at '{cand.name}'" for cand in candidates if cand.kind == DECOMPOSED}
    tracer = _Tracer(shapes, sinks, aux_denied, patterns, junctions)
    blocked: dict[LnCandidate, Blocked] = {}
    active: dict[LnCandidate, frozenset[_Leaf]] = {}
    for cand in candidates:
        if cand.form_problem:
            blocked[cand] = cand.form_problem
            continue
        traced = tracer.prove(cand.node, cand.terms)
        if isinstance(traced, Blocked):
            blocked[cand] = traced
        else:
            active[cand] = traced
    while active:
        leaves = sorted({leaf for ls in active.values() for leaf in ls}, key=lambda l: _leaf_order(l, names))
        index = {leaf: i for i, leaf in enumerate(leaves)}
        violations = _side_effects(leaves, shapes, sinks)
        if not violations:
            break
        for cand, ls in list(active.items()):
            mask = 0
            for leaf in ls:
                mask |= 1 << index[leaf]
            hit = [v for v in violations if v.sources & mask]
            if hit:
                first = min(hit, key=lambda v: (v.blocked.source, v.blocked.reason)).blocked
                blocked[cand] = first
                del active[cand]
                logger.debug("%s blocked: %s", cand.name, first.reason)
    return active, blocked


def _junction_roots(blocked, shapes: ShapeTable, exclude: frozenset[ir.Value] = frozenset()) -> frozenset[ir.Value]:
    """Stream sums (Add/Sub/Sum of two computed tensors) that the blocked LNs' inputs come from
    through carry ops, each shared by at least `AUX_MIN_UNLOCKED` of them, most shared first.

    Centering such a sum explicitly can unlock LNs that no weight edit reaches: in a Wav2Vec2
    encoder the stream starts as `projection + GELU(grouped conv(projection))`; the GELU output
    cannot be centered, and centering the projection changes the grouped conv's input, but the
    sum itself can be centered once for every LN downstream.
    """
    memo: dict[tuple[ir.Value, int], frozenset[ir.Value]] = {}
    reached: dict[ir.Value, set[LnCandidate]] = {}
    for cand in blocked:
        if cand.axis is not None and cand.x is not None:
            for value in _sums_above(cand.x, cand.axis, shapes, memo):
                reached.setdefault(value, set()).add(cand)
    roots: set[ir.Value] = set()
    covered: set[LnCandidate] = set()
    for value, cands in sorted(reached.items(), key=lambda item: (-len(item[1]), item[0].name or "")):
        if value not in exclude and len(cands - covered) >= AUX_MIN_UNLOCKED:
            roots.add(value)
            covered |= cands
    return frozenset(roots)


def _sums_above(start: ir.Value, axis: int, shapes: ShapeTable, memo) -> frozenset[ir.Value]:
    """The stream sums `start` comes from through carry ops (itself included), memoized per
    (tensor, axis); iterative, because streams are deep."""
    stack = [((start, axis), False)]
    while stack:
        key, expanded = stack.pop()
        if key in memo:
            continue
        value, ax = key
        node = value.producer()
        if node is None or node.op_type in _NORMALIZATIONS:
            memo[key] = frozenset()
            continue
        reqs = _carry.backward(node, value.index(), ax, shapes)
        if isinstance(reqs, Blocked):
            memo[key] = frozenset()
            continue
        inputs = [(node.inputs[r.index], r.axis) for r in reqs if r.axis is not None and r.index < len(node.inputs)]
        computed = [(v, a) for v, a in inputs if v is not None and constant_of(v) is None and not v.is_graph_input()]
        if not expanded:
            stack.append((key, True))
            stack.extend((child, False) for child in computed if child not in memo)
            continue
        found = set().union(*(memo[child] for child in computed)) if computed else set()
        if node.op_type in ("Add", "Sub", "Sum") and len(computed) >= 2:
            found.add(value)
        memo[key] = frozenset(found)
    return memo[(start, axis)]


def _mixed_precision_roots(unlocked, shapes: ShapeTable) -> set[ir.Value]:
    """fp16/bf16 roots that unlock an LN of another precision. A mean computed and subtracted in
    10 or 7 mantissa bits leaves a residual mean at that type's rounding: noise for an LN of the
    same type (fp16 models centered explicitly drift from their fp32 original no more than
    unfolded ones: README "Deployment pipelines"), far above the noise of an fp32 LN reached
    through a widening Cast (found by the fuzz test)."""
    return {
        root
        for root, cands in unlocked.items()
        if shapes.dtype(root) in NARROW_FLOAT_TYPES and any(shapes.dtype(cand.x) != shapes.dtype(root) for cand in cands)
    }


# Rounds of stream-sum centering tried for LNs that stay blocked (each round tries new sums only).
_JUNCTION_ROUNDS = 8


def _with_auxiliary_centering(candidates, shapes, sinks, names):
    """Fold with explicit centering roots allowed, denying the roots that unlock too few LNs;
    then, where LNs stay blocked, try centering the stream sums they share (`_junction_roots`)."""
    active, blocked = _aux_fold(candidates, shapes, sinks, names, frozenset())
    # Rounds until no new sum helps: a sum shared by many blocked LNs can unlock only some of
    # them (the rest need a sum further down), and a fold must not leave for a second run what
    # a further round would find (folding a folded model changes nothing).
    junctions: frozenset[ir.Value] = frozenset()
    tried: frozenset[ir.Value] = frozenset()
    for _ in range(_JUNCTION_ROUNDS):
        new = _junction_roots(blocked, shapes, exclude=tried)
        if not new:
            break
        tried |= new
        with_junctions = _aux_fold(candidates, shapes, sinks, names, junctions | new)
        if set(active) <= set(with_junctions[0]) and len(with_junctions[0]) > len(active):
            (active, blocked), junctions = with_junctions, junctions | new
    return active, blocked


def _aux_fold(candidates, shapes, sinks, names, junctions: frozenset[ir.Value]):
    denied: set[ir.Value] = set()
    while True:
        active, blocked = _fold_set(candidates, shapes, sinks, names, denied, junctions)
        unlocked: dict[ir.Value, set[LnCandidate]] = {}
        for cand, leaves in active.items():
            for leaf in leaves:
                if leaf.aux:
                    unlocked.setdefault(leaf.value, set()).add(cand)
        poor = {root for root, cands in unlocked.items() if len(cands) < AUX_MIN_UNLOCKED}
        poor |= {root for root in junctions if root not in unlocked}  # blocked otherwise: prove it instead
        poor |= _mixed_precision_roots(unlocked, shapes)
        if not poor:
            return active, blocked
        denied |= poor - junctions
        junctions = junctions - poor


def analyze(
    model: ir.Model,
    shapes: ShapeTable | None = None,
    *,
    target: str = "ort",
    auxiliary_centering: bool = True,
    fuse_residual: str = "auto",
    tied_weights: str = "auto",
) -> CenteringPlan:
    """Decide, for every LayerNorm of `model`, whether it folds and how; mutate nothing."""
    check_target(model, target, fuse_residual)
    if tied_weights not in TIED_WEIGHTS:
        raise LnFoldError(f"unknown tied_weights '{tied_weights}': choose one of {', '.join(TIED_WEIGHTS)}")
    graph = model.graph
    shapes = shapes or ShapeTable(model)
    names = display_names(graph)
    candidates = find_layer_norms(graph, shapes, names) + find_in_functions(model, names)
    # Uses through which a recognized LN removes a shift along its axis (decomposed LNs; the
    # LayerNormalization op answers for itself in _carry.absorbs).
    sinks = {use: cand.axis for cand in candidates if cand.axis is not None for use in cand.sink_uses}
    # LNs whose fold would cost an ONNX Runtime fusion worth more than it saves stay LNs (they
    # still absorb shifts, as every kept LN does).
    costly = embed_layer_norm_costs(graph, candidates)
    foldable = [cand for cand in candidates if cand not in costly]

    active, blocked = _fold_set(foldable, shapes, sinks, names, None)
    if auxiliary_centering and blocked:
        aux_active, aux_blocked = _with_auxiliary_centering(foldable, shapes, sinks, names)
        # Explicit centering must only ever add folds; the first pass's reasons name the real
        # obstacle for the LNs that stay.
        if set(active) <= set(aux_active) and len(aux_active) > len(active):
            active, blocked = aux_active, {cand: blocked[cand] for cand in aux_blocked}

    # Leaves in a fixed order: fresh names (`W.centered`, `W.centered_2`) are handed out in it,
    # and a set of leaves iterates in an order that changes from run to run.
    edits, centerings = _edits(
        [(leaf, cand.name) for cand, ls in active.items() for leaf in sorted(ls, key=lambda l: _leaf_order(l, names))],
        names,
        taken_names(graph),
        tied_weights if auxiliary_centering else "untie",  # no centering nodes at all, as asked
    )
    claimed: set[ir.Node] = set()
    decisions = []
    for cand in candidates:
        if cand in active:
            n = sum(1 for e in edits if cand.name in e.required_by)
            aux = [c.tensor for c in centerings if cand.name in c.required_by]
            reason = f"input is zero-mean once {n} constant(s) are centered"
            if aux:
                reason += f" and {', '.join(repr(t) for t in aux)} explicitly centered"
            rewrite = choose_rewrite(cand, target, shapes, claimed, fuse_residual)
            decisions.append(
                LnDecision(
                    node=cand.name,
                    op_type=cand.kind,
                    status=FOLDED,
                    proof=reason,
                    axis=cand.axis,
                    epsilon=cand.epsilon,
                    rewrite=rewrite.op,
                    beta=rewrite.beta,  # type: ignore[arg-type]
                    residual_add=names[rewrite.residual_add] if rewrite.residual_add else None,
                    _cand=cand,
                    _out_type=(shapes.declarable(shapes.shape(cand.out)), shapes.dtype(cand.out)),
                    _residual_add=rewrite.residual_add,
                    _bias_add=rewrite.bias_add,
                    _beta_consumers=rewrite.beta_consumers,
                )
            )
        else:
            decisions.append(
                LnDecision(
                    node=cand.name,
                    op_type=cand.kind,
                    status=KEPT,
                    axis=cand.axis,
                    epsilon=cand.epsilon,
                    blocked=blocked[cand] if cand in blocked else costly[cand],
                    _cand=cand,
                )
            )
    advice = order_advice(graph, list(active), list(costly))
    return CenteringPlan(decisions=decisions, edits=edits, centerings=centerings, target=target, advice=advice)
