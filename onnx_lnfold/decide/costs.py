"""What a fold costs ONNX Runtime, against what it replaces (docs/DESIGN.md sections 2.3 and 4.1).

The costs are data: a `CostTable`, read from a JSON file. The table the fold uses unless told
otherwise is the one in this package (`tables/cpu.json`): callgrind's instructions per run on ONNX
Runtime's CPU EP (one thread, graph optimizations ALL), measured by `python -m
benchmarks.emission_costs`, which also writes the file (benchmarks/results/EMISSION_COSTS.md has the
table and the fit; a test checks the file against benchmarks/results/emission_costs.json). `onnx-lnfold
calibrate --provider NAME -o costs.json` measures another provider's (or this machine's) table in
microseconds of wall clock, and `--costs costs.json` folds by it. A table carries its unit, its
provider and its measured range; the rule compares the figures of one table only.

Each node the fold writes or removes costs a fixed part (dispatch, allocation, a launch) plus a part
per token and one per element of the [tokens, d] tensor it passes over, fitted over the measured
shapes; each measured shape also has its spread (between processes), so every figure the rule
reads comes with one. Decisions are taken at `DEFAULT_TOKENS` (8x1024, the top of the measured
range) unless the caller knows how many tokens the LN runs at (docs/DESIGN.md section 4.1).

ONNX Runtime's CPU kernels, read in its sources (onnxruntime/core/providers/cpu/nn/layer_norm_impl.cc,
contrib_ops/cpu/skip_layer_norm.cc): LayerNormalization and SimplifiedLayerNormalization are the
same two loops per row, the simplified one without the `- mean` and `+ beta` of the second; an
Add after it is a whole second pass over the tensor, which costs more than those two operations
save. SkipLayerNormalization (what ORT makes of `Add + LayerNormalization` at session start) and
SkipSimplifiedLayerNormalization are one slower loop that also adds; a separate `Add` (vectorized)
followed by SimplifiedLayerNormalization costs less than either.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from onnx_lnfold.core.errors import InvalidInput
from onnx_lnfold.core.ops import LAYER_NORM, RMS_NORM, SKIP_LAYER_NORM, SKIP_RMS_NORM

# The node kinds every table prices, as ORT runs them:
#   LayerNormalization / SimplifiedLayerNormalization      over [tokens, d]
#   SkipLayerNormalization / SkipSimplifiedLayerNormalization  Add of two [tokens, d] and the norm
#   Add            the residual Add of two [tokens, d]
#   BiasAdd        [tokens, width] + a constant row of width (beta's Add, a created bias)
#   Centering      x - ReduceMean(x) over [tokens, d]
KINDS = (
    LAYER_NORM.op_type,
    RMS_NORM.op_type,
    SKIP_LAYER_NORM.op_type,
    SKIP_RMS_NORM.op_type,
    "Add",
    "BiasAdd",
    "Centering",
)
# The ONNX Runtime ops each kind is, as its optimized graph holds them (what a set's price counts:
# `decide.set_price`).
KIND_OPS = {
    LAYER_NORM.op_type: (LAYER_NORM.op_type,),
    RMS_NORM.op_type: (RMS_NORM.op_type,),
    SKIP_LAYER_NORM.op_type: (SKIP_LAYER_NORM.op_type,),
    SKIP_RMS_NORM.op_type: (SKIP_RMS_NORM.op_type,),
    "Add": ("Add",),
    "BiasAdd": ("Add",),
    "Centering": ("ReduceMean", "Sub"),
    "StridedCentering": ("ReduceMean", "Sub"),
    "StridedDecomposedLayerNorm": ("ReduceMean", "Sub", "Pow", "ReduceMean", "Add", "Sqrt", "Div", "Mul", "Add"),
    "Transpose": ("Transpose",),
}
# What is not a last-axis kernel, priced where a table measured it (a table without them, one
# calibrated before they were measured, prices each as `LAYOUT_FALLBACK` says):
#   StridedCentering            x - ReduceMean(x) over a non-last axis: [outer, d, inner], inner > 1
#   StridedDecomposedLayerNorm  the 9 nodes of a decomposed LN over such an axis, as ORT runs one its
#                               transpose optimizer moved there (no LayerNormalization fusion follows)
#   Transpose                   [outer, d, inner] -> [outer, inner, d]
LAYOUT_KINDS = ("StridedCentering", "StridedDecomposedLayerNorm", "Transpose")
# What a table without a layout kind prices it as: the last-axis kernel it stands for, or nothing.
LAYOUT_FALLBACK = {"StridedCentering": "Centering", "StridedDecomposedLayerNorm": LAYER_NORM.op_type, "Transpose": None}
# What the figures of a table count, and how a reason writes them.
UNITS = {"instructions": "instructions per run", "us": "us per run"}
TABLE_FORMAT = "onnx_lnfold cost table 1"
BUILTIN = "tables/cpu.json"  # in this package

# The measured range of token counts (batch x sequence) of the built-in table is 1x16 .. 8x1024;
# decisions are taken at its top where the LN's own token count is not known.
DEFAULT_TOKENS = 8192
# The narrowest width the built-in table measured. Narrower tensors (test graphs; no model worth
# folding) are priced at a table's narrowest: below it a fit of fixed, per-token and per-element parts
# would be extrapolated where the per-token part takes over, which nothing measured says.
NARROWEST = 64


@dataclass(frozen=True)
class Cost:
    """One node's cost per run: `fixed + per_token * tokens + per_element * tokens * width
    (+ per_width * width)`. The last term is fitted for the layout kinds only: a reduction over a
    non-last axis of [1, d, T] pays per row of d whatever T (measured: a fit without it is off by
    up to 49% at 16 tokens, with it by 0.2%)."""

    fixed: float
    per_token: float
    per_element: float
    per_width: float = 0.0

    def at(self, tokens: int, width: int) -> float:
        return self.fixed + self.per_token * tokens + self.per_element * tokens * width + self.per_width * width


@dataclass(frozen=True)
class Point:
    """One measured shape of one kind: the node's cost there (mean over the processes that
    measured it) and its spread (their max - min, same unit)."""

    tokens: int
    width: int
    value: float
    spread: float


@dataclass(frozen=True)
class CostTable:
    """The kernel costs the rule decides by, for one execution provider, in one unit."""

    provider: str  # the execution provider measured: "CPUExecutionProvider"
    unit: str  # a key of UNITS
    costs: dict[str, Cost]  # per kind of KINDS: the fit over the measured shapes
    points: dict[str, tuple[Point, ...]]  # per kind: the measured shapes the fit went through
    source: str  # where the figures come from, named in every reason that quotes them
    measured_by: str = ""  # the command that measured them
    onnxruntime: str = ""  # the onnxruntime version measured
    default_tokens: int = DEFAULT_TOKENS

    def __hash__(self) -> int:
        return hash((self.provider, self.unit, self.source, tuple(sorted(self.costs.items()))))

    # -- the measured range -------------------------------------------------------------------------
    @property
    def tokens_range(self) -> tuple[int, int]:
        tokens = [p.tokens for ps in self.points.values() for p in ps] or [self.default_tokens]
        return min(tokens), max(tokens)

    @property
    def narrowest(self) -> int:
        widths = [p.width for ps in self.points.values() for p in ps]
        return min(widths) if widths else NARROWEST

    def priced_tokens(self, tokens: int) -> int:
        """`tokens` brought into the measured range (the fit is not extrapolated)."""
        lo, hi = self.tokens_range
        return min(max(tokens, lo), hi)

    # -- figures -------------------------------------------------------------------------------------
    def priced_kind(self, kind: str) -> str | None:
        """The kind this table prices `kind` as: itself, or for a layout kind it did not measure its
        `LAYOUT_FALLBACK` (None: priced at nothing)."""
        return kind if kind in self.costs else LAYOUT_FALLBACK.get(kind, kind)

    def cost(self, kind: str, tokens: int, width: int) -> float:
        priced = self.priced_kind(kind)
        if priced is None:
            return 0.0
        return self.costs[priced].at(self.priced_tokens(tokens), max(width, self.narrowest))

    def spread(self, kind: str, tokens: int, width: int) -> float:
        """How far `cost(kind, tokens, width)` may be off: the relative spread of the nearest
        measured shape (between its processes) plus the fit's error there, times the cost."""
        kind = self.priced_kind(kind)  # type: ignore[assignment]
        if kind is None:
            return 0.0
        tokens, width = self.priced_tokens(tokens), max(width, self.narrowest)
        points = self.points.get(kind) or ()
        if not points:
            return 0.0
        near = min(points, key=lambda p: (abs(math.log(p.tokens / tokens)) + abs(math.log(p.width / width)), p.tokens, p.width))
        fitted = self.costs[kind].at(near.tokens, near.width)
        relative = (near.spread + abs(fitted - near.value)) / abs(near.value) if near.value else 0.0
        return relative * abs(self.costs[kind].at(tokens, width))

    def total(self, nodes: list[tuple[str, int]], tokens: int) -> float:
        """`nodes`, each (kind, width), at `tokens` tokens."""
        return sum(self.cost(kind, tokens, width) for kind, width in nodes)

    def total_spread(self, nodes: list[tuple[str, int]], tokens: int) -> float:
        return sum(self.spread(kind, tokens, width) for kind, width in nodes)

    # -- words ---------------------------------------------------------------------------------------
    @property
    def provider_words(self) -> str:
        short = self.provider.removesuffix("ExecutionProvider")
        return f"ONNX Runtime's {short} EP" if short != self.provider else self.provider

    @property
    def unit_words(self) -> str:
        return UNITS[self.unit]

    def figure(self, value: float) -> str:
        """A cost as a reason writes it."""
        if self.unit == "instructions":
            return f"{value / 1e6:.2f}M" if abs(value) >= 1e5 else f"{value / 1e3:.1f}k"
        return f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}"

    # -- the file ------------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "format": TABLE_FORMAT,
            "provider": self.provider,
            "unit": self.unit,
            "source": self.source,
            "measured_by": self.measured_by,
            "onnxruntime": self.onnxruntime,
            "default_tokens": self.default_tokens,
            "costs": {
                kind: {
                    "fixed": c.fixed,
                    "per_token": c.per_token,
                    "per_element": c.per_element,
                    **({"per_width": c.per_width} if c.per_width else {}),
                    "points": [[p.tokens, p.width, p.value, p.spread] for p in self.points.get(kind, ())],
                }
                for kind, c in self.costs.items()
            },
        }

    @classmethod
    def from_dict(cls, data: dict, where: str) -> CostTable:
        """A table from its JSON form; `InvalidInput` (one line, naming `where`) if it is not one."""

        def bad(why: str) -> InvalidInput:
            return InvalidInput(f"{where}: not an onnx_lnfold cost table: {why}")

        if not isinstance(data, dict) or data.get("format") != TABLE_FORMAT:
            raise bad(f"'format' must be '{TABLE_FORMAT}' (write one with `onnx-lnfold calibrate`)")
        if data.get("unit") not in UNITS:
            raise bad(f"'unit' must be one of {', '.join(UNITS)}")
        if not isinstance(data.get("provider"), str) or not data["provider"]:
            raise bad("no 'provider'")
        entries = data.get("costs")
        missing = [k for k in KINDS if not isinstance(entries, dict) or k not in entries]
        if missing:
            raise bad(f"no cost for {', '.join(missing)}")
        costs, points = {}, {}
        for kind in [*KINDS, *(k for k in LAYOUT_KINDS if k in entries)]:
            entry = entries[kind]
            try:
                coefficients = [float(entry[k]) for k in ("fixed", "per_token", "per_element")]
                coefficients.append(float(entry.get("per_width", 0.0)))
                measured = tuple(Point(int(t), int(w), float(v), float(s)) for t, w, v, s in entry.get("points", []))
            except (KeyError, TypeError, ValueError):
                raise bad(f"{kind}: needs numbers fixed, per_token, per_element and points [tokens, width, value, spread]") from None
            if not all(math.isfinite(c) for c in coefficients) or any(
                p.tokens < 1 or p.width < 1 or not math.isfinite(p.value) or not p.spread >= 0 for p in measured
            ):
                raise bad(f"{kind}: a figure is not a finite number (or a shape or spread is negative)")
            costs[kind], points[kind] = Cost(*coefficients), measured
        default = data.get("default_tokens", DEFAULT_TOKENS)
        if not isinstance(default, int) or default < 1:
            raise bad("'default_tokens' must be a positive whole number")
        return cls(
            provider=data["provider"],
            unit=data["unit"],
            costs=costs,
            points=points,
            source=str(data.get("source") or where),
            measured_by=str(data.get("measured_by", "")),
            onnxruntime=str(data.get("onnxruntime", "")),
            default_tokens=default,
        )


@functools.lru_cache(maxsize=1)
def builtin_table() -> CostTable:
    """The table in this package: ONNX Runtime's CPU EP, callgrind instructions."""
    text = resources.files("onnx_lnfold.decide").joinpath(BUILTIN).read_text()
    return CostTable.from_dict(json.loads(text), f"onnx_lnfold/decide/{BUILTIN}")


@functools.lru_cache(maxsize=8)
def _read_table(path: str, mtime_ns: int) -> CostTable:
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise InvalidInput(f"{path}: cannot read the cost table ({e.strerror or e})") from None
    try:
        data = json.loads(text)
    except ValueError as e:
        raise InvalidInput(f"{path}: not an onnx_lnfold cost table: not JSON ({e})") from None
    # A calibrated table names the file it was read from: that is what a user can open.
    return dataclasses.replace(CostTable.from_dict(data, path), source=path)


def load_table(path: str | Path | None) -> CostTable:
    """The table in the JSON file at `path`; None: the built-in CPU table."""
    if path is None:
        return builtin_table()
    p = Path(path)
    if not p.is_file():
        raise InvalidInput(f"{path}: no such cost table file")
    return _read_table(str(p), p.stat().st_mtime_ns)


def table_for(options) -> CostTable:
    """The table a `FoldOptions` asks for (its `costs`: a path, or None for the built-in one)."""
    return load_table(getattr(options, "costs", None))


@dataclass(frozen=True)
class Comparison:
    """`emitted` against `original` by one table at one token count, each with its spread."""

    emitted: float
    original: float
    spread: float  # how far the difference may be off: the two sides' spreads added

    @property
    def resolved(self) -> bool:
        """Whether the table tells the two apart: their difference exceeds its spread."""
        return abs(self.emitted - self.original) > self.spread

    @property
    def cheaper(self) -> bool:
        return self.resolved and self.emitted < self.original

    @property
    def dearer(self) -> bool:
        return self.resolved and self.emitted > self.original


@dataclass(frozen=True)
class Saving:
    """What one LN's fold saves per run (`amount`, with its `spread`), its width, and the pricing
    those figures come from: what an explicit centering must pay for."""

    amount: float
    spread: float
    width: int | None
    pricing: Pricing


@dataclass(frozen=True)
class OrtLayout:
    """How ONNX Runtime runs a decomposed LN the export wrote over the last axis, where that is not
    one LayerNormalization kernel (`ort_fusions.session_layout`): its 9 nodes over a strided axis, after its
    transpose optimizer removed `transposes` Transposes around it, which the fold brings back."""

    strided: bool
    transposes: int


# How a reason names the layout kinds.
LAYOUT_WORDS = {
    "StridedCentering": "a centering over a non-last axis",
    "StridedDecomposedLayerNorm": "the decomposed LN ONNX Runtime runs as its 9 nodes over a non-last axis",
    "Transpose": "a Transpose",
}


@dataclass(frozen=True)
class Pricing:
    """One table at one deciding token count: what the cost rule reads for one LN (`decide.pricing`
    finds the token count from the LN's shape).

    The rule, within a table's spread: a change is made only where the table shows it cheaper than
    what it replaces by more than the two sides' spreads (`compare(...).cheaper`: a fold, an explicit
    centering); where it cannot tell them apart the original stays, since never-slower is a promise and "as
    fast, within what was measured" is not "faster". Between two forms of one fold (a residual Add
    fused or not, beta in a created bias or an Add) the cheaper by the central figures is emitted:
    both are the fold, and the LN was already judged against the original."""

    table: CostTable
    tokens: int = DEFAULT_TOKENS
    # Where `tokens` came from, as a reason says it ("the default", "the graph's static shape").
    source: str = "the default"
    # How ONNX Runtime runs the LN where that is not as the graph says (None: as written).
    layout: OrtLayout | None = None

    def as_run(
        self, original: list[tuple[str, int]], emitted: list[tuple[str, int]]
    ) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
        """(original, emitted) as ONNX Runtime runs them: an LN it runs decomposed over a strided
        axis is its 9 nodes there, and the Transposes it removed come back with the fold."""
        if self.layout is None or not self.layout.strided:
            return original, emitted
        d = original[0][1]
        return [("StridedDecomposedLayerNorm", d), *original[1:]], [*emitted, *[("Transpose", d)] * self.layout.transposes]

    @property
    def by_default(self) -> bool:
        """Whether the token count is the table's default (nothing fixed the LN's shape)."""
        return self.source == "the default"

    @property
    def words(self) -> str:
        """`at 1500 tokens (the given inputs)`, and where the count was brought into the measured range."""
        priced = self.table.priced_tokens(self.tokens)
        text = f"at {self.tokens} token{'s' if self.tokens != 1 else ''} ({self.source}"
        if priced != self.tokens:
            lo, hi = self.table.tokens_range
            text += f"; priced at {priced}, the {'fewest' if priced == lo else 'most'} the table measured"
        return text + ")"

    def total(self, nodes: list[tuple[str, int]]) -> float:
        return self.table.total(nodes, self.tokens)

    def spread(self, nodes: list[tuple[str, int]]) -> float:
        return self.table.total_spread(nodes, self.tokens)

    def compare(self, emitted: list[tuple[str, int]], original: list[tuple[str, int]]) -> Comparison:
        return Comparison(self.total(emitted), self.total(original), self.spread(emitted) + self.spread(original))

    def costs_more(self, emitted: list[tuple[str, int]], original: list[tuple[str, int]]) -> bool:
        """Whether `emitted` costs more than `original` by the central figures."""
        return self.total(emitted) > self.total(original)

    def saving(self, emitted: list[tuple[str, int]], original: list[tuple[str, int]], width: int | None = None) -> Saving:
        """What replacing `original` by `emitted` saves per run, with its spread."""
        return Saving(self.total(original) - self.total(emitted), self.spread(emitted) + self.spread(original), width, self)

    def created_bias_pays(self, widths: list[int], d: int | None) -> bool:
        """Whether Adds of created biases of `widths` (after linear layers that had none: ORT does
        not fuse MatMul + Add on tensors of symbolic shape, and its Gemm with a bias costs more
        still) cost less than one Add of beta over the LN's output of width `d` (two forms of one
        fold: the central figures decide)."""
        if d is None:
            return False
        return self.total([("BiasAdd", w) for w in widths]) < self.total([("BiasAdd", d)])

    def centering_pays(self, width: int | None, savings: list[Saving], kind: str = "Centering") -> bool:
        """Whether one explicit centering (`kind`: "Centering" over the last axis, or
        "StridedCentering") of a stream of width `width` costs less than the LNs it unlocks save, by
        more than the spread of both."""
        if width is None:
            return False
        return self.centerings_pay([(kind, width)], savings)

    def centerings_pay(self, centerings: list[tuple[str, int]], savings: list[Saving]) -> bool:
        """Whether `centerings` ((kind, width) each) together cost less than the LNs that need them
        save together, by more than the spread of both (docs/DESIGN.md section 2.3)."""
        gain = sum(s.amount for s in savings) - self.total(centerings)
        return gain > sum(s.spread for s in savings) + self.spread(centerings)

    def fused_residual_pays(self, d: int | None) -> bool:
        """Whether SkipSimplifiedLayerNormalization costs less than the residual `Add` followed by
        SimplifiedLayerNormalization over [tokens, d] (what `--fuse-residual auto` emits; two forms
        of one fold: the central figures decide)."""
        if d is None:
            return False
        return not self.costs_more([(SKIP_RMS_NORM.op_type, d)], [("Add", d), (RMS_NORM.op_type, d)])


def default_pricing(table: CostTable | None = None, tokens: int = DEFAULT_TOKENS) -> Pricing:
    return Pricing(table or builtin_table(), tokens)
