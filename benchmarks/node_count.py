"""The default command's time and memory against the number of nodes, beside ONNX Runtime's own
session creation for the same model.

    python -m benchmarks.node_count [--sizes 10000 50000 200000] [--reps 2] [--out benchmarks/results/node_count]

Exports reach 50,000-100,000 nodes; every step of the fold (load, analysis, the fusion check's
weightless copies, apply, the float64 and ONNX Runtime verification, save, report) must take time
near-linear in their number. The model is `tests/hostile_models.identity_chain(n)`: x -> MatMul ->
Add -> n Identity nodes -> LayerNormalization -> MatMul -> Add -> y, one LN that folds, weights of a
few kB, so the nodes are all there is to the cost. For each size, `python -m onnx_lnfold m.onnx -o
o.onnx` (verification included) runs in its own process, the sizes interleaved round by round;
its wall time, CPU seconds and peak RSS are taken from `wait4`. Seconds per 1000 nodes, flat across
the sizes, is the near-linearity. `ORT session` is `onnxruntime.InferenceSession` on the same model
(CPU EP) in its own process, timed around the constructor alone: at its default level, which
removes the Identity nodes first, and with optimizations off, as the check makes one of each model.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import ROOT, log, machine_info, results_header

DEFAULT_SIZES = (10_000, 50_000, 200_000)
_SESSION = (
    "import sys, time, onnxruntime as ort; options = ort.SessionOptions(); "
    "options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, sys.argv[2]); "
    "start = time.perf_counter(); "
    "ort.InferenceSession(sys.argv[1], options, providers=['CPUExecutionProvider']); print(time.perf_counter() - start)"
)
# ONNX Runtime's levels the yardstick is timed at: its default, and off (the check's sessions).
SESSION_LEVELS = {"ort_session_s": "ORT_ENABLE_ALL", "ort_session_off_s": "ORT_DISABLE_ALL"}


def write_model(nodes: int, folder: Path) -> Path:
    """`identity_chain(nodes)` as `folder/m.onnx`."""
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        import hostile_models
    finally:
        sys.path.remove(str(ROOT / "tests"))
    folder.mkdir(parents=True, exist_ok=True)
    hostile_models.identity_chain(nodes)(folder)
    return folder / "m.onnx"


def _child(command: list[str], timeout: float) -> dict:
    """Runs `command`; its exit code, wall seconds, CPU seconds, peak RSS (GB) and stdout/stderr tails."""
    start = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        child = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=err)
        deadline = start + timeout
        while True:
            pid, status, usage = os.wait4(child.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                child.kill()
                _, status, usage = os.wait4(child.pid, 0)
                break
            time.sleep(0.05)
        wall = time.perf_counter() - start
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    return {
        "rc": os.waitstatus_to_exitcode(status),
        "wall_s": wall,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "peak_gb": usage.ru_maxrss * 1024 / 1e9,
        "stdout": stdout[-2000:],
        "stderr": stderr[-2000:],
    }


def fold_run(model: Path, timeout: float) -> dict:
    """The default command on `model`, its output next to it (then removed)."""
    out = model.with_name("o.onnx")
    run = _child([sys.executable, "-m", "onnx_lnfold", str(model), "-o", str(out)], timeout)
    run["summary"] = run.pop("stdout").splitlines()[0] if run["stdout"] else ""
    for leftover in model.parent.glob("o.onnx*"):
        leftover.unlink()
    return run


def session_run(model: Path, timeout: float, level: str = "ORT_ENABLE_ALL") -> dict:
    """ONNX Runtime's session creation for `model` at optimization `level`, timed inside its own process."""
    run = _child([sys.executable, "-c", _SESSION, str(model), level], timeout)
    run["session_s"] = float(run.pop("stdout").strip().splitlines()[-1]) if run["rc"] == 0 else float("nan")
    return run


def spread(values: list[float]) -> dict:
    """min, median and max of `values` (NaN where there are none)."""
    if not values:
        return {"min": float("nan"), "median": float("nan"), "max": float("nan")}
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def summarize(nodes: int, folds: list[dict], sessions: dict[str, list[dict]]) -> dict:
    """The figures of one size: wall, CPU and peak RSS spreads of the successful folds, seconds per
    1000 nodes (from each run's wall time), ONNX Runtime's session creation seconds at each level
    of `sessions` (by the key of `SESSION_LEVELS`)."""
    ok = [r for r in folds if r["rc"] == 0]
    return {
        "nodes": nodes,
        "runs": len(folds),
        "failed": len(folds) - len(ok),
        "wall_s": spread([r["wall_s"] for r in ok]),
        "cpu_s": spread([r["cpu_s"] for r in ok]),
        "peak_gb": spread([r["peak_gb"] for r in ok]),
        "s_per_1000_nodes": spread([r["wall_s"] * 1000 / nodes for r in ok]),
        **{key: spread([r["session_s"] for r in runs if r["rc"] == 0]) for key, runs in sessions.items()},
    }


def table(summaries: list[dict]) -> list[str]:
    def cell(s: dict, digits: int) -> str:
        return f"{s['median']:.{digits}f} [{s['min']:.{digits}f}-{s['max']:.{digits}f}]"

    lines = [
        "| nodes | runs | wall s | CPU s | peak RSS GB | s per 1000 nodes | ORT session s | ORT session s, optimizations off |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        runs = f"{s['runs']}" + (f" ({s['failed']} failed)" if s["failed"] else "")
        lines.append(
            f"| {s['nodes']:,} | {runs} | {cell(s['wall_s'], 1)} | {cell(s['cpu_s'], 1)} | {cell(s['peak_gb'], 2)} "
            f"| {cell(s['s_per_1000_nodes'], 3)} | {cell(s['ort_session_s'], 2)} | {cell(s['ort_session_off_s'], 2)} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=list(DEFAULT_SIZES), help="Identity nodes in the chain")
    p.add_argument("--reps", type=int, default=2, help="rounds; each runs every size once, interleaved")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds one fold may take before it is stopped")
    p.add_argument("--dir", type=Path, default=None, help="where the models are written (default: a temporary folder)")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "node_count")
    args = p.parse_args(argv)

    with tempfile.TemporaryDirectory() as scratch:
        base = args.dir or Path(scratch)
        models = {n: write_model(n, base / f"chain{n}") for n in args.sizes}
        folds: dict[int, list[dict]] = {n: [] for n in args.sizes}
        sessions: dict[int, dict[str, list[dict]]] = {n: {key: [] for key in SESSION_LEVELS} for n in args.sizes}
        for r in range(args.reps):
            order = args.sizes if r % 2 == 0 else args.sizes[::-1]
            for n in order:
                folds[n].append(fold_run(models[n], args.timeout))
                for key, level in SESSION_LEVELS.items():
                    sessions[n][key].append(session_run(models[n], args.timeout, level))
                f = folds[n][-1]
                timed = ", ".join(f"{level} {sessions[n][key][-1]['session_s']:.2f} s" for key, level in SESSION_LEVELS.items())
                log(f"round {r + 1}, {n} nodes: fold rc {f['rc']} {f['wall_s']:.1f} s {f['peak_gb']:.2f} GB; ORT session {timed}")
    summaries = [summarize(n, folds[n], sessions[n]) for n in args.sizes]

    machine = machine_info()
    command = "python -m benchmarks.node_count " + " ".join(argv if argv is not None else sys.argv[1:])
    note = f"{args.reps} interleaved rounds on {machine['cores_usable']} cores: median [min-max]."
    lines = results_header("Node count", command.strip(), machine, note)
    lines += [
        "The default command (verification included) on `tests/hostile_models.identity_chain(n)`, n "
        "Identity nodes between two MatMul/Add pairs around one LayerNormalization; `ORT session` is "
        "onnxruntime.InferenceSession on the same model, alone in its own process, at its default level (which "
        "removes the Identity nodes first) and with optimizations off (as the check makes one of each model).",
        "",
        *table(summaries),
        "",
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "README.md").write_text("\n".join(lines))
    (args.out / "node_count.json").write_text(
        json.dumps({"machine": machine, "command": command.strip(), "summaries": summaries,
                    "folds": folds, "sessions": sessions}, indent=1) + "\n"
    )
    print("\n".join(lines))
    return 0 if all(s["failed"] == 0 for s in summaries) else 1


if __name__ == "__main__":
    raise SystemExit(main())
