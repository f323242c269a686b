"""The cost rule's predicted saving against the one measured, on a real model (instructions).

    python -m benchmarks.pricing_check MODEL.onnx FEEDS.npz --variant NAME=FOLDED.onnx ... [--processes 2]
                                       [--fold-args '...'] [--json F]

Predicted: what the rule's table says the default fold of MODEL (this checkout, priced as ONNX
Runtime runs it, `decide.costs`) saves per run: each folded LN's saving at the shape it was priced at,
less each explicit centering's cost; in the table's unit (callgrind instructions for the built-in
one). Measured: callgrind instructions per run of MODEL and of each variant (the folded files to
compare: the fold before and after a change, say), `--processes` valgrind processes holding every
session in a rotated order after a burn-in session, per run = (I(2N) - I(N)) / N with N = 1
(`benchmarks.instructions.measure`). Printed: each variant's instructions and its saving against
MODEL, mean and range over the processes, beside the prediction.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from benchmarks.common import CACHE
from benchmarks.emission_costs import build
from benchmarks.instructions import measure


def predicted(model_path: str, feeds: dict[str, np.ndarray], fold_args: dict) -> dict:
    """The default plan's LNs folded and the saving the rule predicts for them, in the table's unit."""
    import onnx_ir as ir

    import onnx_lnfold
    from onnx_lnfold.analysis.planner import candidates
    from onnx_lnfold.core.options import FoldOptions
    from onnx_lnfold.decide.costs import table_for
    from onnx_lnfold.decide.pricing import centering_kind
    from onnx_lnfold.decide.targets import choose_rewrite, cost_nodes
    from onnx_lnfold.ort_fusions.fusion_cost import FusionCheck
    from onnx_lnfold.shapes.table import ShapeTable

    options = FoldOptions(**fold_args)
    plan = onnx_lnfold.analyze(model_path, inputs=feeds, **fold_args)
    model = ir.load(model_path)
    shapes = ShapeTable(model, given={name: tuple(a.shape) for name, a in feeds.items()})
    lns = candidates(model, shapes)
    with FusionCheck.start(model, options.keep_ort_fusions) as fusions:
        shapes.ort_layouts.update(fusions.layouts(lns))  # as the analysis prices them
    savings = {}
    for cand in lns:
        if cand.form_problem is None:
            rewrite = choose_rewrite(cand, options, shapes, set())
            original, emitted = cost_nodes(rewrite, shapes)
            savings[cand.name] = rewrite.pricing.saving(emitted, original, original[0][1])
    folded = {d.node for d in plan.folded}
    saved = sum(s.amount for name, s in savings.items() if name in folded)
    table = table_for(options)
    values = {v.name: v for n in model.graph for v in n.outputs}
    centerings = []
    for c in plan.centerings:
        written = values.get(c.tensor)  # priced where written, as the cost rule prices it
        unlocked = [s for name, s in savings.items() if name in c.required_by]
        kind = centering_kind(written, c.axis, shapes) if written is not None else "Centering"
        width = next((s.width for s in unlocked if s.width), None)
        cost = unlocked[0].pricing.total([(kind, width)]) if unlocked and width else 0.0
        centerings.append({"tensor": c.tensor, "axis": c.axis, "kind": kind, "cost": cost})
    return {"folded": len(folded), "lns": len(plan.decisions), "unit": table.unit, "source": table.source,
            "saving": saved - sum(c["cost"] for c in centerings), "lns_saving": saved, "centerings": centerings,
            "priced_at": sorted({d.priced_at for d in plan.decisions if d.priced_at})}


_PROFILE_CHILD = """
import json, os, re, sys, numpy as np, onnxruntime as ort
model, feeds, pattern, runs, prefix = sys.argv[1:6]
so = ort.SessionOptions(); so.intra_op_num_threads = 1; so.inter_op_num_threads = 1
so.enable_profiling = True; so.profile_file_prefix = prefix
s = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
f = dict(np.load(feeds)); f = {i.name: f[i.name] for i in s.get_inputs()}
for _ in range(3 + int(runs)): s.run(None, f)  # 3 warm-up runs, not counted
path = s.end_profiling()
events = json.load(open(path)); os.remove(path)
starts = sorted(e["ts"] for e in events if e.get("name") == "model_run")
per_run = [0.0] * len(starts); ops = {}
for e in events:
    if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time"):
        continue
    name = e["name"][: -len("_kernel_time")]
    i = max(j for j, t in enumerate(starts) if t <= e["ts"])
    if i >= 3 and re.search(pattern, name):
        per_run[i] += e["dur"]
        op = e["args"].get("op_name", "?"); ops[op] = ops.get(op, 0) + e["dur"] / len(starts[3:])
print(json.dumps({"region_us": float(np.median(per_run[3:])), "ops": ops}))
"""


def region_profile(model: str, feeds: str, pattern: str, processes: int, runs: int, work: Path) -> dict:
    """Kernel time per run (ONNX Runtime's profiler, one thread, median over `runs`) of the nodes
    whose names match `pattern`, in `processes` fresh processes."""
    import subprocess

    out = []
    for p in range(processes):
        done = subprocess.run([sys.executable, "-c", _PROFILE_CHILD, model, feeds, pattern, str(runs), str(work / f"prof{p}")],
                              capture_output=True, text=True, check=True)
        out.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return {"region_us": [o["region_us"] for o in out], "ops_us": out[0]["ops"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("feeds")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=FILE")
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--json")
    ap.add_argument("--region", help="also profile the kernel time of the nodes whose names match this regex "
                                     "(the LN region), per variant, in --processes fresh processes")
    ap.add_argument("--profile-runs", type=int, default=20)
    ap.add_argument("--no-callgrind", action="store_true", help="only the prediction and the --region profile")
    args = ap.parse_args(argv)
    feeds = dict(np.load(args.feeds))
    prediction = predicted(args.model, feeds, {})
    print(f"predicted by the rule (this checkout's default fold): {prediction['folded']}/{prediction['lns']} LNs, "
          f"saving {prediction['saving'] / 1e6:+.2f}M {prediction['unit']} per run "
          f"(LNs {prediction['lns_saving'] / 1e6:+.2f}M, centerings "
          f"{-sum(c['cost'] for c in prediction['centerings']) / 1e6:+.2f}M; {', '.join(prediction['priced_at'])})")
    variants = {"original": args.model, **dict(v.split("=", 1) for v in args.variant)}
    names = list(variants)
    CACHE.mkdir(parents=True, exist_ok=True)
    out = {"model": args.model, "predicted": prediction, "measured": {}, "region": {}}
    if args.region:
        with tempfile.TemporaryDirectory(prefix="lnfold-profile-", dir=CACHE) as tmp:
            for n in names:
                out["region"][n] = region_profile(str(Path(variants[n]).resolve()), str(Path(args.feeds).resolve()),
                                                  args.region, args.processes, args.profile_runs, Path(tmp))
                r = out["region"][n]["region_us"]
                print(f"{n:10s} LN region {np.median(r):9.1f} us per run (processes {min(r):.1f}-{max(r):.1f}); "
                      + ", ".join(f"{op} {us:.0f}" for op, us in sorted(out["region"][n]["ops_us"].items())))
    if args.no_callgrind:
        if args.json:
            Path(args.json).write_text(json.dumps(out, indent=1))
        return 0
    with tempfile.TemporaryDirectory(prefix="lnfold-pricing-", dir=CACHE) as tmp:
        work = Path(tmp)
        burn_in = work / "burn_in.onnx"
        burn_in.write_bytes(build("burn_in", 64, 1, 16))
        np.savez(work / "burn_in.npz", x=np.zeros((1, 16, 64), np.float32))
        plans = []
        for p in range(args.processes):
            order = names[p % len(names):] + names[:p % len(names)]
            plans.append([{"name": "burn_in", "model": str(burn_in), "feeds": str(work / "burn_in.npz")}]
                         + [{"name": n, "model": str(Path(variants[n]).resolve()), "feeds": str(Path(args.feeds).resolve())}
                            for n in order])
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            done = list(pool.map(lambda ip: measure(ip[1], 1, 0, work, f"p{ip[0]}"), enumerate(plans)))
    per_run = {n: [d["sessions"][n]["per_run"] for d in done] for n in names}
    for n in names:
        saving = [o - v for o, v in zip(per_run["original"], per_run[n])]
        out["measured"][n] = {"per_run": per_run[n], "mean": float(np.mean(per_run[n])),
                              "saving": saving, "saving_mean": float(np.mean(saving))}
        print(f"{n:10s} {np.mean(per_run[n]) / 1e6:10.2f}M instructions per run "
              f"(processes {min(per_run[n]) / 1e6:.2f}-{max(per_run[n]) / 1e6:.2f}M); saving against the original "
              f"{np.mean(saving) / 1e6:+.2f}M ({min(saving) / 1e6:+.2f} to {max(saving) / 1e6:+.2f}M)")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
