"""`FoldOptions`: the choices that shape a fold, validated once, and the model's precondition.

Every internal step takes one `FoldOptions`; the public entry points (`fold()`, `analyze()`,
`LnFoldPass`) also take its fields as keywords (`keywords_to_options`). Imports nothing heavy:
the command line builds its parser from the choices below.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from onnx_lnfold._errors import LnFoldError

if TYPE_CHECKING:
    import onnx_ir as ir

# "ort": SimplifiedLayerNormalization / SkipSimplifiedLayerNormalization (ONNX Runtime ops);
# "onnx": the standard RMSNormalization, for models already at opset >= ONNX_RMS_OPSET.
TARGETS = ("ort", "onnx")
ONNX_RMS_OPSET = 23

# Which residual Adds become SkipSimplifiedLayerNormalization (`fuse_residual`):
# - "auto": those ONNX Runtime itself fuses with a LayerNormalization at session start (an Add
#   whose only consumer is the LN, on 3-D tensors), where the fused op costs less than the residual
#   Add followed by SimplifiedLayerNormalization by the measured costs (`_costs`): nowhere on ORT's
#   CPU EP, whose fused kernel costs more at every shape measured
#   (python -m benchmarks.emission_costs; benchmarks/results/EMISSION_COSTS.md);
# - "always": every residual Add of two same-shaped tensors (the sum kept as output 3 when read
#   elsewhere), for providers whose fused kernel pays (CUDA: one memory pass instead of two);
# - "never": none.
FUSE_RESIDUAL = ("auto", "always", "never")

# What to do with an embedding table that other uses need unchanged (a tied LM head): "untie"
# centers a copy of the table (no nodes; the file grows by the table); "center" centers the
# Gather's output, `x - ReduceMean(x)` (no copy; two nodes per run, which cost part of the time
# the fold saves). "auto" unties when the other uses read the table only through a Transpose:
# ONNX Runtime constant-folds that Transpose into a copy of its own, so the untied copy costs file
# bytes but no memory at run time; otherwise it centers. Measured in benchmarks/results.
TIED_WEIGHTS = ("auto", "center", "untie")


def _check_choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise LnFoldError(f"unknown {name} '{value}': choose one of {', '.join(choices)}")


@dataclass(frozen=True)
class FoldOptions:
    """How to fold; raises `LnFoldError` (one line) for a value outside the choices.

    `target="onnx"` emits the standard RMSNormalization (opset >= 23 models only);
    `auxiliary_centering=False` never inserts an explicit centering node; `fuse_residual`
    ("auto", "always", "never") says which residual Adds become SkipSimplifiedLayerNormalization;
    `tied_weights` ("auto", "center", "untie") says how an embedding table the LM head shares is
    centered: as a copy ("untie": the file grows by the table; also what `auxiliary_centering=False`
    does), by `x - ReduceMean(x)` after the Gather ("center"), or the copy where ONNX Runtime
    would hold a transposed copy of its own anyway and the centering elsewhere ("auto");
    `fold_costly=True` folds the LNs whose fold costs ONNX Runtime's CPU EP more than the LN (beta
    left as an Add over the stream, say), which are kept by default (stage "cost", code "costs-more").
    """

    target: str = "ort"
    auxiliary_centering: bool = True
    fuse_residual: str = "auto"
    tied_weights: str = "auto"
    fold_costly: bool = False

    def __post_init__(self) -> None:
        # In this order, so a call with several bad values names the same one as before.
        _check_choice("fuse_residual", self.fuse_residual, FUSE_RESIDUAL)
        _check_choice("target", self.target, TARGETS)
        _check_choice("tied_weights", self.tied_weights, TIED_WEIGHTS)


OPTION_NAMES = tuple(f.name for f in dataclasses.fields(FoldOptions))


def check_preconditions(model: ir.Model, options: FoldOptions) -> None:
    """What the options ask of this model: `target="onnx"` needs a default opset of 23 or more."""
    if options.target == "onnx":
        opset = model.opset_imports.get("", model.opset_imports.get("ai.onnx", 0))
        if opset < ONNX_RMS_OPSET:
            raise LnFoldError(
                f"--target onnx emits RMSNormalization (opset {ONNX_RMS_OPSET}); this model's default opset is "
                f"{opset}: convert it first (onnx.version_converter) or use the default target 'ort'"
            )


def keywords_to_options(options: FoldOptions | None, keywords: dict[str, Any], caller: str) -> FoldOptions:
    """`options` with the option keywords given beside it applied on top (`fold(m, target="onnx")`,
    `fold(m, options=FoldOptions(...))`, or both); a keyword that names no option is a TypeError,
    as Python raises for any function."""
    unknown = sorted(set(keywords) - set(OPTION_NAMES))
    if unknown:
        raise TypeError(f"{caller}() got an unexpected keyword argument '{unknown[0]}'")
    base = options if options is not None else FoldOptions()
    return dataclasses.replace(base, **keywords) if keywords else base


def takes_option_keywords(func: Callable) -> Callable:
    """Show `FoldOptions`' fields as keyword-only parameters in `func`'s signature (help(),
    IDEs), in place of the `**option_keywords` it collects them with."""
    signature = inspect.signature(func)
    params = [p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    params += [
        inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=f.type)
        for f in dataclasses.fields(FoldOptions)
    ]
    func.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    return func


__all__ = [
    "FUSE_RESIDUAL",
    "ONNX_RMS_OPSET",
    "TARGETS",
    "TIED_WEIGHTS",
    "FoldOptions",
    "check_preconditions",
    "keywords_to_options",
    "takes_option_keywords",
]
