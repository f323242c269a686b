"""Instructions executed per run under valgrind (callgrind, one thread): original vs folded vs re-saved.

    python -m benchmarks.instructions [--models gpt2_small opt_small vit_small] [--batch 1] [--seq 128]
                                      [--runs 4] [--jobs 2] [--json F] [--md F]

Wall clock on shared cores cannot resolve a 1% effect; the instruction count of a run can, once it is
deterministic. Each measurement is one process under
`valgrind --tool=callgrind --instr-atstart=no --zero-before=getpgrp --dump-before=getsid`:

1. Python, onnxruntime and the session start uninstrumented (fast), one warm-up run;
2. the child switches instrumentation on (`callgrind_control -i on PID`), then brackets each counted
   segment between `os.getpgrp()` (counters zeroed) and `os.getsid(0)` (counters dumped): functions
   neither Python nor onnxruntime call otherwise, so every dump holds exactly one segment's runs;
3. segments: four single runs (runs 2..5: what "one warm-up" counts), then N runs, then 2N runs.
   Per run = (I(2N) - I(N)) / N: the fixed cost of a segment (the brackets, the Python loop's setup)
   cancels, and so does any extra work of the first runs (memory-pattern planning, arena growth).

Every process runs with PYTHONHASHSEED=0, ASLR off (`setarch -R`), one intra-op and one inter-op
thread, intra-op spinning off, graph optimization level ALL, CPU EP: the conditions the wall-clock
benchmark uses, minus the threads.

Validation (per model, before any ratio is trusted): the original twice, a byte-identical copy, and
the original with a random PYTHONHASHSEED. Reported: their spread on the per-run count and on the
single second run. Target: the same file twice and the copy within 0.1%.

Then, per model, in the process of the validation sessions (after a burn-in session: the first
session measured there has shown a one-time cost): the re-saved original (onnx_ir load + save), the
folded model, the original with every LayerNormalization replaced by Identity ("stripped": the model
without its LNs) and by SimplifiedLayerNormalization(x, gamma) ("ideal": every LN replaced by RMSNorm,
beta dropped, nothing centered; not the model's function, but the same instructions for any data):

    norm share  = 1 - I(stripped) / I(original)        the LNs' share of the run, dispatch included
    reachable   = 1 - I(ideal) / I(original)           = norm share x (1 - r), r = the LN nodes'
                                                       instructions after / before, in the model
    achieved    = 1 - I(folded) / I(re-saved)          what the fold saved (against the re-saved
                                                       original, so the load/save path cancels)
    share       = achieved / reachable

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

from benchmarks.common import CACHE, ROOT, ensure_exported, log, machine_info

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


def _files(name: str, work: Path) -> dict[str, str]:
    meta = ensure_exported(name)
    src = Path(meta["path"])
    folded, resaved = src.with_name(f"{name}.lnfold.onnx"), src.with_name(f"{name}.resaved.onnx")
    if not folded.exists():
        subprocess.run([sys.executable, "-m", "onnx_lnfold", str(src), "-o", str(folded), "--no-verify", "-q"],
                       check=True, cwd=ROOT)
    if not resaved.exists():
        import onnx_ir as ir

        ir.save(ir.load(src), resaved)
    copy = work / f"{name}.copy.onnx"
    shutil.copyfile(src, copy)
    stripped = work / f"{name}.stripped.onnx"
    _strip_layernorms(src, stripped)
    ideal = work / f"{name}.ideal.onnx"
    _strip_layernorms(src, ideal, to="SimplifiedLayerNormalization")
    return {"ideal": str(ideal), "meta": meta, "original": str(src), "copy": str(copy), "resaved": str(resaved), "folded": str(folded),
            "stripped": str(stripped)}


def spread(values: list[float]) -> float:
    return (max(values) - min(values)) / min(values)


def run_model(name: str, batch: int, seq: int, runs: int, singles: int, jobs: int, work: Path) -> dict:
    from benchmarks.latency import feeds_for

    files = _files(name, work)
    meta = files["meta"]
    if meta["kind"] == "vision":
        seq = meta["config"]["max_seq"]
    feeds = feeds_for(meta, batch, seq)
    feeds_path = work / f"{name}.b{batch}s{seq}.npz"
    np.savez(feeds_path, **feeds)
    fp = str(feeds_path)
    # the first session measured after instrumentation starts has shown a one-time cost (+0.9% on its
    # second run, -0.45% per run on opt_small): a burn-in session takes it, and is reported apart
    main_plan = [{"name": "burn_in", "model": files["original"], "feeds": fp},
                 {"name": "original", "model": files["original"], "feeds": fp},
                 {"name": "original_again", "model": files["original"], "feeds": fp},
                 {"name": "copy", "model": files["copy"], "feeds": fp},
                 {"name": "resaved", "model": files["resaved"], "feeds": fp},
                 {"name": "folded", "model": files["folded"], "feeds": fp},
                 {"name": "stripped", "model": files["stripped"], "feeds": fp},
                 {"name": "ideal", "model": files["ideal"], "feeds": fp}]
    # the same file again in fresh processes: with PYTHONHASHSEED=0, and with a random one
    fresh_plan = [{"name": "original", "model": files["original"], "feeds": fp}]
    log(f"{name} b{batch} s{seq}: 3 valgrind processes, {jobs} at a time")
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        f_main = pool.submit(measure, main_plan, runs, singles, work, f"{name}.main")
        f_fresh = pool.submit(measure, fresh_plan, runs, singles, work, f"{name}.fresh")
        f_rand = pool.submit(measure, fresh_plan, runs, singles, work, f"{name}.random_seed", "random")
        main, fresh, rand = f_main.result(), f_fresh.result(), f_rand.result()
    m = dict(main["sessions"])
    m["original_fresh_process"] = fresh["sessions"]["original"]
    m["original_random_hash_seed"] = rand["sessions"]["original"]
    for tag, r in m.items():
        log(f"  {name} {tag:26s} per run {r['per_run']:.6e}  (single runs: "
            f"{', '.join(f'{x:.6e}' for x in r['singles'])}; other threads {sum(r['other_threads'])})")

    same = ["original", "original_again", "copy", "original_fresh_process"]
    validation = {
        "per_run_spread": spread([m[k]["per_run"] for k in same]),
        "per_run_spread_with_random_hash_seed": spread([m[k]["per_run"] for k in same + ["original_random_hash_seed"]]),
        "second_run_spread": spread([m[k]["singles"][0] for k in same]),
        "naive_per_run_spread": spread([m[k]["naive_per_run"] for k in same]),
        "warmup_excess": {k: m[k]["singles"][0] / m[k]["per_run"] - 1 for k in same},
    }
    validation["ok"] = validation["per_run_spread"] <= TOLERANCE
    base = float(np.mean([m[k]["per_run"] for k in same]))
    norm_share = 1 - m["stripped"]["per_run"] / base
    reachable = 1 - m["ideal"]["per_run"] / base
    r = 1 - reachable / norm_share  # the LN nodes' instructions after / before, in the model
    achieved = 1 - m["folded"]["per_run"] / m["resaved"]["per_run"]
    achieved_vs_original = 1 - m["folded"]["per_run"] / base
    return {
        "model": name, "batch": batch, "seq": seq, "runs": runs, "measurements": m, "validation": validation,
        "per_run": {"original": base, "resaved": m["resaved"]["per_run"], "folded": m["folded"]["per_run"],
                    "stripped": m["stripped"]["per_run"], "ideal": m["ideal"]["per_run"]},
        "ratios": {"original/folded": base / m["folded"]["per_run"],
                   "resaved/folded": m["resaved"]["per_run"] / m["folded"]["per_run"],
                   "original/resaved": base / m["resaved"]["per_run"]},
        "norm_share": norm_share, "sln_over_ln_in_model": r, "reachable": reachable,
        "achieved": achieved, "achieved_vs_original": achieved_vs_original,
        "share_of_reachable": achieved / reachable if reachable > 0 else float("nan"),
    }


def render(results: list[dict], command: str, machine: dict) -> str:
    lines = ["# Instructions per run under valgrind (callgrind, 1 thread)", "",
             f"Command: `{command}`  ",
             f"onnxruntime {machine['onnxruntime']}, onnx_lnfold at git {machine['git_commit']}, {machine['cpu']}  ",
             f"Run {machine['date']}. Definitions: benchmarks/README.md, section Instruction counts.", "",
             "## Validation: the same file twice and a byte-identical copy", "",
             "| model | batch x seq | per run, spread (N vs 2N) | + random PYTHONHASHSEED | second run alone, spread | "
             "N runs / N, spread | second run's excess over steady | within 0.1% |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        v = r["validation"]
        ex = max(v["warmup_excess"].values())
        lines.append(f"| {r['model']} | {r['batch']} x {r['seq']} | {100 * v['per_run_spread']:.4f}% | "
                     f"{100 * v['per_run_spread_with_random_hash_seed']:.4f}% | {100 * v['second_run_spread']:.3f}% | "
                     f"{100 * v['naive_per_run_spread']:.4f}% | {100 * ex:+.2f}% | {'yes' if v['ok'] else 'NO'} |")
    lines += ["", "## Original vs folded", "",
              "| model | batch x seq | original (M instr/run) | re-saved | folded | original / folded | "
              "re-saved / folded | norm share | SLN / LN in the model | reachable | achieved (vs re-saved) | "
              "share of reachable |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        p = r["per_run"]
        lines.append(f"| {r['model']} | {r['batch']} x {r['seq']} | {p['original'] / 1e6:.3f} | {p['resaved'] / 1e6:.3f} | "
                     f"{p['folded'] / 1e6:.3f} | x{r['ratios']['original/folded']:.4f} | "
                     f"x{r['ratios']['resaved/folded']:.4f} | {100 * r['norm_share']:.2f}% | "
                     f"{r['sln_over_ln_in_model']:.3f} | {100 * r['reachable']:.2f}% | {100 * r['achieved']:.2f}% | "
                     f"{100 * r['share_of_reachable']:.0f}% |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["gpt2_small", "opt_small"])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--runs", type=int, default=1, help="N: segments of N and 2N runs are counted")
    ap.add_argument("--jobs", type=int, default=3, help="valgrind processes at a time")
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
        return 0
    if args.child:
        return child(args.child)
    if not shutil.which("valgrind") or not shutil.which("callgrind_control"):
        print("error: valgrind (with callgrind_control) is not installed", file=sys.stderr)
        return 2
    command = "python -m benchmarks.instructions " + " ".join(argv if argv is not None else sys.argv[1:])
    results = []
    with tempfile.TemporaryDirectory(prefix="lnfold-instr-", dir=CACHE if CACHE.exists() else None) as tmp:
        for name in args.models:
            results.append(run_model(name, args.batch, args.seq, args.runs, args.singles, args.jobs, Path(tmp)))
            machine = machine_info()
            Path(args.json).write_text(json.dumps({"command": command.strip(), "machine": machine,
                                                   "results": results}, indent=1))
            Path(args.md).write_text(render(results, command.strip(), machine))
    print(Path(args.md).read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
