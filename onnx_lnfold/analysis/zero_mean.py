"""Backward zero-mean proofs (docs/DESIGN.md section 2): which uses of which constants to
center so that a tensor becomes zero-mean along an axis. Mutates nothing.

A proof walks up from a tensor through carry ops (`carry.backward`) to leaves (`Leaf`): one *use*
of a constant, centered along one axis (or in blocks of it, `shapes.parts`), or, for explicit centering,
one use of a computed tensor no weight edit can center (an LN or GELU output), which then reads
`x - ReduceMean(x)` instead. Proofs are memoized per (tensor, axis, weights, part) and computed
without recursion: streams are deep.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

import numpy as np
import onnx_ir as ir

from onnx_lnfold import carry
from onnx_lnfold.analysis.sinks import Sinks
from onnx_lnfold.core.blocked import Blocked
from onnx_lnfold.core.ir import FLOAT_TYPES, NARROW_FLOAT_TYPES, constant_of, node_label
from onnx_lnfold.core.ops import NORMALIZATION_TYPES
from onnx_lnfold.core.values import is_zero
from onnx_lnfold.forms import is_residual_sum, sum_terms
from onnx_lnfold.shapes.parts import WHOLE, Part
from onnx_lnfold.shapes.table import ShapeTable

# Per-channel weights along the tracked axis (None: uniform). A tensor "zero-mean with weights w"
# means `tensor * w` is zero-mean: what a layer scale `Mul(linear, w)` asks of its linear layer.
Weights = Optional[tuple]


def weigh(weights: Weights, factor: np.ndarray, divide: bool = False) -> Weights:
    """weights * factor (or / factor), None when the result is uniform along the axis."""
    base = np.ones_like(factor) if weights is None else np.asarray(weights)
    # Dividing by a zero entry (a Mul that zeroes a channel of a shifted tensor, followed
    # forward) gives inf: a non-uniform weight, which no LN absorbs; conservative, as wanted.
    with np.errstate(divide="ignore"):
        out = base / factor if divide else base * factor
    if np.allclose(out, out[0], rtol=1e-9, atol=0):
        return None
    return tuple(float(v) for v in out)


@dataclass(frozen=True)
class Leaf:
    """One use to center, and the tensors that change because of it.

    `aux=False`: `value` is a constant, edited (or an edited copy) along `axis` (in `part`'s blocks).
    `aux=True`: `value` is a computed tensor; the use reads `value - ReduceMean(value, axis)`.
    """

    value: ir.Value
    axis: int | None
    node: ir.Node
    index: int
    seeds: tuple[Seed, ...]  # the outputs of `node` it changes
    aux: bool = False
    weights: Weights = None  # center `value * weights` (an affine chain), not `value`
    part: Part = WHOLE  # its blocks (which, and how long); never a `where`: a constant is centered whole


# A changed tensor: (tensor, the axis its shift is constant along, per-channel weights, the part).
Seed = tuple[ir.Value, int, Weights, Part]

# A proof obligation: `tensor * weights` zero-mean along `axis`, in `part`. The memo's key.
Goal = tuple[ir.Value, int, Weights, Part]


@dataclass(frozen=True)
class Pending:
    """A proof that cannot finish yet: it needs these goals proven first. The caller proves them
    (pushing them on its own stack rather than recursing) and then asks again."""

    needs: tuple[Goal, ...]


class Tracer:
    """Backward zero-mean proofs, memoized per goal. Iterative: streams are deep."""

    def __init__(
        self,
        shapes: ShapeTable,
        sinks: Sinks,
        aux_denied: set[ir.Value] | None,
        pattern_outputs: dict[ir.Value, str] | None = None,
        junctions: frozenset[ir.Value] = frozenset(),
    ):
        self.shapes = shapes
        self.junctions = junctions  # stream sums to center explicitly rather than prove (see `analysis.fold_set._junction_roots`)
        self.sinks = sinks
        self.aux_denied = aux_denied  # None: auxiliary centering off
        # Outputs of LNs written as a pattern of ops, with their labels: they stop a proof as an
        # LN op's output does. Walking into the pattern instead would name a tensor inside it as
        # the obstacle, one that explicit centering cannot use and that folding the LN removes.
        self.pattern_outputs = pattern_outputs or {}
        self.memo: dict[Goal, frozenset[Leaf] | Blocked] = {}
        # The goals whose proof stopped at their own tensor, not upstream of it: an explicit
        # centering of that tensor may stand in for their proof (`_collect`).
        self._stopped_at_own: set[Goal] = set()
        self._zeros: dict[ir.Value, bool] = {}  # `is_zero(exact=False)` by tensor: the graph holds still while it traces
        self._fills: dict = {}  # `core.values.fill_of`'s walks

    def prove(self, node: ir.Node, reqs: tuple[carry.Requirement, ...] | list[carry.Requirement]):
        """Leaves making every required input of `node` zero-mean, or why not."""
        while True:
            result = self._collect(node, reqs, None, None)
            if not isinstance(result, Pending):
                return result
            for value, axis, weights, part in result.needs:
                self.zero_mean(value, axis, weights, part)

    def zero_mean(self, value: ir.Value, axis: int, weights: Weights = None, part: Part = WHOLE) -> frozenset[Leaf] | Blocked:
        stack = [(value, axis, weights, part)]
        while stack:
            key = stack[-1]
            if key in self.memo:
                stack.pop()
                continue
            result = self._step(*key)
            if isinstance(result, Pending):
                stack.extend(result.needs)
                continue
            self.memo[key] = result
            stack.pop()
        return self.memo[(value, axis, weights, part)]

    def _stops_here(self, goal: Goal, blocked: Blocked) -> Blocked:
        """`blocked`, noted as stopping the proof of `goal` at the goal's own tensor."""
        self._stopped_at_own.add(goal)
        return blocked

    def _step(self, value: ir.Value, axis: int, weights: Weights, part: Part) -> frozenset[Leaf] | Blocked | Pending:
        goal = (value, axis, weights, part)
        if self._is_zero(value):  # zero-mean already (zeros_like queries): nothing to center
            return frozenset()
        if value in self.junctions:
            blocked = Blocked("centered-explicitly", f"tensor '{value.name}' is centered explicitly", value.name)
            return self._stops_here(goal, blocked)
        if value.is_graph_input():
            if value.is_initializer():
                blocked = Blocked(
                    "weight-is-input",
                    f"weight '{value.name}' is a graph input: it can be overridden at run time, "
                    "so it is not a constant",
                    value.name,
                    detail=f"'{value.name}'",
                )
                return self._stops_here(goal, blocked)
            blocked = Blocked(
                "graph-input",
                f"tensor '{value.name}' is a graph input: its mean depends on the data",
                value.name,
                detail=f"'{value.name}'",
            )
            return self._stops_here(goal, blocked)
        node = value.producer()
        if node is None:
            return Blocked("constant-on-stream", f"tensor '{value.name}' is a constant on the stream itself", value.name)
        if is_residual_sum(value):  # a carry, not a normalization's output
            terms = sum_terms(node, self.shapes, axis)
            if terms is None:
                blocked = Blocked(
                    "unknown-shape", f"the rank of the skip input of {node_label(node)} is unknown", value.name
                )
                return self._stops_here(goal, blocked)
            terms = [dataclasses.replace(term, part=part.without_where()) for term in terms]
            return self._collect(node, terms, (value, axis, part), weights)
        if node.op_type in NORMALIZATION_TYPES or value in self.pattern_outputs:
            label = self.pattern_outputs.get(value) or node_label(node)
            blocked = Blocked(
                "normalization-output",
                f"tensor '{value.name}' is the output of {label}, whose gamma*n+beta has a data-dependent mean",
                value.name,
                detail=f"reads '{value.name}', the output of {label}",
            )
            return self._stops_here(goal, blocked)
        if node.op_type == "Cast":
            widened = self._widened(node)
            if widened is not None:
                blocked = Blocked("widened-narrow-constant", f"tensor '{value.name}' is {widened}", value.name)
                return self._stops_here(goal, blocked)
        reqs = carry.backward(node, value.index(), axis, self.shapes, part)
        if isinstance(reqs, Blocked):
            blocked = reqs.reworded(
                f"tensor '{value.name}' comes from a node that breaks the chain: {reqs.reason}",
                value.name,
                detail=f"'{value.name}': {reqs.reason}",
            )
            return self._stops_here(goal, blocked)
        if weights is not None and node.op_type == "Slice":
            return Blocked("scaled-slice", f"tensor '{value.name}' is a Slice of a scaled stream (not supported)", value.name)
        return self._collect(node, reqs, (value, axis, part), weights)

    def _is_zero(self, value: ir.Value) -> bool:
        zero = self._zeros.get(value)
        if zero is None:
            zero = self._zeros[value] = is_zero(value, exact=False, memo=self._fills)
        return zero

    def _widened(self, cast: ir.Node) -> str | None:
        """Why a Cast of an fp16/bf16 constant to a wider float stops a proof, or None. The
        constant would be centered in its narrow type, and the mean its rounding leaves is far
        above the wide type's noise (test_fp16_weights_cast_to_fp32_are_kept_with_a_reason). A
        computed fp16 stream widened for an fp32 LN, as the fp16 converter leaves LNs, carries
        fp16 noise of its own: not refused here."""
        src = self.shapes.dtype(cast.inputs[0])
        dst = self.shapes.dtype(cast.outputs[0])
        if src in NARROW_FLOAT_TYPES and dst is not None and dst not in NARROW_FLOAT_TYPES and constant_of(cast.inputs[0]) is not None:
            return (
                f"{node_label(cast)} of {src.name} constant '{cast.inputs[0].name}' to {dst.name}: centered in "
                f"{src.name}, it would leave a mean far above {dst.name} rounding"
            )
        return None

    def _collect(
        self, node: ir.Node, reqs, out: tuple[ir.Value, int, Part] | None, weights: Weights
    ) -> frozenset[Leaf] | Blocked | Pending:
        """The leaves under the required inputs of `node` (`out`: the output being proven, with
        its axis and part, and `weights` the ones asked of it), the first obstacle, or the goals
        to prove first."""
        leaves: set[Leaf] = set()
        needs: list[Goal] = []
        for req in reqs:
            inp = node.inputs[req.index] if req.index < len(node.inputs) else None
            if inp is None or self._is_zero(inp):  # a zero term: zero-mean as it is
                continue
            req_weights = weights
            if req.factor is not None:
                assert out is not None
                factor = carry.axis_vector(node, req.factor, self.shapes.rank(out[0]) or 0, out[1], self.shapes)
                if factor is None or not np.all(factor != 0):
                    return Blocked(
                        "zero-scale-entry",
                        f"{node_label(node)} scales the stream by '{node.inputs[req.factor].name}', "
                        "which has a zero entry: no weight edit can center the product",
                        node.inputs[req.factor].name,
                    )
                req_weights = weigh(weights, factor)
            if inp.is_graph_input() and inp.is_initializer():
                return Blocked(
                    "weight-is-input",
                    f"weight '{inp.name}' of {node_label(node)} is a graph input: it can be overridden "
                    "at run time, so it is not a constant",
                    inp.name,
                    detail=f"'{inp.name}' of {node_label(node)}",
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
            goal = (inp, req.axis, req_weights, req.part)
            sub = self.memo.get(goal)
            if sub is None:
                needs.append(goal)
            elif isinstance(sub, Blocked):
                # An explicit centering of `inp` stands in only where the proof stopped at `inp`
                # itself, and removes the mean of the whole axis: not one per block.
                stopped_here = goal in self._stopped_at_own
                if not stopped_here or req_weights is not None or not req.part.uniform or not self._aux_allowed(inp):
                    return sub
                leaf = self._leaf(node, req, out, weights, None, aux=True)
                if isinstance(leaf, Blocked):
                    return sub
                leaves.add(leaf)
            else:
                leaves |= sub
        return Pending(tuple(needs)) if needs else frozenset(leaves)

    def _aux_allowed(self, value: ir.Value) -> bool:
        if self.aux_denied is None or value in self.aux_denied:
            return False
        # fp16/bf16 roots only for LNs of their own precision (`analysis.fold_set._mixed_precision_roots`).
        return self.shapes.dtype(value) in FLOAT_TYPES

    def _leaf(self, node, req, out, out_weights: Weights, weights: Weights, aux: bool = False):
        """A leaf at input `req.index` of `node`. The change it makes is a shift at the node's
        outputs once multiplied by `out_weights` (those asked of the output being proven). A
        constant is centered whole along its other axes, so the leaf's part has no `where`; an
        explicit centering removes the mean of the whole axis."""
        inp = node.inputs[req.index]
        part = WHOLE if aux else req.part.without_where()
        absorbed = self.sinks.absorbs(node, req.index, req.axis, self.shapes) if req.axis is not None else None
        if isinstance(absorbed, dict):
            if not part.uniform:
                return Blocked("non-uniform-change", f"{node_label(node)} would see '{inp.name}' change by blocks, not uniformly")
            seeds: tuple[Seed, ...] = tuple(
                (node.outputs[k], a, out_weights, part) for k, a in sorted(absorbed.items()) if node.outputs[k] is not None
            )
        elif req.axis is None:
            assert out is not None
            seeds = ((out[0], out[1], out_weights, WHOLE),)  # a constant along the axis: a uniform shift
        else:
            moved = absorbed if absorbed is not None else carry.forward(node, req.index, req.axis, self.shapes, part)
            if isinstance(moved, Blocked):  # the two directions of _carry disagree: refuse, never guess
                return Blocked("internal", f"internal: cannot follow the shift of '{inp.name}': {moved.reason}")
            seeds = tuple(
                (node.outputs[k], a, out_weights, p) for k, (a, p) in sorted(moved.items()) if node.outputs[k] is not None
            )
        return Leaf(inp, req.axis, node, req.index, seeds, aux, weights, part)
