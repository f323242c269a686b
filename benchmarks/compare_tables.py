"""Cost tables side by side: each kind's cost with its spread at the shapes the rule decides on, and
what the never-slower rule decides by each (units differ between tables: each decision is the
table's own, within its own spread).

    onnx-lnfold calibrate --provider CPU --threads 1 -o benchmarks/results/calibrate/cpu_run1.json   # twice
    python -m benchmarks.compare_tables benchmarks/results/calibrate/cpu_run*.json [--out FILE.md]

The built-in table (callgrind instructions, onnx_lnfold/decide/tables/cpu.json) is always the first column.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from benchmarks.common import ROOT
from onnx_lnfold.bench.calibrate import comparisons, judged
from onnx_lnfold.decide.costs import KINDS, builtin_table, load_table

WIDTHS = (64, 384, 768, 1024)
TOKENS = (16, 1024, 8192)


def _cell(table, kind: str, tokens: int, width: int) -> str:
    return f"{table.figure(table.cost(kind, tokens, width))} +- {table.figure(table.spread(kind, tokens, width))}"


def render(paths: list[str]) -> str:
    tables = [builtin_table()] + [load_table(p) for p in paths]
    names = ["built-in (callgrind instructions)"] + [f"{Path(p).name} (us)" for p in paths]
    lines = ["# Cost tables compared", "", f"`python -m benchmarks.compare_tables {' '.join(paths)}`", ""]
    for t, name in zip(tables, names):
        lines.append(f"- {name}: {t.provider}, onnxruntime {t.onnxruntime}; {t.measured_by}")
    lines += ["", "## Each cost with its spread (the fit at the shape; spread: the nearest measured point's "
              "spread between processes plus the fit's error there)", "",
              "| kind | d | tokens | " + " | ".join(names) + " | " + " | ".join(f"/ LN, {n.split(' ')[0]}" for n in names)
              + " |", "|---|---|---|" + "---|" * (2 * len(names))]
    for kind in KINDS:
        for width in WIDTHS:
            for tokens in TOKENS:
                cells = [_cell(t, kind, tokens, width) for t in tables]
                rel = [f"{t.cost(kind, tokens, width) / t.cost('LayerNormalization', tokens, width):.2f}" for t in tables]
                lines.append(f"| {kind} | {width} | {tokens} | " + " | ".join(cells) + " | " + " | ".join(rel) + " |")
    lines += ["", "## What the rule decides by each table (emitted / original; 'cannot tell': within the two sides' "
              "spreads)", "", "| comparison | d | tokens | " + " | ".join(names) + " | same decision |",
              "|---|---|---|" + "---|" * len(names) + "---|"]
    differ = 0
    for width in WIDTHS:
        for tokens in TOKENS:
            for label, emitted, original in comparisons(width):
                verdicts = [judged(t, emitted, original, tokens) for t in tables]
                same = len({w for _, w in verdicts}) == 1
                differ += not same
                lines.append(f"| {label} | {width} | {tokens} | " + " | ".join(f"x{r:.3f} costs {w}" for r, w in verdicts)
                             + f" | {'yes' if same else '**no**'} |")
    lines += ["", f"{differ} comparisons of {len(WIDTHS) * len(TOKENS) * len(comparisons(1024))} decide differently "
              "between the tables.", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tables", nargs="+")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "calibrate" / "CALIBRATE.md"))
    args = ap.parse_args(argv)
    text = render(args.tables)
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
