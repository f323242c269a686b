"""The end-to-end models of the CUDA sweep, prepared the way they are deployed on CUDA.

    exported graph -> onnxruntime.transformers.optimizer.optimize_model(opt_level=0)
                   -> OnnxModel.convert_float_to_float16(keep_io_types=True)        = "original"
    original -> onnx_ir load + save                                                  = "resaved"
    original -> python -m onnx_lnfold --fuse-residual auto|always|never --no-verify   = "folded_*"

opt_level 0 runs the optimizer's own fusions (Attention, SkipLayerNormalization, FastGelu/BiasGelu)
without an onnxruntime session, as README.md's pipeline and tests/models/test_deployment.py do; the fp16
step is the optimizer's own (`python -m onnxruntime.transformers.optimizer --float16` calls the same
method). The fold runs on the fp16 model, as on a model a user already deployed; the sweep checks
every variant against the original on the device at every configuration, so `--no-verify` skips
nothing.

GPT-2-style models are built with `benchmarks.gpt2_onnx` in its "torchscript" style, the graph the
optimizer's GPT-2 fusions match: the preparation fails unless one `Attention` per block comes out.
Real trained models (Whisper tiny.en encoder/decoder, DINOv2 ViT-S/14, a PP-OCRv5 recognizer) are
taken from `--trained` paths or `models/trained/` (filled by models/make/fetch_trained_models.py), with the
input shapes its MANIFEST.json records; their optimizer model type comes from `TRAINED_MODEL_TYPES`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.common import ROOT
from benchmarks.gpt2_onnx import Gpt2Shape, build_gpt2, make_inputs

FUSE_CHOICES = ["auto", "always", "never"]
E2E_VARIANTS = ["original", "resaved"] + [f"folded_{c}" for c in FUSE_CHOICES]
TRAINED_DIR = ROOT / "models" / "trained"
# optimizer (model type, heads, hidden size) by a fragment of the model's name (heads and hidden size of
# the published configs: Whisper tiny d=384 with 6 heads, DINOv2 ViT-S/14 d=384 with 6 heads); other
# models get "bert", the optimizer's default, whose fusions read heads and hidden size off the graph
TRAINED_MODEL_TYPES = {"whisper_tiny": ("bart", 6, 384), "dinov2_vits14": ("vit", 6, 384),
                       "dinov2_vit_s": ("vit", 6, 384)}


class ModelPrepError(Exception):
    """A model could not be prepared as deployed (the optimizer fused less than it must, a fold failed)."""


@dataclasses.dataclass
class Prepared:
    """One model's variants on disk, how they were made, and the inputs of each configuration."""

    name: str
    source: str                       # "gpt2_onnx" or the trained model's file
    paths: dict[str, Path]
    optimizer: dict
    folds: dict[str, dict]
    prepare_s: float
    graph_digest: dict[str, str]
    feeds: object                     # (batch, seq) -> {input: array}
    info: dict = dataclasses.field(default_factory=dict)


def optimize_fp16(src: Path, dst: Path, model_type: str, num_heads: int = 0, hidden_size: int = 0) -> dict:
    """The optimizer at opt_level 0, then its fp16 conversion with fp32 inputs and outputs."""
    from onnxruntime.transformers.optimizer import optimize_model

    t0 = time.perf_counter()
    model = optimize_model(str(src), model_type=model_type, num_heads=num_heads, hidden_size=hidden_size, opt_level=0)
    fused = {k: int(v) for k, v in model.get_fused_operator_statistics().items() if v}
    model.convert_float_to_float16(keep_io_types=True)
    dst.parent.mkdir(parents=True, exist_ok=True)
    model.save_model_to_file(str(dst), use_external_data_format=True)
    return {"optimizer": "onnxruntime.transformers.optimizer.optimize_model", "model_type": model_type,
            "opt_level": 0, "num_heads": num_heads, "hidden_size": hidden_size, "fused": fused,
            "float16": "OnnxModel.convert_float_to_float16(keep_io_types=True)",
            "seconds": time.perf_counter() - t0}


def _start_fold(src: Path, dst: Path, fuse: str) -> subprocess.Popen:
    # --fold-costly: every LN folds in every variant (one whose beta stays an Add is kept by default:
    # the CPU cost rule), so the variants differ by their residual fusion alone.
    return subprocess.Popen([sys.executable, "-m", "onnx_lnfold", str(src), "-o", str(dst), "--no-verify", "-q",
                             "--fuse-residual", fuse, "--fold-costly", "--json", str(dst.with_suffix(".json"))],
                            cwd=ROOT, stderr=subprocess.PIPE, text=True)


def _finish_fold(proc: subprocess.Popen, dst: Path) -> dict:
    _, err = proc.communicate()
    if proc.returncode != 0:
        raise ModelPrepError(f"onnx_lnfold failed on {dst.name} (exit {proc.returncode}): {err.strip()[-300:]}")
    rep = json.loads(dst.with_suffix(".json").read_text())
    return {"layer_norms": rep["layer_norms"], "folded": rep["folded"], "ops_after": rep.get("ops_after"),
            "untied_bytes": rep.get("untied_bytes")}


def graph_digest(path: Path) -> str:
    """Digest of the graph file alone (external data excluded): two variants whose graphs match
    run the same nodes."""
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def make_variants(original: Path, workdir: Path) -> tuple[dict[str, Path], dict[str, dict]]:
    """The re-saved control and the three folds of `original` (the folds in parallel subprocesses)."""
    import onnx_ir as ir

    pending = {fuse: (_start_fold(original, workdir / f"folded_{fuse}.onnx", fuse), workdir / f"folded_{fuse}.onnx")
               for fuse in FUSE_CHOICES}
    resaved = workdir / "resaved.onnx"
    ir.save(ir.load(original), resaved, external_data=resaved.name + ".data", size_threshold_bytes=1024)
    paths = {"original": original, "resaved": resaved}
    folds = {}
    for fuse, (proc, dst) in pending.items():
        folds[fuse] = _finish_fold(proc, dst)
        paths[f"folded_{fuse}"] = dst
    return paths, folds


# --------------------------------------------------------------------------- #
# GPT-2-style
# --------------------------------------------------------------------------- #
def check_gpt2_fusions(shape: Gpt2Shape, fused: dict[str, int]) -> None:
    """The optimizer must have fused every block as it does a deployed GPT-2: one Attention and one
    FastGelu per block, both LNs of every block into SkipLayerNormalization; else ModelPrepError
    (a graph with unfused attention describes no model a user runs on CUDA)."""
    need = {"Attention": shape.layers, "SkipLayerNormalization": 2 * shape.layers, "FastGelu": shape.layers}
    short = {op: (fused.get(op, 0), n) for op, n in need.items() if fused.get(op, 0) != n}
    if short:
        raise ModelPrepError(f"{shape.label}: optimize_model(model_type='gpt2', opt_level=0) fused "
                             + ", ".join(f"{got} {op} (expected {n})" for op, (got, n) in short.items()))


def prepare_gpt2(shape: Gpt2Shape, workdir: Path) -> Prepared:
    t0 = time.perf_counter()
    exported = build_gpt2(shape, "float32", workdir / "exported.onnx", style="torchscript")
    original = workdir / "original.onnx"
    opt = optimize_fp16(exported, original, "gpt2", shape.n_heads, shape.hidden)
    for leftover in (exported, exported.with_name(exported.name + ".data")):
        leftover.unlink(missing_ok=True)
    check_gpt2_fusions(shape, opt["fused"])
    paths, folds = make_variants(original, workdir)
    return Prepared(name=shape.label, source="benchmarks.gpt2_onnx (torchscript style, random weights)", paths=paths,
                    optimizer=opt, folds=folds, prepare_s=time.perf_counter() - t0,
                    graph_digest={k: graph_digest(p) for k, p in paths.items()},
                    feeds=lambda batch, seq: make_inputs(shape, batch, seq, seed=batch * 7 + seq),
                    info={"hidden": shape.hidden, "layers": shape.layers, "vocab": shape.vocab,
                          "params": shape.parameters()})


# --------------------------------------------------------------------------- #
# Real trained models
# --------------------------------------------------------------------------- #
def find_trained(paths: list[str] | None) -> list[Path]:
    """The .onnx files given (files, or folders searched one level deep); default models/trained/."""
    roots = [Path(p) for p in paths] if paths else ([TRAINED_DIR] if TRAINED_DIR.is_dir() else [])
    found: list[Path] = []
    for root in roots:
        if root.is_file() and root.suffix == ".onnx":
            found.append(root)
        elif root.is_dir():
            found.extend(sorted(root.glob("*.onnx")))
        else:
            raise FileNotFoundError(f"--trained {root}: no such .onnx file or folder")
    return found


def _manifest_entry(model: Path) -> dict:
    manifest = model.parent / "MANIFEST.json"
    if manifest.exists():
        entry = json.loads(manifest.read_text()).get("models", {}).get(model.stem)
        if entry:
            return entry
    return {}


def trained_shapes(entry: dict, batch: int) -> dict[str, tuple[int, ...]]:
    """Input shapes the manifest records, with the batch symbol set; inputs with other symbols are
    left to onnx_lnfold's input synthesis (sequence lengths, past lengths)."""
    shapes = {}
    for name, dims in (entry.get("inputs") or {}).items():
        resolved = [batch if isinstance(d, str) and "batch" in d.lower() else d for d in dims]
        if all(isinstance(d, int) for d in resolved):
            shapes[name] = tuple(resolved)
    return shapes


def trained_model_type(name: str, entry: dict) -> tuple[str, int, int]:
    """The manifest's `optimizer_model_type` / `num_heads` / `hidden_size` if it records them, else
    `TRAINED_MODEL_TYPES`, else ("bert", 0, 0)."""
    spec = next((s for fragment, s in TRAINED_MODEL_TYPES.items() if fragment in name.lower()), ("bert", 0, 0))
    return (entry.get("optimizer_model_type", spec[0]), int(entry.get("num_heads", spec[1])),
            int(entry.get("hidden_size", spec[2])))


def prepare_trained(model: Path, workdir: Path) -> Prepared:
    import onnx_ir as ir

    from onnx_lnfold.feeds.synthesize import synthesize_inputs

    t0 = time.perf_counter()
    entry = _manifest_entry(model)
    original = workdir / "original.onnx"
    opt = optimize_fp16(model, original, *trained_model_type(model.stem, entry))
    paths, folds = make_variants(original, workdir)
    graph = ir.load(original)  # the fp16 original keeps fp32 inputs (keep_io_types)

    def feeds(batch: int, seq: int) -> dict[str, np.ndarray]:
        return synthesize_inputs(graph, trained_shapes(entry, batch), batch_size=batch, sequence_length=seq,
                                 seed=batch * 7 + seq)

    return Prepared(name=re.sub(r"\W+", "_", model.stem), source=str(model), paths=paths, optimizer=opt, folds=folds,
                    prepare_s=time.perf_counter() - t0, graph_digest={k: graph_digest(p) for k, p in paths.items()},
                    feeds=feeds, info={"manifest": {k: entry.get(k) for k in ("package", "version", "license", "sha256",
                                                                              "inputs", "note") if k in entry}})


def clean(workdir: Path) -> None:
    shutil.rmtree(workdir, ignore_errors=True)
