"""`FoldOptions`: the choices that shape a fold, validated once, and the model's precondition.

Every internal step takes one `FoldOptions`; the public entry points (`fold()`, `analyze()`,
`LnFoldPass`) also take its fields as keywords (`keywords_to_options`). Imports nothing heavy:
the command line builds its parser from the choices below.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from onnx_lnfold.core import ops
from onnx_lnfold.core.errors import InvalidInput
from onnx_lnfold.core.ops import ONNX_RMS_NORM

if TYPE_CHECKING:
    import onnx_ir as ir

# "ort": SimplifiedLayerNormalization / SkipSimplifiedLayerNormalization (ONNX Runtime ops);
# "onnx": the standard RMSNormalization, the model converted to opset ONNX_RMS_OPSET where older.
TARGETS = tuple(t.name for t in ops.TARGETS)
ONNX_RMS_OPSET = ONNX_RMS_NORM.since_opset

# Which residual Adds become SkipSimplifiedLayerNormalization (`fuse_residual`):
# - "auto": those ONNX Runtime itself fuses with a LayerNormalization at session start (an Add
#   whose only consumer is the LN, on 3-D tensors), where the fused op costs less than the residual
#   Add followed by SimplifiedLayerNormalization by the measured costs (`emit.costs`): nowhere on ORT's
#   CPU EP, whose fused kernel costs more at every shape measured
#   (python -m benchmarks.emission_costs; benchmarks/results/EMISSION_COSTS.md);
# - "always": every residual Add of two same-shaped tensors (the sum kept as output 3 when read
#   elsewhere), for providers whose fused kernel pays (CUDA: one memory pass instead of two);
# - "never": none.
FUSE_RESIDUAL = ("auto", "always", "never")

# What to do with an embedding table that other uses need unchanged (a tied LM head): "untie"
# centers a copy of the table (no nodes; the file grows by the table); "center" centers the
# Gather's output, `x - ReduceMean(x)` (no copy; two small nodes per run over the embeddings);
# "derive" has the Gathers read `table - row means`, a Sub of two constants that ONNX Runtime folds
# into a centered table at session start (no nodes at run time; the file grows by the means only). "auto" unties where the copy adds at most `UNTIE_BUDGET` of the model's
# weight bytes and the other uses read the table only through a Transpose (which ONNX Runtime
# constant-folds into a copy of its own, so the untied copy costs file bytes but no memory at run
# time), derives where they read it through a Transpose and the copy would be larger (run-time
# memory is then the original's: the folded Transpose and the folded Sub each hold one table, as
# the original's Gather and folded Transpose do), and centers otherwise (a head that reads the
# table itself would leave a derived table as a second one in memory). A deployment that ships the file should
# not find it grown by a vocabulary-sized table it did not ask for (a Whisper decoder's tied head
# is two thirds of the file). Run-time costs: benchmarks/results/INSTRUCTIONS.md.
TIED_WEIGHTS = ("auto", "center", "untie", "derive")
# The most an untied copy may add to the file under "auto", as a fraction of the weights.
UNTIE_BUDGET = 0.01

# Seconds the verification's float64 reference may take: None (the default) scales the allowance
# with the fold's own time (verify.judge.first_allowance); a number replaces it (0: none; the fold is
# then judged against the original's own fp32 sensitivity). docs/DESIGN.md section 6.
FLOAT64_BUDGET_S: float | None = None


def _check_choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise InvalidInput(f"unknown {name} '{value}': choose one of {', '.join(choices)}")


@dataclass(frozen=True)
class FoldOptions:
    """How to fold; raises `InvalidInput` (one line; a `ValueError`) for a value outside the choices.

    `target="onnx"` emits the standard RMSNormalization (an older model is converted to opset 23 by
    `onnx.version_converter` first);
    `auxiliary_centering=False` never inserts an explicit centering node; `fuse_residual`
    ("auto", "always", "never") says which residual Adds become SkipSimplifiedLayerNormalization;
    `tied_weights` ("auto", "center", "untie", "derive") says how an embedding table the LM head shares is
    centered: as a copy ("untie": the file grows by the table; also what `auxiliary_centering=False`
    does), by `x - ReduceMean(x)` after the Gather ("center"), by the Gathers reading `table - row
    means`, which ONNX Runtime folds at session start ("derive"), or ("auto") the copy where it adds
    at most 1% to the weights and the head reads the table through a Transpose, the derived table
    where the copy would be larger, the centering elsewhere.
    `keep_ort_fusions=False` skips running ONNX Runtime's optimizers on weightless copies of the
    graph, so no LN is kept because folding it would cost an ONNX Runtime fusion.
    `fold_costly=True` folds the LNs whose fold costs ONNX Runtime's CPU EP more than the LN (beta
    left as an Add over the stream, say), which are kept by default (stage "cost", code "costs-more").
    `costs` is the path of a cost table (`onnx-lnfold calibrate -o costs.json`) the cost rule
    decides by instead of the built-in one (ONNX Runtime's CPU EP, callgrind instructions).
    """

    target: str = "ort"
    auxiliary_centering: bool = True
    fuse_residual: str = "auto"
    tied_weights: str = "auto"
    keep_ort_fusions: bool = True
    fold_costly: bool = False
    costs: str | None = None

    def __post_init__(self) -> None:
        # In this order, so a call with several bad values names the same one as before.
        _check_choice("fuse_residual", self.fuse_residual, FUSE_RESIDUAL)
        _check_choice("target", self.target, TARGETS)
        _check_choice("tied_weights", self.tied_weights, TIED_WEIGHTS)
        if self.costs is not None:
            if not isinstance(self.costs, (str, os.PathLike)) or not str(self.costs):
                raise InvalidInput(f"costs must be the path of a cost table file, not {self.costs!r}")
            object.__setattr__(self, "costs", os.fspath(self.costs))  # read where it is used (emit.costs)


OPTION_NAMES = tuple(f.name for f in dataclasses.fields(FoldOptions))


def target_opset(target: str) -> int | None:
    """The default-domain opset the ops of `target` need (None: any)."""
    return max((op.since_opset for op in ops.NORM_OPS if op.target == target and op.since_opset), default=None)


def check_preconditions(model: ir.Model, options: FoldOptions) -> None:
    """What the options ask of the model the analysis reads: the opset the target's ops need. The
    entry points convert an older model first (`_pipeline.prepare`, `load.opset`), so this refuses
    only a model handed to the analysis unconverted."""
    needed = target_opset(options.target)
    if needed is not None:
        opset = model.opset_imports.get("", model.opset_imports.get("ai.onnx", 0))
        if opset < needed:
            raise InvalidInput(
                f"--target {options.target} emits {target_op_names(options.target)} (opset {needed}); the model analyzed "
                f"is at opset {opset}: convert it first (onnx_lnfold.fold and the command line do)"
            )


def target_op_names(target: str) -> str:
    return ops.target_ops(target)


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
    "FLOAT64_BUDGET_S",
    "FUSE_RESIDUAL",
    "ONNX_RMS_OPSET",
    "TARGETS",
    "TIED_WEIGHTS",
    "UNTIE_BUDGET",
    "FoldOptions",
    "check_preconditions",
    "target_op_names",
    "target_opset",
    "keywords_to_options",
    "takes_option_keywords",
]
