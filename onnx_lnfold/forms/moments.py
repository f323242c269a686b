"""The LayerNorm jax2tf and tf2onnx write (flax's `nn.LayerNorm`, Keras under XLA): the variance
as E[x^2] - E[x]^2, clamped at zero, anchored at the reduction of x that gives the mean:

    m = mean(x)                 ReduceMean, or ReduceSum times 1/n (or divided by n)
    v = mean(x*x) - m*m         x*x as Mul or Pow(x, 2), or ReduceSumSquare(x); m*m as Mul or Pow
    v = Max(v, c), c <= 0       optional, before or after epsilon is added
    r = 1/sqrt(v + eps)         Sqrt then Reciprocal or Div(1, .), or Pow(., -0.5)
    y = (x - m) * r * gamma + beta           gamma after the product, or in it: (x - m) * (r * gamma)
      | (x - m) / sqrt(v + eps) * gamma + beta
      | x * (r * gamma) + (beta - m * (r * gamma))     (the affine form, beta optional)

The reductions may drop the axis (keepdims=0): the statistics get it back through Reshape,
Unsqueeze, Expand or Identity (tf2onnx writes Reshape + Expand) before they meet x or gamma.

On zero-mean input m = 0, so v = E[x^2] and Max(v, c) = v: the pattern is RMSNorm(x) * gamma +
beta with the same epsilon wherever it is added, so it folds like a decomposed LN. A shift of x
moves m, m*m and E[x^2] (and the products of x and of m in the affine form) but leaves v and
x - m as they were (in exact arithmetic; E[x^2] - m^2 cancels in floating point, so a kept one
computes its variance to a few ulps of E[x^2] either way): the pattern removes a shift as long as
nothing outside it reads what moves.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import onnx_ir as ir

from onnx_lnfold.carry.engine import Requirement
from onnx_lnfold.core.blocked import Blocked
from onnx_lnfold.core.ir import attr_or_input_ints, const_scalar, is_standard, normalize_axis
from onnx_lnfold.forms.base import (
    LnCandidate,
    LnForm,
    LnKind,
    absorbs_own_reads,
    along_axis_constant,
    check_unrolled,
    other_input,
    reduce_axis,
)
from onnx_lnfold.shapes.reshape import shape_entries
from onnx_lnfold.shapes.table import ShapeTable

# Ops that only give a statistic its reduced axis back (or broadcast it): they move no values.
_LAYOUT = frozenset({"Reshape", "Expand", "Unsqueeze", "Identity"})
_TOLERANCE = 1e-6  # on 1/n written as a float constant


def _op(node: ir.Node, *ops: str) -> bool:
    return is_standard(node) and node.op_type in ops


@dataclass
class _Pattern:
    """The nodes found so far, each with what its output holds and whether a shift of x moves it."""

    x: ir.Value
    rank: int
    axis: int
    shapes: ShapeTable
    nodes: dict[ir.Node, tuple[str, bool]] = field(default_factory=dict)  # node -> (what, moves)

    def add(self, what: str, moves: bool, node: ir.Node, path: tuple[ir.Node, ...] = ()) -> None:
        """`node` holds `what`; the layout ops on the way to it (`use`'s path) hold what their
        input holds, so a copy of the mean moves with a shift of x as the mean does."""
        for layout in path:
            self.nodes.setdefault(layout, self.nodes.get(_producer(layout.inputs[0]), (what, moves)))
        self.nodes.setdefault(node, (what, moves))

    def add_all(self, what: str, moves: bool, *nodes: ir.Node) -> None:
        for node in nodes:
            self.nodes.setdefault(node, (what, moves))

    def n(self) -> int | None:
        shape = self.shapes.shape(self.x)
        dim = shape[self.axis] if shape is not None else None
        return dim if isinstance(dim, int) else None

    def use(self, value: ir.Value, accept) -> tuple[ir.Node, int, tuple[ir.Node, ...]] | None:
        """The first use of `value`, looking through layout ops, that `accept(node, index)` takes,
        with the layout ops on the way (breadth first: the nearest use wins)."""
        frontier: list[tuple[ir.Value, tuple[ir.Node, ...]]] = [(value, ())]
        while frontier:
            current, path = frontier.pop(0)
            for node, index in current.uses():
                if _op(node, *_LAYOUT) and index == 0:
                    frontier.append((node.outputs[0], (*path, node)))
                elif accept(node, index):
                    return node, index, path
        return None

    def source(self, value: ir.Value | None, origin: ir.Value) -> tuple[ir.Node, ...] | None:
        """The layout ops from `origin` to `value` if `value` is `origin` seen through them."""
        path: list[ir.Node] = []
        while value is not None and value is not origin:
            node = value.producer()
            if node is None or not _op(node, *_LAYOUT):
                return None
            path.append(node)
            value = node.inputs[0]
        return tuple(reversed(path)) if value is origin else None

    def restores_axis(self, node: ir.Node) -> bool:
        """A layout op on a statistic: its output has x's rank with size 1 at the axis (numpy
        broadcasting then lines it up with x), from the reduced statistic or one that kept it."""
        out_rank, in_rank = self.shapes.rank(node.outputs[0]), self.shapes.rank(node.inputs[0])
        if out_rank != self.rank or in_rank not in (self.rank - 1, self.rank):
            return False
        if node.op_type == "Unsqueeze":
            if in_rank == self.rank:
                return False
            axes = [normalize_axis(a, self.rank) for a in (attr_or_input_ints(node, "axes", 1) or [])]
            return axes == [self.axis]
        if node.op_type == "Reshape":
            shape = self.shapes.shape(node.outputs[0])
            if shape is not None and shape[self.axis] == 1:
                return True
            entries = shape_entries(node.inputs[1], self.shapes)
            return entries is not None and len(entries) == self.rank and entries[self.axis] == 1
        return in_rank == self.rank  # Expand, Identity of a statistic that has the axis already

    def restored(self, value: ir.Value | None) -> bool:
        """A statistic as it meets x or gamma: x's rank, size 1 at the axis."""
        shape = self.shapes.shape(value) if value is not None else None
        return shape is not None and len(shape) == self.rank and shape[self.axis] == 1

    def mean_of(self, total: ir.Node) -> tuple[ir.Value, tuple[ir.Node, ...]] | None:
        """`total` (a reduction over the axis) as a mean: itself for ReduceMean, else times 1/n."""
        if total.op_type == "ReduceMean":
            return total.outputs[0], ()
        n = self.n()
        if n is None:
            return None
        found = self.use(
            total.outputs[0],
            lambda node, i: (_op(node, "Mul") and _near(const_scalar(node.inputs[1 - i]), 1 / n))
            or (_op(node, "Div") and i == 0 and _near(const_scalar(node.inputs[1]), n)),
        )
        if found is None:
            return None
        node, _, path = found
        return node.outputs[0], (*path, node)

    def second_moment(self, value: ir.Value | None) -> bool:
        """Whether `value` is mean(x*x) over the axis; adds its nodes."""
        path: list[ir.Node] = []
        node = _producer(value)
        while node is not None and _op(node, *_LAYOUT):
            path.append(node)
            node = _producer(node.inputs[0])
        if node is not None and _op(node, "Mul", "Div"):
            scale = node
            operands = scale.inputs if scale.op_type == "Mul" else scale.inputs[:1]
            totals = [t for t in map(_producer, operands) if t is not None and self._sums(scale, t)]
            if not totals:
                return False
            path.append(scale)
            node = totals[0]
        elif node is None or not _op(node, "ReduceMean"):
            return False
        if reduce_axis(node, self.rank, keepdims=None) != self.axis:
            return False
        if node.op_type == "ReduceSumSquare":
            if node.inputs[0] is not self.x:
                return False
        else:
            square = _producer(node.inputs[0])
            if square is None or not _is_square_of(square, self.x):
                return False
            self.add_all("x*x", True, square)
        self.add_all("E[x^2]", True, node, *path)
        return True

    def _sums(self, scale: ir.Node, total: ir.Node) -> bool:
        """`total` is a sum over the axis that `scale` turns into a mean: times 1/n, or over n."""
        n = self.n()
        if n is None or not _op(total, "ReduceSum", "ReduceSumSquare"):
            return False
        out = total.outputs[0]
        if scale.op_type == "Mul":
            return _near(const_scalar(other_input(scale, out)), 1 / n)
        return scale.inputs[0] is out and _near(const_scalar(scale.inputs[1]), n)

    def layout_ok(self) -> bool:
        """Every layout op of the pattern gives a statistic x's rank with size 1 at the axis."""
        return all(self.restores_axis(node) for node in self.nodes if node.op_type in _LAYOUT - {"Identity"})


def _producer(value: ir.Value | None) -> ir.Node | None:
    return value.producer() if value is not None else None


def _near(value: float | None, target: float) -> bool:
    return value is not None and abs(value - target) <= _TOLERANCE * abs(target)


def _is_square_of(node: ir.Node, value: ir.Value) -> bool:
    if _op(node, "Mul"):
        return node.inputs[0] is value and node.inputs[1] is value
    return _op(node, "Pow") and node.inputs[0] is value and const_scalar(node.inputs[1]) == 2.0


class MomentsForm(LnForm):
    kind = LnKind.MOMENTS
    is_pattern = True

    def match(self, anchor: ir.Node, name: str, shapes: ShapeTable) -> LnCandidate | None:
        """The pattern anchored at the reduction of x that gives its mean; None if it is not one."""
        if not _op(anchor, "ReduceMean", "ReduceSum") or not anchor.inputs or anchor.inputs[0] is None:
            return None
        x = anchor.inputs[0]
        rank = shapes.rank(x)
        axis = reduce_axis(anchor, rank, keepdims=None)
        if rank is None or axis is None:
            return None
        p = _Pattern(x, rank, axis, shapes)
        mean = p.mean_of(anchor)
        if mean is None:
            return None
        m, m_path = mean
        p.add_all("the mean", True, anchor, *m_path)
        # v = E[x^2] - m*m
        found = p.use(m, lambda node, i: _is_square_of(node, node.inputs[0]) and p.source(node.inputs[0], m) is not None)
        if found is None:
            return None
        square, _, path = found
        p.add("the squared mean", True, square, path)
        found = p.use(square.outputs[0], lambda node, i: _op(node, "Sub") and i == 1)
        if found is None:
            return None
        variance, _, path = found
        if not p.second_moment(variance.inputs[0]):
            return None
        p.add("the variance", False, variance, path)
        std = self._inverse_std(p, variance.outputs[0])
        if std is None:
            return None
        epsilon, root, inverse = std
        return self._normalized(p, name, m, root, inverse, epsilon)

    def _inverse_std(self, p: _Pattern, v: ir.Value) -> tuple[float, ir.Value, ir.Value | None] | None:
        """From the variance: [Max(., c<=0)] Add(eps) [Max(., c<=0)] then the square root and its
        inverse: (epsilon, sqrt(v + eps) or None, 1/sqrt(v + eps) or None)."""
        epsilon = None
        clamped = False
        while True:
            found = p.use(
                v,
                lambda node, i: _op(node, "Add", "Max")
                and len(node.inputs) == 2
                and const_scalar(other_input(node, node.inputs[i])) is not None,
            )
            if found is None:
                break
            node, i, path = found
            c = const_scalar(other_input(node, node.inputs[i]))
            assert c is not None
            if node.op_type == "Max":
                if clamped or c > 0:
                    return None  # Max(v, c) with c > 0 is not v on zero-mean input
                clamped = True
                p.add("the clamped variance", False, node, path)
            else:
                if epsilon is not None:
                    return None
                epsilon = c
                p.add("the variance plus epsilon", False, node, path)
            v = node.outputs[0]
        if epsilon is None:
            return None
        found = p.use(v, lambda node, i: _op(node, "Sqrt") or (_op(node, "Pow") and i == 0 and const_scalar(node.inputs[1]) == -0.5))
        if found is None:
            return None
        node, _, path = found
        if node.op_type == "Pow":
            p.add("1/std", False, node, path)
            return epsilon, None, node.outputs[0]
        p.add("the standard deviation", False, node, path)
        root = node.outputs[0]
        found = p.use(
            root,
            lambda node, i: _op(node, "Reciprocal") or (_op(node, "Div") and i == 1 and const_scalar(node.inputs[0]) == 1.0),
        )
        if found is None:
            return epsilon, root, None  # the root may be a divisor: (x - m) / root
        node, _, path = found
        p.add("1/std", False, node, path)
        return epsilon, root, node.outputs[0]

    def _normalized(
        self, p: _Pattern, name: str, m: ir.Value, root: ir.Value | None, inverse: ir.Value | None, epsilon: float
    ) -> LnCandidate | None:
        x, rank, axis, shapes = p.x, p.rank, p.axis, p.shapes

        def gamma_of(node: ir.Node, value: ir.Value) -> ir.Value | None:
            other = other_input(node, value)
            return other if _op(node, "Mul") and along_axis_constant(other, rank, axis, shapes) else None

        scale = beta = None
        factor = inverse  # what x (or x - m) is multiplied by: 1/std, or 1/std times gamma
        if inverse is not None:
            found = p.use(inverse, lambda node, i: gamma_of(node, node.inputs[i]) is not None)
            if found is not None:
                node, i, path = found
                if not p.restored(node.inputs[i]):
                    return None
                scale = gamma_of(node, node.inputs[i])
                p.add("1/std times gamma", False, node, path)
                factor = node.outputs[0]

        def meets(value: ir.Value) -> bool:
            """A statistic meeting x: aligned with it (with gamma in it, it has x's shape already)."""
            return scale is not None or p.restored(value)

        centered = p.use(m, lambda node, i: _op(node, "Sub") and i == 1 and node.inputs[0] is x)
        if centered is not None:  # (x - m) * q or (x - m) / sqrt(v + eps)
            sub, _, path = centered
            if not p.restored(sub.inputs[1]):
                return None
            p.add("the centered input", False, sub, path)
            d = sub.outputs[0]
            if factor is not None:
                found = p.use(factor, lambda node, i: _op(node, "Mul") and other_input(node, node.inputs[i]) is d)
            else:
                assert root is not None
                found = p.use(root, lambda node, i: _op(node, "Div") and i == 1 and node.inputs[0] is d)
            if found is None:
                return None
            node, i, path = found
            if not meets(node.inputs[i]):
                return None
            p.add("the normalized input", False, node, path)
            out = node.outputs[0]
            step = _only_user(out)
            if scale is None and step is not None and gamma_of(step, out) is not None:
                scale = gamma_of(step, out)
                p.add("the normalized input times gamma", False, step)
                out = step.outputs[0]
                step = _only_user(out)
            if step is not None and _op(step, "Add") and along_axis_constant(other_input(step, out), rank, axis, shapes):
                beta = other_input(step, out)
                p.add("the normalized input plus beta", False, step)
                out = step.outputs[0]
        else:  # the affine form: x * q + (beta - m * q), or x * q - m * q
            if factor is None:
                return None
            found = p.use(factor, lambda node, i: _op(node, "Mul") and other_input(node, node.inputs[i]) is x)
            if found is None or not meets(found[0].inputs[found[1]]):
                return None
            x_times, _, path = found
            p.add("x times 1/std", True, x_times, path)

            def times_mean(node: ir.Node, i: int) -> bool:
                return _op(node, "Mul") and node is not x_times and p.source(other_input(node, node.inputs[i]), m) is not None

            found = p.use(factor, times_mean)
            if found is None or not meets(found[0].inputs[found[1]]):
                return None
            m_times, i, path = found
            m_seen = other_input(m_times, m_times.inputs[i])
            if not p.restored(m_seen):
                return None
            p.add_all("the mean", True, *(p.source(m_seen, m) or ()))
            p.add("the mean times 1/std", True, m_times, path)
            x_out, m_out = x_times.outputs[0], m_times.outputs[0]
            last = _only_user(x_out)
            if last is None:
                return None
            shift = _producer(other_input(last, x_out))
            if _op(last, "Sub") and last.inputs[0] is x_out and last.inputs[1] is m_out:
                pass  # no beta
            elif (
                _op(last, "Add")
                and shift is not None
                and _op(shift, "Sub")
                and shift.inputs[1] is m_out
                and along_axis_constant(shift.inputs[0], rank, axis, shapes)
            ):
                beta = shift.inputs[0]
                p.add("beta minus the mean times 1/std", True, shift)
            else:
                return None
            p.add("the normalized input", False, last)
            out = last.outputs[0]
        if not p.layout_ok():
            return None
        return self._candidate(p, name, out, scale, beta, epsilon)

    def _candidate(
        self, p: _Pattern, name: str, out: ir.Value, scale: ir.Value | None, beta: ir.Value | None, epsilon: float
    ) -> LnCandidate:
        x, rank, axis, shapes = p.x, p.rank, p.axis, p.shapes
        chain = list(p.nodes)
        last = out.producer()
        assert last is not None and last in p.nodes
        chain.remove(last)
        chain.append(last)  # the rewrite puts the RMS op after the pattern's last node
        cand = LnCandidate(self, chain[0], name, out, scale, beta, axis, epsilon)
        cand.nodes = tuple(chain)
        cand.terms = (Requirement(0, axis),)
        shared = _shared_intermediate(chain, p.nodes)
        if shared is not None:
            node, (what, moves), how = shared
            if moves:  # its reader would see a shift of x move it: the pattern does not remove one
                cand.form_problem = Blocked(
                    "intermediate-read",
                    f"its intermediate '{node.outputs[0].name}' ({what}) {how}, and centering the input would change it",
                )
                return cand
            cand.form_problem = Blocked(
                "intermediate-read", f"its intermediate '{node.outputs[0].name}' ({what}) {how}; RMSNorm does not compute it"
            )
        # Every read of x in the pattern: together they remove a shift of x.
        cand.sink_uses = tuple((node, i) for node in chain for i, value in enumerate(node.inputs) if value is x)
        check_unrolled(cand, shapes, x, axis, rank, scale, f"axis {axis} of {rank}")
        return cand

    def absorbs(self, cand, node, index, axis, shapes):
        # Every read of x inside the pattern together: the shift they see leaves the output alone.
        return absorbs_own_reads(cand, node, index, axis)


def _only_user(value: ir.Value) -> ir.Node | None:
    uses = value.uses()
    if len(uses) != 1 or value.is_graph_output():
        return None
    return uses[0][0]


def _shared_intermediate(chain: list[ir.Node], roles: dict[ir.Node, tuple[str, bool]]):
    """The first node of the pattern (all but its last) whose output is read outside it or is a
    graph output: (node, (what it holds, whether a shift of x moves it), how it is read). Those
    that move come first: their readers would see the centering."""
    inside = set(chain)
    shared = []
    for node in chain[:-1]:
        out = node.outputs[0]
        if out.is_graph_output():
            shared.append((node, roles[node], "is a graph output"))
        elif any(user not in inside for user, _ in out.uses()):
            shared.append((node, roles[node], "is read outside the pattern"))
    shared.sort(key=lambda item: not item[1][1])
    return shared[0] if shared else None
