"""What each form the fold can emit costs ONNX Runtime's CPU EP, in instructions per run (callgrind).

    python -m benchmarks.emission_costs [--dims 384 768 1024] [--tokens 1x16 1x128 1x1024 8x1024]
                                        [--repeats 2] [--jobs 2] [--cache-sim] [--json F] [--md F]

Every variant is a small graph with the shapes a real export has (`x` is [batch, seq, d] with both
dims symbolic, so ORT's session-level fusions see what they see in a model), run at graph
optimization level ALL on one thread; what ORT turned each variant into is recorded (its optimized
graph's ops). Variants:

    ln              LayerNormalization(x, gamma, beta)                       a plain LN of the original
    sln             SimplifiedLayerNormalization(x, gamma)                   its fold, beta in a consumer
    sln+beta        SimplifiedLayerNormalization(x, gamma) + beta            its fold, beta left as an Add
    beta_add        x + beta (broadcast [d])                                 that Add alone
    center          x - ReduceMean(x, -1)                                    one explicit centering
    add+ln          Add(x, skip) -> LayerNormalization, Add read once        ORT fuses: SkipLayerNormalization
    add+sln         Add(x, skip) -> SimplifiedLayerNormalization             the fold, unfused (ORT never fuses it)
    skip_sln        com.microsoft SkipSimplifiedLayerNormalization           the fold, fused
    add+sln+beta    add+sln, beta as an Add
    skip_sln+beta   skip_sln, beta as an Add
    add+ln|sum      Add(x, skip) -> LayerNormalization, the sum read again    (a residual stream: not fused)
    add+sln|sum     Add(x, skip) -> SimplifiedLayerNormalization, sum read again
    skip_sln|sum    SkipSimplifiedLayerNormalization with output 3 (the sum)
    mm              MatMul(x, W[d, d])
    mm+bias         MatMul(x, W) + bias[d] (x symbolic: ORT leaves MatMul and Add)
    mm+bias|static  the same with x of static shape (ORT: Reshape -> Gemm(bias) -> Reshape)
    center|axis1    x - ReduceMean(x, 1), x [batch, d, seq]                  a centering over a non-last axis
    ln|axis1        the decomposed LN (ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div, Mul, Add)
                    over axis 1 of [batch, d, seq]: what ORT runs where its transpose optimizer cancels
                    the Transposes around a decomposed LN and no LayerNormalization fusion follows
    transpose       Transpose([batch, d, seq] -> [batch, seq, d])             what a fold brings back there

The last three ("layout" variants) price what is not a last-axis kernel. Added to a shape measured
before (`--resume --variants center|axis1 ln|axis1 transpose`), they are measured in processes of
their own, with the one-Add and RMSNorm graphs again (the run's fixed cost is taken out with what
the same process counted).

Each shape is measured in `--repeats` valgrind processes holding every variant, in a different
rotated order each (after a burn-in session: benchmarks/instructions.py found the first session
measured in a process pays a one-time cost); per run = (I(2N) - I(N)) / N, as there. Reported: each
variant's mean over the processes and the spread between them, and the comparisons the fold's cost
rules read (docs/DESIGN.md section 4). With `--cache-sim`, callgrind also simulates the caches
(last-level misses show a second pass over a tensor that does not fit).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper

from benchmarks.common import CACHE, ROOT, log, machine_info, results_header
from benchmarks.instructions import measure, spread
from onnx_lnfold.bench.graphs import decomposed_ln
from onnx_lnfold.bench.tables import fit_points, make_table, write_table
from onnx_lnfold.decide.costs import CostTable, Point

EPS = 1e-5
TABLE = ROOT / "onnx_lnfold" / "decide" / "tables" / "cpu.json"  # the built-in table, written from the results
LAYOUT_VARIANTS = ["center|axis1", "ln|axis1", "transpose"]  # x is [batch, d, seq]
VARIANTS = ["ln", "sln", "sln+beta", "beta_add", "center", "add+ln", "add+sln", "skip_sln", "add+sln+beta",
            "skip_sln+beta", "add+ln|sum", "add+sln|sum", "skip_sln|sum", "mm", "mm+bias", "mm+bias|static",
            *LAYOUT_VARIANTS]
FIXED_VARIANTS = ["beta_add", "sln", "sln+beta"]  # what the run's fixed cost is computed from


def _node(op, inputs, outputs, domain="", **attrs):
    return helper.make_node(op, inputs, outputs, domain=domain, **attrs)


def _nodes(kind: str) -> tuple[list, list[str], list[str]]:
    """(nodes, extra inputs besides x, outputs) of one variant."""
    ln = lambda i, o: _node("LayerNormalization", [i, "gamma", "beta"], [o], axis=-1, epsilon=EPS)  # noqa: E731
    sln = lambda i, o: _node("SimplifiedLayerNormalization", [i, "gamma"], [o], axis=-1, epsilon=EPS)  # noqa: E731
    skip = lambda o, s="": _node("SkipSimplifiedLayerNormalization", ["x", "skip", "gamma"],  # noqa: E731
                                 [o, "", "", s] if s else [o], domain="com.microsoft", epsilon=EPS)
    beta = _node("Add", ["n", "beta"], ["y"])
    residual = _node("Add", ["x", "skip"], ["r"])
    table = {
        "ln": ([ln("x", "y")], [], ["y"]),
        "sln": ([sln("x", "y")], [], ["y"]),
        "sln+beta": ([sln("x", "n"), beta], [], ["y"]),
        "beta_add": ([_node("Add", ["x", "beta"], ["y"])], [], ["y"]),
        "center": ([_node("ReduceMean", ["x"], ["m"], axes=[-1]), _node("Sub", ["x", "m"], ["y"])], [], ["y"]),
        "add+ln": ([residual, ln("r", "y")], ["skip"], ["y"]),
        "add+sln": ([residual, sln("r", "y")], ["skip"], ["y"]),
        "skip_sln": ([skip("y")], ["skip"], ["y"]),
        "add+sln+beta": ([residual, sln("r", "n"), beta], ["skip"], ["y"]),
        "skip_sln+beta": ([skip("n"), beta], ["skip"], ["y"]),
        "add+ln|sum": ([residual, ln("r", "y")], ["skip"], ["y", "r"]),
        "add+sln|sum": ([residual, sln("r", "y")], ["skip"], ["y", "r"]),
        "skip_sln|sum": ([skip("y", "r")], ["skip"], ["y", "r"]),
        "mm": ([_node("MatMul", ["x", "W"], ["y"])], [], ["y"]),
        "mm+bias": ([_node("MatMul", ["x", "W"], ["m"]), _node("Add", ["m", "bias"], ["y"])], [], ["y"]),
        "mm+bias|static": ([_node("MatMul", ["x", "W"], ["m"]), _node("Add", ["m", "bias"], ["y"])], [], ["y"]),
        "center|axis1": ([_node("ReduceMean", ["x"], ["m"], axes=[1]), _node("Sub", ["x", "m"], ["y"])], [], ["y"]),
        "ln|axis1": (decomposed_ln("x", "y", 1), [], ["y"]),
        "transpose": ([_node("Transpose", ["x"], ["y"], perm=[0, 2, 1])], [], ["y"]),
        "burn_in": ([_node("Neg", ["x"], ["y"])], [], ["y"]),
    }
    return table[kind]


def build(kind: str, d: int, batch: int, seq: int) -> bytes:
    nodes, extra, outputs = _nodes(kind)
    shape = [batch, seq, d] if kind.endswith("|static") else ["batch", "seq", d]
    if kind in LAYOUT_VARIANTS:
        shape = ["batch", d, "seq"]
    rng = np.random.default_rng(0)

    def const(name, dims, scale, offset=0.0):
        values = (offset + scale * rng.standard_normal(dims)).astype(np.float32)
        return helper.make_tensor(name, TensorProto.FLOAT, dims, values.ravel())

    inits = [const("gamma", [d], 0.1, 1.0), const("beta", [d], 0.1), const("bias", [d], 0.1),
             const("W", [d, d], d ** -0.5), const("gamma_col", [d, 1], 0.1, 1.0), const("beta_col", [d, 1], 0.1),
             helper.make_tensor("two", TensorProto.FLOAT, [], [2.0]), helper.make_tensor("eps", TensorProto.FLOAT, [], [EPS])]
    used = {i for n in nodes for i in n.input}
    graph = helper.make_graph(
        nodes, kind,
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in ["x", *extra]],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [shape[0], shape[2], shape[1]] if kind == "transpose" else shape)
         for n in outputs],
        [t for t in inits if t.name in used],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 9
    return model.SerializeToString()


def ort_ops(model_path: Path, out: Path) -> list[str]:
    """The ops of the graph ONNX Runtime runs (level ALL, CPU EP)."""
    import onnx
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.optimized_model_filepath = str(out)
    so.log_severity_level = 3
    ort.InferenceSession(str(model_path), so, providers=["CPUExecutionProvider"])
    return [n.op_type for n in onnx.load(str(out)).graph.node]


def measure_shape(d: int, batch: int, seq: int, variants: list[str], repeats: int, runs: int, work: Path,
                  cache_sim: bool, jobs: int) -> dict:
    rng = np.random.default_rng(1)
    feeds = {"x": rng.standard_normal((batch, seq, d)).astype(np.float32),
             "skip": rng.standard_normal((batch, seq, d)).astype(np.float32)}
    layout_feeds = {"x": rng.standard_normal((batch, d, seq)).astype(np.float32)}
    tag = f"d{d}.b{batch}s{seq}"
    paths, graphs = {}, {}
    for kind in variants:
        p = work / f"{tag}.{kind.replace('|', '_').replace('+', '_')}.onnx"
        p.write_bytes(build(kind, d, batch, seq))
        paths[kind] = p
        graphs[kind] = ort_ops(p, work / f"{p.stem}.opt.onnx")
    # The burn-in session is a graph of its own: one of the measured files measured second in the
    # same process ran up to 13% fewer instructions than in the other process (d 64, 16 tokens).
    burn_in = work / f"{tag}.burn_in.onnx"
    burn_in.write_bytes(build("burn_in", d, batch, seq))
    feed_paths = {}
    for n_in in (1, 2):
        fp = work / f"{tag}.feeds{n_in}.npz"
        np.savez(fp, **dict(list(feeds.items())[:n_in]))
        feed_paths[n_in] = str(fp)
    feed_paths["layout"] = str(work / f"{tag}.feeds_layout.npz")
    np.savez(feed_paths["layout"], **layout_feeds)

    def feed_of(kind):
        if kind in LAYOUT_VARIANTS:
            return feed_paths["layout"]
        return feed_paths[1 + ("skip" in _nodes(kind)[1])]

    plans = []
    for r in range(repeats):  # a different rotation per process; odd processes run it backwards
        order = variants[r * len(variants) // repeats:] + variants[:r * len(variants) // repeats]
        if r % 2:
            order = order[::-1]
        plans.append([{"name": "burn_in", "model": str(burn_in), "feeds": feed_paths[1]}]
                     + [{"name": k, "model": str(paths[k]), "feeds": feed_of(k)} for k in order])
    log(f"{tag}: {repeats} valgrind processes x {len(variants)} variants")
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        done = list(pool.map(lambda ip: measure(ip[1], runs, 1, work, f"{tag}.p{ip[0]}", cache_sim=cache_sim),
                             enumerate(plans)))
    out = {"d": d, "batch": batch, "seq": seq, "tokens": batch * seq, "runs": runs,
           "orders": [[s["name"] for s in plan[1:]] for plan in plans], "variants": {}}
    for kind in variants:
        per_run = [p["sessions"][kind]["per_run"] for p in done]
        entry = {"per_run": per_run, "mean": float(np.mean(per_run)), "spread": spread(per_run),
                 "ort_graph": graphs[kind]}
        if cache_sim:
            ev = [p["sessions"][kind]["events_per_run"] for p in done]
            entry["events_mean"] = {k: float(np.mean([e[k] for e in ev])) for k in ev[0]}
        out["variants"][kind] = entry
    return out


# The comparisons the fold's rules read: (label, variant a, variant b); reported as a - b and a / b.
COMPARISONS = [
    ("LN -> SLN (beta in a consumer)", "sln", "ln"),
    ("LN -> SLN + beta Add", "sln+beta", "ln"),
    ("beta Add alone vs what LN -> SLN saves", "beta_add", None),
    ("explicit centering vs what LN -> SLN saves", "center", None),
    ("fused original (SkipLN) -> SkipSLN", "skip_sln", "add+ln"),
    ("fused original (SkipLN) -> Add + SLN", "add+sln", "add+ln"),
    ("SkipSLN vs Add + SLN", "skip_sln", "add+sln"),
    ("fused original (SkipLN) -> SkipSLN + beta Add", "skip_sln+beta", "add+ln"),
    ("fused original (SkipLN) -> Add + SLN + beta Add", "add+sln+beta", "add+ln"),
    ("residual read again: Add + LN -> SkipSLN with sum", "skip_sln|sum", "add+ln|sum"),
    ("residual read again: Add + LN -> Add + SLN", "add+sln|sum", "add+ln|sum"),
    ("created bias after MatMul (symbolic shape)", "mm+bias", "mm"),
    ("centering over axis 1 vs over the last axis", "center|axis1", "center"),
    ("decomposed LN over axis 1 vs LayerNormalization", "ln|axis1", "ln"),
]


def added_costs(shape: dict) -> dict[str, float]:
    """Instructions per run each added node costs, and what one LN -> SLN saves, at one shape."""
    v = {k: e["mean"] for k, e in shape["variants"].items()}
    nan = float("nan")
    beta = v["sln+beta"] - v["sln"]
    return {
        "ln_to_sln_saving": v["ln"] - v["sln"],
        "beta_add": beta,
        "created_bias": v["mm+bias"] - v["mm"] if "mm" in v and "mm+bias" in v else nan,
        "centering": v["center"] - (v["beta_add"] - beta) if "center" in v and "beta_add" in v else nan,
    }


# The node kinds of onnx_lnfold.decide.costs.KINDS, each as a function of one shape's variant means: what
# the node itself costs per run. R (the run's fixed cost: session.run, feeds, fetches) is the one-Add
# graph less what that Add costs, and is taken out of the one-node graphs.
KINDS = {
    "LayerNormalization": lambda v, r: v["ln"] - r,
    "SimplifiedLayerNormalization": lambda v, r: v["sln"] - r,
    "SkipLayerNormalization": lambda v, r: v["add+ln"] - r,  # ORT fuses the graph's Add + LN into it
    "SkipSimplifiedLayerNormalization": lambda v, r: v["skip_sln"] - r,
    "Add": lambda v, r: v["add+sln"] - v["sln"],
    "BiasAdd": lambda v, r: v["sln+beta"] - v["sln"],
    "Centering": lambda v, r: v["center"] - r,
}


# The layout kinds (onnx_lnfold.decide.costs.LAYOUT_KINDS), each one node graph of its own variant,
# fitted over batch-1 shapes (1x16 .. 1x8192): ORT reduces [1, d, T] over d as one [d, T] block and
# [8, d, 1024] item by item, another loop (measured: about 3x fewer instructions per item at d 64):
# a batch of one is how the models that have such reductions (speech, TTS) run, and the dearer.
LAYOUT_KINDS = {
    "StridedCentering": "center|axis1",
    "StridedDecomposedLayerNorm": "ln|axis1",
    "Transpose": "transpose",
}


def _fixed(v: dict[str, float]) -> float:
    """The run's fixed cost: the one-Add graph less what that Add costs."""
    return v["beta_add"] - (v["sln+beta"] - v["sln"])


def node_costs(shape: dict, process: int | None = None) -> dict[str, float]:
    """Each node kind's instructions per run at one measured shape (the mean over its processes,
    or what process `process` counted). A layout variant measured in processes of its own carries
    the fixed cost those processes counted (`fixed_per_run`)."""
    pick = (lambda e: e["mean"]) if process is None else (lambda e: e["per_run"][min(process, len(e["per_run"]) - 1)])
    v = {k: pick(e) for k, e in shape["variants"].items()}
    r = _fixed(v)
    # A shape measured for the layout kinds alone (1x8192) prices none of the others.
    costs = {kind: f(v, r) for kind, f in KINDS.items()} if "ln" in v else {}
    for kind, variant in LAYOUT_KINDS.items():
        entry = shape["variants"].get(variant)
        if entry is None or shape["batch"] != 1:  # see LAYOUT_KINDS
            continue
        fixed = entry.get("fixed_per_run")
        own = r if fixed is None else (float(np.mean(fixed)) if process is None else fixed[min(process, len(fixed) - 1)])
        costs[kind] = pick(entry) - own
    return costs


def points(results: list[dict]) -> dict[str, list[Point]]:
    """Per node kind, each measured shape: its cost (mean over the processes) and spread (max - min
    of what each process counted: every process held every variant of its kind)."""
    out: dict[str, list[Point]] = {kind: [] for kind in [*KINDS, *LAYOUT_KINDS]}
    for r in results:
        mean = node_costs(r)
        # Layout variants added to a shape were measured in processes of their own: each kind's
        # spread is over the processes that measured it.
        layout = {v for v in LAYOUT_KINDS.values() if v in r["variants"]}
        held = [len(e["per_run"]) for k, e in r["variants"].items() if k not in layout] or [0]
        own = [len(r["variants"][v]["per_run"]) for v in layout] or [0]
        each = [node_costs(r, i) for i in range(max(*held, *own))]
        for kind in mean:
            n = own[0] if kind in LAYOUT_KINDS and layout else min(held)
            values = [c[kind] for c in each[:n]]
            out[kind].append(Point(r["tokens"], r["d"], mean[kind], max(values) - min(values)))
    return {kind: ps for kind, ps in out.items() if ps}


def add_layout(shape: dict, measured: dict) -> None:
    """Put layout variants measured in processes of their own (`measured`, with `FIXED_VARIANTS`)
    into a shape measured before, each with the fixed cost of its processes."""
    processes = len(measured["variants"]["beta_add"]["per_run"])
    fixed = [_fixed({k: e["per_run"][i] for k, e in measured["variants"].items()}) for i in range(processes)]
    for variant in LAYOUT_VARIANTS:
        if variant in measured["variants"]:
            shape["variants"][variant] = {**measured["variants"][variant], "fixed_per_run": fixed}
    shape.setdefault("layout_orders", []).extend(measured["orders"])


def fit(results: list[dict]) -> dict[str, tuple[float, float, float]]:
    """Per node kind: (fixed, per_token, per_element) fitted over the shapes (onnx_lnfold.bench.tables:
    least squares on the relative error, every shape weighs the same, 1x16 as much as 8x1024)."""
    return {kind: dataclasses.astuple(fit_points(ps, per_width=kind in LAYOUT_KINDS)) for kind, ps in points(results).items()}


def table(results: list[dict], command: str, machine: dict) -> CostTable:
    """The built-in CPU table (onnx_lnfold/decide/tables/cpu.json) these results give."""
    return make_table(points(results), provider="CPUExecutionProvider", unit="instructions",
                      source="benchmarks/results/EMISSION_COSTS.md",
                      measured_by=f"{command} (callgrind, 1 thread, ORT_ENABLE_ALL)",
                      onnxruntime=machine.get("onnxruntime", ""))


def render(results: list[dict], command: str, machine: dict) -> str:
    lines = results_header("What each emitted form costs ONNX Runtime's CPU EP (callgrind, 1 thread)", command, machine,
                           "Instructions per run (session.run included), mean over the processes; the spread is "
                           "(max - min) / min between processes (rotated orders). Definitions: "
                           "benchmarks/emission_costs.py.")
    kinds = [k for k in VARIANTS if any(k in r["variants"] for r in results)]
    lines += ["## Instructions per run (thousands)", "",
              "| d | tokens | " + " | ".join(kinds) + " | largest spread |",
              "|---|---|" + "---|" * len(kinds) + "---|"]
    for r in results:
        cells = [f"{r['variants'][k]['mean'] / 1e3:.1f}" if k in r["variants"] else "" for k in kinds]
        worst = max(e["spread"] for e in r["variants"].values())
        lines.append(f"| {r['d']} | {r['batch']}x{r['seq']} | " + " | ".join(cells) + f" | {100 * worst:.3f}% |")
    lines += ["", "## What ORT runs (level ALL, CPU EP, shapes symbolic unless `|static`)", "",
              "| variant | ops after session optimization |", "|---|---|"]
    for k in kinds:
        graph = next(r["variants"][k]["ort_graph"] for r in results if k in r["variants"])
        lines.append(f"| {k} | {' -> '.join(graph)} |")
    lines += ["", "## Comparisons (a - b in thousands of instructions per run, and a / b)", "",
              "| comparison | a | b | " + " | ".join(f"d{r['d']} {r['batch']}x{r['seq']}" for r in results) + " |",
              "|---|---|---|" + "---|" * len(results)]
    for label, a, b in COMPARISONS:
        if b is None:
            continue
        cells = []
        for r in results:
            v = r["variants"]
            if a in v and b in v:
                cells.append(f"{(v[a]['mean'] - v[b]['mean']) / 1e3:+.1f} (x{v[a]['mean'] / v[b]['mean']:.3f})")
            else:
                cells.append("")
        lines.append(f"| {label} | {a} | {b} | " + " | ".join(cells) + " |")
    lines += ["", "## Added nodes against one LN -> SLN saving", "",
              "A node's cost is the difference it makes to a graph: beta's `Add` = (sln+beta) - sln, a created "
              "bias = (mm+bias) - mm; an explicit centering (ReduceMean + Sub) = center - (beta_add - beta's Add), "
              "i.e. the run's fixed cost taken out through the one-Add graph.", "",
              "| d | tokens | LN - SLN | beta Add | beta Add / (LN - SLN) | created bias | centering | "
              "centering / (LN - SLN) |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        if "ln" not in r["variants"]:
            continue  # measured for the layout kinds alone
        c = added_costs(r)
        lines.append(f"| {r['d']} | {r['batch']}x{r['seq']} | {c['ln_to_sln_saving'] / 1e3:.1f} | "
                     f"{c['beta_add'] / 1e3:.1f} | {c['beta_add'] / c['ln_to_sln_saving']:.2f} | "
                     f"{c['created_bias'] / 1e3:.1f} | {c['centering'] / 1e3:.1f} | "
                     f"{c['centering'] / c['ln_to_sln_saving']:.2f} |")
    table = fit(results)
    lines += ["", "## Fitted node costs (onnx_lnfold/decide/tables/cpu.json holds these, with each shape and its spread)", "",
              "Instructions per run = fixed + per_token x tokens + per_element x tokens x d (+ per_width x d for the layout kinds, fitted over batch-1 shapes), least squares on "
              "the relative error over the shapes above; the largest relative error of the fit over them.", "",
              "| node | fixed | per token | per element | per width | worst fit error |", "|---|---|---|---|---|---|"]
    for kind, (f0, f1, f2, f3) in table.items():
        err = max(abs(f0 + f1 * r["tokens"] + f2 * r["tokens"] * r["d"] + f3 * r["d"] - node_costs(r)[kind])
                  / node_costs(r)[kind] for r in results if kind in node_costs(r))
        lines.append(f"| {kind} | {f0:.4g} | {f1:.4g} | {f2:.4g} | {f3:.4g} | {100 * err:.1f}% |")
    return "\n".join(lines) + "\n"


def _tokens(text: str) -> tuple[int, int]:
    b, s = text.lower().split("x")
    return int(b), int(s)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dims", type=int, nargs="+", default=[384, 768, 1024])
    ap.add_argument("--tokens", nargs="+", default=["1x16", "1x128", "1x1024", "8x1024"])
    ap.add_argument("--variants", nargs="+", default=VARIANTS, choices=VARIANTS)
    ap.add_argument("--repeats", type=int, default=2, help="valgrind processes per shape (rotated orders)")
    ap.add_argument("--runs", type=int, default=1, help="N: segments of N and 2N runs are counted")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--cache-sim", action="store_true")
    ap.add_argument("--mm-max-tokens", type=int, default=1024,
                    help="the MatMul variants only up to this many tokens (a MatMul of 8192 x d x d under valgrind "
                         "takes most of an hour on a shared core; the bias Add it is there for is measured alone "
                         "at every shape: beta_add)")
    ap.add_argument("--resume", action="store_true", help="keep the shapes already in --json, measure the others")
    ap.add_argument("--redo", nargs="*", default=[], metavar="D:BxS",
                    help="with --resume, measure these shapes again (64:1x16, say)")
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "emission_costs.json"))
    ap.add_argument("--md", default=str(ROOT / "benchmarks" / "results" / "EMISSION_COSTS.md"))
    ap.add_argument("--table", default=str(TABLE),
                    help="the cost table the fold reads, written from the results (default: the package's)")
    args = ap.parse_args(argv)
    if not shutil.which("valgrind") or not shutil.which("callgrind_control"):
        print("error: valgrind (with callgrind_control) is not installed", file=sys.stderr)
        return 2
    command = "python -m benchmarks.emission_costs " + " ".join(argv if argv is not None else sys.argv[1:])
    earlier = json.loads(Path(args.json).read_text()) if args.resume and Path(args.json).exists() else None
    results = earlier["results"] if earlier else []
    if earlier:
        command = f"{earlier['command']} ; {command.strip()}"
    redo = {(int(d), *_tokens(t)) for d, t in (item.split(":") for item in args.redo)}
    results = [r for r in results if (r["d"], r["batch"], r["seq"]) not in redo]
    done = {(r["d"], r["batch"], r["seq"]) for r in results}
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="lnfold-emit-", dir=CACHE) as tmp:
        for d in args.dims:
            for tok in args.tokens:
                batch, seq = _tokens(tok)
                if (d, batch, seq) in done:
                    shape = next(r for r in results if (r["d"], r["batch"], r["seq"]) == (d, batch, seq))
                    layout = [v for v in args.variants if v in LAYOUT_VARIANTS and v not in shape["variants"]]
                    if not layout:
                        continue
                    add_layout(shape, measure_shape(d, batch, seq, [*FIXED_VARIANTS, *layout], args.repeats, args.runs,
                                                    Path(tmp), args.cache_sim, args.jobs))
                    machine = machine_info()
                    Path(args.json).write_text(json.dumps({"command": command.strip(), "machine": machine,
                                                           "results": results}, indent=1))
                    Path(args.md).write_text(render(results, command.strip(), machine))
                    continue
                variants = [v for v in args.variants if not v.startswith("mm") or batch * seq <= args.mm_max_tokens]
                results.append(measure_shape(d, batch, seq, variants, args.repeats, args.runs, Path(tmp),
                                             args.cache_sim, args.jobs))
                results.sort(key=lambda r: (r["d"], r["tokens"]))
                machine = machine_info()
                Path(args.json).write_text(json.dumps({"command": command.strip(), "machine": machine,
                                                       "results": results}, indent=1))
                Path(args.md).write_text(render(results, command.strip(), machine))
    full = json.loads(Path(args.json).read_text())
    write_table(table(full["results"], full["command"], full["machine"]), args.table)
    print(Path(args.md).read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
