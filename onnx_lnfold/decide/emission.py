"""What a folded LN writes, as data: the nodes of its RMSNorm (one op, or the `primitive` target's
six), the Add of beta where beta stays one, and each linear consumer's share of beta
(docs/DESIGN.md section 4). `decide.targets.choose_rewrite` makes one `Emission` per rewrite;
`apply.rewrite` builds the nodes from it and the check's read-back (`verify.readback`) reads the
written file back against it, so that neither derives on its own what a fold writes.

The record is bound to the model it was planned on. What an emitted node reads (`Source`) is an
input slot of the original graph (read when the rewrite runs: an earlier rewrite may have replaced
the tensor in it), a tensor of the original (gamma, beta), a constant the rewrite creates
(`Filled`, its values given), a ReduceMean's axes (`Axes`), or an output of an earlier node of the
record (`Produced`). Names are stems that `core.names.fresh_name` makes unique when the nodes are
built, except where an output takes an original tensor's name and readers (`Output.takes`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import onnx_ir as ir

from onnx_lnfold.core.ops import ONNX_RMS_NORM, PRIMITIVE_OPS, PRIMITIVE_RMS, RMS_NORM, SKIP_RMS_NORM, NormOp
from onnx_lnfold.forms import LnCandidate, RewriteSite
from onnx_lnfold.forms.base import Slot

# What a folded LN becomes (`Rewrite.op`, the plan's `LnDecision.rewrite`), by target.
RMS_OP = RMS_NORM.qualified
SKIP_RMS_OP = SKIP_RMS_NORM.qualified
ONNX_RMS_OP = ONNX_RMS_NORM.qualified
PRIMITIVE_RMS_OP = PRIMITIVE_RMS


@dataclass(frozen=True)
class Filled:
    """A constant the rewrite creates, every entry `value`: the scale of ones of an LN written
    without gamma, the primitive form's 2 and epsilon."""

    stem: str
    value: float
    shape: tuple[int, ...]
    dtype: ir.DataType

    def array(self) -> np.ndarray:
        return np.full(self.shape, self.value, dtype=self.dtype.numpy())


@dataclass(frozen=True)
class Axes:
    """A ReduceMean's axes: an int64 input named from `stem` from opset 18, an attribute before."""

    values: tuple[int, ...]
    stem: str


@dataclass(frozen=True)
class Produced:
    """Output `output` of node `node` (its index in `Emission.nodes`) of the same record."""

    node: int
    output: int = 0


# What an emitted node reads; None: an optional input left out.
Source = Slot | ir.Value | Filled | Axes | Produced | None


@dataclass(frozen=True)
class Output:
    """A tensor an emitted node computes: declared as the model declares `like` (where it declares
    no type, of `dtype`), or without `like` of `dtype` and shape `dims` (None: unknown)."""

    stem: str | None  # None: not computed, left unnamed (a Skip op's mean and inverse deviation)
    like: ir.Value | None = None
    dtype: ir.DataType | None = None
    dims: tuple | None = None
    takes: ir.Value | None = None  # the original tensor whose name and readers it takes over


@dataclass(frozen=True)
class EmittedNode:
    op: NormOp | str  # the normalization op, or a standard op's type
    inputs: tuple[Source, ...]
    outputs: tuple[Output, ...]
    stem: str  # the node's name before `fresh_name`
    attributes: tuple[ir.Attr, ...] = ()
    adds_beta: bool = False  # the Add of beta after the RMSNorm, not part of it

    @property
    def op_type(self) -> str:
        return self.op if isinstance(self.op, str) else self.op.op_type

    @property
    def domain(self) -> str:
        return "" if isinstance(self.op, str) else self.op.domain


@dataclass(frozen=True)
class BiasShare:
    """One linear consumer's share of beta, `scale * (beta @ W)` (W.T with `trans`; beta a row of
    `rows` entries), where it goes: added to the bias at `slot` ("bias"), a bias created as the
    consumer's input `slot` (a Gemm's C, "new_input"), or one created in an Add after the MatMul
    (`slot` None, "new_add"). A Gemm computes `alpha * (A @ B) + beta_g * C`: `scale` is
    alpha / beta_g."""

    consumer: ir.Node
    how: Literal["bias", "new_input", "new_add"]
    slot: Slot | None
    trans: bool
    scale: float
    rows: int
    stem: str | None = None  # a created bias's name before `fresh_name`


@dataclass(frozen=True)
class Emission:
    """Everything one folded LN writes: `nodes` in the order they go in (the last computes the LN's
    output), and the shares of beta its consumers' biases take."""

    nodes: tuple[EmittedNode, ...]
    shares: tuple[BiasShare, ...] = ()


def _scale(cand: LnCandidate) -> ir.Value | Filled:
    """The RMSNorm scale: gamma, or ones for a decomposed LN written without one."""
    if cand.scale is not None:
        return cand.scale
    dim, dtype = cand.ones_scale  # type: ignore[misc]
    return Filled(f"{cand.name}.scale", 1.0, (dim,), dtype)


def _rms(cand: LnCandidate, op: str, site: RewriteSite, y: Output, sum_: Output | None) -> list[EmittedNode]:
    """SimplifiedLayerNormalization (or RMSNormalization, same inputs and attributes). Every
    folded LN normalizes its last axis (the forms keep the others), written -1 as exporters write it:
    OpenVINO cannot read a SimplifiedLayerNormalization whose axis is written non-negative (its
    translator builds Range(axis, rank) with the rank as a 1-D shape and refuses the model; the
    version measured: docs/DESIGN.md section 4)."""
    attributes = (ir.AttrInt64("axis", -1), ir.AttrFloat32("epsilon", cand.epsilon), ir.AttrInt64("stash_type", 1))
    norm = ONNX_RMS_NORM if op == ONNX_RMS_OP else RMS_NORM
    return [EmittedNode(norm, (*site.inputs, _scale(cand)), (y,), f"{cand.name}/rms", attributes)]


def _skip_rms(cand: LnCandidate, op: str, site: RewriteSite, y: Output, sum_: Output | None) -> list[EmittedNode]:
    """com.microsoft::SkipSimplifiedLayerNormalization: input + skip (+ bias), normalized; its
    output 3 takes over the residual sum where anything else reads it (outputs 1 and 2, the mean
    and inverse deviation, are not computed)."""
    inputs = (*site.inputs, _scale(cand), *((site.skip_bias,) if site.skip_bias is not None else ()))
    outputs = (y,) if sum_ is None else (y, Output(None), Output(None), sum_)
    attributes = (ir.AttrFloat32("epsilon", cand.epsilon),)
    return [EmittedNode(SKIP_RMS_NORM, inputs, outputs, f"{cand.name}/skip_rms", attributes)]


def _primitive(cand: LnCandidate, op: str, site: RewriteSite, y: Output, sum_: Output | None) -> list[EmittedNode]:
    """RMSNorm as standard ops, in the form ONNX Runtime's and OpenVINO's RMSNorm fusions both
    recognize (`core.ops.PRIMITIVE_OPS`): `Pow(x, 2)`, `ReduceMean` over the last axis (keepdims),
    `Add(epsilon)`, `Sqrt`, `Div(x, .)`, `Mul(., gamma)`. The constants are of x's type (valid at
    every opset since Pow-7) and scalars; each intermediate is read by the next op alone. A gamma
    of ones keeps its `Mul`: ONNX Runtime's SimplifiedLayerNormFusion needs it (docs/DESIGN.md
    section 2.5)."""
    pow_, reduce_mean, add, sqrt, div, mul = PRIMITIVE_OPS
    (x,) = site.inputs
    read = x[0].inputs[x[1]]
    shape = tuple(cand.out.shape) if cand.out.shape is not None else None
    dtype = y.dtype or (read.type.dtype if read is not None and read.type is not None else ir.DataType.FLOAT)
    rows = (*shape[:-1], 1) if shape is not None else None
    base = cand.name

    def tensor(what: str, dims) -> Output:
        return Output(f"{base}/{what}", dtype=dtype, dims=dims)

    def node(op: str, what: str, inputs: tuple, output: Output, attributes: tuple = ()) -> EmittedNode:
        return EmittedNode(op, inputs, (output,), f"{base}/rms_{what}", attributes)

    return [
        node(pow_, "square", (x, Filled(f"{base}.two", 2.0, (), dtype)), tensor("squares", shape)),
        node(
            reduce_mean,
            "mean",
            (Produced(0), Axes((-1,), f"{base}.axes")),
            tensor("mean_square", rows),
            (ir.AttrInt64("keepdims", 1),),
        ),
        node(
            add,
            "add_eps",
            (Produced(1), Filled(f"{base}.epsilon", cand.epsilon, (), dtype)),
            tensor("mean_square_eps", rows),
        ),
        node(sqrt, "sqrt", (Produced(2),), tensor("rms", rows)),
        node(div, "div", (x, Produced(3)), tensor("normalized", shape)),
        node(mul, "scale", (Produced(4), _scale(cand)), y),
    ]


# The op a target writes -> the function that writes down its nodes (a new target op adds its own here).
EMITTERS = {RMS_OP: _rms, ONNX_RMS_OP: _rms, SKIP_RMS_OP: _skip_rms, PRIMITIVE_RMS_OP: _primitive}


def emission_for(
    cand: LnCandidate,
    op: str,
    site: RewriteSite,
    replaced: set[ir.Node],
    beta_add: bool,
    shares: tuple[BiasShare, ...],
    out_dtype: ir.DataType | None,
    centered: frozenset[str] = frozenset(),
) -> Emission:
    """What the fold of `cand` into `op` at `site` writes: the op's nodes, replacing `replaced`;
    with `beta_add`, beta as an Add over their output; `shares`: beta in its consumers' biases.
    `centered`: the tensors the plan centers explicitly, whose centering nodes read them too (a
    residual sum one of them reads is kept as a Skip op's output 3)."""
    out = cand.out
    y = Output(f"{out.name}.rms", like=out, dtype=out_dtype, takes=None if beta_add else out)
    old_sum = site.old_sum
    keep_sum = old_sum is not None and (
        old_sum.is_graph_output() or old_sum.name in centered or any(n not in replaced for n, _ in old_sum.uses())
    )
    sum_ = Output(f"{old_sum.name}.sum", like=old_sum, takes=old_sum) if keep_sum else None  # type: ignore[union-attr]
    nodes = EMITTERS[op](cand, op, site, y, sum_)
    if beta_add:
        final = Output(f"{out.name}.beta", like=out, dtype=out_dtype, takes=out)
        beta = EmittedNode("Add", (Produced(len(nodes) - 1), cand.bias), (final,), f"{cand.name}/beta", adds_beta=True)
        nodes.append(beta)
    return Emission(tuple(nodes), shares)
