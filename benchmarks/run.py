"""`python -m benchmarks.run [--quick] [--models ...] [--seqs ...] [--out benchmarks/results]`

Exports the benchmark models if they are not cached (benchmarks/cache/), measures the fold cost,
times original / folded / controls in onnxruntime, profiles the normalization group and the
bound, and writes results.json, RESULTS.md and speedup.png into --out. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

from benchmarks import fold_cost as fc
from benchmarks import latency
from benchmarks.common import (
    BASE_MODELS,
    ROOT,
    SMALL_MODELS,
    SPECS,
    cuda_available,
    ensure_exported,
    log,
    machine_info,
    wait_for_quiet,
)

CANT = "can't tell"
NORM_TARGET = 1.3          # normalization-group kernel time at least 1.3x lower after the fold
BOUND_FRACTION = 0.6       # end-to-end saving at least 60% of the bound's saving

QUICK_MODELS = SMALL_MODELS + ["gpt2", "bert"]
FULL_MODELS = SMALL_MODELS + BASE_MODELS
SETTINGS = {
    # per model size: seqs, time budget per config (s), min rounds, warm-up rounds, profiled runs,
    # fold-cost repetitions, cap on batch*seq per run (None: no cap)
    "quick": {
        "small": dict(seqs=[128, 512, 1024], budget_s=8.0, min_rounds=7, warmup=2, profile_runs=9, fold_reps=3,
                      max_tokens=None),
        "base": dict(seqs=[128, 512], budget_s=0.0, min_rounds=5, warmup=1, profile_runs=3, fold_reps=1,
                     max_tokens=2048),
    },
    "full": {
        "small": dict(seqs=[128, 512, 1024, 2048, 4096], budget_s=30.0, min_rounds=15, warmup=2, profile_runs=7,
                      fold_reps=5, max_tokens=None),
        "base": dict(seqs=[128, 512, 1024, 2048, 4096], budget_s=60.0, min_rounds=9, warmup=2, profile_runs=5,
                     fold_reps=3, max_tokens=None),
    },
}


def e2e_threshold(bound: float) -> float:
    """Smallest ratio whose saving (1 - 1/ratio) is BOUND_FRACTION of the bound's saving (1 - 1/bound)."""
    return 1.0 / (1.0 - BOUND_FRACTION * (1.0 - 1.0 / bound))


def e2e_verdict(fold: dict, bound: float, noise: dict | None = None) -> str:
    """`noisy` when the noise floor (two sessions of the same file) itself differs from 1 beyond its
    interval: the intervals of that run are then not to be trusted, whatever they say."""
    t = e2e_threshold(bound)
    if noise is not None and (noise["lo"] > 1.0 or noise["hi"] < 1.0):
        return "noisy"
    if fold["hi"] < 1.0:
        return "SLOWER"
    if fold["lo"] >= t:
        return "met"
    if fold["hi"] < t:
        return "not met"
    return "can't tell"


# --------------------------------------------------------------------------- #
def run_model(name: str, mode: str, args, machine_cuda: tuple[bool, str]) -> dict:
    meta = ensure_exported(name)
    st = dict(SETTINGS[mode][meta["size"]])
    if args.seqs:
        st["seqs"] = args.seqs
    if args.budget is not None:
        st["budget_s"] = args.budget
    if args.min_rounds is not None:
        st["min_rounds"] = args.min_rounds
    if args.max_tokens is not None:
        st["max_tokens"] = args.max_tokens or None
    entry: dict = {"meta": {k: v for k, v in meta.items() if k != "path"}, "settings": st}

    if not args.skip_fold_cost:
        wait_for_quiet(args.wait_quiet)
        log(f"{name}: fold cost ({st['fold_reps']} reps)")
        entry["fold_cost"] = fc.fold_cost(meta, reps=st["fold_reps"], quiet_wait_s=args.wait_quiet,
                                          max_retries=args.retries)
    paths = fc.prepare_variants(meta)
    rep = paths.pop("fold_report")
    entry["fold"] = {
        "folded": len(rep.get("folded", [])) if isinstance(rep.get("folded"), list) else rep.get("folded"),
        "decisions": rep.get("decisions"),
        "ops_before": rep.get("ops_before"), "ops_after": rep.get("ops_after"),
        "untied_bytes": rep.get("untied_bytes"),
        "folded_file_bytes": Path(paths["folded"]).stat().st_size,
        "resaved_file_bytes": Path(paths["resaved"]).stat().st_size,
    }
    configs, notes = latency.configs_for(meta, args.batches, st["seqs"])
    if st["max_tokens"]:
        cut = [c for c in configs if c[0] * c[1] > st["max_tokens"]]
        configs = [c for c in configs if c[0] * c[1] <= st["max_tokens"]]
        if cut:
            notes.append(f"{mode} set: batch*seq > {st['max_tokens']} skipped: {cut}")
    entry["notes"] = notes
    wait_for_quiet(args.wait_quiet)
    log(f"{name}: timing {len(configs)} configs on CPU")
    entry["timing"] = latency.time_model(meta, paths, configs, warmup_rounds=st["warmup"],
                                         min_rounds=st["min_rounds"], budget_s=st["budget_s"], threads=args.threads,
                                         quiet_wait_s=args.wait_quiet, max_retries=args.retries)
    for attempt in range(1 + min(args.retries, 1)):
        wait_for_quiet(args.wait_quiet)
        log(f"{name}: profiling")
        prof = latency.profile_model(meta, paths, configs, runs=st["profile_runs"], threads=args.threads)
        if (prof["foreign_cpu"] or 0) <= 0.10:
            break
        log(f"{name}: other processes used {prof['foreign_cpu'] * 100:.0f}% of the CPU while profiling")
    entry["profile_foreign_cpu"] = prof["foreign_cpu"]
    entry["ort_graph_ops"] = prof["ort_graph_ops"]
    entry["norm_group_nodes"] = prof["norm_group_nodes"]
    entry["profile"] = prof["configs"]
    for t, p in zip(entry["timing"], entry["profile"]):
        t["bound"] = p["bound"]
        t["norm_time_ratio"] = p["norm_time_ratio"]
        t["node_time_ratio"] = p["node_time_ratio"]
        t["norm_share"] = p["original"]["norm_share"]
    apply_verdicts(entry)

    ok, why = machine_cuda
    if ok:
        entry["cuda"] = run_cuda(meta, paths, configs, st, args)
    else:
        entry["cuda"] = {"status": why}
    return entry


def apply_verdicts(entry: dict) -> None:
    for t in entry.get("timing", []):
        t["e2e_threshold"] = e2e_threshold(t["bound"])
        t["e2e_verdict"] = e2e_verdict(t["fold"], t["bound"], t["noise_floor"])
        t["e2e_verdict_cpu_time"] = e2e_verdict(t["cpu_time"]["fold"], t["bound"], t["cpu_time"]["noise_floor"])


def run_cuda(meta: dict, paths: dict, configs, st: dict, args) -> dict:
    """fp32 and fp16 on the CUDA EP (timing only; ORT's CUDA node times are not kernel times)."""
    out = {"status": "run", "fp32": latency.time_model(meta, paths, configs, device="cuda",
                                                       warmup_rounds=st["warmup"], min_rounds=st["min_rounds"],
                                                       budget_s=st["budget_s"])}
    try:
        import onnx
        from onnxruntime.transformers.float16 import convert_float_to_float16

        src = Path(paths["original"])
        fp16 = src.with_name(src.stem + ".fp16.onnx")
        if not fp16.exists():
            onnx.save(convert_float_to_float16(onnx.load(str(src)), keep_io_types=True), str(fp16))
        m16 = dict(meta, path=str(fp16), name=meta["name"])
        p16 = fc.prepare_variants(dict(m16, name=meta["name"] + ".fp16"))
        p16.pop("fold_report")
        out["fp16"] = latency.time_model(meta, p16, configs, device="cuda", warmup_rounds=st["warmup"],
                                         min_rounds=st["min_rounds"], budget_s=st["budget_s"])
    except Exception as e:  # noqa: BLE001
        out["fp16"] = {"status": f"failed: {type(e).__name__}: {e}"}
    return out


# --------------------------------------------------------------------------- #
# Report
# --------------------------------------------------------------------------- #
def _pct(x: float | None) -> str:
    return "?" if x is None else f"{x * 100:.0f}%"


def _r(x: dict, d: int = 3) -> str:
    return f"{x['ratio']:.{d}f} [{x['lo']:.{d}f}, {x['hi']:.{d}f}]"


def targets(results: dict) -> list[dict]:
    rows = []
    models = results["models"]
    # 1. norm-group time on pre-LN models
    figs, ok = [], True
    for n, e in models.items():
        if not e["meta"]["pre_ln"] or not e.get("timing"):
            continue
        worst = min(e["timing"], key=lambda t: t["norm_time_ratio"])
        figs.append(f"{n} min x{worst['norm_time_ratio']:.2f} (b{worst['batch']} s{worst['seq']})")
        ok &= worst["norm_time_ratio"] >= NORM_TARGET
    rows.append({"target": f"norm + residual-Add kernel time >= {NORM_TARGET}x lower after the fold, every pre-LN model",
                 "met": ok if figs else None, "figure": "; ".join(figs) or "no pre-LN model run"})
    # 2. end-to-end vs bound, never slower: on wall-clock latency (the figure) and on CPU time
    for clock, key, ratio in (("wall-clock latency", "e2e_verdict", lambda t: t["fold"]),
                              ("CPU time per run", "e2e_verdict_cpu_time", lambda t: t["cpu_time"]["fold"])):
        counts = {"met": 0, "not met": 0, CANT: 0, "noisy": 0, "SLOWER": 0}
        bad = []
        post = []
        # Never slower holds every model, post-LN ones included: a fold there must not cost either.
        slower = [f"{n} b{t['batch']} s{t['seq']}: x{ratio(t)['ratio']:.3f} [{ratio(t)['lo']:.3f}, {ratio(t)['hi']:.3f}]"
                  + ("" if e["meta"]["pre_ln"] else " (post-LN)")
                  for n, e in models.items() for t in e.get("timing", []) if t[key] == "SLOWER"]
        for n, e in models.items():
            if not e["meta"]["pre_ln"]:  # the fold leaves post-LN blocks alone: their bound is out of its reach
                post += [f"{n} b{t['batch']} s{t['seq']} {t[key]}" for t in e.get("timing", [])]
                continue
            for t in e.get("timing", []):
                counts[t[key]] += 1
                if t[key] in ("not met", "SLOWER"):
                    bad.append(f"{n} b{t['batch']} s{t['seq']}: x{ratio(t)['ratio']:.3f} "
                               f"[{ratio(t)['lo']:.3f}, {ratio(t)['hi']:.3f}] (needs x{t['e2e_threshold']:.3f}, {t[key]})")
        decided = counts["met"] + counts["not met"] + counts["SLOWER"]
        rows.append({"target": f"end-to-end saving >= {int(BOUND_FRACTION * 100)}% of the bound's saving where the "
                               f"interval can tell, pre-LN models ({clock})",
                     "met": (counts["not met"] + counts["SLOWER"] == 0) if decided else None,
                     "figure": f"{counts['met']} met, {counts['not met']} not met, {counts['SLOWER']} slower, "
                               f"{counts[CANT]} can't tell, {counts['noisy']} noisy (pre-LN models)"
                               + ("; " + "; ".join(bad) if bad else "")
                               + (f" (post-LN, not counted: {', '.join(post)})" if post else "")})
        rows.append({"target": f"never slower than the original outside its interval, every model ({clock})",
                     "met": not slower, "figure": "; ".join(slower) or "no configuration significantly slower"})
    # 3, 4. fold cost
    wall, rss, wf, rf = True, True, [], []
    for n, e in models.items():
        c = e.get("fold_cost")
        if not c:
            continue
        wf.append(f"{n} x{c['fold_vs_roundtrip_wall']:.2f}")
        rf.append(f"{n} x{c['fold_rss_vs_file']:.2f}")
        wall &= c["wall_target_met"]
        rss &= c["rss_target_met"]
    rows.append({"target": f"fold wall time <= {fc.WALL_TARGET}x onnx.load+onnx.save", "met": wall if wf else None,
                 "figure": ", ".join(wf) or "not measured"})
    rows.append({"target": f"fold peak RSS <= {fc.RSS_TARGET}x model file size", "met": rss if rf else None,
                 "figure": ", ".join(rf) or "not measured"})
    cuda = [e.get("cuda", {}).get("status") for e in models.values()]
    rows.append({"target": "CUDA EP fp32 / fp16", "met": None,
                 "figure": cuda[0] if cuda and cuda[0] != "run" else "see CUDA section"})
    return rows


def write_markdown(results: dict, path: Path) -> None:
    m = results["machine"]
    L = ["# onnx_lnfold benchmark results", ""]
    L.append(f"Command: `{results['command']}`  ")
    L.append(f"Machine: {m['cpu']}, {m['cores_usable']} cores, {m['memory']} RAM; onnxruntime {m['onnxruntime']} "
             f"(providers {', '.join(m['onnxruntime_providers'])}), onnx {m['onnx']}, Python {m['python']}  ")
    L.append(f"onnx_lnfold {m['onnx_lnfold']} at git {m['git_commit']}"
             + (" (with uncommitted changes in onnx_lnfold/)" if m["onnx_lnfold_uncommitted_changes"] else "")
             + f"; run {m['date']}, {results.get('wall_minutes', float('nan')):.1f} min; ORT intra-op threads: "
             + f"{results.get('threads') or m['cores_usable']}")
    L.append("")
    L.append("Ratios are `median(original) / median(X)` from one interleaved run (> 1: X is faster), with a "
             "paired bootstrap 95% interval. See benchmarks/README.md for definitions.")
    L.append("")
    busy = [f"{n} b{t['batch']} s{t['seq']}" for n, e in results["models"].items() for t in e.get("timing", [])
            if (t.get("foreign_cpu") or 0) > 0.10]
    if busy:
        L.append(f"**Warning:** other processes used more than 10% of the CPU while timing {len(busy)} "
                 f"configuration(s) ({', '.join(busy)}); their ratios are less trustworthy (column `other CPU`).")
        L.append("")
    L.append("## Targets")
    L.append("")
    L.append("| target | met | figure |")
    L.append("|---|---|---|")
    for t in results["targets"]:
        met = {True: "**met**", False: "**not met**", None: "-"}[t["met"]]
        L.append(f"| {t['target']} | {met} | {t['figure']} |")
    L.append("")
    L.append("## Latency, CPU EP, graph optimization level ALL")
    L.append("")
    L.append("Wall clock: the latency of each run. CPU time: the process CPU time of each run (all threads); "
             "not a latency, but a descheduled thread spends none, so it stays readable when other processes "
             "share the cores (column `other CPU`).")
    L.append("")
    L.append("| model | batch | seq | fold ratio, wall [95% CI] | noise floor, wall | re-saved, wall | "
             "fold ratio, CPU time | noise floor, CPU time | re-saved, CPU time | bound | needs | verdict wall / CPU | "
             "norm time before/after | norm share | rounds | other CPU |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for n, e in results["models"].items():
        for t in e.get("timing", []):
            c = t["cpu_time"]
            L.append(f"| {n} | {t['batch']} | {t['seq']} | {_r(t['fold'])} | {_r(t['noise_floor'])} | "
                     f"{_r(t['resaved'])} | {_r(c['fold'])} | {_r(c['noise_floor'])} | {_r(c['resaved'])} | "
                     f"{t['bound']:.4f} | {t['e2e_threshold']:.4f} | {t['e2e_verdict']} / {t['e2e_verdict_cpu_time']} | "
                     f"x{t['norm_time_ratio']:.2f} | {t['norm_share'] * 100:.1f}% | {t['rounds']} | "
                     f"{_pct(t.get('foreign_cpu'))} |")
    L.append("")
    L.append("`bound` = total / (total - norm) from the original's profile; `needs` = the ratio whose saving is "
             f"{int(BOUND_FRACTION * 100)}% of the bound's; verdict `met` when the interval's low end reaches it, "
             "`not met` when its high end is below it, `can't tell` otherwise, `SLOWER` when the whole interval is "
             "below 1, `noisy` when the noise floor's own interval excludes 1 (that configuration's intervals are "
             "not trustworthy). `norm time before/after` = normalization-group kernel time, original / folded (profile).")
    L.append("")
    kern = results.get("norm_kernels")
    if kern:
        L.append("## ORT CPU normalization kernels alone (one-node graphs, `python -m benchmarks.norm_kernels`)")
        L.append("")
        L.append("Ratio = median(Add + LayerNormalization) / median(X), process CPU time, paired bootstrap 95% "
                 "interval: > 1 means X is cheaper than the unfused original pattern.")
        L.append("")
        L.append("| hidden | rows | threads | " + " | ".join(kern[0]["median_us"]) + " |")
        L.append("|---|---|---|" + "---|" * len(kern[0]["median_us"]))
        for k in kern:
            cells = [f"{k['median_us'][x]['cpu']:.0f} us, x{k['vs_add+ln'][x]['cpu']['ratio']:.2f} "
                     f"[{k['vs_add+ln'][x]['cpu']['lo']:.2f}, {k['vs_add+ln'][x]['cpu']['hi']:.2f}]"
                     for x in k["median_us"]]
            L.append(f"| {k['hidden']} | {k['rows']} | {k['threads']} | " + " | ".join(cells) + " |")
        L.append("")
        L.append("add+ln / skip_ln: what the original runs unfused / fused by ORT; add+sln / skip_sln: the same "
                 "for the folded model; ln / sln: the normalization alone.")
        L.append("")
    L.append("## Fold and what ORT ran")
    L.append("")
    L.append("| model | pre-LN | LN folded / total | ORT graph before (norm ops, Add) | ORT graph after | "
             "norm group nodes before -> after | file MB before -> after |")
    L.append("|---|---|---|---|---|---|---|")
    for n, e in results["models"].items():
        if "ort_graph_ops" not in e:
            continue
        dec = e["fold"]["decisions"] or []
        nf = sum(1 for d in dec if d.get("status") == "folded")
        nb = sum(1 for d in dec if d.get("status") == "folded" and d.get("beta") == "add")

        def ops(c):
            keys = [k for k in c if "Normalization" in k] + ["Add"]
            return ", ".join(f"{k} {c.get(k, 0)}" for k in keys)

        g = e["norm_group_nodes"]
        gs = lambda d: ", ".join(f"{k} {v}" for k, v in sorted(d.items()))  # noqa: E731
        L.append(f"| {n} | {'yes' if e['meta']['pre_ln'] else 'no'} | {nf} / {len(dec)} ({nb} with beta as Add) | "
                 f"{ops(e['ort_graph_ops']['original'])} | {ops(e['ort_graph_ops']['folded'])} | "
                 f"{gs(g['original'])} -> {gs(g['folded'])} | "
                 f"{e['meta']['file_size_bytes'] / 1e6:.1f} -> {e['fold']['folded_file_bytes'] / 1e6:.1f} |")
    L.append("")
    if any(e.get("notes") for e in results["models"].values()):
        L.append("Skipped configurations: " + "; ".join(f"{n}: {', '.join(e['notes'])}"
                                                        for n, e in results["models"].items() if e.get("notes")))
        L.append("")
    L.append("## Fold cost (one subprocess per measurement, medians)")
    L.append("")
    L.append("| model | file MB | reps | load+save s | fold s | fold / load+save | verify s | fold peak RSS MB | "
             "RSS / file | load+save peak RSS MB | other CPU |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|")
    for n, e in results["models"].items():
        c = e.get("fold_cost")
        if not c:
            continue
        L.append(f"| {n} | {c['file_size_bytes'] / 1e6:.1f} | {c['reps']} | {c['wall_s']['roundtrip']:.2f} | "
                 f"{c['wall_s']['fold']:.2f} | x{c['fold_vs_roundtrip_wall']:.2f} "
                 f"({'met' if c['wall_target_met'] else 'not met'}) | {c['verify_s']:.2f} | "
                 f"{c['peak_rss_bytes']['fold'] / 1e6:.0f} | x{c['fold_rss_vs_file']:.2f} "
                 f"({'met' if c['rss_target_met'] else 'not met'}) | {c['peak_rss_bytes']['roundtrip'] / 1e6:.0f} | "
                 f"{_pct(c.get('foreign_cpu'))} |")
    s = results.get("startup")
    if s:
        L.append("")
        L.append(f"Context: interpreter start + `import onnx` alone takes {s['import_onnx']['wall_s']:.2f} s / "
                 f"{s['import_onnx']['peak_rss_bytes'] / 1e6:.0f} MB; + `import onnx_lnfold._cli` "
                 f"{s['import_onnx_lnfold_cli']['wall_s']:.2f} s / {s['import_onnx_lnfold_cli']['peak_rss_bytes'] / 1e6:.0f} MB "
                 "(both included in the figures above; verify s = fold with verification minus fold without).")
    L.append("")
    L.append("## CUDA")
    L.append("")
    cuda = [(n, e.get("cuda", {})) for n, e in results["models"].items()]
    if not cuda or all(c.get("status") != "run" for _, c in cuda):
        L.append("CUDA: not measured: " + ((cuda[0][1].get("status") if cuda else None)
                                           or results.get("cuda_status", "not run")))
        L.append("")
        L.append("The CUDA sweep (`python -m benchmarks.cuda`, on a GPU host) writes to `cuda/RESULTS.md`.")
    else:
        L.append("| model | precision | batch | seq | fold ratio [95% CI] | noise floor | re-saved |")
        L.append("|---|---|---|---|---|---|---|")
        for n, c in cuda:
            for prec in ("fp32", "fp16"):
                rows = c.get(prec)
                if isinstance(rows, dict):
                    L.append(f"| {n} | {prec} | - | - | {rows.get('status')} | | |")
                    continue
                for t in rows or []:
                    L.append(f"| {n} | {prec} | {t['batch']} | {t['seq']} | {_r(t['fold'])} | "
                             f"{_r(t['noise_floor'])} | {_r(t['resaved'])} |")
    L.append("")
    path.write_text("\n".join(L) + "\n")


def write_plot(results: dict, path: Path) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib not installed: no plot (pip install matplotlib)"
    batches = sorted({t["batch"] for e in results["models"].values() for t in e.get("timing", [])})
    if not batches:
        return "nothing to plot"
    clocks = [("wall clock", lambda t: t["fold"]), ("CPU time", lambda t: t["cpu_time"]["fold"])]
    fig, axes = plt.subplots(len(clocks), len(batches), figsize=(6.5 * len(batches), 4.6 * len(clocks)),
                             squeeze=False, sharey=True)
    cmap = plt.get_cmap("tab10")
    for row, (clock, get) in enumerate(clocks):
        for ax, b in zip(axes[row], batches):
            for i, (n, e) in enumerate(results["models"].items()):
                rows = sorted((t for t in e.get("timing", []) if t["batch"] == b), key=lambda t: t["seq"])
                if not rows:
                    continue
                x = [t["seq"] for t in rows]
                y = [get(t)["ratio"] for t in rows]
                err = [[get(t)["ratio"] - get(t)["lo"] for t in rows], [get(t)["hi"] - get(t)["ratio"] for t in rows]]
                c = cmap(i % 10)
                ax.errorbar(x, y, yerr=err, color=c, marker="o", ms=4, capsize=3, label=n)
                ax.plot(x, [t["bound"] for t in rows], color=c, ls="--", lw=1)
            ax.axhline(1.0, color="grey", lw=0.8)
            ax.set_xscale("log", base=2)
            ax.set_xlabel("sequence length (tokens)")
            ax.set_title(f"batch {b}, {clock}")
            ax.grid(alpha=0.3)
        axes[row][0].set_ylabel(f"original / folded, median {clock} (95% CI)")
    axes[0][-1].legend(fontsize=8, title="dashed: bound", title_fontsize=8)
    m = results["machine"]
    fig.suptitle(f"onnx_lnfold speed-up, ORT {m['onnxruntime']} CPU EP, {results.get('threads') or m['cores_usable']} "
                 f"intra-op thread(s) ({m['cpu']}, {m['cores_usable']} cores)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def write_all(results: dict, out: Path) -> None:
    results["targets"] = targets(results)
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    write_markdown(results, out / "RESULTS.md")
    msg = write_plot(results, out / "speedup.png")
    if msg:
        results["plot"] = msg
        log(msg)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="quick set: small models at 128/512/1024 and GPT-2/BERT base at 128/512 "
                         "(batch*seq <= 2048 for base models)")
    ap.add_argument("--models", nargs="+", choices=sorted(SPECS), help="models to run (default: the set's models)")
    ap.add_argument("--seqs", nargs="+", type=int, help="sequence lengths (default: per set and model size)")
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--budget", type=float, help="timing seconds per configuration (after the minimum rounds)")
    ap.add_argument("--min-rounds", type=int, help="minimum interleaved rounds per configuration")
    ap.add_argument("--max-tokens", type=int, help="skip configurations with batch*seq above this (0: no cap)")
    ap.add_argument("--threads", type=int, help="ORT intra-op threads (default: all cores)")
    ap.add_argument("--wait-quiet", type=float, default=300.0,
                    help="before each measurement, wait up to this many seconds for other processes to use "
                         "< 10%% of the CPU (default 300)")
    ap.add_argument("--retries", type=int, default=2,
                    help="measure a configuration again (up to N times) when other processes used > 10%% of the "
                         "CPU during it (default 2)")
    ap.add_argument("--report-only", action="store_true",
                    help="only rewrite RESULTS.md and speedup.png from OUT/results.json")
    ap.add_argument("--skip-kernels", action="store_true",
                    help="do not run the normalization-kernel microbenchmark (d=768 and 256, ~40 s)")
    ap.add_argument("--skip-fold-cost", action="store_true", help="do not measure the fold cost")
    args = ap.parse_args(argv)

    out = Path(args.out)
    if args.report_only:
        results = json.loads((out / "results.json").read_text())
        for e in results["models"].values():
            apply_verdicts(e)
        write_all(results, out)
        return 0
    mode = "quick" if args.quick else "full"
    names = args.models or (QUICK_MODELS if args.quick else FULL_MODELS)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    cuda = cuda_available()
    results: dict = {
        "command": "python -m benchmarks.run " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])),
        "mode": mode, "threads": args.threads, "machine": machine_info(), "cuda_status": cuda[1] or "run", "models": {},
        "definitions": {
            "ratio": "median(original latency) / median(X latency), one interleaved run; > 1 means X faster",
            "interval": "paired bootstrap (4000 resamples of rounds) 95% percentile interval",
            "bound": "total / (total - norm), node kernel times of the original from the ORT profile",
            "norm": "kernel time of LayerNormalization, SimplifiedLayerNormalization, SkipLayerNormalization, "
                    "SkipSimplifiedLayerNormalization, Add nodes feeding them and Add(norm output, constant) nodes, "
                    "in the graph ORT executes",
            "e2e_threshold": f"1 / (1 - {BOUND_FRACTION} * (1 - 1/bound))",
        },
    }
    if not args.skip_fold_cost:
        results["startup"] = fc.startup_costs()
    for n in names:
        log(f"== {n}")
        try:
            results["models"][n] = run_model(n, mode, args, cuda)
        except Exception as e:  # noqa: BLE001 - keep the other models' results
            log(f"{n}: FAILED: {type(e).__name__}: {e}")
            results.setdefault("failures", {})[n] = f"{type(e).__name__}: {e}"
        results["wall_minutes"] = (time.time() - t0) / 60
        write_all(results, out)
    if not args.skip_kernels:
        from benchmarks import norm_kernels

        wait_for_quiet(args.wait_quiet)
        log("normalization kernels alone")
        results["norm_kernels"] = [norm_kernels.measure(h, r, args.threads or 1, 15.0) for h, r in ((768, 512), (256, 1024))]
        results["wall_minutes"] = (time.time() - t0) / 60
        write_all(results, out)
    log(f"done in {(time.time() - t0) / 60:.1f} min: {out / 'RESULTS.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
