"""`onnx-lnfold bench` on the committed GPT-2 and the real trained models, each run `--repeat` times.

    python -m benchmarks.bench_models [--models gpt2 whisper_encoder_torchscript dinov2_vits14 ppocrv5_rec piper_encoder]
                                      [--repeat 2] [--processes 5] [--rounds 20] [--threads 2] [--out DIR]

Each model is folded as a user would (`onnx-lnfold MODEL -o FOLDED --inputs FEEDS`: verified, and
the cost rule priced at the shape of those inputs), then `onnx-lnfold bench MODEL FOLDED --inputs FEEDS`
runs `--repeat` times; every run's text and JSON are kept in --out (default
benchmarks/results/bench/), with BENCH.md gathering them. The inputs are those benchmarks/trained.py
runs each model at; GPT-2's are one 128-token sequence.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from benchmarks.common import ROOT, log, machine_info

RESULTS = ROOT / "benchmarks" / "results" / "bench"
MODELS = ("gpt2", "whisper_encoder_torchscript", "dinov2_vits14", "ppocrv5_rec", "piper_encoder")


def model_and_feeds(name: str) -> tuple[Path, dict[str, np.ndarray]]:
    if name == "gpt2":
        return ROOT / "models" / "gpt2.onnx", {"input_ids": (np.arange(128, dtype=np.int64) % 500).reshape(1, 128)}
    from benchmarks import trained

    file, _, make = trained.MODELS[name]
    return trained.TRAINED / file, make()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--processes", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    from onnx_lnfold.bench.cli import main as onnx_lnfold_subcommand

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = "python -m benchmarks.bench_models " + " ".join(argv if argv is not None else sys.argv[1:])
    sections = []
    with tempfile.TemporaryDirectory(prefix="lnfold-bench-models-") as tmp:
        for name in args.models:
            path, feeds = model_and_feeds(name)
            feeds_path = Path(tmp) / f"{name}.feeds.npz"
            np.savez(feeds_path, **feeds)
            folded = Path(tmp) / f"{name}.lnfold.onnx"
            log(f"{name}: fold at its inputs' shape")
            fold = subprocess.run([sys.executable, "-m", "onnx_lnfold", str(path), "-o", str(folded), "--inputs",
                                   str(feeds_path), "--json", str(out / f"{name}.fold.json")], capture_output=True,
                                  text=True, cwd=ROOT)
            if fold.returncode != 0:
                raise SystemExit(f"{name}: the fold failed: {fold.stderr.strip()[-400:]}")
            summary = fold.stdout.splitlines()[0]
            runs = []
            for k in range(args.repeat):
                log(f"{name}: bench run {k + 1}/{args.repeat}")
                text = io.StringIO()
                bench_args = ["bench", str(path), str(folded), "--inputs", str(feeds_path), "--processes",
                              str(args.processes), "--rounds", str(args.rounds), "--threads", str(args.threads),
                              "--json", str(out / f"{name}.run{k + 1}.json")]
                with contextlib.redirect_stdout(text):
                    code = onnx_lnfold_subcommand(bench_args)
                if code != 0:
                    raise SystemExit(f"{name}: bench exited {code}")
                runs.append(text.getvalue().replace(tmp, "$TMP"))
                (out / f"{name}.run{k + 1}.txt").write_text(runs[-1])
                print(runs[-1], flush=True)
            sections += [f"## {name}", "", f"Fold: `{summary.replace(tmp, '$TMP')}`", ""]
            for k, text in enumerate(runs):
                sections += [f"Run {k + 1}:", "", "```", text.rstrip(), "```", ""]
    machine = machine_info()
    (out / "BENCH.md").write_text("\n".join([
        "# onnx-lnfold bench: the committed GPT-2 and real trained models (CPU)", "",
        f"Command: `{command.strip()}`  ",
        f"onnxruntime {machine['onnxruntime']}, onnx_lnfold at git {machine['git_commit']}, {machine['cpu']}, "
        f"{machine['cores_usable']} cores usable (shared with other work: read the intervals, not the medians), "
        f"{machine['date']}.", "", *sections]))
    (out / "machine.json").write_text(json.dumps(machine, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
