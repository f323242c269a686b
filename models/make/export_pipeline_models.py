#!/usr/bin/env python
"""Build small models as a deployment pipeline hands them over, for ``onnx_lnfold``.

A fresh export is not what users fold: they fold what ONNX Runtime's tools made of it.
This script exports small transformers models (built from configs, weights perturbed off
their init as in ``export_models.py``) the way optimum does (TorchScript exporter, opset 17,
dynamic axes) or with the dynamo exporter, then runs one pipeline step on them:

    opt_fp16                OPT pre-LN -> onnxruntime.transformers.float16.convert_float_to_float16(keep_io_types=True)
    gpt2_fp16               GPT-2 -> the same fp16 converter
    gpt2_inferred           GPT-2 -> onnx.shape_inference.infer_shapes (value_info with unk__N dims)
    vit_fp16                ViT -> the fp16 converter
    clip_fp16               CLIPModel -> the fp16 converter
    gpt2_eager_ort_opt0     GPT-2 (eager attention) -> optimize_model(model_type="gpt2", opt_level=0)
    clip_ort                CLIPModel -> optimize_model(model_type="clip")
    vit_torchscript         ViT, TorchScript: flatten(2) is a Reshape whose target is built from
                            the input's own Shape (Shape -> Slice -> Concat)
    swin_torchscript        Swin, TorchScript: flatten(2) and window-partition reshapes
    segformer_torchscript   SegFormer, TorchScript: flatten(2) after every patch and reduction conv
    mbart_torchscript       MBart (pre-LN encoder-decoder), TorchScript: a Gather along the
                            normalized axis feeds only Shape nodes
    wav2vec2_stable         Wav2Vec2 with stable layer norm (pre-LN): the stream starts as a linear
                            projection plus a grouped positional conv through GELU

Every model has 4 transformer layers (MBart: 2 encoder + 2 decoder), hidden size 32 and 4 heads
(Swin and SegFormer: 2 stages of their own small widths); each
is checked in ONNX Runtime against torch at two input sizes, and is written as ``<name>.onnx``
with ``<name>.inputs.npz`` and ``<name>.inputs_alt.npz`` (two input sets of different sizes)
and an entry in ``pipeline_manifest.json``.

Usage::

    python models/make/export_pipeline_models.py [--only NAME ...] [--out-dir models]
"""
from __future__ import annotations

import contextlib
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parent))
from export_coverage_models import no_packed_sequence_check  # noqa: E402
from export_models import export_with_manifest, finalize_onnx, manifest_entry, perturb, run_ort, seed_for  # noqa: E402

HIDDEN, LAYERS, HEADS, INTER = 32, 4, 4, 128
VOCAB, MAX_POS = 320, 64
IMAGE, PATCH = 24, 6
OPSET = 17
TOL = 1e-3
FP16_TOL = 5e-2  # relative to the largest output value
MAX_BYTES = 1024 * 1024


# --------------------------------------------------------------------------- #
# Models
# --------------------------------------------------------------------------- #
def build_gpt2(attn):
    cfg = transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=MAX_POS, n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS,
        n_inner=INTER, use_cache=False, bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1,
        attn_implementation=attn)
    return transformers.GPT2LMHeadModel(cfg)


def build_opt(attn):
    cfg = transformers.OPTConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
        ffn_dim=INTER, max_position_embeddings=MAX_POS, word_embed_proj_dim=HIDDEN,
        do_layer_norm_before=True, use_cache=False, attn_implementation=attn)
    return transformers.OPTForCausalLM(cfg)


def build_vit(attn):
    cfg = transformers.ViTConfig(
        image_size=IMAGE, patch_size=PATCH, num_channels=3, hidden_size=HIDDEN,
        num_hidden_layers=LAYERS, num_attention_heads=HEADS, intermediate_size=INTER,
        num_labels=10, attn_implementation=attn)
    return transformers.ViTForImageClassification(cfg)


def build_swin(attn):
    cfg = transformers.SwinConfig(
        image_size=32, patch_size=4, num_channels=3, embed_dim=24, depths=[2, 2], num_heads=[2, 4],
        window_size=4, mlp_ratio=2.0, num_labels=10, attn_implementation=attn)
    return transformers.SwinForImageClassification(cfg)


def build_segformer(attn):
    cfg = transformers.SegformerConfig(
        num_channels=3, num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32],
        patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2], num_labels=10)
    return transformers.SegformerForImageClassification(cfg)


def build_clip(attn):
    # A narrower MLP than the other models keeps the two 4-layer towers under 1 MB.
    text = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN,
                num_hidden_layers=LAYERS, num_attention_heads=HEADS, max_position_embeddings=MAX_POS,
                projection_dim=32)
    vision = dict(hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=LAYERS,
                  num_attention_heads=HEADS, image_size=IMAGE, patch_size=PATCH, projection_dim=32)
    text.update(bos_token_id=0, eos_token_id=2, pad_token_id=1)
    cfg = transformers.CLIPConfig(text_config=text, vision_config=vision, projection_dim=32,
                                  attn_implementation=attn)
    return transformers.CLIPModel(cfg)


def build_mbart(attn):
    cfg = transformers.MBartConfig(
        vocab_size=VOCAB, d_model=HIDDEN, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=HEADS, decoder_attention_heads=HEADS, encoder_ffn_dim=INTER,
        decoder_ffn_dim=INTER, max_position_embeddings=MAX_POS, use_cache=False,
        pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2,
        attn_implementation=attn)
    return transformers.MBartModel(cfg)


def build_wav2vec2(attn):
    cfg = transformers.Wav2Vec2Config(
        hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
        intermediate_size=INTER, conv_dim=(40, 40), conv_stride=(5, 2), conv_kernel=(10, 3),
        num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, do_stable_layer_norm=True,
        feat_extract_norm="layer", apply_spec_augment=False, vocab_size=VOCAB,
        attn_implementation=attn)
    return transformers.Wav2Vec2Model(cfg)


# --------------------------------------------------------------------------- #
# Inputs
# --------------------------------------------------------------------------- #
def _ids(rng, batch, seq, name="input_ids"):
    return {name: rng.integers(3, VOCAB, size=(batch, seq), dtype=np.int64)}


def text_inputs(mask: bool):
    def make(batch, seq, seed):
        rng = np.random.default_rng(seed)
        feeds = _ids(rng, batch, seq)
        if mask:
            feeds["attention_mask"] = np.ones((batch, seq), dtype=np.int64)
        return feeds
    return make


def image_inputs(batch, seq, seed):
    rng = np.random.default_rng(seed)
    return {"pixel_values": rng.standard_normal((batch, 3, IMAGE, IMAGE)).astype(np.float32)}


def swin_inputs(batch, seq, seed):
    rng = np.random.default_rng(seed)
    return {"pixel_values": rng.standard_normal((batch, 3, 32, 32)).astype(np.float32)}


def clip_inputs(batch, seq, seed):
    rng = np.random.default_rng(seed)
    return {**_ids(rng, batch, seq), "pixel_values": rng.standard_normal((batch, 3, IMAGE, IMAGE)).astype(np.float32),
            "attention_mask": np.ones((batch, seq), dtype=np.int64)}


def mbart_inputs(batch, seq, seed):
    rng = np.random.default_rng(seed)
    return {**_ids(rng, batch, seq), **_ids(rng, batch, seq - 2, "decoder_input_ids")}


def audio_inputs(batch, seq, seed):
    rng = np.random.default_rng(seed)
    return {"input_values": rng.standard_normal((batch, 40 * seq)).astype(np.float32)}


# --------------------------------------------------------------------------- #
# Export and pipeline steps
# --------------------------------------------------------------------------- #
class Wrapper(torch.nn.Module):
    def __init__(self, model, input_names, output_names):
        super().__init__()
        self.model, self.input_names, self.output_names = model, input_names, output_names

    def forward(self, *args):
        kw = dict(zip(self.input_names, args))
        out = self.model(**kw, return_dict=True)
        return tuple(out[o] for o in self.output_names)


@dataclass
class Source:
    name: str
    build: Callable
    attn: str
    inputs: Callable  # (batch, seq, seed) -> feeds
    input_names: list[str]
    output_names: list[str]
    dynamic: dict[str, dict[int, str]]


TEXT_AXES = {0: "batch", 1: "seq"}
SOURCES = {s.name: s for s in [
    Source("gpt2", build_gpt2, "sdpa", text_inputs(False), ["input_ids"], ["logits"], {"input_ids": TEXT_AXES}),
    Source("gpt2_eager", build_gpt2, "eager", text_inputs(True), ["input_ids", "attention_mask"], ["logits"],
           {"input_ids": TEXT_AXES, "attention_mask": TEXT_AXES}),
    Source("opt", build_opt, "eager", text_inputs(True), ["input_ids", "attention_mask"], ["logits"],
           {"input_ids": TEXT_AXES, "attention_mask": TEXT_AXES}),
    Source("vit", build_vit, "eager", image_inputs, ["pixel_values"], ["logits"], {"pixel_values": {0: "batch"}}),
    # optimum marks every dim of pixel_values dynamic
    Source("vit_dynamic", build_vit, "eager", image_inputs, ["pixel_values"], ["logits"],
           {"pixel_values": {0: "batch", 1: "num_channels", 2: "height", 3: "width"}}),
    Source("swin", build_swin, "eager", swin_inputs, ["pixel_values"], ["logits"],
           {"pixel_values": {0: "batch", 1: "num_channels", 2: "height", 3: "width"}}),
    Source("segformer", build_segformer, "eager", swin_inputs, ["pixel_values"], ["logits"],
           {"pixel_values": {0: "batch", 1: "num_channels", 2: "height", 3: "width"}}),
    Source("clip", build_clip, "eager", clip_inputs, ["input_ids", "pixel_values", "attention_mask"],
           ["logits_per_image", "logits_per_text", "text_embeds", "image_embeds"],
           {"input_ids": TEXT_AXES, "attention_mask": TEXT_AXES, "pixel_values": {0: "image_batch"}}),
    Source("mbart", build_mbart, "eager", mbart_inputs, ["input_ids", "decoder_input_ids"], ["last_hidden_state"],
           {"input_ids": TEXT_AXES, "decoder_input_ids": {0: "batch", 1: "decoder_seq"}}),
    Source("wav2vec2", build_wav2vec2, "eager", audio_inputs, ["input_values"], ["last_hidden_state"],
           {"input_values": {0: "batch", 1: "samples"}}),
]}


def build_source(src: Source):
    seed = seed_for(f"pipeline_{src.name}")
    torch.manual_seed(seed)
    model = src.build(src.attn).eval()
    perturb(model, seed)
    return Wrapper(model, src.input_names, src.output_names).eval(), seed


def torchscript_export(src: Source, wrapper, feeds, path: Path) -> onnx.ModelProto:
    args = tuple(torch.from_numpy(feeds[n]) for n in src.input_names)
    axes = dict(src.dynamic)
    for o in src.output_names:
        axes[o] = {0: "batch"}
    with warnings.catch_warnings(), no_packed_sequence_check():
        warnings.simplefilter("ignore")
        torch.onnx.export(wrapper, args, str(path), dynamo=False, opset_version=OPSET,
                          input_names=src.input_names, output_names=src.output_names,
                          dynamic_axes=axes, do_constant_folding=True)
    return finalize_onnx(path)


def fp16(model: onnx.ModelProto) -> onnx.ModelProto:
    from onnxruntime.transformers.float16 import convert_float_to_float16
    return convert_float_to_float16(model, keep_io_types=True)


def inferred(model: onnx.ModelProto) -> onnx.ModelProto:
    return onnx.shape_inference.infer_shapes(model)


def ort_optimized(model_type: str, opt_level: int | None):
    def step(model: onnx.ModelProto) -> onnx.ModelProto:
        from onnxruntime.transformers import optimizer
        with contextlib.redirect_stdout(sys.stderr):
            opt = optimizer.optimize_model(model, model_type=model_type, num_heads=HEADS, hidden_size=HIDDEN,
                                           opt_level=opt_level, use_gpu=False)
        return opt.model
    return step


def identity(model: onnx.ModelProto) -> onnx.ModelProto:
    return model


@dataclass
class Artifact:
    name: str
    source: str
    step: Callable[[onnx.ModelProto], onnx.ModelProto]
    producer: str
    seqs: tuple[int, int] = (8, 5)


ARTIFACTS = {a.name: a for a in [
    Artifact("opt_fp16", "opt", fp16, "OPT pre-LN, TorchScript opset 17 -> convert_float_to_float16(keep_io_types=True)"),
    Artifact("gpt2_fp16", "gpt2", fp16, "GPT-2, TorchScript opset 17 -> convert_float_to_float16(keep_io_types=True)"),
    Artifact("gpt2_inferred", "gpt2", inferred, "GPT-2, TorchScript opset 17 -> onnx.shape_inference.infer_shapes"),
    Artifact("vit_fp16", "vit", fp16, "ViT, TorchScript opset 17 -> convert_float_to_float16(keep_io_types=True)"),
    Artifact("clip_fp16", "clip", fp16, "CLIPModel, TorchScript opset 17 -> convert_float_to_float16(keep_io_types=True)"),
    Artifact("gpt2_eager_ort_opt0", "gpt2_eager", ort_optimized("gpt2", 0),
             "GPT-2 eager, TorchScript opset 17 -> optimize_model(model_type='gpt2', opt_level=0)"),
    Artifact("clip_ort", "clip", ort_optimized("clip", None), "CLIPModel, TorchScript opset 17 -> optimize_model(model_type='clip')"),
    Artifact("vit_torchscript", "vit_dynamic", identity,
             "ViT, TorchScript opset 17, every pixel_values dim dynamic (flatten(2) as Shape/Slice/Concat -> Reshape)"),
    Artifact("swin_torchscript", "swin", identity,
             "Swin (2 stages of 2 blocks), TorchScript opset 17, every pixel_values dim dynamic (flatten(2), window reshapes)"),
    Artifact("segformer_torchscript", "segformer", identity,
             "SegFormer (2 stages), TorchScript opset 17, every pixel_values dim dynamic (flatten(2) after each "
             "overlapping patch conv and each sequence-reduction conv)"),
    Artifact("mbart_torchscript", "mbart", identity, "MBartModel (pre-LN, 2+2 layers), TorchScript opset 17"),
    Artifact("wav2vec2_stable", "wav2vec2", identity,
             "Wav2Vec2Model (stable layer norm, feature-extractor LN), TorchScript opset 17", seqs=(16, 12)),
]}


def max_rel(ref: dict, got: dict) -> float:
    worst = 0.0
    for k, r in ref.items():
        r64, g64 = r.astype(np.float64), got[k].astype(np.float64)
        assert r64.shape == g64.shape, (k, r64.shape, g64.shape)
        worst = max(worst, float(np.abs(r64 - g64).max() / max(np.abs(r64).max(), 1e-30)))
    return worst


def export_artifact(art: Artifact, out_dir: Path, cache: dict) -> dict:
    src = SOURCES[art.source]
    if src.name not in cache:
        wrapper, seed = build_source(src)
        ref_in = src.inputs(2, art.seqs[0], seed + 10)
        tmp = out_dir / f".{src.name}.src.onnx"
        base = torchscript_export(src, wrapper, ref_in, tmp)
        tmp.unlink()
        cache[src.name] = (wrapper, seed, base)
    wrapper, seed, base = cache[src.name]
    model = art.step(onnx.ModelProto.FromString(base.SerializeToString()))
    path = out_dir / f"{art.name}.onnx"
    onnx.save(model, str(path), save_as_external_data=False)
    size = path.stat().st_size
    if size >= MAX_BYTES:
        raise RuntimeError(f"{art.name}: {size} bytes, over 1 MB")
    feeds = [src.inputs(2, art.seqs[0], seed + 10), src.inputs(3, art.seqs[1], seed + 20)]
    diffs = []
    for f in feeds:
        with torch.no_grad():
            ref = dict(zip(src.output_names, (t.numpy() for t in wrapper(*[torch.from_numpy(f[n]) for n in src.input_names]))))
        diffs.append(max_rel(ref, run_ort(path, f)))
    tol = FP16_TOL if art.step is fp16 else TOL
    if max(diffs) > tol:
        raise RuntimeError(f"{art.name}: ORT differs from torch by {max(diffs):.3g} (relative)")
    return manifest_entry(model, path, art.name, art.producer, feeds, diffs, value_info=len(model.graph.value_info))


def main(argv=None) -> None:
    cache: dict = {}
    export_with_manifest(__doc__, ARTIFACTS, "pipeline_manifest.json", "models/make/export_pipeline_models.py",
                         lambda name, out_dir: export_artifact(ARTIFACTS[name], out_dir, cache), argv)


if __name__ == "__main__":
    main()
