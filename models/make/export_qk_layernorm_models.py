#!/usr/bin/env python
"""Export small StableLM and Persimmon models with per-head q/k LayerNorms (``qk_layernorm=True``).

Both normalize queries and keys head by head (docs/DESIGN.md section 2.4): StableLM with one LN per
head after ``torch.split`` along the heads, Persimmon with one LN over the head dim of its fused
q/k/v viewed as ``[B, T, H, 3, Dh]``. Each model is built from a small config (hidden 64, 2 layers,
4 heads of 16, partial rotary), its weights perturbed as ``export_models.py`` does, and exported
twice: by the dynamo exporter (opset 18) and by TorchScript (opset 17), eager attention. Every
export is run in onnxruntime and compared with torch before it is written.

Usage::

    python models/make/export_qk_layernorm_models.py [--only NAME ...] --out-dir DIR

Names: stablelm_dynamo, stablelm_torchscript, persimmon_dynamo, persimmon_torchscript.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import numpy as np
import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parent))
import export_models as em  # noqa: E402


def build_stablelm(attn: str) -> torch.nn.Module:
    cfg = transformers.StableLmConfig(
        vocab_size=em.VOCAB, hidden_size=em.HIDDEN, num_hidden_layers=em.LAYERS, num_attention_heads=em.HEADS,
        num_key_value_heads=em.HEADS, intermediate_size=em.INTER, max_position_embeddings=em.MAX_POS,
        qk_layernorm=True, partial_rotary_factor=0.25, use_cache=False, attn_implementation=attn)
    return transformers.StableLmForCausalLM(cfg)


def build_persimmon(attn: str) -> torch.nn.Module:
    cfg = transformers.PersimmonConfig(
        vocab_size=em.VOCAB, hidden_size=em.HIDDEN, num_hidden_layers=em.LAYERS, num_attention_heads=em.HEADS,
        intermediate_size=em.INTER, max_position_embeddings=em.MAX_POS, qk_layernorm=True,
        partial_rotary_factor=0.5, use_cache=False, attn_implementation=attn)
    return transformers.PersimmonForCausalLM(cfg)


BUILDERS = {"stablelm": build_stablelm, "persimmon": build_persimmon}
NAMES = [f"{model}_{exporter}" for model in BUILDERS for exporter in ("dynamo", "torchscript")]


def export(name: str, out_dir: Path) -> Path:
    model_name, exporter = name.rsplit("_", 1)
    spec = em.Spec(name, BUILDERS[model_name], "text", ["input_ids", "attention_mask"], ["logits"])
    model = BUILDERS[model_name]("eager").eval()
    em.perturb(model, em.seed_for(model_name))
    wrapper = em.make_wrapper(model, spec)
    feeds = em.make_inputs(spec, em.REF_BATCH, em.REF_SEQ, em.seed_for(name))
    args = tuple(torch.from_numpy(feeds[n]) for n in spec.input_names)
    path = out_dir / f"{name}.onnx"
    em.try_export(spec, wrapper, args, path, ["logits"], dynamo=exporter == "dynamo")
    with torch.no_grad():
        expected = wrapper(*args)[0].numpy()
    got = em.run_ort(path, feeds)["logits"]
    worst = float(np.abs(got - expected).max())
    if worst > 1e-4 * max(1.0, float(np.abs(expected).max())):
        raise RuntimeError(f"{name}: onnxruntime differs from torch by {worst:.3g}")
    print(f"{name}: {path} (onnxruntime vs torch: max|diff| {worst:.2g})")
    return path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", choices=NAMES, default=NAMES)
    parser.add_argument("--out-dir", type=Path, required=True)
    args = parser.parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    warnings.filterwarnings("ignore")
    for name in args.only:
        export(name, args.out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
