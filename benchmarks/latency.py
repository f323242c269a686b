"""Latency of original vs folded models in onnxruntime, the controls, and the profile-based bound.

Timing (`time_model`): one process holds four sessions, all at graph optimization level ALL with
intra-op spinning off:

    original     the exported model
    folded       onnx_lnfold's output (CLI, --no-verify)
    original_2   a second session of the original file      -> noise floor
    resaved      onnx_ir.save(onnx_ir.load(original))       -> what the load/save path alone does

For each (batch, seq) configuration the sessions are warmed up, then run interleaved in rounds
(one run of each session per round, the order rotated every round) until both a minimum number of
rounds and a time budget are reached. Figures are ratios of medians against the original,
``median(original) / median(X)`` (> 1: X is faster), with a paired bootstrap 95% interval over
rounds. Only ratios from one interleaved run are reported as results, never absolute times.

Bound (`profile_model`): the original and the folded model run in sessions with
``enable_profiling``; every node's ``*_kernel_time`` event is attributed to its run. Per run:

    total       sum of all node kernel times
    norm        kernel time of the normalization group:
                  LayerNormalization, SimplifiedLayerNormalization, SkipLayerNormalization,
                  SkipSimplifiedLayerNormalization (the ops ORT actually ran, `args.op_name`);
                  residual Adds: Add nodes whose output feeds one of those;
                  beta Adds: Add nodes that read a normalization output and a constant
                  (the fold writes beta as such an Add when it cannot fold it into a consumer).
    bound       = total_original / (total_original - norm_original)

The group is found in the graph ORT actually executes (its optimized model, dumped by the
profiled session), so ORT's Add + LayerNormalization -> SkipLayerNormalization fusion is counted
as a normalization node. ``bound`` is the end-to-end speed-up a fold would give if it removed all
normalization-group time and changed nothing else; since node time <= wall time it is an upper
bound for the wall-clock ratio. Per run medians are reported.
"""

from __future__ import annotations

import bisect
import gc
import json
import os
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

from benchmarks.common import (
    SPECS,
    CpuMonitor,
    exporter,
    log,
    providers_for,
    ratio_of_medians,
    session_options,
    wait_for_quiet,
)
from onnx_lnfold.bench import session_graph

LABELS = ["original", "folded", "original_2", "resaved"]


def configs_for(meta: dict, batches: list[int], seqs: list[int]) -> tuple[list[tuple[int, int]], list[str]]:
    """(batch, seq) pairs that the model accepts; vision models run at their own token count."""
    max_seq = meta["config"]["max_seq"]
    skipped = []
    if meta["kind"] == "vision":
        return [(b, max_seq) for b in batches], [f"vision model: fixed {max_seq} tokens "
                                                 f"({meta['config']['image_size']}px / {meta['config']['patch_size']})"]
    ok = [s for s in seqs if s <= max_seq]
    if len(ok) < len(seqs):
        skipped.append(f"seq {[s for s in seqs if s > max_seq]} > max positions {max_seq}: skipped")
    return [(b, s) for b in batches for s in ok], skipped


def feeds_for(meta: dict, batch: int, seq: int) -> dict[str, np.ndarray]:
    return exporter.make_inputs(SPECS[meta["name"]], meta, batch, seq, seed=1000 + batch * 7 + seq)


def _session(path: str, device: str, **kw):
    import onnxruntime as ort

    return ort.InferenceSession(path, session_options(**kw), providers=providers_for(device))


# --------------------------------------------------------------------------- #
# Timing
# --------------------------------------------------------------------------- #
def _time_config(sessions: dict, feeds: dict, warmup_rounds: int, min_rounds: int, max_rounds: int,
                 budget_s: float) -> dict:
    times: dict[str, list[float]] = {k: [] for k in LABELS}
    cpu: dict[str, list[float]] = {k: [] for k in LABELS}
    for _ in range(warmup_rounds):
        for k in LABELS:
            sessions[k].run(None, feeds)
    mon = CpuMonitor()
    t_start = time.perf_counter()
    r = 0
    while r < max_rounds and (r < min_rounds or time.perf_counter() - t_start < budget_s):
        order = LABELS[r % 4:] + LABELS[:r % 4]
        for k in order:
            c0, t0 = time.process_time(), time.perf_counter()
            sessions[k].run(None, feeds)
            times[k].append(time.perf_counter() - t0)
            cpu[k].append(time.process_time() - c0)
        r += 1
    arr = {k: np.array(v) for k, v in times.items()}
    carr = {k: np.array(v) for k, v in cpu.items()}
    return {
        "rounds": r,
        "seconds": time.perf_counter() - t_start,
        "foreign_cpu": mon.foreign(),
        "median_ms": {k: float(np.median(v) * 1e3) for k, v in arr.items()},
        "fold": ratio_of_medians(arr["original"], arr["folded"]),
        "noise_floor": ratio_of_medians(arr["original"], arr["original_2"]),
        "resaved": ratio_of_medians(arr["original"], arr["resaved"]),
        "fold_vs_resaved": ratio_of_medians(arr["resaved"], arr["folded"]),
        # the same ratios on the process CPU time of each run (all threads): not latency, but far less
        # sensitive to other processes taking the cores (a descheduled thread spends no CPU time)
        "cpu_time": {
            "median_ms": {k: float(np.median(v) * 1e3) for k, v in carr.items()},
            "fold": ratio_of_medians(carr["original"], carr["folded"]),
            "noise_floor": ratio_of_medians(carr["original"], carr["original_2"]),
            "resaved": ratio_of_medians(carr["original"], carr["resaved"]),
        },
        "times_ms": {k: [round(x * 1e3, 4) for x in v] for k, v in times.items()},
        "cpu_times_ms": {k: [round(x * 1e3, 4) for x in v] for k, v in cpu.items()},
    }


def time_model(meta: dict, paths: dict[str, str], configs: list[tuple[int, int]], *, device: str = "cpu",
               warmup_rounds: int = 2, min_rounds: int = 7, max_rounds: int = 400, budget_s: float = 15.0,
               threads: int | None = None, max_foreign: float = 0.10, max_retries: int = 2,
               quiet_wait_s: float = 120.0) -> list[dict]:
    """Time every configuration; one measured while other processes used more than `max_foreign` of
    the CPU is measured again (after waiting for a quiet machine), up to `max_retries` times, and the
    attempt with the least foreign load is kept."""
    files = {"original": paths["original"], "folded": paths["folded"], "original_2": paths["original"],
             "resaved": paths["resaved"]}
    sessions = {k: _session(p, device, threads=threads) for k, p in files.items()}
    results = []
    try:
        for batch, seq in configs:
            feeds = feeds_for(meta, batch, seq)
            attempts = []
            for attempt in range(1 + max_retries):
                if attempt:
                    wait_for_quiet(quiet_wait_s, max_foreign)
                res = _time_config(sessions, feeds, warmup_rounds, min_rounds, max_rounds, budget_s)
                res.update(batch=batch, seq=seq, device=device)
                attempts.append(res)
                if res["foreign_cpu"] is None or res["foreign_cpu"] <= max_foreign or attempt == max_retries:
                    break
                log(f"  {meta['name']} b{batch} s{seq}: other processes used {res['foreign_cpu'] * 100:.0f}% "
                    f"of the CPU; measuring again")
            res = min(attempts, key=lambda a: a["foreign_cpu"] or 0.0)
            res["attempts"] = len(attempts)
            results.append(res)
            f, nf = res["fold"], res["noise_floor"]
            log(f"  {meta['name']} b{batch} s{seq} [{device}]: fold x{f['ratio']:.3f} [{f['lo']:.3f}, {f['hi']:.3f}]"
                f"  noise x{nf['ratio']:.3f} [{nf['lo']:.3f}, {nf['hi']:.3f}]"
                f"  resaved x{res['resaved']['ratio']:.3f}  | cpu time: fold x{res['cpu_time']['fold']['ratio']:.3f}"
                f" [{res['cpu_time']['fold']['lo']:.3f}, {res['cpu_time']['fold']['hi']:.3f}]"
                f" noise x{res['cpu_time']['noise_floor']['ratio']:.3f}  ({res['rounds']} rounds, {res['median_ms']['original']:.1f} ms,"
                f" other processes {100 * (res['foreign_cpu'] or 0):.0f}% CPU)")
    finally:
        del sessions
        gc.collect()
    return results


# --------------------------------------------------------------------------- #
# Profile and bound
# --------------------------------------------------------------------------- #
def norm_groups(optimized_model: str) -> dict[str, str]:
    """node name -> 'norm_op' / 'residual_add' / 'beta_add' / 'centering' in the graph ORT executes."""
    return session_graph.norm_roles(session_graph.read(optimized_model))


def graph_op_counts(optimized_model: str) -> dict[str, int]:
    import onnx

    m = onnx.load(optimized_model, load_external_data=False)
    return dict(sorted(Counter(n.op_type for n in m.graph.node).items()))


def _parse_profile(profile_path: str, calls: list, roles: dict[str, str]) -> dict:
    """Per configuration: per-run totals and group times (microseconds)."""
    events = json.loads(Path(profile_path).read_text())
    runs = sorted((e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"),
                  key=lambda e: e["ts"])
    if len(runs) != len(calls):
        raise RuntimeError(f"profile has {len(runs)} model_run events, expected {len(calls)}")
    starts = [e["ts"] for e in runs]
    per_run = [defaultdict(float) for _ in runs]
    per_run_op = [defaultdict(float) for _ in runs]
    for e in events:
        if e.get("cat") != "Node" or not e.get("name", "").endswith("_kernel_time"):
            continue
        i = bisect.bisect_right(starts, e["ts"]) - 1
        if i < 0 or e["ts"] > runs[i]["ts"] + runs[i]["dur"]:
            continue
        node = e["name"][: -len("_kernel_time")]
        op = e.get("args", {}).get("op_name", "?")
        d = float(e["dur"])
        per_run[i]["total"] += d
        role = roles.get(node)
        if role:
            per_run[i][role] += d
            per_run[i]["norm"] += d
            per_run_op[i][f"{role}:{op}"] += d
    out: dict = defaultdict(lambda: {"runs": []})
    for i, key in enumerate(calls):
        if key is None:  # warm-up
            continue
        out[key]["runs"].append({**per_run[i], "by_op": dict(per_run_op[i]), "wall": float(runs[i]["dur"])})
    return dict(out)


def _summarize(runs: list[dict]) -> dict:
    def med(k):
        return float(np.median([r.get(k, 0.0) for r in runs]))

    ops = sorted({k for r in runs for k in r["by_op"]})
    return {
        "runs": len(runs),
        "total_us": med("total"), "wall_us": med("wall"), "norm_us": med("norm"),
        "norm_share": float(np.median([r.get("norm", 0.0) / r["total"] for r in runs])),
        "by_role_us": {k: med(k) for k in ("norm_op", "residual_add", "beta_add", "centering")},
        "by_op_us": {k: float(np.median([r["by_op"].get(k, 0.0) for r in runs])) for k in ops},
    }


def profile_model(meta: dict, paths: dict[str, str], configs: list[tuple[int, int]], *, device: str = "cpu",
                  runs: int = 5, threads: int | None = None) -> dict:
    """Profile original and folded (interleaved); return per-config bound and norm-time ratio."""
    variants = ["original", "folded"]
    mon = CpuMonitor()
    with tempfile.TemporaryDirectory(prefix="lnfold-prof-") as tmp:
        sessions, roles, counts, calls = {}, {}, {}, {k: [] for k in variants}
        for v in variants:
            opt = os.path.join(tmp, f"{v}.optimized.onnx")
            import onnxruntime as ort

            so = session_options(threads=threads, profile_prefix=os.path.join(tmp, v), optimized_path=opt)
            so.add_session_config_entry("session.optimized_model_external_initializers_file_name",
                                        f"{v}.optimized.data")
            so.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "64")
            sessions[v] = ort.InferenceSession(paths[v], so, providers=providers_for(device))
            roles[v] = norm_groups(opt)
            counts[v] = graph_op_counts(opt)
        for batch, seq in configs:
            feeds = feeds_for(meta, batch, seq)
            for v in variants:
                sessions[v].run(None, feeds)
                calls[v].append(None)
            for _ in range(runs):
                for v in variants:
                    sessions[v].run(None, feeds)
                    calls[v].append((batch, seq))
        parsed = {}
        for v in variants:
            prof = sessions[v].end_profiling()
            parsed[v] = _parse_profile(prof, calls[v], roles[v])
        del sessions
        gc.collect()

    out = {"ort_graph_ops": counts, "foreign_cpu": mon.foreign(),
           "norm_group_nodes": {v: dict(Counter(roles[v].values())) for v in variants},
           "configs": []}
    for batch, seq in configs:
        o = _summarize(parsed["original"][(batch, seq)]["runs"])
        f = _summarize(parsed["folded"][(batch, seq)]["runs"])
        bound = o["total_us"] / (o["total_us"] - o["norm_us"]) if o["total_us"] > o["norm_us"] else float("inf")
        res = {
            "batch": batch, "seq": seq, "device": device,
            "original": o, "folded": f,
            "bound": bound,
            "norm_time_ratio": o["norm_us"] / f["norm_us"] if f["norm_us"] > 0 else float("inf"),
            "node_time_ratio": o["total_us"] / f["total_us"],
        }
        out["configs"].append(res)
        log(f"  {meta['name']} b{batch} s{seq} profile: norm share {o['norm_share'] * 100:.1f}%  bound x{bound:.4f}"
            f"  norm time {o['norm_us'] / 1e3:.2f} -> {f['norm_us'] / 1e3:.2f} ms (x{res['norm_time_ratio']:.2f})"
            f"  node time x{res['node_time_ratio']:.3f}")
    return out
