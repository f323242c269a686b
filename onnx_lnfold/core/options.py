"""`FoldOptions`: the choices that shape a fold, validated once, and the model's precondition.

`OPTIONS` is the one table of them: each option's name, default, choices, command-line flag and
help, which the command line's parser, the Olive pass's config and docs/OPTIONS.md are made from.
Every internal step takes one `FoldOptions`; the public entry points (`fold()`, `analyze()`,
`LnFoldPass`) also take its fields as keywords (`keywords_to_options`). Imports nothing heavy:
the command line builds its parser from this module.
"""

from __future__ import annotations

import argparse
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
#   Add followed by SimplifiedLayerNormalization by the measured costs (`decide.costs`): nowhere on ORT's
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

    What each field does: `OPTIONS` below (`help(onnx_lnfold.core.options)`, docs/OPTIONS.md).
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
            object.__setattr__(self, "costs", os.fspath(self.costs))  # read where it is used (decide.costs)


OPTION_NAMES = tuple(f.name for f in dataclasses.fields(FoldOptions))


@dataclass(frozen=True)
class Option:
    """One option as every surface shows it: `name` is the `FoldOptions` field and the Olive config
    key, `flag` the command line's. A bool whose default is True is turned off on the command line
    (`--no-aux-centering`); any other bool is turned on by its flag."""

    name: str
    flag: str
    help: str
    choices: tuple[str, ...] | None = None
    metavar: str | None = None

    @property
    def default(self) -> Any:
        return _DEFAULTS[self.name]

    @property
    def kind(self) -> type:
        return bool if isinstance(self.default, bool) else str

    @property
    def flag_turns_off(self) -> bool:
        return self.default is True

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        """This option's argument, its value landing at `args.<name>`."""
        text = self.help.replace("%", "%%")  # argparse formats help with %
        if self.kind is bool:
            action = "store_false" if self.flag_turns_off else "store_true"
            parser.add_argument(self.flag, dest=self.name, action=action, help=text)
        else:
            parser.add_argument(self.flag, dest=self.name, choices=self.choices, default=self.default, metavar=self.metavar, help=text)

    def cli_args(self, value: Any) -> list[str]:
        """The command-line arguments that set this option to `value` (none for the default)."""
        if value == self.default:
            return []
        return [self.flag] if self.kind is bool else [self.flag, str(value)]

    def markdown_row(self) -> str:
        """`| --flag | name | default | help |`, the row of docs/OPTIONS.md's table."""
        flag = f"`{self.flag} {'|'.join(self.choices)}`".replace("|", "\\|") if self.choices else f"`{self.flag}`"
        if self.metavar:
            flag = f"`{self.flag} {self.metavar}`"
        return f"| {flag} | `{self.name}` | `{self.default}` | {self.help} |"


_DEFAULTS = {f.name: f.default for f in dataclasses.fields(FoldOptions)}

OPTIONS = (
    Option("target", "--target", ops.target_help(), choices=TARGETS),
    Option(
        "fuse_residual",
        "--fuse-residual",
        "which residual Adds become SkipSimplifiedLayerNormalization: auto (where ONNX Runtime fuses the "
        "original's Add + LayerNormalization and the fused op costs less, by measured CPU costs: nowhere on "
        "CPU; default), always (for providers whose fused kernel pays), never",
        choices=FUSE_RESIDUAL,
    ),
    Option(
        "tied_weights",
        "--tied-weights",
        "an embedding table the LM head shares: untie (center a copy; the file grows by the table), center "
        "(x - ReduceMean(x) after the Gather: no copy, two nodes per run), derive (the Gathers read table - row "
        "means, which ONNX Runtime folds at load: the file grows by the means only), or auto (default: untie "
        "where the copy adds at most 1% of the weights and the head reads the table through a Transpose, "
        "derive where the copy would be larger, center otherwise)",
        choices=TIED_WEIGHTS,
    ),
    Option(
        "auxiliary_centering",
        "--no-aux-centering",
        "insert an explicit x - ReduceMean(x) where no weight edit can center a stream (default); turned off "
        "(--no-aux-centering, auxiliary_centering=False), never, and tied weights are untied",
    ),
    Option(
        "keep_ort_fusions",
        "--ignore-ort-fusions",
        "keep the LNs whose fold would cost an ONNX Runtime fusion (EmbedLayerNormalization, a session's Gelu "
        "or Attention), found by running ONNX Runtime's optimizers on weightless copies of the graph (default); "
        "turned off (--ignore-ort-fusions, keep_ort_fusions=False), that check is skipped and those LNs fold too",
    ),
    Option(
        "fold_costly",
        "--fold-costly",
        "also fold the LNs whose fold costs ONNX Runtime's CPU EP more than the LN (beta left as an Add over "
        "the stream, say; measured kernel costs): by default they are kept",
    ),
    Option(
        "costs",
        "--costs",
        "decide what pays by the kernel costs in this table (`onnx-lnfold calibrate --provider NAME -o "
        "COSTS.json`: another execution provider, this machine) instead of the built-in one (ONNX Runtime's "
        "CPU EP, callgrind instructions)",
        metavar="COSTS.json",
    ),
)


def options_from(config: object) -> FoldOptions:
    """The options an object holds as attributes of their names: the command line's parsed
    arguments, the Olive pass's config."""
    return FoldOptions(**{name: getattr(config, name) for name in OPTION_NAMES})


def fold_keywords(config: object) -> dict[str, Any]:
    """The keywords of `fold()` the Olive pass's config holds: `verify`, `input_shapes` and the
    options."""
    shapes = getattr(config, "input_shapes", None) or {}
    return {
        "verify": config.verify,  # type: ignore[attr-defined]
        "input_shapes": {name: tuple(dims) for name, dims in shapes.items()},
        "options": options_from(config),
    }


def options_markdown() -> str:
    """The table of docs/OPTIONS.md: flag, keyword, default, help for each option."""
    header = "| command line | keyword / Olive config | default | what it does |\n| --- | --- | --- | --- |"
    return "\n".join([header, *(option.markdown_row() for option in OPTIONS)])


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
    "OPTIONS",
    "FoldOptions",
    "Option",
    "check_preconditions",
    "target_op_names",
    "target_opset",
    "keywords_to_options",
    "fold_keywords",
    "options_from",
    "options_markdown",
    "takes_option_keywords",
]
