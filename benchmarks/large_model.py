"""Fold cost on a large external-data model: peak RSS and wall time against a plain load + save.

    python -m benchmarks.large_model                       # hidden 2048, 48 layers: ~7.3 GB of weights
    python -m benchmarks.large_model --hidden 1024 --layers 8 --repeat 3 --dir /tmp/lm

Builds (once, cached in --dir) a GPT-2-style pre-LN model with `models/make/make_large_model.py`, then
runs, each in its own process:

- `round trip`: `onnx_ir.load(IN)` + `onnx_ir.save(OUT, external_data=...)`, the least any tool
  that rewrites the model must do;
- `fold`: `python -m onnx_lnfold IN -o OUT --no-verify -q`.

Peak RSS is the child's `ru_maxrss`, read by a small meter process that runs one command and
reports `getrusage(RUSAGE_CHILDREN)`, so runs never see each other's peaks. Wall time is the
median of `--repeat` runs (round trip and fold alternate; one unmeasured round trip first warms
the page cache; `sync` before each). Targets: fold RSS <= 0.5x the weight bytes, fold wall <= 1.5x the round trip.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RSS_TARGET = 0.5
WALL_TARGET = 1.5

_METER = r"""
import resource, subprocess, sys, time, json
t = time.perf_counter()
code = subprocess.call(sys.argv[1:])
wall = time.perf_counter() - t
print(json.dumps({"code": code, "wall": wall, "maxrss_kb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))
"""

_ROUND_TRIP = (
    "import sys, os, onnx_ir as ir; m = ir.load(sys.argv[1]); "
    "ir.save(m, sys.argv[2], external_data=os.path.basename(sys.argv[2]) + '.data')"
)


def _generator():
    spec = importlib.util.spec_from_file_location("make_large_model", ROOT / "models" / "make" / "make_large_model.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def measure(cmd: list[str]) -> dict:
    """Run `cmd` under the meter: exit code, wall seconds, peak RSS in bytes. Dirty pages of the
    previous run are flushed first, so that no run pays for another's writes."""
    os.sync()
    out = subprocess.run([sys.executable, "-c", _METER, *cmd], capture_output=True, text=True, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if result["code"] != 0:
        raise SystemExit(f"command failed ({result['code']}): {' '.join(cmd)}\n{out.stderr}")
    return {"wall": result["wall"], "rss": result["maxrss_kb"] * 1024}


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB"


def _remove(path: Path) -> None:
    for p in (path, path.with_name(path.name + ".data")):
        p.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--layers", type=int, default=48)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--tie-head", action="store_true")
    p.add_argument("--repeat", type=int, default=3, help="measured runs of each command (median wall, max RSS)")
    p.add_argument("--dir", type=Path, default=ROOT / "benchmarks" / "cache" / "large", help="where the model is built and kept")
    p.add_argument("--json", type=Path, help="also write the figures as JSON")
    p.add_argument("--drop-caches", action="store_true",
                   help="sync and drop the page cache first (needs root): the state the recorded result was taken in")
    args = p.parse_args(argv)

    gen = _generator()
    args.dir.mkdir(parents=True, exist_ok=True)
    tag = f"h{args.hidden}_l{args.layers}_v{args.vocab}" + ("_tied" if args.tie_head else "")
    model = args.dir / f"large_{tag}.onnx"
    data = model.with_name(model.name + ".data")
    if not (model.is_file() and data.is_file()):
        print(f"building {model} ...", file=sys.stderr, flush=True)
        t = time.perf_counter()
        gen.make_model(model, hidden=args.hidden, layers=args.layers, vocab=args.vocab, tie_head=args.tie_head)
        print(f"built in {time.perf_counter() - t:.0f} s", file=sys.stderr, flush=True)
    from onnx_lnfold.core.ir import weight_bytes
    from onnx_lnfold.load.model import load_path

    weights = weight_bytes(load_path(model))
    files = model.stat().st_size + data.stat().st_size
    free = shutil.disk_usage(args.dir).free
    if free < 2.2 * files:
        raise SystemExit(f"{args.dir}: {_gb(free)} free, need about {_gb(2.2 * files)} for the outputs")

    rt_out = args.dir / "roundtrip.onnx"
    fold_out = args.dir / "folded.onnx"
    round_trip = [sys.executable, "-c", _ROUND_TRIP, str(model), str(rt_out)]
    fold = [sys.executable, "-m", "onnx_lnfold", str(model), "-o", str(fold_out), "--no-verify", "-q"]

    if args.drop_caches:
        os.sync()
        try:
            Path("/proc/sys/vm/drop_caches").write_text("3\n")
        except OSError as e:
            raise SystemExit(f"--drop-caches: {e.strerror or e} (needs root on Linux)")
    print("warm-up round trip ...", file=sys.stderr, flush=True)
    measure(round_trip)
    _remove(rt_out)
    runs: dict[str, list[dict]] = {"round trip": [], "fold": []}
    for i in range(args.repeat):
        for name, cmd, out in (("round trip", round_trip, rt_out), ("fold", fold, fold_out)):
            r = measure(cmd)
            runs[name].append(r)
            print(f"  run {i + 1}/{args.repeat} {name:10s} {r['wall']:7.2f} s  {_gb(r['rss'])}", file=sys.stderr, flush=True)
            _remove(out)

    rt_wall = statistics.median(r["wall"] for r in runs["round trip"])
    rt_rss = max(r["rss"] for r in runs["round trip"])
    fold_wall = statistics.median(r["wall"] for r in runs["fold"])
    fold_rss = max(r["rss"] for r in runs["fold"])
    rt_min = min(r["wall"] for r in runs["round trip"])
    fold_min = min(r["wall"] for r in runs["fold"])
    rss_ratio = fold_rss / weights
    wall_ratio = fold_wall / rt_wall
    verdict = {True: "met", False: "NOT met"}

    print(f"model: {model.name} (hidden {args.hidden}, {args.layers} layers, vocab {args.vocab}), files {_gb(files)}, "
          f"weights {_gb(weights)}; median of {args.repeat} runs, {os.cpu_count()} CPUs")
    print(f"{'':12s} {'wall':>9s} {'min wall':>9s} {'peak RSS':>10s} {'RSS/weights':>12s}")
    print(f"{'round trip':12s} {rt_wall:8.2f}s {rt_min:8.2f}s {_gb(rt_rss):>10s} {rt_rss / weights:11.2f}x")
    print(f"{'fold':12s} {fold_wall:8.2f}s {fold_min:8.2f}s {_gb(fold_rss):>10s} {rss_ratio:11.2f}x")
    print(f"fold RSS / weight bytes  {rss_ratio:5.2f}x  (target <= {RSS_TARGET}x: {verdict[rss_ratio <= RSS_TARGET]})")
    print(f"fold wall / round trip   {wall_ratio:5.2f}x  (target <= {WALL_TARGET}x: {verdict[wall_ratio <= WALL_TARGET]}; "
          f"ratio of the fastest runs {fold_min / rt_min:.2f}x)")
    if args.json:
        args.json.write_text(json.dumps({
            "model": model.name, "hidden": args.hidden, "layers": args.layers, "vocab": args.vocab,
            "file_bytes": files, "weight_bytes": weights, "runs": runs,
            "round_trip": {"wall": rt_wall, "min_wall": rt_min, "rss": rt_rss},
            "fold": {"wall": fold_wall, "min_wall": fold_min, "rss": fold_rss},
            "rss_ratio": rss_ratio, "wall_ratio": wall_ratio,
        }, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
