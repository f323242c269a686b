"""The normalization ops the fold reads, prices and writes, each described once.

Every step that names one of these ops reads it here: the forms that recognize an LN
(`forms`), the proof that stops at a normalization's output (`analysis.zero_mean`), what a fold
emits and what that costs (`decide`), the fusion check that tells the fold's own changes from lost
fusions (`ort_fusions`), the report's "already folded", and the `--target` help. A new emission
target is one `NormOp` here with its `target`, the nodes it writes in `decide.emission`, and its
choice in `decide.targets` if it needs one (docs/DESIGN.md section 8).

Imports nothing: the command line's `--help` reads the targets from here.
"""

from __future__ import annotations

from dataclasses import dataclass

MS_DOMAIN = "com.microsoft"


@dataclass(frozen=True)
class Target:
    """A choice of `--target`: what the folds of that target emit, and for which runtimes."""

    name: str
    description: str  # what the ops are and which runtimes run them (measured), for `--help`


# Which runtimes run each target's output is measured, not assumed; the runtimes and versions
# measured are in docs/DESIGN.md section 4 (benchmarks/results/runtimes/RUNTIMES.md, tests/runtimes/),
# which the descriptions point to rather than repeat. The default stays ONNX Runtime's op.
TARGETS = (
    Target(
        "ort",
        "ONNX Runtime's ops, run by its CPU and CUDA kernels and by OpenVINO's CPU plugin as its RMS kernel; the "
        "OpenVINO inside ONNX Runtime's OpenVINO EP decomposes them (measured on CPU: docs/DESIGN.md section 4); "
        "the default",
    ),
    Target(
        "onnx",
        "the standard op, at opset 23, to which an older model is converted by onnx.version_converter; ONNX Runtime and "
        "OpenVINO run it, the OpenVINO inside ONNX Runtime's OpenVINO EP refuses it and the EP leaves it to ORT's CPU "
        "EP, slower than the original there (measured: docs/DESIGN.md section 4)",
    ),
    Target(
        "primitive",
        "standard ops at the model's opset, which ONNX Runtime, at optimization level EXTENDED and up, and OpenVINO "
        "fuse into their RMSNorm kernels, for runtimes with neither op; float32 and float64 LNs (measured: "
        "docs/DESIGN.md section 4)",
    ),
)


@dataclass(frozen=True)
class NormOp:
    """One normalization op: its name and domain, what it computes, and who emits it."""

    op_type: str
    domain: str = ""
    rms: bool = False  # normalizes x / rms(x): no mean is removed (an RMSNorm)
    skip: bool = False  # normalizes input + skip (+ bias); its output 3 is that sum
    embed: bool = False  # gathers embeddings and adds them before normalizing
    target: str | None = None  # the --target whose folds emit it
    since_opset: int | None = None  # the default-domain opset that has it (standard ops)
    words: str = ""  # how a cost reason names it, where that differs from its op type

    @property
    def qualified(self) -> str:
        """`SimplifiedLayerNormalization`, `com.microsoft::SkipSimplifiedLayerNormalization`."""
        return f"{self.domain}::{self.op_type}" if self.domain else self.op_type

    @property
    def described(self) -> str:
        return self.words or self.op_type


LAYER_NORM = NormOp("LayerNormalization", since_opset=17)
SKIP_LAYER_NORM = NormOp(
    "SkipLayerNormalization", MS_DOMAIN, skip=True, words="SkipLayerNormalization (ORT's fusion of the residual Add and the LN)"
)
EMBED_LAYER_NORM = NormOp("EmbedLayerNormalization", MS_DOMAIN, embed=True)
RMS_NORM = NormOp("SimplifiedLayerNormalization", rms=True, target="ort")
SKIP_RMS_NORM = NormOp("SkipSimplifiedLayerNormalization", MS_DOMAIN, rms=True, skip=True, target="ort")
ONNX_RMS_NORM = NormOp("RMSNormalization", rms=True, target="onnx", since_opset=23)

NORM_OPS = (LAYER_NORM, SKIP_LAYER_NORM, EMBED_LAYER_NORM, RMS_NORM, SKIP_RMS_NORM, ONNX_RMS_NORM)
# ONNX Runtime's own ops that it registers in the default domain, where ONNX defines no such op
# (ONNX's checker would refuse the fold's own output).
ORT_DEFAULT_DOMAIN_OPS = frozenset(op.op_type for op in NORM_OPS if not op.domain and op.since_opset is None)


# RMSNorm written as standard ops (target "primitive"), in the one form that both ONNX Runtime's
# SimplifiedLayerNormFusion (onnxruntime/core/optimizer/layer_norm_fusion.cc, ORT_ENABLE_EXTENDED
# and up) and OpenVINO's RMSFusion (its CPU plugin) turn into their RMSNorm kernel:
#   Pow(x, 2) -> ReduceMean(axes [-1], keepdims 1) -> Add(epsilon) -> Sqrt -> Div(x, .) -> Mul(., gamma)
# each intermediate read by the next op alone. Neither fuses Mul(x, x), a Reciprocal or Pow(., -0.5).
PRIMITIVE_OPS = ("Pow", "ReduceMean", "Add", "Sqrt", "Div", "Mul")
PRIMITIVE_RMS = "/".join(PRIMITIVE_OPS)  # how a plan and the report name what such a fold emits
PRIMITIVE_TARGET = "primitive"


def target_ops(target: str) -> str:
    """What `target`'s folds emit, in words: `SimplifiedLayerNormalization / ...`."""
    if target == PRIMITIVE_TARGET:
        return PRIMITIVE_RMS
    return " / ".join(op.op_type for op in NORM_OPS if op.target == target)


def target_help() -> str:
    """`ort writes SimplifiedLayerNormalization / SkipSimplifiedLayerNormalization: ... . onnx writes ...`."""
    return " ".join(f"{t.name} writes {target_ops(t.name)}: {t.description}." for t in TARGETS)


# Op types (any domain) whose output is a normalization's: gamma * n + beta, a data-dependent mean.
NORMALIZATION_TYPES = frozenset(op.op_type for op in NORM_OPS)
# The ops a folded model holds in place of LayerNorms (a model with these and no LN was folded before).
RMS_OPS = tuple(op.qualified for op in NORM_OPS if op.rms)
