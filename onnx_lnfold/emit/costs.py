"""What a fold costs ONNX Runtime, against what it replaces (docs/DESIGN.md sections 2.3 and 4).

Every figure is measured: callgrind's instructions per run on ONNX Runtime's CPU EP (one thread,
graph optimizations ALL), by `python -m benchmarks.emission_costs`; the table and how these
figures were fitted are in benchmarks/results/EMISSION_COSTS.md, and a test checks the constants
below against benchmarks/results/emission_costs.json. Each node the fold writes or removes costs
a fixed part (dispatch, allocation) plus a part per element of the [tokens, d] tensor it passes over.
Decisions are taken at the top of the measured range, 8x1024 tokens (`DECIDING_TOKENS`): there
the per-element costs decide, and the normalizations' share of a run is largest. At 16 tokens a
node's fixed cost (dispatch, about 6k instructions) outweighs its work, and a fold that pays at 8192
tokens may cost a few thousand instructions more per run there: a few hundredths of a percent of any
model's run, below what the committed figures resolve.

ONNX Runtime's CPU kernels, read in its sources (onnxruntime/core/providers/cpu/nn/layer_norm_impl.cc,
contrib_ops/cpu/skip_layer_norm.cc): LayerNormalization and SimplifiedLayerNormalization are the
same two loops per row, the simplified one without the `- mean` and `+ beta` of the second; an
Add after it is a whole second pass over the tensor, which costs more than those two operations
save. SkipLayerNormalization (what ORT makes of `Add + LayerNormalization` at session start) and
SkipSimplifiedLayerNormalization are one slower loop that also adds; a separate `Add` (vectorized)
followed by SimplifiedLayerNormalization costs less than either.

On CUDA (not measured here) each of these kernels is one memory-bound pass: SimplifiedLN saves
arithmetic but no bytes, and every added node (beta's Add, an explicit centering) is a whole pass
more. The rules follow the CPU figures; where CUDA would decide otherwise is in DESIGN.md section 4.1.
"""

from __future__ import annotations

from dataclasses import dataclass

from onnx_lnfold.core.ops import LAYER_NORM, RMS_NORM, SKIP_LAYER_NORM, SKIP_RMS_NORM

SOURCE = "benchmarks/results/EMISSION_COSTS.md"

# The measured range of token counts (batch x sequence) is 1x16 .. 8x1024; decisions are taken at its top.
DECIDING_TOKENS = 8192
# The narrowest width measured. Narrower tensors (test graphs; no model worth folding) are priced
# at it: below it a fit of fixed, per-token and per-element parts would be extrapolated where the
# per-token part takes over, which nothing measured says.
NARROWEST = 64


@dataclass(frozen=True)
class Cost:
    """Instructions per run of one node: `fixed + per_token * tokens + per_element * tokens * width`."""

    fixed: float
    per_token: float
    per_element: float

    def at(self, tokens: int, width: int) -> float:
        return self.fixed + self.per_token * tokens + self.per_element * tokens * width


# Per node kind, as ORT's CPU EP runs it (the fit at the end of EMISSION_COSTS.md):
#   LayerNormalization / SimplifiedLayerNormalization      over [tokens, d]
#   SkipLayerNormalization / SkipSimplifiedLayerNormalization  Add of two [tokens, d] and the norm
#   Add            the residual Add of two [tokens, d]
#   BiasAdd        [tokens, width] + a constant row of width (beta's Add, a created bias)
#   Centering      x - ReduceMean(x) over [tokens, d]
CPU: dict[str, Cost] = {
    LAYER_NORM.op_type: Cost(7110, 259, 3.123),
    RMS_NORM.op_type: Cost(6628, 240.1, 1.373),
    SKIP_LAYER_NORM.op_type: Cost(13520, 128, 19.75),
    SKIP_RMS_NORM.op_type: Cost(13250, 139.1, 6.245),
    "Add": Cost(12910, -0.003629, 1.749),
    "BiasAdd": Cost(6433, 159.2, 1.748),
    "Centering": Cost(12370, 204.8, 2.371),
}


def total(nodes: list[tuple[str, int]], tokens: int = DECIDING_TOKENS) -> float:
    """Instructions per run of `nodes`, each (kind, width), at `tokens` tokens."""
    return sum(CPU[kind].at(tokens, max(width, NARROWEST)) for kind, width in nodes)


def costs_more(emitted: list[tuple[str, int]], original: list[tuple[str, int]]) -> bool:
    """Whether `emitted` costs more than `original` (at `DECIDING_TOKENS`)."""
    return total(emitted) > total(original)


def saving(emitted: list[tuple[str, int]], original: list[tuple[str, int]]) -> float:
    """What replacing `original` by `emitted` saves per run (at `DECIDING_TOKENS`)."""
    return total(original) - total(emitted)


def created_bias_pays(widths: list[int], d: int | None) -> bool:
    """Whether Adds of created biases of `widths` (after linear layers that had none: ORT does not
    fuse MatMul + Add on tensors of symbolic shape, and its Gemm with a bias costs more still) cost
    less than one Add of beta over the LN's output of width `d`."""
    if d is None:
        return False
    return total([("BiasAdd", w) for w in widths]) < total([("BiasAdd", d)])


def centering_pays(width: int | None, savings: list[float]) -> bool:
    """Whether one explicit centering of a [tokens, width] stream costs less than the LNs it
    unlocks save."""
    return width is not None and sum(savings) > total([("Centering", width)])


def fused_residual_pays(d: int | None) -> bool:
    """Whether SkipSimplifiedLayerNormalization costs less than the residual `Add` followed by
    SimplifiedLayerNormalization over [tokens, d] (what `--fuse-residual auto` emits)."""
    if d is None:
        return False
    return not costs_more([(SKIP_RMS_NORM.op_type, d)], [("Add", d), (RMS_NORM.op_type, d)])
