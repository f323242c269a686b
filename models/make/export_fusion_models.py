#!/usr/bin/env python
"""Small models on which ONNX Runtime's fusions decide what the fold keeps (docs/DESIGN.md section 10).

    python models/make/export_fusion_models.py [--only NAME ...] [--out-dir models]

Built from transformers configs (hidden 64, 2 layers, 4 heads; no hub access), every floating
parameter perturbed as `export_models.py` does, exported, checked in onnxruntime against torch at
two batch sizes, and written as `<name>.onnx` (one file, under 1 MB), `<name>.inputs.npz`,
`<name>.outputs.npz` and an entry of `fusion_manifest.json`:

    distilbert_torchscript   DistilBertModel, TorchScript exporter (opset 17): the transformers
                             optimizer (model_type bert) fuses its embeddings LN into
                             EmbedLayerNormalization, so that LN stays (`fusion-cost`)
    gpt_neo                  GPTNeoModel, dynamo (opset 18): the embeddings sum feeds the first
                             layer's LN; the optimizer fuses no EmbedLayerNormalization; all fold
    pegasus_decoder          PegasusForCausalLM (the decoder), dynamo (opset 18): scaled token
                             embedding + sinusoidal positions into a pre-LN stack; nothing fused
    whisper_encoder_torchscript  WhisperModel(...).encoder, TorchScript exporter (opset 17): GELU
                             written as `x * (erf(x / sqrt 2) + 1) * 0.5` in the conv stem; the
                             stream needs an explicit centering right after it, which must not
                             cost ONNX Runtime's Gelu fusion

Same versions, same bytes (the pins of `export_models.py`).
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
import torch
import transformers

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import export_models as em  # noqa: E402
from export_models import finalize_onnx, max_diff, perturb, run_ort, seed_for  # noqa: E402

HIDDEN, LAYERS, HEADS, VOCAB, POSITIONS = em.HIDDEN, em.LAYERS, em.HEADS, em.VOCAB, em.MAX_POS
WHISPER_MEL, WHISPER_POS = 16, 32
TOL = 1e-3
MAX_BYTES = 1_000_000


class _Wrapper(torch.nn.Module):
    """The model called with keyword inputs, returning one output tensor."""

    def __init__(self, model: torch.nn.Module, input_names: list[str], output: str):
        super().__init__()
        self.model, self.input_names, self.output = model, input_names, output

    def _run(self, *args):
        return self.model(**dict(zip(self.input_names, args)), return_dict=True)[self.output]


class _One(_Wrapper):
    def forward(self, a):
        return self._run(a)


class _Two(_Wrapper):
    def forward(self, a, b):
        return self._run(a, b)


@dataclass
class FusionSpec:
    name: str
    build: Callable[[], torch.nn.Module]
    input_names: list[str]
    output: str
    dynamo: bool
    make_inputs: Callable[[int, int], dict[str, np.ndarray]]
    note: str


def _text(batch: int, seed: int, seq: int = 8) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "input_ids": rng.integers(0, VOCAB, size=(batch, seq), dtype=np.int64),
        "attention_mask": np.ones((batch, seq), dtype=np.int64),
    }


def _mel(batch: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"input_features": rng.standard_normal((batch, WHISPER_MEL, 2 * WHISPER_POS)).astype(np.float32)}


def build_distilbert() -> torch.nn.Module:
    cfg = transformers.DistilBertConfig(
        vocab_size=VOCAB, dim=HIDDEN, n_layers=LAYERS, n_heads=HEADS, hidden_dim=4 * HIDDEN,
        max_position_embeddings=POSITIONS, attn_implementation="eager")
    return transformers.DistilBertModel(cfg)


def build_gpt_neo() -> torch.nn.Module:
    cfg = transformers.GPTNeoConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, num_layers=LAYERS, num_heads=HEADS,
        attention_types=[[["global", "local"], 1]], max_position_embeddings=POSITIONS, window_size=16,
        use_cache=False)
    return transformers.GPTNeoModel(cfg)


def build_pegasus_decoder() -> torch.nn.Module:
    cfg = transformers.PegasusConfig(
        vocab_size=VOCAB, d_model=HIDDEN, decoder_layers=LAYERS, encoder_layers=LAYERS,
        decoder_attention_heads=HEADS, encoder_attention_heads=HEADS, decoder_ffn_dim=4 * HIDDEN,
        encoder_ffn_dim=4 * HIDDEN, max_position_embeddings=POSITIONS, use_cache=False)
    return transformers.PegasusForCausalLM(cfg)


def build_whisper_encoder() -> torch.nn.Module:
    cfg = transformers.WhisperConfig(
        vocab_size=VOCAB, num_mel_bins=WHISPER_MEL, d_model=HIDDEN, encoder_layers=LAYERS,
        encoder_attention_heads=HEADS, decoder_layers=LAYERS, decoder_attention_heads=HEADS,
        encoder_ffn_dim=4 * HIDDEN, decoder_ffn_dim=4 * HIDDEN, max_source_positions=WHISPER_POS,
        max_target_positions=POSITIONS, attn_implementation="eager", pad_token_id=VOCAB - 1, bos_token_id=VOCAB - 2,
        eos_token_id=VOCAB - 1, decoder_start_token_id=VOCAB - 2)
    return transformers.WhisperModel(cfg).get_encoder()


SPECS = {s.name: s for s in [
    FusionSpec("distilbert_torchscript", build_distilbert, ["input_ids", "attention_mask"], "last_hidden_state",
               False, _text, "DistilBertModel; ORT's transformers optimizer fuses EmbedLayerNormalization"),
    FusionSpec("gpt_neo", build_gpt_neo, ["input_ids", "attention_mask"], "last_hidden_state", True, _text,
               "GPTNeoModel; embeddings sum into a pre-LN stack, no EmbedLayerNormalization fusion"),
    FusionSpec("pegasus_decoder", build_pegasus_decoder, ["input_ids", "attention_mask"], "logits", True, _text,
               "PegasusForCausalLM (decoder only); no EmbedLayerNormalization fusion"),
    FusionSpec("whisper_encoder_torchscript", build_whisper_encoder, ["input_features"], "last_hidden_state",
               False, _mel, "Whisper encoder; erf GELU written x * (erf + 1) * 0.5 in the conv stem"),
]}


def export(spec: FusionSpec, out_dir: Path) -> dict:
    seed = seed_for(spec.name)
    torch.manual_seed(seed)
    model = spec.build().eval()
    perturb(model, seed)
    model.eval()
    wrapper = {1: _One, 2: _Two}[len(spec.input_names)](model, spec.input_names, spec.output).eval()
    ref, alt = spec.make_inputs(em.REF_BATCH, seed + 10), spec.make_inputs(em.ALT_BATCH, seed + 20)
    args = tuple(torch.from_numpy(ref[n]) for n in spec.input_names)
    path = out_dir / f"{spec.name}.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if spec.dynamo:
            batch = torch.export.Dim("batch", min=1, max=1024)
            seq = torch.export.Dim("seq", min=2, max=POSITIONS)
            torch.onnx.export(
                wrapper, args, str(path), dynamo=True, opset_version=em.OPSET_DYNAMO, input_names=spec.input_names,
                output_names=[spec.output], dynamic_shapes=tuple({0: batch, 1: seq} for _ in spec.input_names),
                external_data=False, optimize=True)
        else:
            axes = {n: ({0: "batch"} if n == "input_features" else {0: "batch", 1: "seq"}) for n in spec.input_names}
            axes[spec.output] = {0: "batch"} if "input_features" in spec.input_names else {0: "batch", 1: "seq"}
            torch.onnx.export(
                wrapper, args, str(path), dynamo=False, opset_version=em.OPSET_TORCHSCRIPT,
                input_names=spec.input_names, output_names=[spec.output], dynamic_axes=axes, do_constant_folding=True)
    m = finalize_onnx(path)
    diffs = {}
    for label, feeds in (("ref", ref), ("alt", alt)):
        with torch.no_grad():
            expected = {spec.output: wrapper(*[torch.from_numpy(feeds[n]) for n in spec.input_names]).numpy()}
        diffs[label] = max_diff(expected, run_ort(path, feeds))
        if diffs[label] > TOL:
            raise RuntimeError(f"{spec.name}: onnxruntime differs from torch by {diffs[label]:.3g}")
        if label == "ref":
            np.savez(out_dir / f"{spec.name}.inputs.npz", **feeds)
            np.savez(out_dir / f"{spec.name}.outputs.npz", **expected)
    size = path.stat().st_size
    if size > MAX_BYTES:
        raise RuntimeError(f"{spec.name}: {size} bytes, over the {MAX_BYTES} allowed for a committed model")
    return {
        "file": path.name,
        "note": spec.note,
        "exporter": "dynamo" if spec.dynamo else "torchscript",
        "opset": next(o.version for o in m.opset_import if o.domain in ("", "ai.onnx")),
        "architecture": type(model).__name__,
        "inputs": {n: list(ref[n].shape) for n in spec.input_names},
        "layernorm_count": sum(n.op_type == "LayerNormalization" for n in m.graph.node),
        "file_size_bytes": size,
        "ort_max_abs_diff": diffs,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "onnx": onnx.__version__},
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="+", choices=sorted(SPECS))
    ap.add_argument("--out-dir", default=str(HERE.parent))
    args = ap.parse_args(argv)
    torch.set_num_threads(2)
    out_dir = Path(args.out_dir)
    manifest_path = out_dir / "fusion_manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    for name in args.only or list(SPECS):
        manifest[name] = export(SPECS[name], out_dir)
        manifest_path.write_text(json.dumps(dict(sorted(manifest.items())), indent=1) + "\n")
        print(f"{name}: {manifest[name]['file_size_bytes']:,} bytes, max |ORT - torch| {max(manifest[name]['ort_max_abs_diff'].values()):.2g}")


if __name__ == "__main__":
    main()
