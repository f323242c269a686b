"""Fold cost on one large external-data model: `benchmarks.fold_cost` at one configuration.

    python -m benchmarks.large_model --hidden 2048 --layers 12 [--repeat 3] [--dir D] [--out O]

The same as `python -m benchmarks.fold_cost --hidden H --layers L --reps N`: the model is built
(once, cached in --dir) by `models/make/make_large_model.py`, then `onnx.load` + `onnx.save`, the
default fold and `--no-verify` run interleaved, each in its own metered process; the meter, the
builder and the report are `benchmarks.fold_cost`'s (FOLD_COST.md, fold_cost.json in --out).
For several sizes at once: `python -m benchmarks.fold_cost --sizes 0.5,2.5,6,10`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from benchmarks import fold_cost


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--tie-head", action="store_true")
    p.add_argument("--repeat", type=int, default=3, help="runs of each command")
    p.add_argument("--dir", type=Path, help="where the model is built and kept (default: fold_cost's)")
    p.add_argument("--out", type=Path, help="where FOLD_COST.md and fold_cost.json go (default: fold_cost's)")
    args = p.parse_args(argv)
    forwarded = ["--hidden", str(args.hidden), "--layers", str(args.layers), "--vocab", str(args.vocab),
                 "--reps", str(args.repeat)]
    forwarded += ["--tie-head"] if args.tie_head else []
    forwarded += ["--dir", str(args.dir)] if args.dir else []
    forwarded += ["--out", str(args.out)] if args.out else []
    return fold_cost.main(forwarded)


if __name__ == "__main__":
    sys.exit(main())
