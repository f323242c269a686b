"""The floor of the default run at scale: what the check cannot do without, beside a copy of the files.

    python -m benchmarks.check_floor [--hidden 4096 --layers 52] [--dir DIR] [--reps 2]
                                     [--out benchmarks/results/check_floor]

On a model larger than memory the default run is held to 3x copying the model's files (issue 31;
`benchmarks.fold_cost`). Its check runs both models in ONNX Runtime block by block on the three
input sets, and the float64 twins of the original and of the fold on the first
(`verify.side_by_side`). Here each of those runs alone, in a process of its own, on the
GPT-2-style model of `models/make/make_large_model.py` (built once into `--dir`, as fold_cost
builds it), rep after rep in this order:

    copy            the model's files copied (fold_cost's baseline at this size)
    no_verify       python -m onnx_lnfold MODEL -o OUT --no-verify
    ort_original    ONNX Runtime's block-by-block run of the original on the check's input sets
    ort_fold        the same, of the fold that no_verify wrote
    twin_original   the original's float64 twin on the first set
    default         python -m onnx_lnfold MODEL -o OUT: the fold and its check, as users run it

and what the default run cannot go under (`floors`): the check's runs need their CPU seconds, at
best spread over every core. Each run alone reads its file from disk; side by side in the check a
file is read about once, so the floors count their CPU, not their wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.common import CACHE, log, machine_info, results_header, wait_for_quiet
from benchmarks.fold_cost import COPY_FILES, build_model, measure, model_files, warm_files, weight_bytes_of
from onnx_lnfold.bench.stats import fmt_ratio, ratio_of_medians

VARIANTS = ("copy", "no_verify", "ort_original", "ort_fold", "twin_original", "default")
WRITERS = ("copy", "no_verify", "default")  # each writes the output anew
RUNS = ("ort_original", "ort_fold", "twin_original")  # the check's runs: timed by themselves
TARGET = 3.0  # the default run's time over the copy's (issue 31)


def _input_sets(model: Path) -> list[dict[str, np.ndarray]]:
    """The check's input sets for `model`, as `verify.check.check_equivalence` makes them."""
    from onnx_lnfold.feeds.sets import verification_input_sets
    from onnx_lnfold.load.model import load_model

    ir_model, _ = load_model(model)
    return [s.feeds for s in verification_input_sets(ir_model)]


def run_one(kind: str, model: Path) -> dict[str, float]:
    """One of the check's runs, alone (what a `--run` subprocess does): its wall and CPU seconds
    (every thread's), from its inputs made to its outputs (the imports and the inputs left out:
    the check shares them)."""
    feeds = _input_sets(model)
    started, cpu = time.perf_counter(), time.process_time()
    if kind == "ort":
        from onnx_lnfold.verify.sessions import run_sets, session_for

        results = run_sets(session_for(model), feeds)  # block by block where the check runs it so
    else:
        from onnx_lnfold.verify.oracle.reference import Float64Model

        results = Float64Model(model).run_many(feeds[:1])
    failed = [r for r in results if isinstance(r, Exception)]
    if failed:
        raise SystemExit(f"{model}: {failed[0]}")
    return {"run_s": time.perf_counter() - started, "run_cpu_s": time.process_time() - cpu}


def _run_cmd(kind: str, model: Path) -> list[str]:
    return [sys.executable, "-m", "benchmarks.check_floor", "--run", kind, str(model)]


def _spread(values: list[float]) -> str:
    return f"{np.median(values):.1f} [{min(values):.1f}-{max(values):.1f}]"


def floors(runs: dict[str, list[dict]], cores: int) -> dict[str, list[float]]:
    """Per rep, over that rep's copy, what the default run cannot go under on `cores` cores:

    - "fold, then onnxruntime": the fold's own time, then ONNX Runtime's runs of both models, their
      CPU seconds spread over every core (the twins and the read-back free);
    - "default run's CPU": the default run's own CPU seconds spread over every core (its work as
      built, however its steps were scheduled);
    - "one pass": a fold and check in one pass over the weights, the fold costing a copy's CPU,
      ONNX Runtime's runs and both twins (the fold's counted as the original's) spread over every
      core (at least the copy's time; each twin alone reads its file, which the check shares)."""
    out: dict[str, list[float]] = {"fold, then onnxruntime": [], "default run's CPU": [], "one pass": []}
    for rep in range(len(runs["copy"])):
        cpu = {k: runs[k][rep]["run_cpu_s"] for k in VARIANTS}
        ort = cpu["ort_original"] + cpu["ort_fold"]
        copy = runs["copy"][rep]["wall_s"]
        out["fold, then onnxruntime"].append((runs["no_verify"][rep]["wall_s"] + ort / cores) / copy)
        out["default run's CPU"].append(cpu["default"] / cores / copy)
        out["one pass"].append(max(copy, (cpu["copy"] + ort + 2 * cpu["twin_original"]) / cores) / copy)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", choices=("ort", "twin"), help=argparse.SUPPRESS)
    p.add_argument("model", nargs="?", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--layers", type=int, default=52)
    p.add_argument("--dir", type=Path, default=CACHE / "large", help="where the model is built and kept, the fold written")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--wait-quiet", type=float, default=60.0, help="seconds to wait for other processes to go quiet")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/check_floor"))
    args = p.parse_args(argv)
    if args.run:
        print(json.dumps(run_one(args.run, args.model)))
        return 0
    cfg = {"label": "", "hidden": args.hidden, "layers": args.layers, "vocab": 50257, "positions": 1024}
    model = build_model(cfg, args.dir)
    out = args.dir / "floor_out.onnx"
    weights = weight_bytes_of(model)
    cmds = {
        "copy": [sys.executable, "-c", COPY_FILES, str(model), str(out)],
        "no_verify": [sys.executable, "-m", "onnx_lnfold", str(model), "-o", str(out), "--no-verify", "-q"],
        "ort_original": _run_cmd("ort", model),
        "ort_fold": _run_cmd("ort", out),
        "twin_original": _run_cmd("twin", model),
        "default": [sys.executable, "-m", "onnx_lnfold", str(model), "-o", str(out)],
    }
    runs: dict[str, list[dict]] = {k: [] for k in VARIANTS}
    warm_files(model)
    try:
        for rep in range(args.reps):
            for variant in VARIANTS:
                if variant in WRITERS:
                    for f in model_files(out):
                        f.unlink(missing_ok=True)
                if args.wait_quiet > 0:
                    wait_for_quiet(args.wait_quiet)
                os.sync()
                said = args.dir / "floor_run.json"
                r = measure(cmds[variant], stdout=said)
                # the run's own seconds where it says them (a copy and the fold: the whole process)
                own = json.loads(said.read_text()) if variant in RUNS and r["rc"] == 0 else {}
                r["run_s"], r["run_cpu_s"] = own.get("run_s", r["wall_s"]), own.get("run_cpu_s", r["cpu_s"])
                if variant == "default":  # its one line: what the verdict rests on
                    r["summary"] = next((x for x in said.read_text().splitlines() if x.startswith("onnx_lnfold:")), "")
                said.unlink(missing_ok=True)
                if r["rc"] != 0:
                    raise SystemExit(f"{variant} failed (rc {r['rc']}): {r.get('stderr', '')[-400:]}")
                runs[variant].append(r)
                log(f"rep {rep + 1}/{args.reps} {variant:13s} {r['wall_s']:6.1f} s (run {r['run_s']:.1f} s), CPU {r['cpu_s']:6.1f} s, "
                    f"peak {r['tree_peak_rss_bytes'] / 1e9:.2f} GB")
    finally:
        for f in model_files(out):
            f.unlink(missing_ok=True)

    machine = machine_info()
    command = "python -m benchmarks.check_floor " + " ".join(argv if argv is not None else sys.argv[1:])
    lines = results_header("Floor of the default run at scale", command.strip(), machine,
                           f"{args.reps} reps, the variants in this order each rep")
    lines += [f"Model: hidden {args.hidden}, {args.layers} layers, {weights / 1e9:.2f} GB of float32 weights.", "",
              "| run | wall s | its run s | its run's CPU s | peak GB | run vs copy |", "|---|---|---|---|---|---|"]
    copy = [r["wall_s"] for r in runs["copy"]]
    for variant in VARIANTS:
        wall, own = [r["wall_s"] for r in runs[variant]], [r["run_s"] for r in runs[variant]]
        lines.append(f"| {variant} | {_spread(wall)} | {_spread(own)} | {_spread([r['run_cpu_s'] for r in runs[variant]])} "
                     f"| {max(r['tree_peak_rss_bytes'] for r in runs[variant]) / 1e9:.2f} "
                     f"| {fmt_ratio(ratio_of_medians(own, copy), 2)} |")
    lines += ["", f"What the default run cannot go under, over the copy (per rep; CPU seconds spread over {os.cpu_count()} cores, `floors`):", "",
              "| floor | x copy | target |", "|---|---|---|"]
    cores = os.cpu_count() or 1
    found = floors(runs, cores)
    for name, ratios in found.items():
        lines.append(f"| {name} | {np.median(ratios):.2f} [{min(ratios):.2f}-{max(ratios):.2f}] | {TARGET:g} |")
    lines += ["", "The default run said: " + "; ".join(f"`{r['summary']}`" for r in runs["default"])]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "CHECK_FLOOR.md").write_text("\n".join(lines) + "\n")
    (args.out / "check_floor.json").write_text(json.dumps(
        {"machine": machine, "config": cfg, "weight_bytes": weights, "runs": runs, "floors": found,
         "when": time.strftime("%Y-%m-%d %H:%M")}, indent=1) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
