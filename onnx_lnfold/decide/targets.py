"""What a folded LN becomes, and whether that pays (docs/DESIGN.md section 4). Pure: decides,
mutates nothing.

- target "ort" (default): `SimplifiedLayerNormalization` (domain ''), with the residual `Add` left
  as it is (ONNX Runtime's CPU EP runs `Add + SimplifiedLayerNormalization` for less than its fused
  kernel), or `com.microsoft::SkipSimplifiedLayerNormalization` for `SkipLayerNormalization` inputs
  and where `--fuse-residual` asks;
- target "onnx": the standard `RMSNormalization` (opset 23; an older model is converted first,
  `load.opset`);
- target "primitive": RMSNorm as `Pow -> ReduceMean -> Add -> Sqrt -> Div -> Mul` (`core.ops.PRIMITIVE_OPS`),
  standard ops at any opset, which ONNX Runtime (ORT_ENABLE_EXTENDED and up) fuses back into
  `SimplifiedLayerNormalization` and OpenVINO's CPU plugin into its RMS node.

What each writes, node by node, is the rewrite's `emission` (`decide.emission`).

`beta` goes where it costs nothing (`beta_placement`): the consumers' biases, a key projection's
share dropped where the attention's Softmax removes it (`decide.softmax_shift`), a bias created where
that costs less than the Add; else it stays an explicit `Add`. `cost_refusal` keeps an LN whose
fold would cost ONNX Runtime more than the LN, by the measured costs of `decide.costs`.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx_ir as ir

from onnx_lnfold.core.blocked import Blocked
from onnx_lnfold.core.ir import constant_of, is_standard, node_label, reads_only_shape
from onnx_lnfold.core.ops import LAYER_NORM, PRIMITIVE_TARGET, RMS_NORM, SKIP_LAYER_NORM, SKIP_RMS_NORM
from onnx_lnfold.core.options import FoldOptions
from onnx_lnfold.core.quantized import bias_taken_in
from onnx_lnfold.core.values import is_zero
from onnx_lnfold.decide.costs import LAYOUT_WORDS, NARROWEST, Comparison, Pricing, Saving, default_pricing, table_for
from onnx_lnfold.decide.emission import (
    ONNX_RMS_OP,
    PRIMITIVE_RMS_OP,
    RMS_OP,
    SKIP_RMS_OP,
    BiasShare,
    Emission,
    emission_for,
)
from onnx_lnfold.decide.pricing import pricing_for
from onnx_lnfold.decide.softmax_shift import softmax_removes
from onnx_lnfold.forms import LnCandidate, LnKind, RewriteSite
from onnx_lnfold.shapes.table import ShapeTable, dims_equal


@dataclass(frozen=True)
class Rewrite:
    """What one folded LN becomes, bound to the IR objects of the model it was planned on:
    `apply.rewrite` writes its `emission`, which the check's read-back reads the written file back
    against (the plan reports `op`, `beta` and the residual Add's name)."""

    cand: LnCandidate  # the LN replaced: its nodes, output, gamma and beta
    op: str  # RMS_OP, SKIP_RMS_OP, ONNX_RMS_OP or PRIMITIVE_RMS_OP
    site: RewriteSite  # what the op reads besides its scale, and where it goes
    residual_add: ir.Node | None  # the Add folded into a SkipSimplifiedLayerNormalization
    taken_in: tuple[ir.Node, ...]  # nodes outside the LN the op replaces too (that Add, a bias Add)
    beta: BetaPlacement  # where beta goes
    out_dtype: ir.DataType | None  # the LN output's inferred element type, for new tensors where the model declares none
    pricing: Pricing  # the cost table and the token count this LN's fold is judged at
    emission: Emission  # every node and bias share the fold writes

    @property
    def replaced(self) -> set[ir.Node]:
        """Every node the emitted op takes the place of."""
        return set(self.cand.nodes) | set(self.taken_in)


def _residual_add(
    cand: LnCandidate, shapes: ShapeTable, claimed: set[ir.Node], mode: str, pricing: Pricing
) -> ir.Node | None:
    """The residual Add feeding `cand`, if it should become SkipSimplifiedLayerNormalization's sum:
    with "always" any it can take; with "auto" one ONNX Runtime fuses in the original, and only
    where the fused op costs less than `Add + SimplifiedLayerNormalization` (never on CPU:
    `decide.costs.Pricing.fused_residual_pays`)."""
    if mode == "never":
        return None
    add = _skip_able_add(cand, shapes)
    if add is None or add in claimed:
        return None
    if mode == "auto" and not (ort_fuses_residual(cand, shapes) and pricing.fused_residual_pays(ln_width(cand, shapes))):
        return None
    return add


def _skip_able_add(cand: LnCandidate, shapes: ShapeTable) -> ir.Node | None:
    """The residual Add feeding `cand` that a SkipSimplifiedLayerNormalization could take in."""
    if shapes.dtype(cand.x) not in (ir.DataType.FLOAT, ir.DataType.FLOAT16):
        return None  # the only types ONNX Runtime's CPU and CUDA kernels take
    add = cand.x.producer()
    if add is None or add.op_type != "Add" or not is_standard(add):
        return None
    if add.graph is not cand.node.graph:
        return None  # an outer graph's sum, read by an If/Loop body's LN: the Skip op cannot take it in
    if len(add.inputs) != 2 or any(v is None or constant_of(v) is not None for v in add.inputs):
        return None  # a bias Add, not a residual
    a, b = (shapes.shape(v) for v in add.inputs)
    if a is None or b is None or len(a) != len(b) or len(a) not in (2, 3) or not isinstance(a[-1], int):
        return None
    if not all(dims_equal(p, q) for p, q in zip(a, b)):
        return None
    scale = constant_of(cand.scale)
    if scale is None or tuple(scale.shape.dims) != (a[-1],):
        return None  # the Skip kernels take a gamma of the hidden size only, not a broadcast [1]
    return add


def ort_fuses_residual(cand: LnCandidate, shapes: ShapeTable) -> bool:
    """Whether ONNX Runtime fuses the original's `Add + LayerNormalization` into
    SkipLayerNormalization at session start (onnxruntime/core/optimizer/skip_layer_norm_fusion.cc:
    3-D addends of one shape, every dim a value or a name both share as ORT's own shape inference
    sees them, the Add read by the LN alone and not a graph output)."""
    if cand.kind is not LnKind.LAYER_NORM:
        return False  # a Skip form is fused already; ORT fuses no other form with its Add
    add = _skip_able_add(cand, shapes)
    if add is None:
        return False
    out = add.outputs[0]
    if len(out.uses()) != 1 or out.is_graph_output():
        return False
    seen = [shapes.session_shape(v) for v in add.inputs]  # what ORT's own inference knows
    if any(s is None or len(s) != 3 for s in seen):
        return False
    return all(a is not None and a == b for a, b in zip(*seen))  # every dim named, and alike


def ln_width(cand: LnCandidate, shapes: ShapeTable) -> int | None:
    """The length of the normalized axis, from the input's shape or gamma's."""
    shape = shapes.shape(cand.x) if cand.x is not None else None
    if shape and isinstance(shape[-1], int):
        return shape[-1]
    scale = constant_of(cand.scale)
    if scale is not None and len(scale.shape) == 1 and scale.shape[0] > 1:
        return int(scale.shape[0])
    return cand.ones_scale[0] if cand.ones_scale else None


def _bias_add(residual: ir.Node, shapes: ShapeTable) -> ir.Node | None:
    """An `Add(x, bias)` feeding the residual Add that the fused op can take as its `bias` input
    (what ORT's own SkipLayerNormalization fusion absorbs too): a 1-D constant over the last axis,
    read by nothing else."""
    for value in residual.inputs:
        node = value.producer() if value is not None else None
        if node is None or node.op_type != "Add" or len(node.inputs) != 2 or len(value.uses()) != 1:
            continue
        if value.is_graph_output():
            continue
        for k in (0, 1):
            bias, other = node.inputs[k], node.inputs[1 - k]
            tensor = constant_of(bias)
            other_shape = shapes.shape(other)
            if (
                tensor is not None
                and len(tensor.shape) == 1
                and other_shape is not None
                and other_shape == shapes.shape(value)
                and other_shape[-1] == tensor.shape[0]
                and constant_of(other) is None
            ):
                return node
    return None


def _linear_consumers(value: ir.Value, shapes: ShapeTable, depth: int = 0) -> list[ir.Node] | str:
    """The linear layers (MatMul, Gemm with a constant 2-D weight) `value` feeds, looking through
    reshapes that keep the last axis (GPT-2's `Reshape -> Gemm`) and Identity nodes (exports
    cleaned up for other runtimes keep them); else why not, in words."""
    found = []
    for node, index in value.uses():
        if reads_only_shape(node):
            continue  # reads only the shape, which beta does not change
        if node.op_type in ("Reshape", "Flatten", "Identity") and is_standard(node) and index == 0 and depth < 3:
            src, dst = shapes.shape(value), shapes.shape(node.outputs[0])
            keeps = node.op_type == "Identity" or (
                src is not None and dst is not None and isinstance(src[-1], int) and src[-1] == dst[-1]
            )
            if not keeps:
                return f"{node_label(node)} does not keep the last axis"
            if node.outputs[0].is_graph_output():
                return f"'{node.outputs[0].name}' is a graph output"
            inner = _linear_consumers(node.outputs[0], shapes, depth + 1)
            if isinstance(inner, str):
                return inner
            found += inner
            continue
        if index != 0 or not _is_linear(node):
            return f"{node_label(node)} reads it"
        found.append(node)
    return found


# Ops after a MatMul that add a constant bias to it: (op, domain) -> index of the bias input.
_BIAS_FOLLOWERS = {("Add", ""): None, ("FastGelu", "com.microsoft"): 1, ("BiasGelu", "com.microsoft"): 1}


def bias_slot(matmul: ir.Node) -> tuple[ir.Node, int] | None:
    """The (node, input index) of the constant bias added to a MatMul's output, if there is one."""
    out = matmul.outputs[0]
    if out.is_graph_output() or len(out.uses()) != 1:
        return None
    follower, index = out.uses()[0]
    key = (follower.op_type, follower.domain if follower.domain != "ai.onnx" else "")
    if key not in _BIAS_FOLLOWERS or len(follower.inputs) != 2:
        return None
    slot = _BIAS_FOLLOWERS[key]
    if slot is None:  # Add: the bias is whichever input the MatMul is not
        slot = 1 - index
    elif index != 0:
        return None
    weight = constant_of(matmul.inputs[1])
    bias = constant_of(follower.inputs[slot])
    if weight is None or bias is None or tuple(bias.shape.dims) not in ((weight.shape[1],), (1, weight.shape[1])):
        return None
    return follower, slot


def _is_linear(node: ir.Node) -> bool:
    """A MatMul or Gemm (transA=0) with a constant 2-D weight: `beta @ W` is one row of its output."""
    weight = constant_of(node.inputs[1]) if len(node.inputs) > 1 else None
    if weight is None or len(weight.shape) != 2 or not is_standard(node):
        return False
    if node.op_type == "Gemm":  # one that ignores C (beta 0), or whose C is not a row, takes no bias
        if node.attributes.get_int("transA", 0) or node.attributes.get_float("beta", 1.0) == 0.0:
            return False
        return len(node.inputs) < 3 or node.inputs[2] is None or has_bias(node)
    return node.op_type == "MatMul"


def has_bias(node: ir.Node) -> bool:
    """A linear layer whose existing constant bias can absorb `beta @ W` at no cost."""
    if node.op_type == "MatMul":
        return bias_slot(node) is not None
    if len(node.inputs) < 3 or node.inputs[2] is None:
        return False  # a Gemm without C: a bias would be created
    bias = constant_of(node.inputs[2])
    weight = constant_of(node.inputs[1])
    n = weight.shape[0] if node.attributes.get_int("transB", 0) else weight.shape[1]  # type: ignore[union-attr]
    # beta @ W is a row of N: the bias must be one too (not a scalar or an [M, N] block).
    return bias is not None and tuple(bias.shape.dims) in ((n,), (1, n))


def output_width(node: ir.Node) -> int:
    weight = constant_of(node.inputs[1])
    trans = node.op_type == "Gemm" and node.attributes.get_int("transB", 0)
    return int(weight.shape[0] if trans else weight.shape[1])  # type: ignore[union-attr]


@dataclass(frozen=True)
class BetaSite:
    """Where one linear consumer's share of beta (`beta @ W`) goes."""

    node: ir.Node
    how: str  # "bias": added to its bias; "created": a bias made for it; "softmax": dropped (the
    # attention's Softmax removes it: _softmax_shift)

    def describe(self, names: dict[ir.Node, str]) -> str:
        return f"{names.get(self.node, self.node.name)}: {BETA_SITE_WORDS[self.how]}"


BETA_SITE_WORDS = {
    "bias": "its bias",
    "created": "a bias created for it",
    "softmax": "dropped, the Softmax over the keys removes it",
}


# Why a folded LN writes no beta although it has a beta input.
ZERO_BETA = "beta is all zero"


@dataclass(frozen=True)
class BetaPlacement:
    how: str  # "none", "add" or "consumers"
    sites: tuple[BetaSite, ...] = ()
    # Why beta stays an Add over the LN output ("add"), or why a consumer gets a bias created for
    # it ("consumers" with a "created" site).
    why: str | None = None


def beta_placement(cand: LnCandidate, shapes: ShapeTable, pricing: Pricing | None = None) -> BetaPlacement:
    """Where a folded LN's beta goes (docs/DESIGN.md section 4): nowhere ('none'), into its
    consumers ('consumers': every consumer a linear layer whose bias takes `beta @ W`, whose share
    an attention's Softmax removes, or, where that costs less than the Add, that gets a bias
    created), else an explicit 'add' after the RMSNorm."""
    if cand.bias is None:
        return BetaPlacement("none")
    if is_zero(cand.bias):  # LayerNorm(bias=False) as TorchScript writes it: no beta at all
        return BetaPlacement("none", why=ZERO_BETA)
    out = cand.out
    if constant_of(cand.bias) is None:
        return BetaPlacement("add", why="beta is not a constant")
    if out.is_graph_output():
        return BetaPlacement("add", why=f"the LN's output '{out.name}' is a graph output")
    if not out.uses():
        return BetaPlacement("add", why="nothing reads the LN's output")
    if len(shapes.shape(cand.bias) or ()) > 1:
        return BetaPlacement("add", why="beta is broadcast over more than the normalized axis")
    consumers = _linear_consumers(out, shapes)
    if isinstance(consumers, str):
        return BetaPlacement("add", why=consumers)
    if not consumers:
        return BetaPlacement("add", why="only shapes are read")
    sites, refusals = [], []
    for node in consumers:
        if has_bias(node):
            sites.append(BetaSite(node, "bias"))
            continue
        refusal = softmax_removes(node, shapes)
        if refusal is None:
            sites.append(BetaSite(node, "softmax"))
        else:
            sites.append(BetaSite(node, "created"))
            refusals.append(f"{node_label(node)} has no bias, and its share cannot be dropped: {refusal}")
    created = [site.node for site in sites if site.how == "created"]
    pricing = pricing or default_pricing()
    if created and not pricing.created_bias_pays([output_width(n) for n in created], ln_width(cand, shapes)):
        return BetaPlacement("add", why="; ".join(refusals) + " (a created bias costs more than the Add)")
    return BetaPlacement("consumers", tuple(sites), "; ".join(refusals) or None)


def _residual_site(add: ir.Node, bias_add: ir.Node | None) -> RewriteSite:
    """SkipSimplifiedLayerNormalization in place of `add` (and of the `bias_add` feeding it, whose
    constant becomes the op's bias input): it reads the addends, and its output 3 is the sum."""
    inputs = [(add, 0), (add, 1)]
    bias = None
    if bias_add is not None:  # x + bias + skip
        slot = 0 if add.inputs[0] is bias_add.outputs[0] else 1
        is_const = [constant_of(v) is not None for v in bias_add.inputs]
        inputs[slot] = (bias_add, is_const.index(False))
        bias = (bias_add, is_const.index(True))
    return RewriteSite(tuple(inputs), bias, add.outputs[0], add)


def bias_share(site: BetaSite) -> BiasShare | None:
    """Where a linear consumer's share of beta goes, as the rewrite writes it (None: dropped, the
    attention's Softmax removes it)."""
    if site.how == "softmax":
        return None
    node = site.node
    weight = constant_of(node.inputs[1])
    assert weight is not None
    if node.op_type != "Gemm":
        rows = int(weight.shape[0])
        if site.how == "created":
            return BiasShare(node, "new_add", None, False, 1.0, rows, f"{node.name or 'matmul'}.bias_from_beta")
        slot = bias_slot(node)
        assert slot is not None, node.name
        return BiasShare(node, "bias", slot, False, 1.0, rows)
    attrs = node.attributes
    trans = bool(attrs.get_int("transB", 0))
    scale = attrs.get_float("alpha", 1.0) / attrs.get_float("beta", 1.0)  # Gemm computes alpha * (A @ B) + beta_g * C
    rows = int(weight.shape[1] if trans else weight.shape[0])
    if len(node.inputs) > 2 and node.inputs[2] is not None:
        return BiasShare(node, "bias", (node, 2), trans, scale, rows)
    return BiasShare(node, "new_input", (node, 2), trans, scale, rows, f"{node.name or 'gemm'}.bias_from_beta")


def choose_rewrite(
    cand: LnCandidate,
    options: FoldOptions,
    shapes: ShapeTable,
    claimed: set[ir.Node],
    centered: frozenset[str] = frozenset(),
    centered_input: frozenset[str] = frozenset(),
) -> Rewrite:
    """What `cand` becomes; `claimed` holds the residual Adds earlier LNs took in, `centered` the
    tensors the plan centers explicitly (their centerings read them: `emission_for`), and
    `centered_input` those centered for `cand` itself: a residual sum among them stays an Add, since
    a SkipSimplifiedLayerNormalization would normalize the sum uncentered."""
    pricing = pricing_for(cand, shapes, table_for(options))
    beta = beta_placement(cand, shapes, pricing)
    out_dtype = shapes.dtype(cand.out)
    shares = tuple(s for s in map(bias_share, beta.sites) if s is not None) if beta.how == "consumers" else ()

    def rewrite(op: str, site: RewriteSite, add: ir.Node | None = None, taken_in: tuple = ()) -> Rewrite:
        replaced = set(cand.nodes) | set(taken_in)
        emission = emission_for(cand, op, site, replaced, beta.how == "add", shares, out_dtype, centered)
        return Rewrite(cand, op, site, add, taken_in, beta, out_dtype, pricing, emission)

    if cand.form.has_skip:
        return rewrite(SKIP_RMS_OP, cand.form.site(cand))
    if options.target == "onnx":
        return rewrite(ONNX_RMS_OP, cand.form.site(cand))
    if options.target == PRIMITIVE_TARGET:
        return rewrite(PRIMITIVE_RMS_OP, cand.form.site(cand))
    add = _residual_add(cand, shapes, claimed, options.fuse_residual, pricing)
    if add is not None and add.outputs[0].name in centered_input:
        add = None
    if add is None:
        return rewrite(RMS_OP, cand.form.site(cand))
    claimed.add(add)
    bias_add = _bias_add(add, shapes)
    taken_in = (add,) if bias_add is None else (add, bias_add)
    return rewrite(SKIP_RMS_OP, _residual_site(add, bias_add), add, taken_in)


# How a reason names each kind of node the cost rule counts (`decide.costs.KINDS`).
NODE_WORDS = {
    **{op.op_type: op.described for op in (LAYER_NORM, SKIP_LAYER_NORM, RMS_NORM, SKIP_RMS_NORM)},
    "Add": "the residual Add",
    "BiasAdd": "an Add of beta",
    "Centering": "an explicit centering (ReduceMean + Sub)",
    **LAYOUT_WORDS,
}


# The input types the primitive form is written in (in the input's own type, as ORT's fusion and
# OpenVINO's read it).
_PRIMITIVE_TYPES = frozenset({ir.DataType.FLOAT, ir.DataType.DOUBLE})


def target_refusal(cand: LnCandidate, options: FoldOptions, shapes: ShapeTable) -> Blocked | None:
    """Why the target cannot write this LN's RMSNorm exactly, or None. `primitive` writes it in the
    input's type: in fp16 or bf16 its squares overflow above 256 (fp16) and its epsilon rounds
    (1e-5 is 1.0014e-05 in fp16), where LayerNormalization computes in float32 (stash_type 1)."""
    if options.target != PRIMITIVE_TARGET or cand.form.has_skip:
        return None  # a Skip LN becomes SkipSimplifiedLayerNormalization: the model is ONNX Runtime's already
    dtype = shapes.dtype(cand.x)
    if dtype is None or dtype in _PRIMITIVE_TYPES:
        return None
    kind = dtype.name.lower()
    return Blocked(
        "no-target-form",
        f"--target primitive writes RMSNorm in its input's type, and this LN's is {kind}: its squares would overflow "
        f"and its epsilon round there, where LayerNormalization computes in float32; --target ort or onnx fold it",
        detail=f"input {kind}",
    )


def cost_nodes(rewrite: Rewrite, shapes: ShapeTable) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """(original, emitted): the nodes ONNX Runtime's CPU EP runs for this LN before and after
    the fold, each as (kind of `decide.costs.KINDS`, width). The primitive form (`PRIMITIVE_RMS_OP`) is
    the SimplifiedLayerNormalization ONNX Runtime fuses it into at ORT_ENABLE_EXTENDED and up: its
    optimized graph is the default target's, node for node (tests/apply/test_primitive.py), so it
    costs what that costs. The original's `Add + LayerNormalization`
    counts as the SkipLayerNormalization ORT fuses it into (with the bias Add before it, which
    ORT takes in too); a residual Add that runs in both models is left out of both."""
    original, emitted = described_nodes(rewrite, shapes)
    return [(kind, d) for kind, d, _ in original], [(kind, d) for kind, d, _ in emitted]


def described_nodes(
    rewrite: Rewrite, shapes: ShapeTable
) -> tuple[list[tuple[str, int, str]], list[tuple[str, int, str]]]:
    """`cost_nodes`, each node with the words a reason names it by (an Add of beta, the projection's
    bias Add ORT had taken in)."""
    cand = rewrite.cand
    d = ln_width(cand, shapes) or NARROWEST  # unknown: where the fixed costs weigh most
    fused = cand.form.has_skip or ort_fuses_residual(cand, shapes)
    original = [(SKIP_LAYER_NORM.op_type if fused else LAYER_NORM.op_type, d)]
    emitted: list[tuple[str, int, str]] = []
    if rewrite.op == SKIP_RMS_OP:
        emitted.append((SKIP_RMS_NORM.op_type, d, NODE_WORDS[SKIP_RMS_NORM.op_type]))
    elif fused:
        emitted += [("Add", d, NODE_WORDS["Add"]), (RMS_NORM.op_type, d, NODE_WORDS[RMS_NORM.op_type])]
        bias = None if cand.form.has_skip else _bias_add(cand.x.producer(), shapes)
        if bias is not None and not bias_taken_in(bias):  # ORT had taken it in too; a quantized matmul takes it still
            emitted.append(("BiasAdd", d, "the projection's bias Add"))
    else:
        emitted.append((RMS_NORM.op_type, d, NODE_WORDS[RMS_NORM.op_type]))
    if rewrite.beta.how == "add":
        emitted.append(("BiasAdd", d, NODE_WORDS["BiasAdd"]))
    emitted += [
        ("BiasAdd", output_width(site.node), f"an Add of the bias created for {node_label(site.node)}")
        for site in rewrite.beta.sites
        if site.how == "created"
    ]
    # As ONNX Runtime runs them, where known (`Pricing.as_run` keeps the emitted nodes in order and
    # appends the Transposes the layout brings back): what it adds is named by its kind.
    run_original, run_emitted = rewrite.pricing.as_run(original, [(kind, w) for kind, w, _ in emitted])
    words = [word for _, _, word in emitted]
    return (
        [(kind, w, NODE_WORDS[kind]) for kind, w in run_original],
        [(kind, w, words[i] if i < len(words) else NODE_WORDS[kind]) for i, (kind, w) in enumerate(run_emitted)],
    )


def once_centered(constants: int, then: str = "") -> str:
    """`once 2 constants are centered and 'x' is inserted`: what makes an LN's input zero-mean, in
    words (no count where no constant is centered: `once 'x' is inserted`)."""
    parts = [f"{constants} constant{' is' if constants == 1 else 's are'} centered"] if constants else []
    parts += [then] if then else []
    return "once " + " and ".join(parts) if parts else "as the graph computes it"


@dataclass(frozen=True)
class CenteringSite:
    """An explicit centering as a reason names it: the tensor written, the axis, its cost kind
    ("Centering", or "StridedCentering" over a non-last axis: `decide.pricing.centering_kind`)."""

    tensor: str
    axis: int
    kind: str = "Centering"

    @property
    def words(self) -> str:
        text = f"'{self.tensor}' - ReduceMean over axis {self.axis}"
        if self.kind == "StridedCentering":
            text += " (ONNX Runtime runs it over a non-last axis: a strided reduction)"
        return text


def centering_refusal(
    own: list[CenteringSite], sites: list[CenteringSite], lns: int, savings: list[Saving], constants: int
) -> Blocked:
    """Why an LN that folds once `own` are centered explicitly stays: `sites`, every centering the
    `lns` LNs that fold with it need (its own among them, each counted once), do not cost less
    together than those LNs save together (`savings`, by their pricing) by more than the figures'
    spread (docs/DESIGN.md section 2.3); `constants`: what this LN's proof centers besides. Costs
    more: code "centering-costs-more"; within the spread: "cost-unresolved". The detail, the same
    for every LN of those centerings, is what the report groups them under."""
    pricing = savings[0].pricing
    table = pricing.table
    d = next((s.width for s in savings if s.width is not None), None) or NARROWEST
    cost = [(site.kind, d) for site in sites]  # "StridedCentering": over a non-last axis (`decide.pricing.centering_kind`)
    cmp = Comparison(
        pricing.total(cost), sum(s.amount for s in savings), pricing.spread(cost) + sum(s.spread for s in savings)
    )
    figures = f"{table.figure(cmp.emitted)} against {table.figure(cmp.original)} {table.unit_words} {pricing.words}, d={d}"
    mine = " and ".join(site.words for site in own)
    every = " and ".join(site.words for site in sites)
    proof = (
        f"kept: its input is zero-mean {once_centered(constants, f'{mine} {_is_are(own)} inserted')} "
        f"({'an explicit centering' if len(own) == 1 else 'explicit centerings'})"
    )
    unlocks = f"{lns} LN{'s' * (lns != 1)}"
    if len(sites) == 1:
        centerings, saved = "that centering", f"the {unlocks} it would unlock save"
    elif lns == 1:
        centerings, saved = f"the {len(sites)} centerings it needs", "it saves"
    else:
        centerings, saved = f"the {len(sites)} centerings that the {unlocks} sharing them need", "those LNs save"
    those = f"{centerings} {'costs' if len(sites) == 1 else 'cost'}"
    unlock = "would unlock" if len(sites) == 1 else "would together unlock"
    if cmp.dearer:
        return Blocked(
            "centering-costs-more",
            f"{proof}, and {those} {table.provider_words} more than {saved}: {figures} ({table.source})",
            sites[0].tensor,
            detail=f"{every} {unlock} {unlocks}, and {'costs' if len(sites) == 1 else 'cost'} more than they save: {figures}",
        )
    figures += f", a difference within the figures' spread of {table.figure(cmp.spread)}"
    return Blocked(
        "cost-unresolved",
        f"{proof}, and its cost table cannot tell {centerings} from what {saved} on {table.provider_words} "
        f"({figures}): the never-slower rule inserts only what it shows cheaper ({table.source})",
        sites[0].tensor,
        detail=f"{every} {unlock} {unlocks}, within the spread of what they save: {figures}",
    )


def _is_are(items: list) -> str:
    return "is" if len(items) == 1 else "are"


def _priced_and_named(rewrite: Rewrite, shapes: ShapeTable):
    """`cost_nodes` (original, emitted), and (what the fold runs, what it replaces) as reasons list
    them: every node the cost rule counts (`described_nodes`, read once)."""
    original, emitted = described_nodes(rewrite, shapes)
    priced = [(kind, d) for kind, d, _ in original], [(kind, d) for kind, d, _ in emitted]
    return priced, (" + ".join(word for _, _, word in emitted), " + ".join(word for _, _, word in original))


def beta_add_note(rewrite: Rewrite, shapes: ShapeTable) -> str:
    """Why a fold whose beta stays an Add over the stream runs: what it costs against the original,
    by its pricing's table (or that it was asked for, `--fold-costly`, where the table does not
    show it cheaper)."""
    (original, emitted), (what, before) = _priced_and_named(rewrite, shapes)
    pricing, table = rewrite.pricing, rewrite.pricing.table
    cmp = pricing.compare(emitted, original)
    figures = f"{table.figure(cmp.emitted)} against {table.figure(cmp.original)} {table.unit_words} {pricing.words}"
    if cmp.cheaper:
        return f"it pays: {what} costs less than {before} on {table.provider_words}: {figures}"
    if cmp.dearer:
        return f"folded as asked (--fold-costly), though {what} costs more than {before}: {figures}"
    return f"folded as asked (--fold-costly), though its table cannot tell {what} from {before}: {figures}"


def cost_refusal(rewrite: Rewrite, shapes: ShapeTable) -> Blocked | None:
    """Why folding this LN would not pay, by the measured kernel costs of its pricing's table at the
    tokens it runs at; None when the fold costs less than the LN by more than the table's spread
    (docs/DESIGN.md section 4.1). Costs more: code "costs-more"; the table cannot tell the two
    apart: "cost-unresolved" (the LN stays: never slower)."""
    (original, emitted), (what, before) = _priced_and_named(rewrite, shapes)
    pricing, table = rewrite.pricing, rewrite.pricing.table
    cmp = pricing.compare(emitted, original)
    if cmp.cheaper:
        return None
    d = original[0][1]
    if rewrite.beta.how == "add":
        head = f"kept: its beta would stay a separate Add over the LN's output ({rewrite.beta.why})"
    elif rewrite.beta.how == "consumers" and rewrite.beta.why:
        head = f"kept: beta would need a created bias ({rewrite.beta.why})"
    else:
        head = "kept"
    at = f"{pricing.words}, d={d}"
    if cmp.dearer:
        figures = f"{table.figure(cmp.emitted)} against {table.figure(cmp.original)} {table.unit_words} {at}"
        return Blocked(
            "costs-more",
            f"{head}, and {what} costs more than {before} on {table.provider_words}: {figures} ({table.source})",
            detail=f"{rewrite.beta.why}; {figures}" if rewrite.beta.how != "none" and rewrite.beta.why else figures,
        )
    figures = (
        f"{table.figure(cmp.emitted)} against {table.figure(cmp.original)} {table.unit_words} {at}, "
        f"a difference within the figures' spread of {table.figure(cmp.spread)}"
    )
    return Blocked(
        "cost-unresolved",
        f"{head}: its cost table cannot tell {what} from {before} on {table.provider_words} ({figures}), and the "
        f"never-slower rule folds only what it shows cheaper ({table.source})",
        detail=f"{rewrite.beta.why}; {figures}" if rewrite.beta.how != "none" and rewrite.beta.why else figures,
    )
