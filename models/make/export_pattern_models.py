#!/usr/bin/env python
"""Export the models behind two carry patterns, for the slow tests of tests/analysis/test_patterns.py.

* ``timesformer_dynamo`` / ``timesformer_torchscript``: ``TimesformerModel`` (image 32, patch 8,
  2 frames, hidden 64, 2 layers, 4 heads: 7 LayerNorms) by ``torch.onnx.export(dynamo=True)``
  (opset 18) and by the TorchScript exporter (opset 17). Its divided space-time attention repeats
  the class token over the frames (``Tile`` with repeats ``[1, frames, 1]``).
* ``whisper_decoder_dynamo``: the decoder of a ``WhisperForConditionalGeneration`` (d_model 64,
  2 decoder layers, 4 heads, vocab 512, 128 positions) without cache, ``input_ids`` and
  ``encoder_hidden_states`` in, ``logits`` out (the LM head tied to the token table). The dynamo
  exporter writes ``embed_positions.weight[position_ids]`` as a ``GatherND`` on the table. (The
  TorchScript exporter fails on this decoder with transformers 5: ``aten::diff``.)

Weights are perturbed off their init as ``export_models.py`` does. Each model is checked in
onnxruntime against torch at two batch sizes; nothing else is written (no manifest): the files
are not committed, the tests export them into a temporary folder.

Usage::

    python models/make/export_pattern_models.py OUT_DIR [--only NAME ...]
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

TOL = 1e-4


class _LastHidden(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, pixel_values):
        return self.model(pixel_values=pixel_values).last_hidden_state


class _Decoder(torch.nn.Module):
    """Whisper's decoder and LM head, without cache."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, encoder_hidden_states):
        decoder = self.model.model.decoder
        hidden = decoder(input_ids=input_ids, encoder_hidden_states=encoder_hidden_states, use_cache=False)
        return self.model.proj_out(hidden.last_hidden_state)


def _timesformer(name: str) -> torch.nn.Module:
    config = transformers.TimesformerConfig(
        image_size=em.IMAGE, patch_size=em.PATCH, num_channels=em.CHANNELS, num_frames=2, hidden_size=em.HIDDEN,
        num_hidden_layers=em.LAYERS, num_attention_heads=em.HEADS, intermediate_size=em.INTER,
    )
    torch.manual_seed(em.seed_for(name))
    model = transformers.TimesformerModel(config).eval()
    em.perturb(model, em.seed_for(name))
    return _LastHidden(model).eval()


def _whisper_decoder(name: str) -> torch.nn.Module:
    config = transformers.WhisperConfig(
        vocab_size=em.VOCAB, d_model=em.HIDDEN, encoder_layers=em.LAYERS, decoder_layers=em.LAYERS,
        encoder_attention_heads=em.HEADS, decoder_attention_heads=em.HEADS, encoder_ffn_dim=em.INTER,
        decoder_ffn_dim=em.INTER, num_mel_bins=16, max_source_positions=32, max_target_positions=em.MAX_POS,
        pad_token_id=em.VOCAB - 1, bos_token_id=em.VOCAB - 2, eos_token_id=em.VOCAB - 1,
        decoder_start_token_id=em.VOCAB - 2, use_cache=False,
    )
    torch.manual_seed(em.seed_for(name))
    model = transformers.WhisperForConditionalGeneration(config).eval()
    em.perturb(model, em.seed_for(name))
    return _Decoder(model).eval()


def _video(batch: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"pixel_values": rng.standard_normal((batch, 2, em.CHANNELS, em.IMAGE, em.IMAGE)).astype(np.float32)}


def _decoder_inputs(batch: int, seq: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "input_ids": rng.integers(0, em.VOCAB, size=(batch, seq), dtype=np.int64),
        "encoder_hidden_states": rng.standard_normal((batch, 6, em.HIDDEN)).astype(np.float32),
    }


def _check(module: torch.nn.Module, path: Path, feeds: dict[str, np.ndarray], output: str) -> float:
    with torch.no_grad():
        expected = module(*(torch.from_numpy(v) for v in feeds.values())).numpy()
    diff = float(np.abs(em.run_ort(path, feeds)[output] - expected).max())
    if not diff < TOL:
        raise RuntimeError(f"{path.name}: onnxruntime differs from torch by {diff:.3g}")
    return diff


def export_timesformer(out_dir: Path, dynamo: bool) -> Path:
    name = f"timesformer_{'dynamo' if dynamo else 'torchscript'}"
    module, path = _timesformer(name), out_dir / f"{name}.onnx"
    feeds = _video(em.REF_BATCH, em.seed_for(name))
    args = (torch.from_numpy(feeds["pixel_values"]),)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            torch.onnx.export(
                module, args, str(path), dynamo=True, opset_version=em.OPSET_DYNAMO, input_names=["pixel_values"],
                output_names=["last_hidden_state"], dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=64)},),
                external_data=False, optimize=True,
            )
        else:
            torch.onnx.export(
                module, args, str(path), dynamo=False, opset_version=em.OPSET_TORCHSCRIPT, input_names=["pixel_values"],
                output_names=["last_hidden_state"], do_constant_folding=True,
                dynamic_axes={"pixel_values": {0: "batch"}, "last_hidden_state": {0: "batch"}},
            )
    em.finalize_onnx(path)
    for batch, seed in ((em.REF_BATCH, 1), (em.ALT_BATCH, 2)):
        _check(module, path, _video(batch, seed), "last_hidden_state")
    return path


def export_whisper_decoder(out_dir: Path) -> Path:
    name = "whisper_decoder_dynamo"
    module, path = _whisper_decoder(name), out_dir / f"{name}.onnx"
    feeds = _decoder_inputs(em.REF_BATCH, em.REF_SEQ, em.seed_for(name))
    batch, seq, frames = (torch.export.Dim(n, min=1, max=64) for n in ("batch", "decoder_sequence_length", "encoder_sequence_length"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module, tuple(torch.from_numpy(v) for v in feeds.values()), str(path), dynamo=True,
            opset_version=em.OPSET_DYNAMO, input_names=list(feeds), output_names=["logits"],
            dynamic_shapes=({0: batch, 1: seq}, {0: batch, 1: frames}), external_data=False, optimize=True,
        )
    em.finalize_onnx(path)
    for b, s, seed in ((em.REF_BATCH, em.REF_SEQ, 1), (em.ALT_BATCH, em.ALT_SEQ, 2)):
        _check(module, path, _decoder_inputs(b, s, seed), "logits")
    return path


EXPORTS = {
    "timesformer_dynamo": lambda out: export_timesformer(out, dynamo=True),
    "timesformer_torchscript": lambda out: export_timesformer(out, dynamo=False),
    "whisper_decoder_dynamo": export_whisper_decoder,
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir")
    ap.add_argument("--only", nargs="+", choices=sorted(EXPORTS))
    args = ap.parse_args(argv)
    torch.set_num_threads(2)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in args.only or sorted(EXPORTS):
        print(f"exported {EXPORTS[name](out_dir)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
