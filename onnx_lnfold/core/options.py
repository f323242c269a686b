"""`FoldOptions`: the choices that shape a fold, validated once, and the model's precondition.

`OPTIONS` is the one table of them: each option's name, default, choices, command-line flag and
help, which the command line's parser, the Olive pass's config and docs/COMMAND_LINE.md's table are made from.
Every internal step takes one `FoldOptions`; the public entry points (`fold()`, `analyze()`,
`LnFoldPass`) also take its fields as keywords (`keywords_to_options`). Imports nothing heavy:
the command line builds its parser from this module.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import math
import os
import re
from collections.abc import Callable, Mapping
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
# with the fold's own time (verify.judges.allowance.first_allowance); a number replaces it (0: none; the fold is
# then judged against the original's own fp32 sensitivity). docs/DESIGN.md section 6.
FLOAT64_BUDGET_S: float | None = None


def _check_choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise InvalidInput(f"unknown {name} '{value}': choose one of {', '.join(choices)}")


@dataclass(frozen=True)
class FoldOptions:
    """How to fold; raises `InvalidInput` (one line; a `ValueError`) for a value outside the choices.

    What each field does: `OPTIONS` below (`help(onnx_lnfold.core.options)`, docs/COMMAND_LINE.md).
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


class InvalidSetting(InvalidInput):
    """A setting outside its range: the keyword (`rtol`) or the flag (`--rtol`) as each surface
    spells it, what it must be, and the value given."""

    def __init__(self, keyword: str, must_be: str, value: object, flag: str | None = None):
        self.keyword, self.must_be, self.value = keyword, must_be, value
        self.flag = flag or "--" + keyword.replace("_", "-")
        super().__init__(self.said("api"))

    def said(self, surface: str) -> str:
        name = self.flag if surface == "cli" else self.keyword
        return f"{name} must be {self.must_be}, not {self.value!r}"


def _dims(name: object, dims: object) -> tuple[int, ...]:
    """`dims` as a shape: a sequence of non-negative ints (numpy's included, bools not)."""
    try:
        shape = tuple(dims)  # type: ignore[arg-type]
        if all(hasattr(d, "__index__") and not isinstance(d, bool) and d.__index__() >= 0 for d in shape):
            return tuple(d.__index__() for d in shape)
    except TypeError:
        pass
    raise InvalidSetting(
        "input_shapes", "{name: (D1, D2, ...)} with non-negative integer sizes", {name: dims}, "--input-shape"
    )


@dataclass(frozen=True)
class RunShapes:
    """The shapes the model runs at: `inputs` (arrays, keyed by graph input name), else
    `input_shapes` (name -> dims), else none given (the graph's, and sizes chosen for its symbols).
    Checked against the graph where it is read (`feeds.given`)."""

    input_shapes: Mapping[str, tuple[int, ...]] | None = None
    inputs: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.input_shapes is not None:
            if not isinstance(self.input_shapes, Mapping):
                raise InvalidSetting("input_shapes", "a dict {name: (D1, D2, ...)}", self.input_shapes, "--input-shape")
            shapes = {str(name): _dims(name, dims) for name, dims in self.input_shapes.items()}
            object.__setattr__(self, "input_shapes", shapes)
        if self.inputs is not None:
            if not isinstance(self.inputs, Mapping) or not all(
                hasattr(a, "shape") and hasattr(a, "dtype") for a in self.inputs.values()
            ):
                raise InvalidSetting("inputs", "a dict {name: numpy array}", type(self.inputs).__name__, "--inputs")
            object.__setattr__(self, "inputs", dict(self.inputs))

    @property
    def given(self) -> dict[str, tuple[int, ...]]:
        """The input shapes given (the inputs', else `input_shapes`): the cost rule prices each LN at
        the tokens they make it run at (`decide.pricing`), whether or not the check runs."""
        if self.inputs is not None:
            return {name: tuple(array.shape) for name, array in self.inputs.items()}
        return dict(self.input_shapes or {})


# When the check also runs both models at ORT_ENABLE_ALL (`CheckSettings.deployed_check`).
DEPLOYED_CHECKS = ("auto", "always", "never")


@dataclass(frozen=True)
class CheckSettings:
    """Whether (`verify`) and how the fold is checked in ONNX Runtime (docs/DESIGN.md section 6): `rtol`,
    every output's tolerance (None: each output's by its element type); `float64_budget`, the
    seconds the float64 reference may take (0: none; None: scaled with the fold's own time);
    `deployed_check`, whether both models are also judged at ORT_ENABLE_ALL (`verify.deployed`:
    "auto" for models with quantized ops, "always", "never").
    `disabled_because` is the report's reason when the check is off."""

    verify: bool = True
    rtol: float | None = None
    float64_budget: float | None = FLOAT64_BUDGET_S
    deployed_check: str = "auto"
    disabled_because: str = "disabled by the caller"

    def __post_init__(self) -> None:
        if self.deployed_check not in DEPLOYED_CHECKS:
            raise InvalidSetting("deployed_check", f"one of {', '.join(DEPLOYED_CHECKS)}", self.deployed_check)
        # Checked here, for every surface: a negative rtol would run the whole fold and then fail it.
        if self.rtol is not None and not (_is_number(self.rtol) and math.isfinite(self.rtol) and self.rtol > 0):
            raise InvalidSetting("rtol", "a positive number", self.rtol)
        if self.float64_budget is not None and not (_is_number(self.float64_budget) and self.float64_budget >= 0):
            raise InvalidSetting("float64_budget", "a number of seconds, 0 or more", self.float64_budget)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)


OPTION_NAMES = tuple(f.name for f in dataclasses.fields(FoldOptions))


def parse_input_shape(spec: str) -> tuple[str, tuple[int, ...]]:
    """'NAME:D1,D2,...' -> (NAME, (D1, D2, ...)): how the command line spells one input's shape."""
    name, sep, dims = spec.rpartition(":")
    try:
        if not sep or not name:
            raise ValueError
        shape = tuple(int(d) for d in dims.split(","))
        if any(d < 0 for d in shape):
            raise ValueError
    except ValueError:
        raise InvalidInput(f"bad --input-shape '{spec}': expected NAME:D1,D2,... with non-negative integers") from None
    return name, shape


def _in_own_words(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    def parsed(text: str) -> Any:
        try:
            return parse(text)
        except InvalidInput as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return parsed


# Where each option lands: the settings object whose field it is.
_HOLDERS = {"fold": FoldOptions, "check": CheckSettings, "shapes": RunShapes}
_DEFAULTS = {f.name: (group, f.default) for group, holder in _HOLDERS.items() for f in dataclasses.fields(holder)}


@dataclass(frozen=True)
class Option:
    """One setting as every surface shows it: `name` is the keyword (`fold()`, the Olive config) and
    the field of `FoldOptions`, `CheckSettings` or `RunShapes` (its `group`); `flag` is the command
    line's. A bool whose default is True is turned off on the command line (`--no-verify`); any
    other bool is turned on by its flag. `kind` is the value's type where the default does not say
    it; `parse` reads one command-line value (`repeated`: the flag may be given several times);
    `olive`: the Olive pass's config holds it."""

    name: str
    flag: str
    help: str
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    kind_: type | None = None
    parse: Callable[[str], Any] | None = None
    repeated: bool = False
    olive: bool = True

    @property
    def group(self) -> str:
        return _DEFAULTS[self.name][0]

    @property
    def default(self) -> Any:
        return _DEFAULTS[self.name][1]

    @property
    def kind(self) -> type:
        if self.kind_ is not None:
            return self.kind_
        return bool if isinstance(self.default, bool) else str

    @property
    def flag_turns_off(self) -> bool:
        return self.default is True

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        """This option's argument, its value landing at `args.<name>` (a repeated one's as a list)."""
        text = self.help.replace("%", "%%")  # argparse formats help with %
        if self.kind is bool:
            action = "store_false" if self.flag_turns_off else "store_true"
            parser.add_argument(self.flag, dest=self.name, action=action, help=text)
            return
        parse = self.parse or (self.kind if self.kind in (int, float) else None)
        if self.parse is not None:  # its own words, where argparse would say "invalid value"
            parse = _in_own_words(self.parse)
        default = [] if self.repeated else self.default
        action = "append" if self.repeated else "store"
        parser.add_argument(
            self.flag,
            dest=self.name,
            action=action,
            type=parse,
            choices=self.choices,
            default=default,
            metavar=self.metavar,
            help=text,
        )

    def cli_args(self, value: Any) -> list[str]:
        """The command-line arguments that set this option to `value` (none for the default)."""
        if value == self.default:
            return []
        if self.kind is bool:
            return [self.flag]
        if self.repeated:  # {name: dims}, as `parse_input_shape` reads it back
            return [arg for name, dims in value.items() for arg in (self.flag, f"{name}:{','.join(map(str, dims))}")]
        return [self.flag, str(value)]

    def markdown_row(self) -> str:
        """`| --flag | name | default | help |`, the row of docs/COMMAND_LINE.md's table."""
        flag = f"`{self.flag} {'|'.join(self.choices)}`".replace("|", "\\|") if self.choices else f"`{self.flag}`"
        if self.metavar:
            flag = f"`{self.flag} {self.metavar}`"
        return f"| {flag} | `{self.name}` | `{self.default}` | {self.help} |"


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
    # The check's (`CheckSettings`, `RunShapes`).
    Option(
        "verify",
        "--no-verify",
        "check the fold against the input in ONNX Runtime before it is written or returned (default); turned "
        "off (--no-verify, verify=False), the fold is unverified",
    ),
    Option(
        "rtol",
        "--rtol",
        "max max|diff| / max|ref| of the fold from the truth per output, judged in float64 (default 1e-4 for "
        "float32 outputs, 1e-2 for fp16/bf16 ones)",
        metavar="X",
        kind_=float,
    ),
    Option(
        "float64_budget",
        "--float64-budget",
        "seconds the float64 reference may take (default: 3x what the fold took, at least 60 s, so it grows with "
        "the model; its memory is bounded by half the available memory); beyond it, or with 0, the fold is judged "
        "against the original's own float32 sensitivity; on either judgment the fold is first read back against "
        "its plan in float64 (every changed tensor and node)",
        metavar="SECONDS",
        kind_=float,
    ),
    Option(
        "deployed_check",
        "--deployed-check",
        "also run both models at ORT_ENABLE_ALL, the level ONNX Runtime runs by default, and refuse a fold whose "
        "difference there exceeds rtol plus 10x the original's own sensitivity at that level (its weights moved by "
        "one rounding step): auto (default) for models with quantized ops, whose fused kernels round otherwise; "
        "always; never",
        choices=DEPLOYED_CHECKS,
    ),
    Option(
        "input_shapes",
        "--input-shape",
        "shape of a graph input to check at (repeatable); the cost rule also prices each LN at the tokens it "
        "gives. Without it, the check synthesizes inputs at small sizes (batch 2 and 3, retried at batch 1 where "
        "the original runs at no larger one, the report saying so; sequences of 5, 8 and 64); an input over 256 "
        "MiB at those sizes (a dim declared as 2^31, say) is refused before anything is allocated, naming the "
        "input, its declared shape and bytes and the shape to pass (`feeds.budget.MAX_INPUT_BYTES`)",
        metavar="NAME:D1,D2,...",
        kind_=dict,
        parse=parse_input_shape,
        repeated=True,
    ),
    Option(
        "inputs",
        "--inputs",
        "inputs to check at, keyed by graph input name (a .npz file on the command line, a dict of arrays "
        "through the API; use real-scale data when you have it); the cost rule prices each LN at their shapes",
        metavar="FILE.npz",
        olive=False,
    ),
)

FOLD_OPTIONS = tuple(option for option in OPTIONS if option.group == "fold")
OLIVE_OPTIONS = tuple(option for option in OPTIONS if option.olive)


def options_from(config: object) -> FoldOptions:
    """The fold's options an object holds as attributes of their names: the command line's parsed
    arguments, the Olive pass's config."""
    return FoldOptions(**{name: getattr(config, name) for name in OPTION_NAMES})


def check_from(config: object, **fields: Any) -> CheckSettings:
    """The check's settings an object holds as attributes of their names (the command line's parsed
    arguments, the Olive pass's config), with `fields` (`disabled_because`) beside them."""
    names = [o.name for o in OPTIONS if o.group == "check" and hasattr(config, o.name)]
    return CheckSettings(**{name: getattr(config, name) for name in names}, **fields)


def fold_keywords(config: object) -> dict[str, Any]:
    """The keywords of `fold()` the Olive pass's config holds: every option of `OLIVE_OPTIONS`, the
    fold's gathered as `options`."""
    keywords = {o.name: getattr(config, o.name) for o in OLIVE_OPTIONS if o.group != "fold"}
    return {**keywords, "options": options_from(config)}


def options_markdown() -> str:
    """The table of docs/COMMAND_LINE.md: flag, keyword, default, help for each option."""
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
            raise SettingMismatch(
                f"{{target={options.target}}} emits {target_op_names(options.target)} (opset {needed}); the model analyzed "
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


_SETTING = re.compile(r"\{([a-z][a-z0-9_]*)(?:=([^{}]*))?\}")


def spelled(name: str, surface: str, value: str | None = None) -> str:
    """How `surface` spells the option `name` (set to `value`, where given): its flag on the command
    line ("cli": `--target onnx`, `--fold-costly`), its keyword through the API (`target='onnx'`)."""
    option = next(o for o in OPTIONS if o.name == name)
    if surface == "cli":
        return option.flag if value is None or option.kind is bool else f"{option.flag} {value}"
    return name if value is None else f"{name}={value!r}"


class SettingMismatch(InvalidInput):
    """A setting given does not fit the model (an input shape it names no input of, a target whose
    opset it cannot be converted to). Its words name the setting as each surface spells it
    (`spelled`): `{input_shapes}` or `{target=onnx}` in `template` stand for the option."""

    def __init__(self, template: str):
        self.template = template
        super().__init__(self.said("api"))

    def said(self, surface: str) -> str:
        names = {o.name for o in OPTIONS}

        def spell(match: re.Match) -> str:
            name, value = match.group(1), match.group(2)
            return spelled(name, surface, value) if name in names else match.group(0)

        return _SETTING.sub(spell, self.template)


__all__ = [
    "SettingMismatch",
    "spelled",
    "FLOAT64_BUDGET_S",
    "FUSE_RESIDUAL",
    "ONNX_RMS_OPSET",
    "TARGETS",
    "TIED_WEIGHTS",
    "UNTIE_BUDGET",
    "OPTIONS",
    "FOLD_OPTIONS",
    "OLIVE_OPTIONS",
    "CheckSettings",
    "FoldOptions",
    "InvalidSetting",
    "Option",
    "RunShapes",
    "check_from",
    "parse_input_shape",
    "check_preconditions",
    "target_op_names",
    "target_opset",
    "keywords_to_options",
    "fold_keywords",
    "options_from",
    "options_markdown",
    "takes_option_keywords",
]
