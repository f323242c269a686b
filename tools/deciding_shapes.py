"""Which decisions change when the cost rule prices each LN at the shape the model runs at, rather
than at the default 8x1024 tokens (docs/DESIGN.md section 4.1).

    python tools/deciding_shapes.py [--out benchmarks/results/DECIDING_SHAPES.md] [--costs COSTS.json]

For every committed model (`models/*.onnx`, at its committed verification inputs `NAME.inputs.npz`)
and every real trained model that is there (`LNFOLD_TRAINED_DIR` or models/trained/, at the shapes
`benchmarks/trained.py` runs them: Whisper's encoder at 1500 frames, its decoder one step after 16
tokens and a 29-token prompt, DINOv2 at 257 tokens, PP-OCRv5 at a 48 x 320 line), the plan with no
inputs (the default) and with those inputs, and every LN whose decision differs.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))  # this checkout's onnx_lnfold and benchmarks

import onnx_lnfold  # noqa: E402


def _decision(d) -> str:
    if d.folded:
        return f"folded ({d.rewrite.split('::')[-1]}, beta {d.beta})"
    return f"kept ({d.code})"


def cases() -> list[tuple[str, Path, dict[str, np.ndarray], str]]:
    """(name, model, inputs, what the inputs are)."""
    out = []
    for model in sorted((ROOT / "models").glob("*.onnx")):
        feeds = model.with_name(model.stem + ".inputs.npz")
        if feeds.exists():
            with np.load(feeds) as z:
                out.append((model.stem, model, {k: z[k] for k in z.files}, "committed verification inputs"))
    from benchmarks import trained

    for name, (file, what, make) in trained.MODELS.items():
        path = trained.TRAINED / file
        if path.exists():
            out.append((f"{name} (real)", path, make(), what))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "DECIDING_SHAPES.md"))
    ap.add_argument("--costs", help="a cost table (default: the built-in CPU one)")
    args = ap.parse_args(argv)
    logging.disable(logging.WARNING)
    rows, changes = [], []
    for name, path, feeds, what in cases():
        default = onnx_lnfold.analyze(path, costs=args.costs)
        own = onnx_lnfold.analyze(path, inputs=feeds, costs=args.costs)
        shapes = ", ".join(f"{k}{tuple(v.shape)}" for k, v in feeds.items() if v.ndim)
        at = sorted({d.priced_at for d in own.decisions if d.priced_at})
        differ = [(a, b) for a, b in zip(default.decisions, own.decisions) if _decision(a) != _decision(b)]
        rows.append(f"| {name} | {shapes} ({what}) | {len(default.decisions)} | {len(default.folded)} | "
                    f"{len(own.folded)} | {'; '.join(at) or '-'} | {len(differ)} |")
        for a, b in differ:
            changes.append(f"| {name} | {a.node} | {_decision(a)} | {_decision(b)} | {b.priced_at or '-'} |")
        print(f"{name}: {len(default.folded)} -> {len(own.folded)} folded, {len(differ)} decisions differ", flush=True)
    table = onnx_lnfold.analyze(ROOT / "models" / "gpt2.onnx", costs=args.costs).costs
    text = [
        "# Decisions priced at the model's own shape against the default 8x1024 tokens",
        "",
        f"`python tools/deciding_shapes.py{' --costs ' + args.costs if args.costs else ''}`; cost table: {table}. "
        "`default`: no inputs given (every LN priced at 8192 tokens, the top of the table's measured range); "
        "`own`: the inputs below given (`--inputs`), each LN priced at the tokens they make it run at "
        "(below 16 tokens priced at 16, the fewest measured).",
        "",
        "| model | inputs | LNs | folded (default) | folded (own) | priced at (own) | decisions that differ |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
        "## Every decision that differs",
        "",
        "| model | LN | default | own shape | priced at |",
        "|---|---|---|---|---|",
        *(changes or ["| - | - | - | - | - |"]),
    ]
    Path(args.out).write_text("\n".join(text) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
