"""The GPU host's first part: a cost table for the provider, and `onnx-lnfold bench` with it.

    python -m benchmarks.cuda.costs --out DIR [--max-seconds 150]   # on the GPU host, CUDA
    python -m benchmarks.cuda.costs --smoke --out DIR               # the same steps on the CPU EP

1. `onnx-lnfold calibrate --provider CUDA` (onnx_lnfold/bench/calibrate.py): every kernel cost the
   never-slower rule reads, at the shapes it decides on, with its spread -> DIR/cuda_costs.json, and
   COSTS.md: each cost with its spread, and the rule's comparisons by this table against the
   built-in CPU one.
2. For each model (the real trained models present, at the shapes `benchmarks/trained.py` runs them,
   and the committed GPT-2): the plan by the built-in CPU table and by the new table (the decisions
   that differ), the fold by the new table (`--costs`, unverified here: the sweep after this checks
   its own folds' equivalence on the device), and `onnx-lnfold bench ORIGINAL FOLDED --provider
   CUDA` (onnx_lnfold/bench/compare.py) with the model's inputs -> BENCH.md, bench.json.

Every session runs on the provider asked for or the part fails with one line (no CPU figure is
ever written as a CUDA one). `--smoke` runs the same code on the CPU EP at toy sizes (`calibrate
--quick`, two processes of three rounds), to rehearse every step without a GPU; its results say so.
A part whose estimate would end after `--max-seconds` does not start and is listed as skipped.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.common import ROOT, log, machine_info

GPT2 = ROOT / "models" / "gpt2.onnx"
RESULTS_CUDA = ROOT / "benchmarks" / "results" / "cuda"


# The order models are benched in, where a time cap cuts the last first.
FIRST = ("whisper_encoder_torchscript", "dinov2_vits14", "ppocrv5_rec", "gpt2")


def models_present() -> list[tuple[str, Path, dict[str, np.ndarray]]]:
    """(name, file, inputs at the shape it runs) of each real trained model present, and the
    committed GPT-2; those of `FIRST` first."""
    from benchmarks import trained

    out = [(name, trained.TRAINED / file, make) for name, (file, _, make) in trained.MODELS.items()
           if (trained.TRAINED / file).exists()]
    out.append(("gpt2", GPT2, lambda: {"input_ids": (np.arange(128, dtype=np.int64) % 500).reshape(1, 128)}))
    out.sort(key=lambda m: FIRST.index(m[0]) if m[0] in FIRST else len(FIRST))
    return [(name, path, make()) for name, path, make in out]


def _decision(d) -> str:
    return f"folded ({d.rewrite.split('::')[-1]}, beta {d.beta})" if d.folded else f"kept ({d.code})"


def plan_changes(path: Path, feeds: dict, table: str) -> list[str]:
    """The LNs whose decision differs between the built-in CPU table and `table`, at the model's shape."""
    import onnx_lnfold

    builtin = onnx_lnfold.analyze(path, inputs=feeds)
    other = onnx_lnfold.analyze(path, inputs=feeds, costs=table)
    return [f"{a.node}: {_decision(a)} -> {_decision(b)}" for a, b in zip(builtin.decisions, other.decisions)
            if _decision(a) != _decision(b)]


def main(argv=None) -> int:
    t0 = time.perf_counter()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="the same steps on the CPU EP at toy sizes")
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-seconds", type=float, default=150.0, help="time cap for both steps (default 150)")
    ap.add_argument("--processes", type=int, default=3, help="bench processes (default 3: the fewest a verdict takes)")
    ap.add_argument("--rounds", type=int, default=10, help="bench rounds per process (default 10)")
    args = ap.parse_args(argv)
    from onnx_lnfold.bench.calibrate import calibrate, costs_text, decisions_text
    from onnx_lnfold.bench.compare import bench
    from onnx_lnfold.bench.placement import PlacementError
    from onnx_lnfold.bench.tables import write_table
    from onnx_lnfold.decide.costs import builtin_table

    provider = "CPUExecutionProvider" if args.smoke else "CUDAExecutionProvider"
    out = Path(args.out)
    if args.smoke and RESULTS_CUDA.resolve() in (out.resolve(), *out.resolve().parents):
        print(f"error: --smoke runs on the CPU EP; its figures are not written under {RESULTS_CUDA}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    table_path = out / ("cpu_smoke_costs.json" if args.smoke else "cuda_costs.json")
    command = "python -m benchmarks.cuda.costs " + " ".join(argv if argv is not None else sys.argv[1:])
    header = [f"Command: `{command.strip()}`" + ("  \n**SMOKE: CPU EP at toy sizes, not CUDA**" if args.smoke else "")]
    try:
        from benchmarks.cuda.sweep import _preload_cuda_libraries

        if not args.smoke:
            _preload_cuda_libraries()
        log(f"calibrate on {provider}")
        quick = {"widths": (64, 256), "tokens": (16, 128), "rounds": 3} if args.smoke else {}
        table, raw = calibrate(provider, processes=2, max_seconds=0.6 * args.max_seconds, source=str(table_path),
                               command=command.strip(), log=log, threads=1 if args.smoke else None, **quick)
    except PlacementError as e:
        print(f"error: placement: {e}", file=sys.stderr)
        return 2
    write_table(table, table_path)
    (out / "COSTS.md").write_text("\n".join([
        f"# Kernel costs on {provider} (onnx-lnfold calibrate)", "", *header, "",
        f"onnxruntime {table.onnxruntime}; {table.measured_by}; {time.perf_counter() - t0:.0f} s", "", "```",
        costs_text(table), "```", "",
        "What the never-slower rule decides by this table and by the built-in CPU one (emitted / original, each in "
        "its table's unit; 'cannot tell': the difference is within the two sides' spreads):", "", "```",
        decisions_text(table, builtin_table()), "```", ""]))
    log(f"table -> {table_path}")

    results, lines, skipped = [], [], []
    for name, path, feeds in models_present():
        elapsed = time.perf_counter() - t0
        if elapsed > args.max_seconds:
            skipped.append(f"{name} (time cap: {elapsed:.0f} s > {args.max_seconds:.0f} s)")
            continue
        folded = out / f"{path.stem}.{table_path.stem}.onnx"
        log(f"{name}: fold by {table_path.name}, bench on {provider}")
        changes = plan_changes(path, feeds, str(table_path))
        proc = subprocess.run([sys.executable, "-m", "onnx_lnfold", str(path), "-o", str(folded), "--costs",
                               str(table_path), "--no-verify", "-q", "--json", str(out / f"{folded.stem}.fold.json")],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            skipped.append(f"{name} (fold failed: {proc.stderr.strip().splitlines()[-1:]})")
            continue
        try:
            result = bench(str(path), str(folded), provider=provider, inputs=feeds, processes=args.processes,
                           rounds=3 if args.smoke else args.rounds, warmup=2, threads=1 if args.smoke else None)
        except PlacementError as e:
            skipped.append(f"{name} (placement: {e})")
            continue
        result.inputs_from = "at the shape benchmarks/trained.py runs it"
        results.append({"model": name, "decisions_cpu_table_vs_this": changes, **result.to_dict()})
        lines += [f"## {name}", "", f"Decisions that differ from the built-in CPU table's: {len(changes)}", ""]
        lines += [f"- {c}" for c in changes] + ["", "```", result.format_text(), "```", ""]
        (out / "bench.json").write_text(json.dumps({"machine": machine_info(), "results": results}, indent=1))
    text = [f"# onnx-lnfold bench on {provider}, folds by {table_path.name}", "", *header, "",
            f"{time.perf_counter() - t0:.0f} s in all (calibration included)", "", *lines]
    if skipped:
        text += ["Skipped: " + "; ".join(skipped), ""]
    (out / "BENCH.md").write_text("\n".join(text))
    log(f"done in {time.perf_counter() - t0:.0f} s: {out / 'COSTS.md'}, {out / 'BENCH.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
