"""What the fold does on the quantized fixtures of models/ (models/make/export_quantized_models.py):
per model, its LNs, how many fold at the default options, the explicit centerings inserted, the
DequantizeLinear -> consumer pairs an inserted node splits (also under `fold_costly`, which folds
the LNs the defaults keep), the op counts of ONNX Runtime's ORT_ENABLE_ALL optimized graph for the
original and the folded model, and the folded model's largest relative output difference from the
original (both at ORT_ENABLE_ALL, on the committed inputs) beside the original's own difference
between ORT_DISABLE_ALL and ORT_ENABLE_ALL and the quantization's own error (the original against the
float model it was made from); and where anything folds, the fold's speed against the original by
`onnx-lnfold bench` (`BENCH_SHAPE`, one thread).

    python -m benchmarks.quantized [--models NAME,...] [--processes 3] [--rounds 10] [--out benchmarks/results/quantized]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

import onnx_lnfold
from benchmarks.common import ROOT, load_script, log, machine_info, results_header
from onnx_lnfold.bench.compare import bench
from onnx_lnfold.core.ops import NORMALIZATION_TYPES
from onnx_lnfold.verify.sessions import compare

MODELS = ROOT / "models"
GENERATOR = load_script(MODELS / "make" / "export_quantized_models.py")
FIXTURES = sorted(GENERATOR.FIXTURES)
# The op types of the optimized graphs each table names, with their column labels (QLinear*: every
# op type of that prefix).
NAMED_OPS = {
    "DequantizeLinear": "DQ",
    "QuantizeLinear": "Q",
    "QLinear*": "QLinear*",
    "MatMulNBits": "NBits",
    "DynamicQuantizeMatMul": "DynQMatMul",
    "MatMulIntegerToFloat": "MatMulIntToFloat",
    "LayerNormalization": "LN",
    "SkipLayerNormalization": "SkipLN",
    "SimplifiedLayerNormalization": "SimplifiedLN",
    "SkipSimplifiedLayerNormalization": "SkipSimplifiedLN",
}


def committed_inputs(name: str) -> dict[str, np.ndarray]:
    with np.load(MODELS / f"{name}.inputs.npz") as f:
        return {k: f[k] for k in f.files}


def split_dequantize_pairs(original: onnx.ModelProto, folded: onnx.ModelProto) -> list[tuple[str, str]]:
    """The (DequantizeLinear output, consumer) pairs of `original` that `folded` splits: the consumer
    (or the node now writing its output) no longer reads the dequantized tensor itself, and a node the
    fold inserted reads it instead (an explicit centering's ReduceMean / Sub). The normalization that
    replaces an LN, and the node that writes the LN's own output (its beta's Add), stand for the LN."""
    names = {n.name for n in original.graph.node}
    dequantized = {o for n in original.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    by_name = {n.name: n for n in folded.graph.node}
    inserted_readers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
    for node in folded.graph.node:
        if node.name not in names and node.op_type not in NORMALIZATION_TYPES:
            for tensor in set(node.input) & dequantized:
                inserted_readers[tensor].append(node)
    pairs = []
    for consumer in original.graph.node:
        for tensor in sorted(set(consumer.input) & dequantized):
            now = by_name.get(consumer.name)
            if now is not None and tensor in now.input:
                continue
            between = [n for n in inserted_readers[tensor] if not set(n.output) & set(consumer.output)]
            if between:
                pairs.append((tensor, consumer.name))
    return pairs


def _session(model: str | bytes, level: ort.GraphOptimizationLevel, optimized: str | None = None):
    options = ort.SessionOptions()
    options.graph_optimization_level = level
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    if optimized:
        options.optimized_model_filepath = optimized
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def _run(session: ort.InferenceSession, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds)))


def optimized_ops(model: str | bytes, folder: Path, tag: str) -> tuple[Counter, ort.InferenceSession]:
    """Op counts of ONNX Runtime's ORT_ENABLE_ALL graph of `model` (written beside in `folder`), and the session."""
    path = folder / f"{tag}.optimized.onnx"
    session = _session(model, ort.GraphOptimizationLevel.ORT_ENABLE_ALL, str(path))
    return Counter(n.op_type for n in onnx.load(str(path)).graph.node), session


def named_counts(ops: Counter) -> dict[str, int]:
    counts = {op: ops.get(op, 0) for op in NAMED_OPS if not op.endswith("*")}
    counts["QLinear*"] = sum(v for k, v in ops.items() if k.startswith("QLinear"))
    counts["total"] = sum(ops.values())
    return {op: counts[op] for op in (*NAMED_OPS, "total")}


def max_rel(reference: dict[str, np.ndarray], candidate: dict[str, np.ndarray]) -> float:
    return max(d.rel_diff for d in compare(reference, candidate))


# The shape the speed is measured at: batch x sequence = 8192 tokens, the count a fold is priced at
# where the graph does not fix it (the fixtures' positions stop at 128).
BENCH_SHAPE = (64, 128)


def speed(original: Path, folded: bytes, folder: Path, processes: int, rounds: int) -> dict:
    """`onnx-lnfold bench` of the fold against the original at `BENCH_SHAPE`, one thread: the
    ratios original / folded and re-saved / folded with their intervals, and the verdict."""
    path = folder / f"{original.stem}.folded.onnx"
    path.write_bytes(folded)
    names = [i.name for i in onnx.load(str(original), load_external_data=False).graph.input]
    result = bench(
        str(original),
        str(path),
        input_shapes=dict.fromkeys(names, BENCH_SHAPE),
        processes=processes,
        rounds=rounds,
        threads=1,
        profile=False,
        workdir=str(folder),
    )
    ratios = result.timing["ratios"]
    keep = ("ratio", "lo", "hi", "min", "max")
    return {
        "shape": list(BENCH_SHAPE),
        "processes": processes,
        "rounds": rounds,
        "median_ms": result.timing["median_ms"],
        "original/folded": {k: ratios["original/folded"][k] for k in keep},
        "resaved/folded": {k: ratios["resaved/folded"][k] for k in keep},
        "verdict": result.verdict,
    }


def measure(name: str, folder: Path, processes: int = 3, rounds: int = 10) -> dict:
    path = MODELS / f"{name}.onnx"
    original = onnx.load(str(path))
    feeds = committed_inputs(name)
    result = onnx_lnfold.fold(path)
    costly = onnx_lnfold.fold(path, verify=False, fold_costly=True)
    folded_bytes = result.model_proto.SerializeToString()
    ops_original, session_original = optimized_ops(str(path), folder, f"{name}.original")
    ops_folded, session_folded = optimized_ops(folded_bytes, folder, f"{name}.folded")
    reference = _run(session_original, feeds)
    unoptimized = _run(_session(str(path), ort.GraphOptimizationLevel.ORT_DISABLE_ALL), feeds)
    source = MODELS / f"{GENERATOR.FIXTURES[name][0]}.onnx"
    float_source = _run(_session(str(source), ort.GraphOptimizationLevel.ORT_ENABLE_ALL), feeds)
    return {
        "model": name,
        "lns": len(result.plan.decisions),
        "folded": len(result.plan.folded),
        "centerings": len(result.plan.centerings),
        "kept_codes": sorted({d.code for d in result.plan.kept}),
        "verification": result.report.verification.status,
        "dequantize_pairs_split": len(split_dequantize_pairs(original, result.model_proto)),
        "fold_costly": {
            "folded": len(costly.plan.folded),
            "centerings": len(costly.plan.centerings),
            "dequantize_pairs_split": len(split_dequantize_pairs(original, costly.model_proto)),
        },
        "optimized_original": named_counts(ops_original),
        "optimized_folded": named_counts(ops_folded),
        "max_rel_fold_vs_original": max_rel(reference, _run(session_folded, feeds)),
        "max_rel_original_disable_vs_enable": max_rel(reference, unoptimized),
        "max_rel_original_vs_float_source": max_rel(float_source, reference),
        "deployed_check": result.report.to_dict()["verification"]["deployed"],
        "speed": speed(path, folded_bytes, folder, processes, rounds) if result.plan.folded else None,
    }


def _ratio(r: dict) -> str:
    return f"x{r['ratio']:.3f} [{r['lo']:.3f}, {r['hi']:.3f}] (processes {r['min']:.3f}-{r['max']:.3f})"


def speed_table(rows: list[dict]) -> list[str]:
    lines = [
        "| model | LNs folded | original ms (median) | original / folded | re-saved / folded | verdict | the check at ORT_ENABLE_ALL: fold vs original / the original's sensitivity |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        s = r["speed"]
        if s is None:
            lines.append(f"| {r['model']} | 0/{r['lns']} | - | nothing folded: the file is the original | - | - | - |")
            continue
        d = r["deployed_check"]
        cells = [
            r["model"],
            f"{r['folded']}/{r['lns']}",
            f"{s['median_ms']['original']:.1f}",
            _ratio(s["original/folded"]),
            _ratio(s["resaved/folded"]),
            s["verdict"],
            f"{d['rel_diff']:.2g} / {d['sensitivity']:.2g} ({'passed' if d['passed'] else 'refused'})"
            if d
            else "not run",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def table(rows: list[dict]) -> list[str]:
    head = [
        "model",
        "LNs folded (default)",
        "centerings",
        "DQ pairs split",
        "fold_costly: folded / centerings / DQ pairs split",
        "ORT nodes original -> folded",
        *NAMED_OPS.values(),
        "max rel fold vs original",
        "max rel original DISABLE vs ENABLE",
        "max rel original vs float source",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        o, f, c = r["optimized_original"], r["optimized_folded"], r["fold_costly"]
        cells = [
            r["model"],
            f"{r['folded']}/{r['lns']}",
            str(r["centerings"]),
            str(r["dequantize_pairs_split"]),
            f"{c['folded']} / {c['centerings']} / {c['dequantize_pairs_split']}",
            f"{o['total']} -> {f['total']}",
            *(f"{o[op]} -> {f[op]}" for op in NAMED_OPS),
            f"{r['max_rel_fold_vs_original']:.2e}",
            f"{r['max_rel_original_disable_vs_enable']:.2e}",
            f"{r['max_rel_original_vs_float_source']:.2e}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", help="comma-separated fixture names (default: all)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "quantized")
    ap.add_argument("--processes", type=int, default=3, help="fresh processes per speed measurement (default 3)")
    ap.add_argument("--rounds", type=int, default=10, help="interleaved rounds per process (default 10)")
    args = ap.parse_args(argv)
    names = args.models.split(",") if args.models else FIXTURES
    rows = []
    with tempfile.TemporaryDirectory(prefix="quantized-") as tmp:
        for name in names:
            log(f"{name}")
            rows.append(measure(name, Path(tmp), args.processes, args.rounds))
    machine = machine_info()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "quantized.json").write_text(json.dumps({"machine": machine, "models": rows}, indent=1) + "\n")
    command = "python -m benchmarks.quantized" + (f" --models {args.models}" if args.models else "")
    lines = results_header(
        "Quantized models: what the fold does (CPU)",
        command,
        machine,
        "Default options; the ORT graphs are CPU EP, ORT_ENABLE_ALL, one thread.",
    )
    lines += [
        "Each op column: its count in ONNX Runtime's optimized graph, original -> folded. "
        "`DQ pairs split`: DequantizeLinear -> consumer pairs with a node the fold inserted between them.",
        "",
    ]
    lines += table(rows)
    lines += [
        "",
        "## Speed: `onnx-lnfold bench`, default fold against the original",
        "",
        f"CPU EP, ORT_ENABLE_ALL, one thread, synthesized inputs of {BENCH_SHAPE[0]} x {BENCH_SHAPE[1]} tokens (the "
        f"count a fold is priced at where the graph does not fix it); {args.processes} fresh processes x "
        f"{args.rounds} interleaved rounds. A ratio > 1: the fold is faster; median [bootstrap 95% interval] "
        "(range over processes).",
        "",
        *speed_table(rows),
    ]
    (args.out / "README.md").write_text("\n".join(lines) + "\n")
    print("\n".join(table(rows)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
