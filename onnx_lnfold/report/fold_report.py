"""The report: a summary line, then the plan, node counts before and after, verification figures,
where the output went. `format_text()` is what the command line prints; `to_json()` the same as data.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import onnx_ir as ir

from onnx_lnfold.analysis.plan import CenteringPlan, LnDecision
from onnx_lnfold.core.ops import RMS_OPS, TARGETS
from onnx_lnfold.core.version import VERSION
from onnx_lnfold.decide.pricing import DEFAULT
from onnx_lnfold.decide.targets import BETA_SITE_WORDS
from onnx_lnfold.report import kept
from onnx_lnfold.verify.verdict import FLOAT64, Verification

# How the JSON names the figure a verdict rests on (`verdict_figure`): the key it is the worst of.
_FLOAT64_FIGURE = "outputs[].float64_written (the fold as written vs the float64 reference)"
_ORT_FIGURE = "max_rel_diff (the fold vs the original in ONNX Runtime)"

_WIDTH = 100  # long lines (reasons, lists of names) wrap here
# A kept LN's specifics stand beside its name when that leaves them this column on; else under it.
_DETAIL_COLUMN = 48



def count_ops(model: ir.Model) -> dict[str, int]:
    counts = Counter(
        node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}" for node in model.graph
    )
    return dict(sorted(counts.items()))


def model_bytes(path: Path, data_files: Iterable[Path] = ()) -> int:
    """Bytes on disk of a model file and the external data files it reads."""
    return path.stat().st_size + sum(p.stat().st_size for p in set(data_files) if p.is_file())


def _mb(n: int) -> str:
    mb = n / 1e6
    return f"{mb:.0f}" if mb >= 100 else f"{mb:.1f}" if mb >= 10 else f"{mb:.2f}"


def _plural(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else many or one + 's'}"


def _wrap(text: str, indent: str, first: str = "") -> list[str]:
    """`first + text` wrapped at _WIDTH, continuation lines indented by `indent`."""
    return textwrap.wrap(
        text, _WIDTH, initial_indent=first, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False
    ) or [first.rstrip()]


def _folded_what(d: LnDecision) -> str:
    what = f"-> {d.rewrite}"
    if d.residual_add:
        what += " with its residual Add"
    if d.beta == "consumers" and any(site.endswith(BETA_SITE_WORDS["softmax"]) for site in d.beta_sites):
        return what + ", beta into consumer biases (a key projection's share: dropped)"
    return what + {"add": ", beta as Add", "consumers": ", beta folded into consumer biases"}.get(d.beta or "", "")


def _grouped(items: list[tuple[str, LnDecision]]) -> list[tuple[str, list[LnDecision]]]:
    """Decisions grouped by key, groups in graph order of their first LN, members in graph order."""
    groups: dict[str, list[LnDecision]] = {}
    for key, d in items:
        groups.setdefault(key, []).append(d)
    return list(groups.items())


@dataclass
class FoldReport:
    """What a fold did. `format_text()` is the report the command line prints, `format_summary()`
    its first line, `to_json()` the same as data; the repr is that line, shorter."""

    plan: CenteringPlan
    ops_before: dict[str, int]
    ops_after: dict[str, int]
    verification: Verification
    source: str | None = None
    output: str | None = None
    notes: list[str] = field(default_factory=list)
    size_before: int | None = None  # bytes on disk, external data included
    size_after: int | None = None
    elapsed_s: float | None = None
    dry_run: bool = False
    trace: list[str] = field(default_factory=list)  # the per-LN proof (`--verbose`)
    # The output is the input file's own bytes (nothing was folded, no external data); False when
    # the output was serialized from the model; None while nothing is written.
    output_identical: bool | None = None

    @property
    def nodes_before(self) -> int:
        return sum(self.ops_before.values())

    @property
    def nodes_after(self) -> int:
        return sum(self.ops_after.values())

    def _already_folded(self) -> dict[str, int]:
        return {op: self.ops_before[op] for op in RMS_OPS if self.ops_before.get(op)}

    def to_dict(self) -> dict[str, Any]:
        verification = self.verification.to_dict()
        verification["passed"] = self.verification.passed
        ort = sys.modules.get("onnxruntime") if self.verification.status != "skipped" else None
        verification["onnxruntime"] = getattr(ort, "__version__", None)
        # The one figure the verdict rests on (the summary line's), named: `max_rel_diff` is the fold
        # vs the original in ONNX Runtime, which decides only where no float64 reference ran.
        compared = bool(self.verification.outputs)
        verification["verdict_rel_diff"] = self.verification.decisive_rel_diff if compared else None
        verification["verdict_figure"] = (
            (_FLOAT64_FIGURE if self.verification.judgment == FLOAT64 else _ORT_FIGURE) if compared else None
        )
        return {
            "tool": "onnx_lnfold",
            "version": VERSION,
            "source": os.path.abspath(self.source) if self.source else None,
            "output": os.path.abspath(self.output) if self.output else None,
            "output_identical": self.output_identical,
            "dry_run": self.dry_run,
            "elapsed_s": self.elapsed_s,
            "size_before": self.size_before,
            "size_after": self.size_after,
            **self.plan.to_dict(),
            "target_description": self._target_description(),
            "nodes_before": self.nodes_before,
            "nodes_after": self.nodes_after,
            "ops_before": self.ops_before,
            "ops_after": self.ops_after,
            "verification": verification,
            "notes": self.notes,
            "trace": self.trace,
        }

    def _target_description(self) -> str:
        """What the target writes and which runtimes run it (measured: core.ops.TARGETS)."""
        return next(t.description for t in TARGETS if t.name == self.plan.target)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @property
    def refused(self) -> bool:
        """Something was folded and the check did not pass (failed, or could not run): nothing is
        written, and `fold()` raises instead of returning the model."""
        return self.verification.status in ("failed", "unverified")

    def _lns(self, one: str) -> str:
        """`5/5 LayerNorms folded` (`would fold 5/5 ...` in a dry run), or why there are none."""
        plan = self.plan
        if plan.decisions:
            counts = f"{len(plan.folded)}/{_plural(len(plan.decisions), one)}"
            return f"would fold {counts}" if self.dry_run else f"{counts} folded"
        done = self._already_folded()
        if done:
            return "already folded (" + ", ".join(f"{n} {op.split('::')[-1]}" for op, n in done.items()) + ")"
        return "no LayerNormalization"

    def _deciding_shape(self) -> str:
        """` at 8192 tokens (the default guess; --input-shape or --inputs sets it)`: the shape the
        cost rule priced the LNs at (the most of them, where they differ), and, where that was the
        default, the flags that give the shape the model runs at; empty where no LN was priced."""
        priced = Counter(d.priced_at for d in self.plan.decisions if d.priced_at)
        if not priced:
            return ""
        (most, _), *others = priced.most_common()
        text = f" {most}" + (f" (and {_plural(len(others), 'other shape')})" if others else "")
        if any(DEFAULT in at for at in priced):
            hint = "--input-shape or --inputs sets it"
            guess = f"({DEFAULT})"
            text = text.replace(guess, f"({DEFAULT} guess; {hint})") if guess in text else f"{text} ({DEFAULT} is a guess; {hint})"
        return text

    def _verdict(self, diff: str) -> str:
        return self.verification.verdict(diff)

    def _copy_kind(self) -> str:
        """How an output of a fold that changed nothing relates to the input."""
        return "unchanged copy" if self.output_identical else "equivalent copy"

    def format_summary(self) -> str:
        """One line: where from and to, LNs folded, size, verification verdict, time."""
        plan = self.plan
        where = self.source or "<model>"
        if self.output:
            where += f" -> {self.output}" + ("" if plan.folded else f" ({self._copy_kind()})")
        elif self.dry_run:
            where += " (dry run, nothing written)"
        elif self.refused:
            where += " (nothing written)"
        parts = [where, self._lns("LayerNorm") + self._deciding_shape()]
        if self.size_before is not None and self.size_after is not None:
            parts.append(f"{_mb(self.size_before)} -> {_mb(self.size_after)} MB")
        elif self.size_before is not None:
            grows = f" (+{_mb(plan.untied_bytes)} MB once written)" if plan.untied_bytes else ""
            parts.append(f"{_mb(self.size_before)} MB{grows}")
        parts.append(self._verdict("worst relative diff"))
        if self.elapsed_s is not None:
            parts.append(f"{self.elapsed_s:.1f} s")
        return "onnx_lnfold: " + ", ".join(parts)

    def summary(self) -> str:
        """Deprecated alias of `format_summary()` (it read like an attribute); removed in 0.2."""
        warnings.warn(
            "FoldReport.summary() is deprecated; use FoldReport.format_summary()", DeprecationWarning, stacklevel=2
        )
        return self.format_summary()

    def brief(self) -> str:
        """The repr's text: `gpt2.onnx -> out.onnx: 5/5 LNs folded, verified (rel 4.9e-07), 0.86 -> 0.98 MB, 0.3 s`."""
        where = os.path.basename(self.source) if self.source else "<model>"
        if self.output:
            where += f" -> {os.path.basename(self.output)}"
        parts = [self._lns("LN"), self._verdict("rel")]
        if self.size_before is not None:
            after = f" -> {_mb(self.size_after)}" if self.size_after is not None else ""
            parts.append(f"{_mb(self.size_before)}{after} MB")
        if self.elapsed_s is not None:
            parts.append(f"{self.elapsed_s:.1f} s")
        return f"{where}: " + ", ".join(parts)

    def __repr__(self) -> str:
        return f"<FoldReport {self.brief()}>"

    def _layer_norm_lines(self) -> list[str]:
        plan = self.plan
        if not plan.decisions:
            done = self._already_folded()
            if done:
                ops = ", ".join(f"{n} {op}" for op, n in done.items())
                return [f"nothing to fold: already folded ({ops}), no LayerNormalization left"]
            return ["nothing to fold: the model has no LayerNormalization"]
        folded = "would fold" if self.dry_run else "folded"
        lines = [f"LayerNorm nodes: {len(plan.folded)} {folded}, {len(plan.kept)} kept (of {len(plan.decisions)})"]
        for (what, note), members in _grouped([((_folded_what(d), d.cost_note), d) for d in plan.folded]):
            lines.append(f"  {len(members)} {folded} {what}:")
            names = ", ".join(d.node + (f" (Add '{d.residual_add}')" if d.residual_add else "") for d in members)
            lines += _wrap(names, " " * 6, " " * 6)
            if note:
                lines += _wrap(f"({note})", " " * 7, " " * 6)
        explained = {d.node: kept.explain_kept(d) for d in plan.kept}
        for headline, members in _grouped([(explained[d.node][0], d) for d in plan.kept]):
            lines += _wrap(headline, " " * 4, f"  {len(members)} kept: ")
            if not any(explained[d.node][1] for d in members):  # nothing to add per LN: names only
                lines += _wrap(", ".join(d.node for d in members), " " * 6, " " * 6)
                continue
            width = max(len(d.node) for d in members)
            for d in members:
                if 6 + width + 2 <= _DETAIL_COLUMN:  # name and detail side by side
                    lines += _wrap(explained[d.node][1], " " * (6 + width + 2), f"      {d.node:<{width}}  ")
                else:  # names too long for a column: the detail under its name
                    lines += _wrap(d.node, " " * 8, " " * 6)
                    lines += _wrap(explained[d.node][1], " " * 10, " " * 10)
        return lines

    def _pricing_lines(self) -> list[str]:
        """Which cost table decided, at which shapes (the LNs the cost rule priced)."""
        priced = Counter(d.priced_at for d in self.plan.decisions if d.priced_at)
        if not priced or not self.plan.costs:
            return []
        shapes = "; ".join(f"{at}: {_plural(n, 'LN')}" for at, n in priced.most_common())
        return _wrap(f"Priced by {self.plan.costs}, {shapes}", "  ")

    def _edit_lines(self) -> list[str]:
        plan = self.plan
        if not plan.edits:
            return []
        # A derived table (the Gathers read `table - row means`) is no copy in the file: it is
        # counted apart, so the count never says "copy" where the detail says "no copy".
        derived = [e for e in plan.edits if e.untie and e.means_name]
        copies = [e for e in plan.edits if e.untie and not e.means_name]
        parts = [_plural(len(copies), "untied copy", "untied copies")]
        if derived:
            parts.append(f"{len(derived)} derived at load")
        lines = [f"Centered constants: {len(plan.edits)} ({', '.join(parts)}, +{plan.untied_bytes:,} bytes)"]
        # In graph order of the first LN each edit serves, then by name.
        position = {d.node: i for i, d in enumerate(plan.decisions)}
        edits = sorted(plan.edits, key=lambda e: (min((position.get(n, 0) for n in e.required_by), default=0), e.tensor))
        width = max(len(e.tensor) for e in edits)
        for e in edits:
            copy = f"  untied -> {e.new_name} (+{e.copy_bytes:,} B)" if e.untie else ""
            if e.means_name:
                copy = f"  derived at load (+{e.copy_bytes:,} B of row means)"
            lines += _wrap(f"{e.centered_along:<7}  {e.role}{copy}", " " * (4 + width + 4), f"  {e.tensor:<{width}}  ")
            if e.note:
                lines += _wrap(f"({e.note})", " " * 6, " " * 6)
        for c in plan.centerings:
            if c.instead_of_untie:
                text = (
                    f"Explicit centering: '{c.tensor}' - ReduceMean over axis {c.axis} ({c.cost}) instead of "
                    f"an untied copy of '{c.instead_of_untie}' (saves {c.saved_bytes:,} bytes; --tied-weights untie)"
                )
            else:
                text = (
                    f"Explicit centering: '{c.tensor}' - ReduceMean over axis {c.axis} ({c.cost}) "
                    f"unlocks {_plural(len(c.required_by), 'LN')}: {', '.join(c.required_by)}"
                )
            lines += _wrap(text, "  ")
        return lines

    def _verification_lines(self) -> list[str]:
        first, *rest = self.verification.format_lines()
        lines = _wrap(first, "    ")
        for line in rest:  # already indented, by two or more
            indent = line[: len(line) - len(line.lstrip())]
            lines += _wrap(line.strip(), indent + "  ", indent)
        return lines

    def format_text(self) -> str:
        lines = [self.format_summary()]
        changed = [k for k in sorted(set(self.ops_before) | set(self.ops_after)) if self.ops_before.get(k, 0) != self.ops_after.get(k, 0)]
        # Each "op a -> b" stays whole on a line (a no-break space while wrapping: textwrap splits
        # on ASCII whitespace only).
        counts = "".join(f"; {k}\u00a0{self.ops_before.get(k, 0)}\u00a0->\u00a0{self.ops_after.get(k, 0)}" for k in changed)
        nodes = _wrap(f"Nodes: {self.nodes_before} -> {self.nodes_after}{counts}", "  ")
        lines += [line.replace("\u00a0", " ") for line in nodes]
        plan = self.plan
        if plan.folded:
            lines += _wrap(f"Target {plan.target}: {self._target_description()}", "  ")
        if plan.converted_from is not None:
            lines += _wrap(
                f"Opset: {plan.converted_from} -> {plan.converted_to}, converted by onnx.version_converter for --target "
                f"{plan.target} (its op needs opset {plan.converted_to}); the check runs the converted fold against the "
                "original as given",
                "  ",
            )
        lines += self._layer_norm_lines()
        lines += self._pricing_lines()
        lines += self._edit_lines()
        for advice in self.plan.advice:  # pipeline order (see _pipeline_order)
            lines += _wrap(advice, "  ")
        lines += self._verification_lines()
        if self.trace:
            lines.append("Proof per LayerNorm (--verbose):")
            for line in self.trace:  # indented by the proof itself
                indent = "  " + line[: len(line) - len(line.lstrip())]
                lines += _wrap(line.strip(), indent + "    ", indent)
        for note in self.notes:
            lines += _wrap(note, "  ")
        if self.output:
            copy = "an unchanged copy of the input" if self.output_identical else "an equivalent copy of the input, re-serialized"
            lines.append(f"Wrote {self.output}" + ("" if self.plan.folded else f" ({copy}: nothing was folded)"))
        return "\n".join(lines)
