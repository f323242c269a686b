"""Recognize LayerNorm in its forms and normalize what the analysis and the rewrite need to know.

Forms (docs/DESIGN.md section 5):
- `LayerNormalization` (opset 17+);
- `com.microsoft::SkipLayerNormalization` (written by `onnxruntime.transformers.optimizer`): it
  normalizes `input + skip (+ bias)`, and its output 3 is that sum;
- the decomposed form older exporters write: `ReduceMean -> Sub -> Pow|Mul -> ReduceMean -> Add(eps)
  -> Sqrt -> Div | Reciprocal+Mul -> [Mul(gamma)] -> [Add(beta)]`;
- `com.microsoft::EmbedLayerNormalization`, reported: it has no RMS counterpart.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import onnx_ir as ir

from onnx_lnfold._blocked import Blocked
from onnx_lnfold._carry import Requirement
from onnx_lnfold._ir import FLOAT_TYPES, MS_DOMAIN, attr_or_input_ints, const_scalar, is_standard, node_label, normalize_axis
from onnx_lnfold._shapes import ShapeTable

# LayerNormalization's epsilon default (ONNX spec). SkipSimplifiedLayerNormalization's default
# differs (1e-12), which is why the rewrite always writes epsilon explicitly.
LN_DEFAULT_EPSILON = 1e-5
SKIP_LN_DEFAULT_EPSILON = 1e-12

LAYER_NORM = "LayerNormalization"
SKIP_LAYER_NORM = "com.microsoft::SkipLayerNormalization"
DECOMPOSED = "decomposed LayerNorm"
EMBED_LAYER_NORM = "com.microsoft::EmbedLayerNormalization"



@dataclass(eq=False)  # identity semantics: one candidate per LN
class LnCandidate:
    """One LayerNorm in the graph, in any form, with the facts the analysis and rewrite share."""

    kind: str
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
    def x(self) -> ir.Value:
        return self.node.inputs[0]  # type: ignore[return-value]


def _used(value: ir.Value | None) -> bool:
    return value is not None and (bool(value.uses()) or value.is_graph_output())


def _only_use(value: ir.Value) -> tuple[ir.Node, int] | None:
    uses = value.uses()
    if len(uses) != 1 or value.is_graph_output():
        return None
    return uses[0]


def _other(node: ir.Node, value: ir.Value) -> ir.Value | None:
    return node.inputs[1] if node.inputs[0] is value else node.inputs[0]


def _check_float(cand: LnCandidate, shapes: ShapeTable) -> Blocked | None:
    dtype = shapes.dtype(cand.x)
    if dtype is not None and dtype not in FLOAT_TYPES:
        return Blocked("not-float", f"its input is {dtype.name}, not a float type")
    return None


def _layer_norm(node: ir.Node, name: str, shapes: ShapeTable) -> LnCandidate:
    inputs = list(node.inputs) + [None] * (3 - len(node.inputs))
    cand = LnCandidate(
        LAYER_NORM, node, name, node.outputs[0], inputs[1], inputs[2], None, node.attributes.get_float("epsilon", LN_DEFAULT_EPSILON)
    )
    cand.nodes = (node,)
    rank = shapes.rank(cand.x)
    if rank is None:
        cand.form_problem = Blocked("unknown-shape", f"the rank of input '{cand.x.name}' is unknown, so the normalized axis is unknown")
        return cand
    first = normalize_axis(node.attributes.get_int("axis", -1), rank)
    if first != rank - 1:
        cand.form_problem = Blocked("several-axes", f"it normalizes over {rank - first} axes ({first}..{rank - 1}); RMSNorm folding needs one axis")
        return cand
    cand.axis = first
    cand.terms = (Requirement(0, first),)
    cand.form_problem = _check_float(cand, shapes)
    for i, out in enumerate(node.outputs[1:], start=1):
        if _used(out):
            what = "Mean" if i == 1 else "InvStdDev"
            cand.form_problem = Blocked("stats-output-used", f"its {what} output '{out.name}' is used, and RMSNorm has no such output")
            return cand  # and it does not absorb a shift of its input either: not a sink
    cand.sink_uses = ((node, 0),)
    if cand.scale is None:
        cand.form_problem = Blocked("no-scale", f"{node_label(node)} has no scale input")
    return cand


def _skip_layer_norm(node: ir.Node, name: str, shapes: ShapeTable) -> LnCandidate:
    inputs = list(node.inputs) + [None] * (5 - len(node.inputs))
    cand = LnCandidate(
        SKIP_LAYER_NORM, node, name, node.outputs[0], inputs[2], inputs[3], None,
        node.attributes.get_float("epsilon", SKIP_LN_DEFAULT_EPSILON),
    )
    cand.nodes = (node,)
    rank, skip_rank = shapes.rank(inputs[0]), shapes.rank(inputs[1])
    if rank is None or skip_rank is None:
        cand.form_problem = Blocked("unknown-shape", "the ranks of its input and skip are unknown, so the normalized axis is unknown")
        return cand
    cand.axis = rank - 1
    terms = [Requirement(0, rank - 1), Requirement(1, skip_rank - 1)]
    if inputs[4] is not None:
        terms.append(Requirement(4, 0))
    cand.terms = tuple(terms)
    cand.form_problem = _check_float(cand, shapes)
    for i in (1, 2):
        if i < len(node.outputs) and _used(node.outputs[i]):
            cand.form_problem = Blocked("stats-output-used", f"its {'mean' if i == 1 else 'inv_std_var'} output is used")
            return cand
    cand.sink_uses = tuple((node, t.index) for t in terms)
    return cand


def _use(value: ir.Value, match) -> tuple[ir.Node, int] | None:
    """The first use (node, input index) of `value` that `match(node, index)` accepts."""
    for node, index in value.uses():
        if match(node, index):
            return node, index
    return None


# What each intermediate of a decomposed LN holds, in pattern order (for reasons).
_INTERMEDIATES = (
    "the mean",
    "the centered input",
    "the squared deviations",
    "the variance",
    "the variance plus epsilon",
    "the standard deviation",
    "1/std",
)


def _shared_intermediate(chain: list[ir.Node]) -> tuple[ir.Node, str, str] | None:
    """The first node of the pattern (all but its last) whose output is read outside the pattern
    or is a graph output, what it holds and how it is read: folding removes these nodes, and
    their readers need them."""
    inside = set(chain)
    for node, what in zip(chain[:-1], _INTERMEDIATES):
        out = node.outputs[0]
        if out.is_graph_output():
            return node, what, "is a graph output"
        if any(user not in inside for user, _ in out.uses()):
            return node, what, "is read outside the pattern"
    return None


def _decomposed(mean: ir.Node, name: str, shapes: ShapeTable) -> LnCandidate | None:
    """Match the decomposed pattern anchored at its first ReduceMean; None if it is not one.

    Intermediates may have readers outside the pattern (or be graph outputs): the pattern is
    still an LN, reported and kept, since folding removes the nodes that compute them."""
    x = mean.inputs[0]
    rank = shapes.rank(x)
    axis = _reduce_axis(mean, rank)
    if x is None or axis is None:
        return None
    use = _use(mean.outputs[0], lambda n, i: n.op_type == "Sub" and i == 1 and n.inputs[0] is x)
    if use is None:
        return None
    sub = use[0]
    d = sub.outputs[0]
    square = _use(
        d,
        lambda n, i: (n.op_type == "Pow" and i == 0 and const_scalar(n.inputs[1]) == 2.0)
        or (n.op_type == "Mul" and n.inputs[0] is d and n.inputs[1] is d),
    )
    if square is None:
        return None
    square = square[0]
    chain = [mean, sub, square]
    step = _use(
        square.outputs[0], lambda n, i: n.op_type == "ReduceMean" and i == 0 and _reduce_axis(n, rank) == axis
    )
    if step is None:
        return None
    chain.append(step[0])
    step = _use(
        step[0].outputs[0], lambda n, i: n.op_type == "Add" and const_scalar(_other(n, n.inputs[i])) is not None
    )
    if step is None:
        return None
    epsilon = const_scalar(_other(step[0], step[0].inputs[step[1]]))
    assert epsilon is not None
    chain.append(step[0])
    step = _use(step[0].outputs[0], lambda n, i: n.op_type == "Sqrt")
    if step is None:
        return None
    chain.append(step[0])
    root = step[0].outputs[0]
    norm = _use(d, lambda n, i: n.op_type == "Div" and i == 0 and n.inputs[1] is root)
    if norm is None:
        recip = _use(root, lambda n, i: n.op_type == "Reciprocal")
        if recip is None:
            return None
        r = recip[0].outputs[0]
        norm = _use(d, lambda n, i: n.op_type == "Mul" and i == 0 and n.inputs[1] is r)
        if norm is None:
            return None
        chain.append(recip[0])
    norm = norm[0]
    chain.append(norm)
    out = norm.outputs[0]
    scale = beta = None
    step = _only_use(out)
    if rank is None:  # recognized, and reported, but not folded: the axis is unknown
        cand = LnCandidate(DECOMPOSED, mean, name, out, None, None, None, epsilon)
        cand.nodes = tuple(chain)
        cand.form_problem = Blocked("unknown-shape", f"the rank of input '{x.name}' is unknown, so the normalized axis is unknown")
        return cand
    if step is not None and step[0].op_type == "Mul" and _along_axis_constant(_other(step[0], out), rank, axis, shapes):
        scale = _other(step[0], out)
        chain.append(step[0])
        out = step[0].outputs[0]
        step = _only_use(out)
    if step is not None and step[0].op_type == "Add" and _along_axis_constant(_other(step[0], out), rank, axis, shapes):
        beta = _other(step[0], out)
        chain.append(step[0])
        out = step[0].outputs[0]
    cand = LnCandidate(DECOMPOSED, mean, name, out, scale, beta, axis, epsilon)
    cand.nodes = tuple(chain)
    cand.terms = (Requirement(0, axis),)
    shared = _shared_intermediate(chain)
    if shared is not None:
        node, what, how = shared
        if node is mean:
            # The mean moves with a shift of the input: this pattern does not remove one.
            cand.form_problem = Blocked("intermediate-read", f"its mean '{mean.outputs[0].name}' {how}, and centering the input would change it")
            return cand
        cand.form_problem = Blocked(
            "intermediate-read", f"its intermediate '{node.outputs[0].name}' ({what}) {how}; RMSNorm does not compute it"
        )
    # The pattern removes a shift of x whatever else reads its shift-free intermediates.
    cand.sink_uses = ((mean, 0), (sub, 0))
    if cand.form_problem is None:
        cand.form_problem = _check_float(cand, shapes)
    if cand.form_problem is None and axis != rank - 1:
        cand.form_problem = Blocked("not-last-axis", f"it normalizes over axis {axis}, not the last one; RMSNorm ops normalize trailing axes")
    if cand.form_problem is None and scale is None:
        dim, dtype = (shapes.shape(x) or (None,) * rank)[axis], shapes.dtype(x)
        if not isinstance(dim, int) or dtype is None:
            cand.form_problem = Blocked("unknown-shape", "it has no gamma and the length or type of its normalized axis is unknown")
        else:
            cand.ones_scale = (dim, dtype)
    return cand


def _reduce_axis(node: ir.Node, rank: int | None) -> int | None:
    """The single axis a keepdims ReduceMean reduces over (as written, if the rank is unknown),
    else None."""
    if node.attributes.get_int("keepdims", 1) == 0:
        return None
    axes = attr_or_input_ints(node, "axes", 1)
    if axes is None or len(axes) != 1:
        return None
    return axes[0] if rank is None else normalize_axis(axes[0], rank)


def _along_axis_constant(value: ir.Value | None, rank: int, axis: int, shapes: ShapeTable) -> bool:
    """A constant that varies only along `axis` (gamma / beta of a decomposed LN)."""
    if value is None or value.is_graph_input() or ir.convenience.get_const_tensor(value) is None:
        return False
    shape = shapes.shape(value)
    if shape is None:
        return False
    offset = rank - len(shape)
    return all(d == 1 for i, d in enumerate(shape) if i + offset != axis)


def find_layer_norms(graph: ir.Graph, shapes: ShapeTable, names: dict[ir.Node, str]) -> list[LnCandidate]:
    """Every LayerNorm of the graph and its subgraphs (If/Loop/Scan bodies), in any recognized
    form, in graph order."""
    found = []
    for node in ir.traversal.RecursiveGraphIterator(graph):
        if is_standard(node) and node.op_type == "LayerNormalization":
            found.append(_layer_norm(node, names[node], shapes))
        elif node.domain == MS_DOMAIN and node.op_type == "SkipLayerNormalization":
            found.append(_skip_layer_norm(node, names[node], shapes))
        elif node.domain == MS_DOMAIN and node.op_type == "EmbedLayerNormalization":
            cand = LnCandidate(EMBED_LAYER_NORM, node, names[node], node.outputs[0], None, None, None, 0.0)
            cand.form_problem = Blocked("no-rms-form", "EmbedLayerNormalization fuses the embeddings with the LN and has no RMSNorm counterpart")
            found.append(cand)
        elif is_standard(node) and node.op_type == "ReduceMean":
            cand = _decomposed(node, names[node], shapes)
            if cand is not None:
                found.append(cand)
    return found


def find_in_functions(model: ir.Model, names: dict[ir.Node, str]) -> list[LnCandidate]:
    """LNs inside model-local functions: reported, not folded (a function body is shared by
    every call, and its constants by every caller)."""
    found = []
    for function in model.functions.values():
        for node in ir.traversal.RecursiveGraphIterator(function):
            if node.op_type in ("LayerNormalization", "SkipLayerNormalization"):
                name = f"{function.name}/{node.name or node.op_type}"
                cand = LnCandidate(LAYER_NORM, node, name, node.outputs[0], None, None, None, 0.0)
                cand.form_problem = Blocked(
                    "in-function",
                    f"it is inside model-local function '{function.domain}::{function.name}'; inline "
                    "functions first (onnx.inliner.inline_local_functions) to fold it",
                )
                found.append(cand)
    return found
