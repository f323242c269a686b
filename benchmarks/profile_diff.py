"""Where does the fold's saving go? Per-node kernel time of original vs folded, from ORT's profile.

    python -m benchmarks.profile_diff opt_small [--batch 1] [--seq 128] [--runs 21] [--threads 1] [--json F]
    python -m benchmarks.profile_diff --files ORIGINAL.onnx FOLDED.onnx FEEDS.npz [--runs 21] [--threads 1]

Both models (from benchmarks/cache/, folded and re-saved as benchmarks.run does; or any two files
and their inputs, `--files`: a real model and the fold a user made of it) run in profiled
CPU sessions at graph optimization level ALL, interleaved, after warm-up runs. The graph ORT
executes is dumped by each session, and every node is classified by the normalization-group
roles of `benchmarks.latency.norm_groups`. Printed:

- kernel time per op type in the normalization group (norm ops, residual Adds, beta Adds,
  centering nodes), original vs folded, medians over runs, and the group's ratio;
- each normalization node's own time, paired by position (the n-th norm node of each graph), with
  the shape of its input as ORT ran it: where a folded node costs more than its original, it shows;
- the op types whose total time changed most outside the group (a fold can move ORT's other
  fusions: a Reshape kept or removed, a MatMul+Add that no longer fuses);
- the run split in two: what the fold changed (the group, and every node outside it that only one
  of the two graphs runs, matched by name and op) and the nodes both run. The first is the fold's
  effect; the second runs the same kernels on the same shapes in both, so what moves it is the
  machine, and its ratio's interval says how far a whole-run figure can be trusted. Each ratio is a
  median of paired runs with a bootstrap 95% interval.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np

from benchmarks.common import ensure_exported, session_options
from benchmarks.latency import feeds_for, norm_groups
from onnx_lnfold.bench.session_graph import split_nodes
from onnx_lnfold.bench.stats import fmt_ratio, ratio_of_medians


def _prepare(name: str) -> dict[str, str]:
    meta = ensure_exported(name)
    src = Path(meta["path"])
    folded = src.with_name(f"{name}.lnfold.onnx")
    if not folded.exists():
        import subprocess
        import sys

        subprocess.run([sys.executable, "-m", "onnx_lnfold", str(src), "-o", str(folded), "--no-verify", "-q"],
                       check=True)
    return {"meta": meta, "original": str(src), "folded": str(folded)}


def _node_events(profile: str, n_calls: int) -> list[dict[str, tuple[str, float, list]]]:
    """Per run: node name -> (op, kernel us, input shapes)."""
    events = json.loads(Path(profile).read_text())
    runs = sorted((e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"),
                  key=lambda e: e["ts"])
    assert len(runs) == n_calls, (len(runs), n_calls)
    per_run: list[dict] = [dict() for _ in runs]
    for e in events:
        if e.get("cat") != "Node" or not e.get("name", "").endswith("_kernel_time"):
            continue
        for i, r in enumerate(runs):
            if r["ts"] <= e["ts"] <= r["ts"] + r["dur"]:
                args = e.get("args", {})
                shapes = [list(s.values())[0] for s in args.get("input_type_shape", [])]
                per_run[i][e["name"][: -len("_kernel_time")]] = (args.get("op_name", "?"), float(e["dur"]), shapes)
                break
    return per_run


def profile_pair(name: str, batch: int, seq: int, runs: int, threads: int) -> dict:
    paths = _prepare(name)
    feeds = feeds_for(paths["meta"], batch, seq)
    return profile_files(name, paths, feeds, runs, threads, batch, seq)


def profile_files(name: str, paths: dict[str, str], feeds: dict, runs: int, threads: int, batch=None, seq=None) -> dict:
    """`profile_pair` on the files `paths["original"]` and `paths["folded"]`, run on `feeds`."""
    import onnx
    import onnxruntime as ort

    out: dict = {"model": name, "batch": batch, "seq": seq, "runs": runs, "threads": threads}
    with tempfile.TemporaryDirectory(prefix="lnfold-pdiff-") as tmp:
        sessions, roles, order, nodes = {}, {}, {}, {}
        for v in ("original", "folded"):
            opt = os.path.join(tmp, f"{v}.opt.onnx")
            so = session_options(threads=threads, profile_prefix=os.path.join(tmp, v), optimized_path=opt)
            sessions[v] = ort.InferenceSession(paths[v], so, providers=["CPUExecutionProvider"])
            roles[v] = norm_groups(opt)
            g = onnx.load(opt, load_external_data=False).graph
            order[v] = [n.name for n in g.node if roles[v].get(n.name) == "norm_op"]
            nodes[v] = {n.name: n.op_type for n in g.node}
        warm = 3
        for _ in range(warm):
            for v in sessions:
                sessions[v].run(None, feeds)
        for r in range(runs):
            for v in (("original", "folded") if r % 2 == 0 else ("folded", "original")):
                sessions[v].run(None, feeds)
        per_run = {v: _node_events(sessions[v].end_profiling(), warm + runs)[warm:] for v in sessions}

    def med(values):
        return float(np.median(values)) if len(values) else 0.0

    by_op_all: dict[str, dict[str, float]] = {}
    group: dict[str, dict[str, float]] = {}
    for v, rs in per_run.items():
        acc_all, acc_group = defaultdict(list), defaultdict(list)
        for run in rs:
            t_all, t_group = defaultdict(float), defaultdict(float)
            for node, (op, us, _) in run.items():
                t_all[op] += us
                role = roles[v].get(node)
                if role:
                    t_group[f"{role}:{op}"] += us
                    t_group["TOTAL"] += us
            t_all["TOTAL"] = sum(us for _, us, _ in run.values())
            for k, val in t_all.items():
                acc_all[k].append(val)
            for k, val in t_group.items():
                acc_group[k].append(val)
        by_op_all[v] = {k: med(x) for k, x in acc_all.items()}
        group[v] = {"TOTAL": 0.0, **{k: med(x) for k, x in acc_group.items()}}
    out["group_us"] = group
    # None where a side has no normalization op ONNX Runtime names (LNs decomposed into their nodes,
    # which the split below counts among the nodes only one graph runs)
    both = group["original"]["TOTAL"] and group["folded"]["TOTAL"]
    out["group_ratio"] = group["original"]["TOTAL"] / group["folded"]["TOTAL"] if both else None
    out["total_ratio"] = by_op_all["original"]["TOTAL"] / by_op_all["folded"]["TOTAL"]
    ops = sorted(set(by_op_all["original"]) | set(by_op_all["folded"]))
    out["by_op_us"] = {op: [by_op_all["original"].get(op, 0.0), by_op_all["folded"].get(op, 0.0)] for op in ops}
    pairs = []
    for i, (a, b) in enumerate(zip(order["original"], order["folded"])):
        ta = med([r[a][1] for r in per_run["original"] if a in r])
        tb = med([r[b][1] for r in per_run["folded"] if b in r])
        sa = next((r[a][2] for r in per_run["original"] if a in r), None)
        sb = next((r[b][2] for r in per_run["folded"] if b in r), None)
        opa = next((r[a][0] for r in per_run["original"] if a in r), "?")
        opb = next((r[b][0] for r in per_run["folded"] if b in r), "?")
        pairs.append({"i": i, "original": [a, opa, ta, sa], "folded": [b, opb, tb, sb],
                      "ratio": ta / tb if tb else float("inf")})
    out["norm_nodes"] = pairs
    out.update(_split_by_change(per_run, nodes, roles))
    return out


def _split_by_change(per_run: dict[str, list[dict]], nodes: dict[str, dict[str, str]],
                     roles: dict[str, dict[str, str]]) -> dict:
    """The run split into the nodes the fold changed and those both graphs run
    (`onnx_lnfold.bench.session_graph.split_nodes`)."""
    shared, alone = split_nodes(nodes, roles)
    us: dict[str, dict[str, list[float]]] = {}
    for v, runs in per_run.items():
        both = [sum(t for name, (_, t, _) in run.items() if name in shared) for run in runs]
        total = [sum(t for _, t, _ in run.values()) for run in runs]
        us[v] = {"changed": [a - b for a, b in zip(total, both)], "shared": both, "total": total}
    moved = []
    for name in shared:
        a, b = (float(np.median([run[name][1] for run in per_run[v] if name in run] or [0.0])) for v in ("original", "folded"))
        moved.append((name, nodes["original"][name], a, b))
    moved.sort(key=lambda m: -abs(m[3] - m[2]))
    return {
        "shared_moved_most": [list(m) for m in moved[:8]],
        "shared_nodes": len(shared),
        "only_original": alone["original"],
        "only_folded": alone["folded"],
        "split_us": {part: [float(np.median(us[v][part])) for v in ("original", "folded")] for part in us["original"]},
        "split_ratio": {part: ratio_of_medians(us["original"][part], us["folded"][part]) for part in us["original"]},
    }


def print_report(r: dict) -> None:
    shape = f" b{r['batch']} s{r['seq']}" if r.get("batch") is not None else ""
    print(f"{r['model']}{shape}, {r['runs']} profiled runs each, {r['threads']} thread(s)")
    print(f"  normalization group: {r['group_us']['original']['TOTAL']:.0f} us -> "
          f"{r['group_us']['folded']['TOTAL']:.0f} us "
          f"({'x%.2f' % r['group_ratio'] if r['group_ratio'] else 'no ratio: one side names no normalization op'}); "
          f"all nodes x{r['total_ratio']:.3f}")
    keys = sorted(set(r["group_us"]["original"]) | set(r["group_us"]["folded"]) - {"TOTAL"})
    for k in keys:
        print(f"    {k:48s} {r['group_us']['original'].get(k, 0):9.0f} {r['group_us']['folded'].get(k, 0):9.0f} us")
    print("  norm nodes paired by position (original -> folded):")
    for p in r["norm_nodes"]:
        a, b = p["original"], p["folded"]
        print(f"    {p['i']:2d} {a[1]:34s} {a[2]:7.0f} us {str(a[3]):40s} -> {b[1]:34s} {b[2]:7.0f} us  x{p['ratio']:.2f}")
    if "split_ratio" in r:
        def ops(counts):
            return ", ".join(f"{n} {op}" for op, n in counts.items()) or "none"

        us, ratio = r["split_us"], r["split_ratio"]
        print(f"  what the fold changed (the group; outside it, only the original runs {ops(r['only_original'])}; "
              f"only the fold, {ops(r['only_folded'])}): {us['changed'][0]:.0f} -> {us['changed'][1]:.0f} us "
              f"x{fmt_ratio(ratio['changed'])}")
        print(f"  the {r['shared_nodes']} nodes both run: {us['shared'][0]:.0f} -> {us['shared'][1]:.0f} us "
              f"x{fmt_ratio(ratio['shared'])} (the same kernels on the same shapes: the machine's noise)")
        print(f"  the whole run: {us['total'][0]:.0f} -> {us['total'][1]:.0f} us x{fmt_ratio(ratio['total'])}")
        print("  shared nodes that moved most (original, folded us):")
        for name, op, a, b in r["shared_moved_most"]:
            print(f"    {name[:60]:60s} {op:14s} {a:9.0f} {b:9.0f}  ({b - a:+.0f})")
    print("  op types whose total moved most (original, folded us):")
    moved = sorted(r["by_op_us"].items(), key=lambda kv: -abs(kv[1][0] - kv[1][1]))
    for op, (a, b) in moved[:10]:
        print(f"    {op:34s} {a:9.0f} {b:9.0f}  ({b - a:+.0f})")


def summarize(results: list[dict]) -> str:
    """Markdown: per model and thread count, the group ratio with and without the fused Skip node,
    and the plain LN -> SimplifiedLN node ratio (median over that configuration's nodes)."""
    lines = ["| model | threads | batch x seq | group ratio | group ratio without the Skip node | "
             "plain LN -> SLN nodes (median ratio) | Skip node before -> after (us) | beta Add share of folded group |",
             "|---|---|---|---|---|---|---|---|"]
    for r in sorted(results, key=lambda r: (r["model"], r["threads"], r["batch"], r["seq"])):
        if not r["group_ratio"]:  # LNs run decomposed: the table's columns are about named norm ops
            continue
        o, f = r["group_us"]["original"], r["group_us"]["folded"]
        skip_o = o.get("norm_op:SkipLayerNormalization", 0.0)
        skip_f = f.get("norm_op:SkipSimplifiedLayerNormalization", 0.0)
        plain = [p["ratio"] for p in r["norm_nodes"]
                 if p["original"][1] == "LayerNormalization" and p["folded"][1] == "SimplifiedLayerNormalization"]
        without = (o["TOTAL"] - skip_o) / (f["TOTAL"] - skip_f)
        lines.append(f"| {r['model']} | {r['threads']} | {r['batch']} x {r['seq']} | x{r['group_ratio']:.2f} | "
                     f"x{without:.2f} | x{float(np.median(plain)):.2f} ({len(plain)} nodes) | "
                     + (f"{skip_o:.0f} -> {skip_f:.0f} |" if skip_o else "none |")
                     + f" {100 * f.get('beta_add:Add', 0.0) / f['TOTAL']:.1f}% |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?")
    ap.add_argument("--files", nargs=3, metavar=("ORIGINAL", "FOLDED", "FEEDS_NPZ"),
                    help="profile these two files on these inputs instead of a benchmark model")
    ap.add_argument("--summarize", nargs="+", metavar="JSON", help="print the summary table of earlier --json outputs")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--runs", type=int, default=21)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    if args.summarize:
        loaded = [json.loads(Path(f).read_text()) for f in args.summarize]
        print(summarize([r for x in loaded for r in (x if isinstance(x, list) else [x])]))
        return 0
    if args.files:
        original, folded, feeds = args.files
        r = profile_files(Path(original).stem, {"original": original, "folded": folded}, dict(np.load(feeds)),
                          args.runs, args.threads)
    elif args.model:
        r = profile_pair(args.model, args.batch, args.seq, args.runs, args.threads)
    else:
        ap.error("a model name (or --files) is required")
    print_report(r)
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
