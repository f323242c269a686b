#!/usr/bin/env python
"""Export small models whose LNs are decided by values the exporter writes, not by structure
(docs/DESIGN.md sections 2.3 and 2.5), and write ``value_manifest.json``:

- ``stablelm_qk_torchscript``, ``stablelm_qk_dynamo``: StableLM with per-head q/k LayerNorms
  (``LayerNorm(bias=False)``: TorchScript writes their beta as a constant of zeros);
- ``adaln_torchscript``: a DiT/PixArt-style adaLN block (``LayerNorm(elementwise_affine=False)``,
  gamma ones and beta zeros as TorchScript writes them, then ``* (1 + scale) + shift`` from the
  conditioning);
- ``detr_decoder_torchscript``: a DETR-style post-LN decoder whose target starts as
  ``zeros_like(query_pos)`` (``ConstantOfShape(Shape(...))``), over a dynamic batch;
- ``deberta_masked_torchscript``: DeBERTa-v2, whose embeddings LN output is multiplied by the
  attention mask before the first residual sum.

transformers configs (StableLM, DeBERTa-v2) or small modules written here (adaLN, DETR decoder),
hidden 32, 2 layers, 4 heads, weights perturbed as ``export_models.py`` does; TorchScript exporter at
opset 17 (the dynamo one at 18), dynamic batch (and sequence). Each export is checked in ONNX
Runtime against torch at two input sizes and written with ``<name>.inputs.npz`` and
``<name>.inputs_alt.npz``.

Usage::

    python models/make/export_value_models.py [--only NAME ...] [--out-dir DIR]
"""

from __future__ import annotations

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

HIDDEN, LAYERS, HEADS, VOCAB, POSITIONS = 32, 2, 4, 128, 64
TOL = 1e-3  # relative to the largest output value
MAX_BYTES = 400 * 1024


class HfWrapper(torch.nn.Module):
    """A transformers model called with (input_ids, attention_mask), returning one tensor."""

    def __init__(self, model, output: str):
        super().__init__()
        self.model, self.output = model, output

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, return_dict=True)[self.output]


def build_stablelm() -> torch.nn.Module:
    cfg = transformers.StableLmConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
        num_key_value_heads=HEADS, intermediate_size=2 * HIDDEN, max_position_embeddings=POSITIONS,
        qk_layernorm=True, partial_rotary_factor=0.25, use_cache=False, attn_implementation="eager")
    # transformers 4.57's StableLM initializer zeroes every LayerNorm's bias, and its per-head ones
    # have none: they are left to `perturb` (gamma 1 + noise), as the others' are.
    pretrained = transformers.models.stablelm.modeling_stablelm.StableLmPreTrainedModel
    original = pretrained._init_weights

    def init_weights(self, module):
        if not (isinstance(module, torch.nn.LayerNorm) and module.bias is None):
            original(self, module)

    pretrained._init_weights = init_weights
    try:
        return HfWrapper(transformers.StableLmForCausalLM(cfg), "logits")
    finally:
        pretrained._init_weights = original


def build_deberta() -> torch.nn.Module:
    cfg = transformers.DebertaV2Config(
        vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
        intermediate_size=2 * HIDDEN, max_position_embeddings=POSITIONS, relative_attention=True,
        position_buckets=16, max_relative_positions=POSITIONS, pos_att_type=["p2c", "c2p"])

    class Deberta(HfWrapper):
        def forward(self, input_ids, attention_mask):
            return self.model(input_ids=input_ids, attention_mask=attention_mask, return_dict=True)[self.output]

    return Deberta(transformers.DebertaV2Model(cfg), "last_hidden_state")


class AdaLnBlock(torch.nn.Module):
    """DiT's block: `x + gate * attn(modulate(LN(x), shift, scale))`, the same for the MLP, with
    shift/scale/gate from the conditioning; LNs without affine (DiT, PixArt)."""

    def __init__(self):
        super().__init__()
        self.norm1 = torch.nn.LayerNorm(HIDDEN, elementwise_affine=False, eps=1e-6)
        self.attn = torch.nn.MultiheadAttention(HIDDEN, HEADS, batch_first=True)
        self.norm2 = torch.nn.LayerNorm(HIDDEN, elementwise_affine=False, eps=1e-6)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(HIDDEN, 2 * HIDDEN), torch.nn.GELU(approximate="tanh"),
                                       torch.nn.Linear(2 * HIDDEN, HIDDEN))
        self.ada = torch.nn.Sequential(torch.nn.SiLU(), torch.nn.Linear(HIDDEN, 6 * HIDDEN))

    def forward(self, x, c):
        shift1, scale1, gate1, shift2, scale2, gate2 = self.ada(c).unsqueeze(1).chunk(6, dim=-1)
        h = self.norm1(x) * (1 + scale1) + shift1
        x = x + gate1 * self.attn(h, h, h, need_weights=False)[0]
        h = self.norm2(x) * (1 + scale2) + shift2
        return x + gate2 * self.mlp(h)


class AdaLn(torch.nn.Module):
    """Patch tokens in, a DiT-style stack of adaLN blocks and its final adaLN layer."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Linear(16, HIDDEN)
        self.pos = torch.nn.Parameter(torch.randn(1, 16, HIDDEN) * 0.1)
        self.t_embed = torch.nn.Sequential(torch.nn.Linear(8, HIDDEN), torch.nn.SiLU(), torch.nn.Linear(HIDDEN, HIDDEN))
        self.blocks = torch.nn.ModuleList(AdaLnBlock() for _ in range(LAYERS))
        self.norm_final = torch.nn.LayerNorm(HIDDEN, elementwise_affine=False, eps=1e-6)
        self.ada_final = torch.nn.Sequential(torch.nn.SiLU(), torch.nn.Linear(HIDDEN, 2 * HIDDEN))
        self.out = torch.nn.Linear(HIDDEN, 16)

    def forward(self, patches, timestep):
        x = self.embed(patches) + self.pos
        c = self.t_embed(timestep)
        for block in self.blocks:
            x = block(x, c)
        shift, scale = self.ada_final(c).unsqueeze(1).chunk(2, dim=-1)
        return self.out(self.norm_final(x) * (1 + scale) + shift)


class DetrDecoderLayer(torch.nn.Module):
    """DETR's post-LN decoder layer: self-attention over the queries (plus their positions),
    cross-attention to the encoder memory, an MLP; each followed by a residual LN."""

    def __init__(self):
        super().__init__()
        self.self_attn = torch.nn.MultiheadAttention(HIDDEN, HEADS, batch_first=True)
        self.cross_attn = torch.nn.MultiheadAttention(HIDDEN, HEADS, batch_first=True)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(HIDDEN, 2 * HIDDEN), torch.nn.ReLU(), torch.nn.Linear(2 * HIDDEN, HIDDEN))
        self.norm1, self.norm2, self.norm3 = (torch.nn.LayerNorm(HIDDEN) for _ in range(3))

    def forward(self, tgt, query_pos, memory, memory_pos):
        q = tgt + query_pos
        tgt = self.norm1(tgt + self.self_attn(q, q, tgt, need_weights=False)[0])
        tgt = self.norm2(tgt + self.cross_attn(tgt + query_pos, memory + memory_pos, memory, need_weights=False)[0])
        return self.norm3(tgt + self.mlp(tgt))


class DetrDecoder(torch.nn.Module):
    """The encoder's output projected to the model width (the input projection), and the decoder:
    learned query positions repeated over the batch, the target `zeros_like` them; a final LN."""

    def __init__(self):
        super().__init__()
        self.input_projection = torch.nn.Linear(24, HIDDEN)
        self.query_position_embeddings = torch.nn.Embedding(10, HIDDEN)
        self.layers = torch.nn.ModuleList(DetrDecoderLayer() for _ in range(LAYERS))
        self.layernorm = torch.nn.LayerNorm(HIDDEN)

    def forward(self, features, memory_pos):
        memory = self.input_projection(features)
        query_pos = self.query_position_embeddings.weight.unsqueeze(0).repeat(features.shape[0], 1, 1)
        tgt = torch.zeros_like(query_pos)
        for layer in self.layers:
            tgt = layer(tgt, query_pos, memory, memory_pos)
        return self.layernorm(tgt)


def text_inputs(batch: int, seq: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, seq), np.int64)
    mask[0, seq - 2 :] = 0  # padding: the mask's Mul does something
    return {"input_ids": rng.integers(0, VOCAB, size=(batch, seq), dtype=np.int64), "attention_mask": mask}


def adaln_inputs(batch: int, seq: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"patches": rng.standard_normal((batch, 16, 16)).astype(np.float32),
            "timestep": rng.standard_normal((batch, 8)).astype(np.float32)}


def detr_inputs(batch: int, seq: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"features": rng.standard_normal((batch, seq, 24)).astype(np.float32),
            "memory_pos": rng.standard_normal((batch, seq, HIDDEN)).astype(np.float32)}


TEXT_AXES = {0: "batch", 1: "seq"}


@dataclass(frozen=True)
class Export:
    name: str
    build: Callable[[], torch.nn.Module]
    inputs: Callable[[int, int, int], dict[str, np.ndarray]]
    input_names: list[str]
    output: str
    dynamic: dict[str, dict[int, str]]
    dynamo: bool
    producer: str
    seqs: tuple[int, int] = (8, 5)


EXPORTS = {e.name: e for e in [
    Export("stablelm_qk_torchscript", build_stablelm, text_inputs, ["input_ids", "attention_mask"], "logits",
           {"input_ids": TEXT_AXES, "attention_mask": TEXT_AXES}, False,
           "StableLmForCausalLM (qk_layernorm: per-head LayerNorm(bias=False)), TorchScript opset 17"),
    Export("stablelm_qk_dynamo", build_stablelm, text_inputs, ["input_ids", "attention_mask"], "logits",
           {"input_ids": TEXT_AXES, "attention_mask": TEXT_AXES}, True,
           "StableLmForCausalLM (qk_layernorm), dynamo opset 18"),
    Export("adaln_torchscript", AdaLn, adaln_inputs, ["patches", "timestep"], "output",
           {"patches": {0: "batch"}, "timestep": {0: "batch"}}, False,
           "DiT-style adaLN blocks (LayerNorm(elementwise_affine=False)), TorchScript opset 17"),
    Export("detr_decoder_torchscript", DetrDecoder, detr_inputs, ["features", "memory_pos"], "output",
           {"features": {0: "batch", 1: "tokens"}, "memory_pos": {0: "batch", 1: "tokens"}}, False,
           "DETR-style post-LN decoder, target zeros_like(query_pos), TorchScript opset 17", seqs=(12, 7)),
    Export("deberta_masked_torchscript", build_deberta, text_inputs, ["input_ids", "attention_mask"], "output",
           {"input_ids": TEXT_AXES, "attention_mask": TEXT_AXES}, False,
           "DebertaV2Model (embeddings LN output times the mask), TorchScript opset 17"),
]}


def export(spec: Export, module: torch.nn.Module, feeds: dict[str, np.ndarray], path: Path) -> onnx.ModelProto:
    args = tuple(torch.from_numpy(feeds[n]) for n in spec.input_names)
    with warnings.catch_warnings(), no_packed_sequence_check():
        warnings.simplefilter("ignore")
        if spec.dynamo:
            dims = {axis: torch.export.Dim(name, min=1, max=POSITIONS) for d in spec.dynamic.values() for axis, name in d.items()}
            shapes = tuple({axis: dims[axis] for axis in spec.dynamic[n]} for n in spec.input_names)
            torch.onnx.export(module, args, str(path), dynamo=True, opset_version=18, input_names=spec.input_names,
                              output_names=[spec.output], dynamic_shapes=shapes, external_data=False, verbose=False)
        else:
            axes = {**spec.dynamic, spec.output: {0: "batch"}}
            torch.onnx.export(module, args, str(path), dynamo=False, opset_version=17, input_names=spec.input_names,
                              output_names=[spec.output], dynamic_axes=axes, do_constant_folding=True)
    model = finalize_onnx(path)
    if spec.dynamo:  # the exporter's per-node stack traces: most of the file, no part of the graph
        for node in model.graph.node:
            del node.metadata_props[:]
        onnx.save(model, str(path))
    return model


def max_rel(ref: np.ndarray, got: np.ndarray) -> float:
    r, g = ref.astype(np.float64), got.astype(np.float64)
    return float(np.abs(r - g).max() / max(np.abs(r).max(), 1e-30))


def export_one(spec: Export, out_dir: Path) -> dict:
    seed = seed_for(f"values_{spec.name}")
    torch.manual_seed(seed)
    module = spec.build().eval()
    perturb(module, seed)
    feeds = [spec.inputs(2, spec.seqs[0], seed + 10), spec.inputs(3, spec.seqs[1], seed + 20)]
    path = out_dir / f"{spec.name}.onnx"
    model = export(spec, module, feeds[0], path)
    size = path.stat().st_size
    if size >= MAX_BYTES:
        raise RuntimeError(f"{spec.name}: {size} bytes, over {MAX_BYTES}")
    diffs = []
    for f in feeds:
        with torch.no_grad():
            ref = module(*[torch.from_numpy(f[n]) for n in spec.input_names]).numpy()
        diffs.append(max_rel(ref, run_ort(path, f)[spec.output]))
    if max(diffs) > TOL:
        raise RuntimeError(f"{spec.name}: ORT differs from torch by {max(diffs):.3g} (relative)")
    return manifest_entry(model, path, spec.name, spec.producer, feeds, diffs)


def main(argv=None) -> None:
    export_with_manifest(__doc__, EXPORTS, "value_manifest.json", "models/make/export_value_models.py",
                         lambda name, out_dir: export_one(EXPORTS[name], out_dir), argv)


if __name__ == "__main__":
    main()
