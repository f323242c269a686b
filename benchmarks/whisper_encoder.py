"""The Whisper tiny.en encoder, both exporters: which LNs fold, where each beta goes, and the
instructions per run of the original, re-saved and folded models under valgrind.

    python -m benchmarks.whisper_encoder export              # into benchmarks/cache/ (git-ignored)
    python -m benchmarks.whisper_encoder fold                # the fold's plan, one line per LN
    python -m benchmarks.whisper_encoder count [--runs 1]    # callgrind, benchmarks.instructions' machinery

The model is `WhisperModel(config).encoder` with tiny.en's sizes (d_model 384, 4 layers, 6 heads,
FFN 1536, 80 mel bins, 1500 positions) and every parameter perturbed off its init as
models/make/export_models.py does (a trained checkpoint is not downloaded here). Exports:
`torch.onnx.export(dynamo=False, opset_version=17)` ("torchscript", eager attention: what the
issue measured) and `dynamo=True, opset_version=18` ("dynamo"), input [batch, 80, 3000] with a
dynamic batch. A trained export under /work/cache/trained/ (another helper's) is used by `fold`
and `count` when given with --model.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from benchmarks.common import CACHE, ROOT, log

FRAMES = 3000
EXPORTS = ("torchscript", "dynamo")


def _perturb():
    spec = importlib.util.spec_from_file_location("export_models", ROOT / "models" / "make" / "export_models.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["export_models"] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod.perturb, mod.seed_for


def path_of(export: str) -> Path:
    return CACHE / f"whisper_tiny_encoder_{export}.onnx"


def export(exports=EXPORTS) -> None:
    import torch
    import transformers

    perturb, seed_for = _perturb()
    cfg = transformers.WhisperConfig(
        d_model=384, encoder_layers=4, encoder_attention_heads=6, decoder_layers=4, decoder_attention_heads=6,
        encoder_ffn_dim=1536, decoder_ffn_dim=1536, num_mel_bins=80, max_source_positions=1500,
        vocab_size=51864, attn_implementation="eager",
    )
    torch.manual_seed(0)
    encoder = transformers.WhisperModel(cfg).encoder.eval()
    perturb(encoder, seed_for("whisper_tiny_encoder"))

    class Encoder(torch.nn.Module):
        def __init__(self, enc):
            super().__init__()
            self.enc = enc

        def forward(self, input_features):
            return self.enc(input_features).last_hidden_state

    wrapper = Encoder(encoder).eval()
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((1, 80, FRAMES)).astype(np.float32))
    CACHE.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        ref = wrapper(x).numpy()
    for name in exports:
        out = path_of(name)
        log(f"exporting {name} -> {out}")
        if name == "torchscript":
            torch.onnx.export(wrapper, (x,), str(out), dynamo=False, opset_version=17,
                              input_names=["input_features"], output_names=["last_hidden_state"],
                              dynamic_axes={"input_features": {0: "batch"}, "last_hidden_state": {0: "batch"}})
        else:
            program = torch.onnx.export(wrapper, (x,), dynamo=True, opset_version=18,
                                        input_names=["input_features"], output_names=["last_hidden_state"],
                                        dynamic_shapes={"input_features": {0: torch.export.Dim("batch")}})
            program.save(str(out))
        import onnxruntime as ort

        sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
        got = sess.run(None, {"input_features": x.numpy()})[0]
        log(f"  {name}: max |ORT - torch| = {float(np.abs(got - ref).max()):.2e}")
    np.savez(CACHE / "whisper_tiny_encoder.inputs.npz", input_features=x.numpy())


def fold_lines(path: Path) -> list[str]:
    import onnx_lnfold

    result = onnx_lnfold.fold(path)
    lines = [f"{path.name}: {len(result.plan.folded)}/{len(result.plan.decisions)} LNs fold, "
             f"{len(result.plan.centerings)} explicit centering(s), verification "
             f"{result.report.verification.status} ({result.report.verification.max_rel_diff:.1e})"]
    for d in result.plan.decisions:
        how = f"{d.rewrite}, beta -> {d.beta}" if d.folded else f"kept [{d.stage}/{d.code}] {d.reason}"
        lines.append(f"  {d.node}: {how}")
        lines += [f"      {site}" for site in d.beta_sites]
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("step", choices=("export", "fold", "count"))
    ap.add_argument("--exports", nargs="*", default=list(EXPORTS), choices=EXPORTS)
    ap.add_argument("--model", nargs="*", default=[], help="other encoder files (a trained export)")
    ap.add_argument("--runs", type=int, default=0,
                    help="N for the N / 2N segments; 0 (default): the second run alone, one run of a whole encoder "
                         "under valgrind taking minutes")
    ap.add_argument("--repeats", type=int, default=2, help="valgrind processes per model, rotated orders")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--compare-with", type=Path, help="another checkout whose fold is counted too (folded_before)")
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "whisper_encoder.json"))
    args = ap.parse_args(argv)
    if args.step == "export":
        export(args.exports)
        return 0
    paths = [path_of(e) for e in args.exports] + [Path(p) for p in args.model]
    if args.step == "fold":
        for p in paths:
            print("\n".join(fold_lines(p)))
        return 0
    return count(paths, args.runs, Path(args.json), args.compare_with, args.repeats, args.jobs)


def _fold_with(pythonpath: Path, src: Path, dst: Path) -> None:
    """Fold `src` with the onnx_lnfold found at `pythonpath` (this checkout, or another one to
    compare with), in a subprocess."""
    env = dict(os.environ, PYTHONPATH=str(pythonpath))
    subprocess.run([sys.executable, "-m", "onnx_lnfold", str(src), "-o", str(dst), "--no-verify", "-q"],
                   check=True, env=env, cwd=pythonpath)


def count(paths: list[Path], runs: int, json_out: Path, compare_with: Path | None, repeats: int, jobs: int) -> int:
    """Instructions of one run (the second: one uninstrumented warm-up first) of the original,
    re-saved and folded encoder at [1, 80, 3000], in `repeats` valgrind processes per model with
    rotated orders, after a burn-in session (benchmarks/instructions.py)."""
    import onnx_ir as ir

    from benchmarks.common import machine_info
    from benchmarks.instructions import measure, spread

    results = []
    with tempfile.TemporaryDirectory(prefix="lnfold-whisper-", dir=CACHE) as tmp:
        work = Path(tmp)
        feeds = CACHE / "whisper_tiny_encoder.inputs.npz"
        plans = []
        for src in paths:
            files = {"original": src}
            files["resaved"] = work / f"{src.stem}.resaved.onnx"
            ir.save(ir.load(src), files["resaved"])
            files["folded"] = work / f"{src.stem}.folded.onnx"
            _fold_with(ROOT, src, files["folded"])
            if compare_with is not None:
                files["folded_before"] = work / f"{src.stem}.folded_before.onnx"
                _fold_with(compare_with, src, files["folded_before"])
            names = list(files)
            for r in range(repeats):
                order = names[r:] + names[:r]
                sessions = [{"name": "burn_in", "model": str(src), "feeds": str(feeds)}]
                sessions += [{"name": n, "model": str(files[n]), "feeds": str(feeds)} for n in order]
                plans.append((src, r, sessions))
        log(f"{len(plans)} valgrind processes, {jobs} at a time")
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            done = list(pool.map(lambda p: measure(p[2], runs, 1, work, f"{p[0].stem}.p{p[1]}"), plans))
        for src in paths:
            mine = [d for (s, _, _), d in zip(plans, done) if s == src]
            names = [n for n in mine[0]["sessions"] if n != "burn_in"]
            per = {n: [m["sessions"][n]["per_run"] or m["sessions"][n]["singles"][0] for m in mine] for n in names}
            mean = {n: float(np.mean(v)) for n, v in per.items()}
            results.append({"model": src.name, "counts": per, "mean": mean,
                            "spread": {n: spread(v) for n, v in per.items()},
                            "ratios": {f"{n} / folded": mean[n] / mean["folded"] for n in names if n != "folded"},
                            "fold": fold_lines(src)})
    out = {"command": "python -m benchmarks.whisper_encoder " + " ".join(sys.argv[1:]), "machine": machine_info(),
           "runs": runs, "repeats": repeats, "results": results}
    json_out.write_text(json.dumps(out, indent=1))
    for r in results:
        print(r["model"])
        for n, m in r["mean"].items():
            print(f"  {n:14s} {m / 1e9:.4f} G instructions (spread {100 * r['spread'][n]:.3f}%)")
        for k, v in r["ratios"].items():
            print(f"  {k}: x{v:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
