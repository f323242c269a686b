"""Instructions executed per run under valgrind (callgrind, one thread): original vs folded vs re-saved.

    python -m benchmarks.instructions [--models gpt2_small opt_small] [--batch 1] [--seq 16]
                                      [--file MODEL.onnx FEEDS.npz ...] [--int8]
                                      [--runs 2] [--processes 2] [--jobs 2] [--json F] [--md F]

Wall clock on shared cores cannot resolve a 1% effect; the instruction count of a run can, once it is
deterministic. Each measurement is one process under
`valgrind --tool=callgrind --instr-atstart=no --zero-before=getpgrp --dump-before=getsid`:

1. Python, onnxruntime and the sessions start uninstrumented (fast), one warm-up run each;
2. the child switches instrumentation on (`callgrind_control -i on PID`), then brackets each counted
   segment between `os.getpgrp()` (counters zeroed) and `os.getsid(0)` (counters dumped): functions
   neither Python nor onnxruntime call otherwise, so every dump holds exactly one segment's runs;
3. segments per session: `--singles` single runs (what "one warm-up" counts), then N runs, then 2N
   runs. Per run = (I(2N) - I(N)) / N: the fixed cost of a segment (the brackets, the Python loop's
   setup) cancels, and so does any extra work of the first runs (memory-pattern planning, arena growth).

Every process runs with PYTHONHASHSEED=0, ASLR off (`setarch -R`), one intra-op and one inter-op
thread, intra-op spinning off, graph optimization level ALL, CPU EP: the conditions the wall-clock
benchmark uses, minus the threads.

The variants, per model: the original, a byte-identical copy (the control: a name, a position or a
process alone must move nothing), the re-saved original (onnx_ir load + save: the path the fold writes
through), the folded model, and two rewrites of the original that run the instructions of a model
without its LNs and of one whose LNs all became RMSNorm (every LayerNormalization replaced by
Identity, "stripped", and by SimplifiedLayerNormalization(x, gamma), "ideal": neither computes the
model's function, but kernels execute the same instructions whatever the values). With `--int8`,
every variant again after `quantize_dynamic` (the fold first, as deployments should run it).

Every variant enters its ratios measured at least four times: twice in each of `--processes`
processes (default 2), at rotated positions (a burn-in session first in each: the first session
measured after instrumentation starts has shown a one-time cost). The agreement gate holds every
variant alike: its counts must agree within 0.1%, and so must the original's with the copy's. A
one-off event (~200k instructions have been seen to land in any session's segment) fails the gate
instead of passing as a saving; the row is then marked not trusted and the exit status is 1.

    norm share  = 1 - I(stripped) / I(original)        the LNs' share of the run, dispatch included
    reachable   = 1 - I(ideal) / I(original)           what replacing every LN by RMSNorm saves
    achieved    = 1 - I(folded) / I(re-saved)          what the fold saved (against the re-saved
                                                       original, so the load/save path cancels)
    share       = achieved / reachable

Each is printed from the medians, with the range over every pairing of the counts behind it.
The fused SkipLayerNormalization that ORT makes of the original's last `Add + LN` becomes an `Add` and a
SimplifiedLayerNormalization in the ideal model (ORT never fuses `Add + SimplifiedLN`). The fold writes
the same there (`--fuse-residual auto`): on ORT's CPU EP SkipSimplifiedLayerNormalization costs more
instructions than `Add + SimplifiedLayerNormalization`, at every shape measured
(benchmarks/results/EMISSION_COSTS.md). What the ideal model saves and no exact fold can is beta:
the ideal drops it, the fold keeps it, in a consumer's bias where that is free and as an `Add` after
the RMSNorm where nothing can take it (the final LN before a tied LM head: a bias over the vocabulary
would cost more).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from benchmarks.common import CACHE, ROOT, ensure_exported, log, machine_info, results_header

SINGLE_SEGMENTS = 2
ZERO_FN, DUMP_FN = "getpgrp", "getsid"
TOLERANCE = 1e-3  # the same file twice / a byte-identical copy must agree within 0.1%


# --------------------------------------------------------------------------- #
# Child: runs under valgrind
# --------------------------------------------------------------------------- #
def child(plan_path: str) -> int:
    """Run the plan: every session is created and warmed up once uninstrumented; then, instrumented,
    for each session in turn: `singles` segments of one run, a segment of N runs, one of 2N runs."""
    import onnxruntime as ort

    plan = json.loads(Path(plan_path).read_text())
    sessions = []
    for item in plan["sessions"]:
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.intra_op_num_threads = 1
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        so.log_severity_level = 3
        sess = ort.InferenceSession(item["model"], so, providers=["CPUExecutionProvider"])
        with np.load(item["feeds"]) as z:
            feeds = {i.name: z[i.name] for i in sess.get_inputs()}
        sess.run(None, feeds)  # warm-up, uninstrumented
        sessions.append((sess, feeds))
    # Python's cyclic GC runs every few hundred allocations, not every run: its cost would land in
    # whichever segment crosses the threshold
    gc.collect()
    gc.disable()
    if os.environ.get("LNFOLD_UNDER_CALLGRIND"):
        ctl = subprocess.run(["callgrind_control", "-i", "on", str(os.getpid())], capture_output=True, text=True)
        if ctl.returncode != 0:
            print(f"callgrind_control failed: {ctl.stderr.strip()}", file=sys.stderr)
            return 3
    runs = plan["runs"]
    for sess, feeds in sessions:
        for count in [1] * plan["singles"] + [runs, 2 * runs]:
            os.getpgrp()  # callgrind: --zero-before
            for _ in range(count):
                sess.run(None, feeds)
            os.getsid(0)  # callgrind: --dump-before
    return 0


# --------------------------------------------------------------------------- #
# Parent
# --------------------------------------------------------------------------- #
def _read_dumps(prefix: Path) -> list[dict]:
    """Per dump (in order): instructions of the main thread and of all other threads together
    (--separate-threads=yes writes PREFIX.K-TT, TT = thread)."""
    by_dump: dict[int, dict] = {}
    for p in prefix.parent.glob(prefix.name + ".*-*"):
        k, thread = p.name[len(prefix.name) + 1:].split("-")
        ir_count = 0
        for line in p.read_text().splitlines():
            if line.startswith("summary:") or line.startswith("totals:"):
                ir_count = int(line.split()[1])
                break
        d = by_dump.setdefault(int(k), {"main": 0, "other_threads": 0})
        d["main" if int(thread) == 1 else "other_threads"] += ir_count
    return [by_dump[k] for k in sorted(by_dump)]


def _read_main_events(prefix: Path) -> list[dict[str, int]]:
    """Per dump (in order): every event callgrind counted in the main thread (Ir, and with
    --cache-sim=yes the data reads/writes and the first-level and last-level cache misses)."""
    by_dump: dict[int, dict[str, int]] = {}
    for p in prefix.parent.glob(prefix.name + ".*-01"):
        names: list[str] = []
        for line in p.read_text().splitlines():
            if line.startswith("events:"):
                names = line.split()[1:]
            elif line.startswith("summary:") or line.startswith("totals:"):
                by_dump[int(p.name[len(prefix.name) + 1:].split("-")[0])] = dict(zip(names, map(int, line.split()[1:])))
                break
    return [by_dump[k] for k in sorted(by_dump)]


def measure(sessions: list[dict], runs: int, singles: int, workdir: Path, tag: str, hash_seed: str = "0",
            cache_sim: bool = False) -> dict:
    """One valgrind process over several sessions: per session, its segments and the per-run figure
    (main thread: onnxruntime runs every kernel there with one intra-op thread; other threads'
    instructions are reported apart). With `cache_sim`, callgrind also simulates the caches and
    every main-thread event is reported per run (`events_per_run`)."""
    prefix = workdir / f"cg.{tag}"
    plan = workdir / f"plan.{tag}.json"
    plan.write_text(json.dumps({"sessions": sessions, "runs": runs, "singles": singles}))
    env = dict(os.environ, PYTHONHASHSEED=hash_seed, LNFOLD_UNDER_CALLGRIND="1", OMP_NUM_THREADS="1",
               OPENBLAS_NUM_THREADS="1")
    cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--separate-threads=yes",
           f"--zero-before={ZERO_FN}", f"--dump-before={DUMP_FN}", f"--callgrind-out-file={prefix}",
           *(["--cache-sim=yes"] if cache_sim else []),
           sys.executable, "-m", "benchmarks.instructions", "--child", str(plan)]
    if shutil.which("setarch"):
        cmd = ["setarch", os.uname().machine, "-R"] + cmd
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"valgrind child failed for {tag}: {proc.stderr.strip()[-800:]}")
    dumps = _read_dumps(prefix)
    events = _read_main_events(prefix)
    per = singles + 2
    if len(dumps) != per * len(sessions):
        raise RuntimeError(f"{tag}: expected {per * len(sessions)} callgrind dumps, found {len(dumps)}")
    out = {}
    for i, item in enumerate(sessions):
        seg = dumps[i * per:(i + 1) * per]
        i_n, i_2n = seg[-2]["main"], seg[-1]["main"]
        out[item["name"]] = {"model": item["model"], "hash_seed": hash_seed, "process": tag, "runs": runs,
                             "singles": [d["main"] for d in seg[:singles]], "I_N": i_n, "I_2N": i_2n,
                             # runs=0: a model too slow under valgrind for more than its single runs
                             "per_run": (i_2n - i_n) / runs if runs else None,
                             "naive_per_run": i_n / runs if runs else None,
                             "other_threads": [d["other_threads"] for d in seg]}
        if cache_sim and runs:
            ev_n, ev_2n = events[(i + 1) * per - 2], events[(i + 1) * per - 1]
            out[item["name"]]["events_per_run"] = {k: (ev_2n[k] - ev_n[k]) / runs for k in ev_2n}
    return {"sessions": out, "seconds": time.perf_counter() - t0}


def _strip_layernorms(src: Path, dst: Path, to: str = "Identity") -> int:
    """Every LayerNormalization becomes `Identity(x)` ("stripped": the model without its LNs) or
    `SimplifiedLayerNormalization(x, gamma)` with the same axis and epsilon ("ideal": every LN replaced
    by RMSNorm, beta dropped, nothing centered). Neither computes the model's function; both execute
    what they would for any data, and instruction counts of these kernels do not depend on the values."""
    import onnx

    m = onnx.load(str(src))
    n = 0
    for node in m.graph.node:
        if node.op_type == "LayerNormalization" and node.domain in ("", "ai.onnx"):
            del node.input[1 if to == "Identity" else 2:]
            keep = [a for a in node.attribute if to != "Identity" and a.name in ("axis", "epsilon")]
            del node.attribute[:]
            node.attribute.extend(keep)
            del node.output[1:]
            node.op_type = to
            n += 1
    used = {i for node in m.graph.node for i in node.input}
    keep = [t for t in m.graph.initializer if t.name in used]
    del m.graph.initializer[:]
    m.graph.initializer.extend(keep)
    onnx.save(m, str(dst))
    return n


def spread(values: list[float]) -> float:
    return (max(values) - min(values)) / min(values)


# The models whose counts enter a ratio. `copy` is the original's bytes under another name: the
# control that a file name, a position or a process alone moves nothing.
VARIANTS = ("original", "copy", "resaved", "folded", "stripped", "ideal")


def process_plan(variants: dict[str, str], feeds: str, k: int) -> list[dict]:
    """The sessions of process `k`: a burn-in session (the first session measured after
    instrumentation starts has shown a one-time cost), then every variant twice, the order rotated
    by `k` and reversed for the second pass, so each variant is counted at two positions per
    process and at other positions in every other process."""
    names = list(variants)
    order = names[k % len(names):] + names[: k % len(names)]
    sessions = [{"name": "burn_in", "model": variants["original"], "feeds": feeds}]
    for position, pass_order in enumerate((order, order[::-1]), 1):
        sessions += [{"name": f"{v}@{position}", "model": variants[v], "feeds": feeds} for v in pass_order]
    return sessions


def interval(num: list[float], den: list[float]) -> tuple[float, float, float]:
    """1 - num/den: from the medians, and the range over every pairing of the measurements (the
    worst case: no pairing of the two variants' counts gives a figure outside it)."""
    point = 1 - float(np.median(num)) / float(np.median(den))
    return point, 1 - max(num) / min(den), 1 - min(num) / max(den)


def summarize(counts: dict[str, list[float]]) -> dict:
    """Savings and shares from every variant's per-run counts (each measured several times), with
    the agreement gate applied to every variant alike."""
    originals = counts["original"] + counts["copy"]
    gate = {v: spread(c) for v, c in counts.items()}
    gate["original+copy"] = spread(originals)
    norm_share = interval(counts["stripped"], originals)
    reachable = interval(counts["ideal"], originals)
    achieved = interval(counts["folded"], counts["resaved"])
    resave = interval(counts["resaved"], originals)
    share = (achieved[0] / reachable[0], achieved[1] / reachable[2], achieved[2] / reachable[1]) if reachable[1] > 0 else (
        float("nan"),) * 3
    return {
        "per_run": {v: float(np.median(c)) for v, c in counts.items()},
        "gate": gate,
        "ok": all(g <= TOLERANCE for g in gate.values()),
        "norm_share": norm_share,
        "reachable": reachable,
        "achieved": achieved,
        "resave_effect": resave,
        "share_of_reachable": share,
    }


def quantized(src: Path, dst: Path) -> Path:
    """`onnxruntime.quantization.quantize_dynamic` with its defaults (int8 weights of MatMul/Gemm),
    as a deployment runs it: after the fold (the README's order)."""
    from onnxruntime.quantization import quantize_dynamic

    if not dst.exists():
        quantize_dynamic(str(src), str(dst))
    return dst


def variant_files(src: Path, work: Path, int8: bool = False, fold_args: tuple[str, ...] = ()) -> dict[str, str]:
    """The six variants of `src` in `work` (folded with the defaults or `fold_args`, verification
    off: the benchmark measures; the tests verify), each quantized after the fact with `int8`."""
    import onnx_ir as ir

    stem = src.stem
    files = {"original": src, "copy": work / f"{stem}.copy.onnx", "resaved": work / f"{stem}.resaved.onnx",
             "folded": work / f"{stem}.lnfold.onnx", "stripped": work / f"{stem}.stripped.onnx",
             "ideal": work / f"{stem}.ideal.onnx"}
    if not files["copy"].exists():
        shutil.copyfile(src, files["copy"])
    if not files["resaved"].exists():
        ir.save(ir.load(src), files["resaved"])
    if not files["folded"].exists():
        subprocess.run([sys.executable, "-m", "onnx_lnfold", str(src), "-o", str(files["folded"]), "--no-verify", "-q",
                        *fold_args], check=True, cwd=ROOT)
    if not files["stripped"].exists():
        _strip_layernorms(src, files["stripped"])
    if not files["ideal"].exists():
        _strip_layernorms(src, files["ideal"], to="SimplifiedLayerNormalization")
    if int8:
        files = {v: quantized(Path(f), work / f"{Path(f).stem}.int8.onnx") for v, f in files.items()}
    return {v: str(f) for v, f in files.items()}


def bench_model(name: str, batch: int, seq: int) -> tuple[Path, dict[str, np.ndarray], str]:
    """A benchmark model of models/make/export_bench_models.py (exported on first use) and its feeds."""
    from benchmarks.latency import feeds_for

    meta = ensure_exported(name)
    if meta["kind"] == "vision":
        seq = meta["config"]["max_seq"]
    return Path(meta["path"]), feeds_for(meta, batch, seq), f"{batch} x {seq}"


def _short_shape(shape: str, keep: int = 2) -> str:
    """The first `keep` inputs of a long shape list and how many more (the JSON keeps them all)."""
    parts = shape.split("], ")
    if len(parts) <= keep + 1:
        return shape
    return "], ".join(parts[:keep]) + f"], +{len(parts) - keep} more inputs"


def file_model(path: Path, feeds_path: Path) -> tuple[Path, dict[str, np.ndarray], str]:
    """Any ONNX file (a trained model at the shapes it runs) with its inputs in an .npz."""
    with np.load(feeds_path) as z:
        feeds = {k: z[k] for k in z.files}
    shapes = ", ".join(f"{k}{list(v.shape)}" for k, v in feeds.items())
    return path, feeds, shapes


def run_model(label: str, src: Path, feeds: dict[str, np.ndarray], shape: str, runs: int, singles: int,
              processes: int, jobs: int, work: Path, int8: bool = False, fold_args: tuple[str, ...] = ()) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    files = variant_files(src, work, int8, fold_args)
    feeds_path = work / f"{label}.feeds.npz"
    np.savez(feeds_path, **feeds)
    plans = [process_plan(files, str(feeds_path), k) for k in range(processes)]
    log(f"{label} ({shape}{', int8' if int8 else ''}): {processes} valgrind processes, {jobs} at a time")
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(measure, plan, runs, singles, work, f"{label}.p{k}") for k, plan in enumerate(plans)]
        done = [f.result()["sessions"] for f in futures]
    counts: dict[str, list[float]] = {v: [] for v in files}
    for k, sessions in enumerate(done):
        for tag, r in sessions.items():
            if tag != "burn_in":
                counts[tag.split("@")[0]].append(r["per_run"])
            log(f"  {label} p{k} {tag:12s} per run {r['per_run']:.6e}  (single runs: "
                f"{', '.join(f'{x:.6e}' for x in r['singles'])})")
    summary = summarize(counts)
    if not summary["ok"]:
        worst = max(summary["gate"], key=summary["gate"].get)
        log(f"  {label}: NOT TRUSTED: {worst} spreads {100 * summary['gate'][worst]:.3f}% > {100 * TOLERANCE:g}%")
    return {"model": label, "shape": shape, "int8": int8, "fold_args": list(fold_args), "runs": runs, "processes": processes,
            "counts": counts, "measurements": done, **summary}


def _pct(triple, digits: int = 2) -> str:
    point, lo, hi = (100 * x for x in triple)
    return f"{point:.{digits}f}% [{lo:.{digits}f}, {hi:.{digits}f}]"


def render(results: list[dict], command: str, machine: dict) -> str:
    lines = results_header("Instructions per run under valgrind (callgrind, 1 thread)", command, machine,
                           "Definitions: benchmarks/README.md, section Instruction counts. Every variant is counted "
                           "at two positions in each of the processes; a figure is the median, [the range over every "
                           f"pairing of the counts]; a variant whose counts spread more than {100 * TOLERANCE:g}% "
                           "fails the gate and its row is not trusted.")
    lines += ["| model | shape | original (M instr/run) | folded | saved vs re-saved | reachable | share of reachable | "
              "norm share | re-save effect | widest spread (variant) | trusted |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        p = r["per_run"]
        worst = max(r["gate"], key=r["gate"].get)
        name = r["model"] + (" (int8)" if r.get("int8") else "") + "".join(f" `{a}`" for a in r.get("fold_args", []))
        # a saving far above what the norms could give is not the norms' (int8: what quantize_dynamic
        # makes of a tied embedding table); its share of the norms' reachable saving means nothing
        share = _pct(r["share_of_reachable"], 0) if r["share_of_reachable"][0] <= 2 else "not the norms"
        lines.append(f"| {name} | {_short_shape(r['shape'])} | {p['original'] / 1e6:.3f} | {p['folded'] / 1e6:.3f} | "
                     f"{_pct(r['achieved'])} | {_pct(r['reachable'])} | {share} | "
                     f"{_pct(r['norm_share'])} | {_pct(r['resave_effect'], 3)} | {100 * r['gate'][worst]:.3f}% ({worst}) | "
                     f"{'yes' if r['ok'] else 'NO'} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="*", default=["gpt2_small", "opt_small"],
                    help="benchmark models of models/make/export_bench_models.py, at --batch x --seq")
    ap.add_argument("--file", nargs=2, action="append", default=[], metavar=("ONNX", "FEEDS_NPZ"),
                    help="any model with its inputs (a trained model at the shapes it runs); repeatable")
    ap.add_argument("--int8", action="store_true", help="also every variant after quantize_dynamic")
    ap.add_argument("--fold-args", default="", help="options for the fold, e.g. '--tied-weights untie'")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--runs", type=int, default=2, help="N: segments of N and 2N runs are counted")
    ap.add_argument("--processes", type=int, default=2, help="valgrind processes per model (each counts every variant twice)")
    ap.add_argument("--jobs", type=int, default=2, help="valgrind processes at a time")
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "instructions.json"))
    ap.add_argument("--md", default=str(ROOT / "benchmarks" / "results" / "INSTRUCTIONS.md"))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--singles", type=int, default=SINGLE_SEGMENTS,
                    help="single-run segments counted before N and 2N (they show the warm-up effect)")
    ap.add_argument("--merge", nargs="+", metavar="JSON",
                    help="write --json/--md from earlier outputs (models measured in parallel invocations)")
    args = ap.parse_args(argv)
    if args.merge:
        parts = [json.loads(Path(f).read_text()) for f in args.merge]
        merged = {"command": " ; ".join(p["command"] for p in parts), "machine": parts[-1]["machine"],
                  "results": [r for p in parts for r in p["results"]]}
        Path(args.json).write_text(json.dumps(merged, indent=1))
        Path(args.md).write_text(render(merged["results"], merged["command"], merged["machine"]))
        print(Path(args.md).read_text())
        return 0 if all(r["ok"] for r in merged["results"]) else 1
    if args.child:
        return child(args.child)
    if not shutil.which("valgrind") or not shutil.which("callgrind_control"):
        print("error: valgrind (with callgrind_control) is not installed", file=sys.stderr)
        return 2
    if args.processes < 2:
        print("error: --processes must be at least 2: every variant is counted in two processes", file=sys.stderr)
        return 2
    command = "python -m benchmarks.instructions " + " ".join(argv if argv is not None else sys.argv[1:])
    models = [(name, *bench_model(name, args.batch, args.seq)) for name in args.models]
    models += [(Path(onnx_path).stem, *file_model(Path(onnx_path), Path(feeds))) for onnx_path, feeds in args.file]
    results = []
    with tempfile.TemporaryDirectory(prefix="lnfold-instr-", dir=CACHE if CACHE.exists() else None) as tmp:
        for label, src, feeds, shape in models:
            for int8 in (False, True) if args.int8 else (False,):
                work = Path(tmp) / (label + (".int8" if int8 else ""))
                results.append(run_model(label, src, feeds, shape, args.runs, args.singles, args.processes, args.jobs,
                                         work, int8, tuple(args.fold_args.split())))
                machine = machine_info()
                Path(args.json).write_text(json.dumps({"command": command.strip(), "machine": machine,
                                                       "results": results}, indent=1))
                Path(args.md).write_text(render(results, command.strip(), machine))
    print(Path(args.md).read_text())
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
