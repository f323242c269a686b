"""What a folded LN becomes (docs/DESIGN.md section 4). Pure: decides, mutates nothing.

- target "ort" (default): `SimplifiedLayerNormalization` (domain ''), or
  `com.microsoft::SkipSimplifiedLayerNormalization` where the LN reads a residual `Add` (ONNX
  Runtime fuses `Add + LayerNormalization` at session start but never `Add +
  SimplifiedLayerNormalization`, so without this the fold would lose a fusion the original had)
  and for `SkipLayerNormalization` inputs;
- target "onnx": the standard `RMSNormalization` (opset 23), for models already at opset >= 23.

`beta` goes into the biases of the consumers when they are all linear layers with constant
weights (`bias += beta @ W`), else it stays an explicit `Add`.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx_ir as ir

from onnx_lnfold._forms import LnCandidate, RewriteSite
from onnx_lnfold._ir import constant_of, is_standard, reads_only_shape
from onnx_lnfold._options import FoldOptions
from onnx_lnfold._shapes import ShapeTable, dims_equal

RMS_OP = "SimplifiedLayerNormalization"
SKIP_RMS_OP = "com.microsoft::SkipSimplifiedLayerNormalization"
ONNX_RMS_OP = "RMSNormalization"


@dataclass(frozen=True)
class Rewrite:
    """What one folded LN becomes, bound to the IR objects of the model it was planned on:
    `_rewrite` carries it out, and nothing else needs it (the plan reports `op`, `beta` and the
    residual Add's name)."""

    cand: LnCandidate  # the LN replaced: its nodes, output, gamma and beta
    op: str  # RMS_OP, SKIP_RMS_OP or ONNX_RMS_OP
    site: RewriteSite  # what the op reads besides its scale, and where it goes
    residual_add: ir.Node | None  # the Add folded into a SkipSimplifiedLayerNormalization
    taken_in: tuple[ir.Node, ...]  # nodes outside the LN the op replaces too (that Add, a bias Add)
    beta: str  # "none", "add" or "consumers"
    beta_consumers: tuple[ir.Node, ...]  # the linear layers whose bias absorbs beta
    out_type: tuple  # inferred (shape, dtype) of the LN output, for tensors the model declares none of

    @property
    def replaced(self) -> set[ir.Node]:
        """Every node the emitted op takes the place of."""
        return set(self.cand.nodes) | set(self.taken_in)


def _residual_add(cand: LnCandidate, shapes: ShapeTable, claimed: set[ir.Node], mode: str) -> ir.Node | None:
    """The residual Add feeding `cand`, if it should become SkipSimplifiedLayerNormalization's sum."""
    if mode == "never":
        return None
    if shapes.dtype(cand.x) not in (ir.DataType.FLOAT, ir.DataType.FLOAT16):
        return None  # the only types ONNX Runtime's CPU and CUDA kernels take
    add = cand.x.producer()
    if add is None or add.op_type != "Add" or not is_standard(add) or add in claimed:
        return None
    if len(add.inputs) != 2 or any(v is None or constant_of(v) is not None for v in add.inputs):
        return None  # a bias Add, not a residual
    a, b = (shapes.shape(v) for v in add.inputs)
    if a is None or b is None or len(a) != len(b) or len(a) not in (2, 3) or not isinstance(a[-1], int):
        return None
    if not all(dims_equal(p, q) for p, q in zip(a, b)):
        return None
    if mode == "auto" and (len(a) != 3 or len(add.outputs[0].uses()) != 1 or add.outputs[0].is_graph_output()):
        return None  # ORT would not have fused the original's Add + LayerNormalization here
    scale = constant_of(cand.scale)
    if scale is None or tuple(scale.shape.dims) != (a[-1],):
        return None  # the Skip kernels take a gamma of the hidden size only, not a broadcast [1]
    return add


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


def _linear_consumers(value: ir.Value, shapes: ShapeTable, depth: int = 0) -> list[ir.Node] | None:
    """The linear layers `value` feeds, looking through reshapes that keep the last axis
    (GPT-2's `Reshape -> Gemm`); None if anything else reads it."""
    found = []
    for node, index in value.uses():
        if reads_only_shape(node):
            continue  # reads only the shape, which beta does not change
        if node.op_type in ("Reshape", "Flatten") and index == 0 and depth < 2:
            src, dst = shapes.shape(value), shapes.shape(node.outputs[0])
            if src is None or dst is None or not isinstance(src[-1], int) or src[-1] != dst[-1]:
                return None
            if node.outputs[0].is_graph_output():
                return None
            inner = _linear_consumers(node.outputs[0], shapes, depth + 1)
            if inner is None:
                return None
            found += inner
            continue
        if index != 0 or not _takes_bias(node):
            return None
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


def _takes_bias(node: ir.Node) -> bool:
    """A linear layer with a constant weight whose bias can absorb `beta @ W`."""
    weight = constant_of(node.inputs[1]) if len(node.inputs) > 1 else None
    if weight is None or len(weight.shape) != 2:
        return False
    if node.op_type == "Gemm":
        if node.attributes.get_int("transA", 0):
            return False
        if node.attributes.get_float("beta", 1.0) == 0.0:  # it ignores C: nothing to absorb into
            return False
        if len(node.inputs) < 3 or node.inputs[2] is None:
            return True
        bias = constant_of(node.inputs[2])
        n = weight.shape[0] if node.attributes.get_int("transB", 0) else weight.shape[1]
        # beta @ W is a row of N: the bias must be one too (not a scalar or an [M, N] block).
        return bias is not None and tuple(bias.shape.dims) in ((n,), (1, n))
    return node.op_type == "MatMul" and bias_slot(node) is not None


def beta_placement(cand: LnCandidate, shapes: ShapeTable) -> tuple[str, list[ir.Node]]:
    """Where a folded LN's beta goes: 'none', into the 'consumers' biases, or an explicit 'add'.

    Folding into consumers needs every consumer to be a linear layer with a constant weight whose
    bias we can edit: MatMul followed only by an Add of a constant, or Gemm (transA=0), possibly
    behind reshapes that keep the last axis.
    """
    if cand.bias is None:
        return "none", []
    out = cand.out
    if constant_of(cand.bias) is None or out.is_graph_output() or not out.uses():
        return "add", []
    if len(shapes.shape(cand.bias) or ()) > 1:
        return "add", []  # beta broadcast over more than the normalized axis
    consumers = _linear_consumers(out, shapes)
    if not consumers:
        return "add", []
    return "consumers", consumers


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


def choose_rewrite(cand: LnCandidate, options: FoldOptions, shapes: ShapeTable, claimed: set[ir.Node]) -> Rewrite:
    """What `cand` becomes; `claimed` holds the residual Adds earlier LNs took in."""
    beta, consumers = beta_placement(cand, shapes)
    out_type = (shapes.declarable(shapes.shape(cand.out)), shapes.dtype(cand.out))

    def rewrite(op: str, site: RewriteSite, add: ir.Node | None = None, taken_in: tuple = ()) -> Rewrite:
        return Rewrite(cand, op, site, add, taken_in, beta, tuple(consumers), out_type)

    if cand.form.has_skip:
        return rewrite(SKIP_RMS_OP, cand.form.site(cand))
    if options.target == "onnx":
        return rewrite(ONNX_RMS_OP, cand.form.site(cand))
    add = _residual_add(cand, shapes, claimed, options.fuse_residual)
    if add is None:
        return rewrite(RMS_OP, cand.form.site(cand))
    claimed.add(add)
    bias_add = _bias_add(add, shapes)
    taken_in = (add,) if bias_add is None else (add, bias_add)
    return rewrite(SKIP_RMS_OP, _residual_site(add, bias_add), add, taken_in)
