"""What every LayerNorm form shares: its kind, the candidate it recognizes, and the questions the
analysis and the rewrite ask of a form (docs/DESIGN.md section 5)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import ClassVar

import onnx_ir as ir

from onnx_lnfold.carry.engine import Requirement
from onnx_lnfold.core import ops
from onnx_lnfold.core.blocked import Blocked
from onnx_lnfold.core.ir import FLOAT_TYPES, attr_or_input_ints, const_scalar, const_tensor, node_label, normalize_axis
from onnx_lnfold.shapes.table import ShapeTable


class LnKind(str, enum.Enum):
    """The forms, by the name the plan reports (`LnDecision.op_type`)."""

    LAYER_NORM = ops.LAYER_NORM.qualified
    SKIP_LAYER_NORM = ops.SKIP_LAYER_NORM.qualified
    DECOMPOSED = "decomposed LayerNorm"
    MOMENTS = "LayerNorm as E[x^2]-E[x]^2"
    EMBED_LAYER_NORM = ops.EMBED_LAYER_NORM.qualified

    def __str__(self) -> str:
        return self.value


@dataclass(eq=False)  # identity semantics: one candidate per LN
class LnCandidate:
    """One LayerNorm in the graph, in any form, with the facts the analysis and rewrite share."""

    form: LnForm
    node: ir.Node  # anchor: the node whose `terms` inputs must be zero-mean
    name: str  # display name, unique in the graph
    out: ir.Value  # the normalized result (the LN output, after gamma and beta)
    scale: ir.Value | None
    bias: ir.Value | None  # beta
    axis: int | None  # non-negative normalized axis; None if unknown
    epsilon: float
    terms: tuple[Requirement, ...] = ()
    nodes: tuple[ir.Node, ...] = ()  # every node the rewrite replaces
    # Why it cannot be folded whatever its upstream looks like; None if it may be.
    form_problem: Blocked | None = None
    # (node, input index) pairs through which this LN removes a shift of its input.
    sink_uses: tuple[tuple[ir.Node, int], ...] = field(default=())
    # Length and dtype of the normalized axis, for a decomposed LN written without gamma (the
    # rewrite then needs a scale of ones).
    ones_scale: tuple[int, ir.DataType] | None = None

    @property
    def kind(self) -> str:
        return self.form.kind

    @property
    def x(self) -> ir.Value:
        return self.node.inputs[0]  # type: ignore[return-value]


# An input slot, (node, input index): read when the rewrite runs, because an earlier rewrite may
# have replaced the tensor in it (an LN reading another LN's output).
Slot = tuple[ir.Node, int]


@dataclass(frozen=True)
class RewriteSite:
    """Where a folded LN's RMS op goes and what it reads besides its scale."""

    inputs: tuple[Slot, ...]  # x, or input and skip for SkipSimplifiedLayerNormalization
    skip_bias: Slot | None  # the Skip op's bias input
    old_sum: ir.Value | None  # a residual sum the Skip op takes over as its output 3
    anchor: ir.Node  # the new nodes go right after this one


class LnForm:
    """One way a LayerNorm is written. Subclasses answer for their own nodes only."""

    kind: ClassVar[str]  # how the plan names the LNs of this form (`LnDecision.op_type`)
    op_type: ClassVar[str | None] = None  # the op it is, if it is one op
    # It normalizes `input + skip` itself: its fold is always SkipSimplifiedLayerNormalization,
    # and shifts of its several inputs add up (the side-effect rule lets them change together).
    has_skip: ClassVar[bool] = False
    # What the plan calls a constant input of the LN op that an edit centers (by input index).
    roles: ClassVar[dict[int, str]] = {}
    # Written as a pattern of ops: its output stops a proof as an LN op's output does.
    is_pattern: ClassVar[bool] = False

    def match(self, node: ir.Node, name: str, shapes: ShapeTable) -> LnCandidate | None:
        """The candidate `node` anchors in this form, or None if it anchors none."""
        raise NotImplementedError

    def absorbs(
        self, cand: LnCandidate, node: ir.Node, index: int, axis: int, shapes: ShapeTable
    ) -> dict[int, int] | Blocked | None:
        """What the LN does with a shift along `axis` arriving at input `index` of `node` (one of
        its nodes): {} when it removes it, {output: axis} for outputs that still carry it, a
        `Blocked` when it cannot remove it, None when this input is not the LN's to answer for."""
        return None

    def site(self, cand: LnCandidate) -> RewriteSite:
        """Where the RMS op goes when it takes the LN's place as it is."""
        return RewriteSite(((cand.node, 0),), None, None, cand.nodes[-1])


def used(value: ir.Value | None) -> bool:
    return value is not None and (bool(value.uses()) or value.is_graph_output())


def check_float(cand: LnCandidate, shapes: ShapeTable) -> Blocked | None:
    dtype = shapes.dtype(cand.x)
    if dtype is not None and dtype not in FLOAT_TYPES:
        return Blocked("not-float", f"its input is {dtype.name}, not a float type")
    return None


# --- reading a pattern of ops (the forms written as several nodes) -----------------------------


def only_use(value: ir.Value) -> tuple[ir.Node, int] | None:
    """The one use (node, input index) of `value`; None if it has several or is a graph output."""
    uses = value.uses()
    if len(uses) != 1 or value.is_graph_output():
        return None
    return uses[0]


def other_input(node: ir.Node, value: ir.Value) -> ir.Value | None:
    """The other operand of a binary `node` that reads `value`."""
    return node.inputs[1] if node.inputs[0] is value else node.inputs[0]


def first_use(value: ir.Value, match) -> tuple[ir.Node, int] | None:
    """The first use (node, input index) of `value` that `match(node, index)` accepts."""
    for node, index in value.uses():
        if match(node, index):
            return node, index
    return None


def centered_square(x: ir.Value, mean: ir.Value) -> tuple[ir.Node, ir.Node] | None:
    """The Sub(x, mean) that reads `mean` and the first square of its output, Mul(d, d) or
    Pow(d, 2): the deviations a written-out variance averages; None where either is missing."""
    sub = first_use(mean, lambda n, i: n.op_type == "Sub" and i == 1 and n.inputs[0] is x)
    if sub is None:
        return None
    d = sub[0].outputs[0]
    square = first_use(
        d,
        lambda n, i: (
            (n.op_type == "Pow" and i == 0 and const_scalar(n.inputs[1]) == 2.0)
            or (n.op_type == "Mul" and n.inputs[0] is d and n.inputs[1] is d)
        ),
    )
    if square is None:
        return None
    return sub[0], square[0]


def epsilon_added(value: ir.Value) -> tuple[ir.Node, float] | None:
    """The first Add of a constant scalar to `value`, with that scalar; None if there is none."""
    plus = first_use(value, lambda n, i: n.op_type == "Add" and const_scalar(other_input(n, n.inputs[i])) is not None)
    if plus is None:
        return None
    epsilon = const_scalar(other_input(plus[0], plus[0].inputs[plus[1]]))
    assert epsilon is not None
    return plus[0], epsilon


def reduce_axis(node: ir.Node, rank: int | None, keepdims: bool | None = True) -> int | None:
    """The single axis a reduction reduces over (as written, if the rank is unknown), else None.
    `keepdims`: the value its attribute must have (None: either)."""
    if keepdims is not None and bool(node.attributes.get_int("keepdims", 1)) != keepdims:
        return None
    axes = attr_or_input_ints(node, "axes", 1)
    if axes is None or len(axes) != 1:
        return None
    return axes[0] if rank is None else normalize_axis(axes[0], rank)


def along_axis_constant(value: ir.Value | None, rank: int, axis: int, shapes: ShapeTable) -> bool:
    """A constant that varies only along `axis` (gamma / beta of an LN written as ops)."""
    if value is None or value.is_graph_input() or const_tensor(value) is None:
        return False
    shape = shapes.shape(value)
    if shape is None:
        return False
    offset = rank - len(shape)
    return all(d == 1 for i, d in enumerate(shape) if i + offset != axis)


def check_unrolled(
    cand: LnCandidate, shapes: ShapeTable, x: ir.Value, axis: int, rank: int, scale: ir.Value | None, axis_text: str
) -> None:
    """The form checks an LN written out in ops (decomposed, moments) shares: a float input, the
    last axis (`axis_text` says which it is), and without a gamma a known width and type, for the
    ones the RMSNorm op needs as its scale. Sets `cand.form_problem` or `cand.ones_scale`."""
    if cand.form_problem is None:
        cand.form_problem = check_float(cand, shapes)
    if cand.form_problem is None and axis != rank - 1:
        cand.form_problem = Blocked(
            "not-last-axis", f"it normalizes over {axis_text}, not the last one; RMSNorm ops normalize trailing axes"
        )
    if cand.form_problem is None and scale is None:
        dim, dtype = (shapes.shape(x) or (None,) * rank)[axis], shapes.dtype(x)
        if not isinstance(dim, int) or dtype is None:
            cand.form_problem = Blocked(
                "unknown-shape", "it has no gamma and the length or type of its normalized axis is unknown"
            )
        else:
            cand.ones_scale = (dim, dtype)


def shared_intermediate(chain: list[ir.Node], holds: tuple[str, ...]) -> tuple[ir.Node, str, str] | None:
    """The first node of an unrolled LN's pattern (all but its last) whose output is read outside
    the pattern or is a graph output, what it holds (`holds`, in pattern order) and how it is read:
    folding removes these nodes, and their readers need them."""
    inside = set(chain)
    for node, what in zip(chain[:-1], holds):
        out = node.outputs[0]
        if out.is_graph_output():
            return node, what, "is a graph output"
        if any(user not in inside for user, _ in out.uses()):
            return node, what, "is read outside the pattern"
    return None


def absorbs_own_reads(cand: LnCandidate, node: ir.Node, index: int, axis: int) -> Blocked | dict | None:
    """`LnForm.absorbs` of an unrolled LN: the reads of x inside its pattern (`cand.sink_uses`)
    together remove a shift of x along the LN's axis, whatever else reads its shift-free
    intermediates; any other read is not the LN's."""
    if cand.axis is None or (node, index) not in cand.sink_uses:
        return None
    if axis != cand.axis:
        return Blocked("normalizes-other-axis", f"it feeds {node_label(node)}, a LayerNorm over another axis")
    return {}
