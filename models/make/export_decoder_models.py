#!/usr/bin/env python
"""Export two KV-cache GPT-2 decoders, the graphs whose verification inputs are hardest to guess.

* ``gpt2_kv_cache``: one decode step exported by ``torch.onnx.export(dynamo=True)`` with past
  key/values as inputs: ``input_ids [batch, 1]``, ``attention_mask [batch, past_sequence_length + 1]``,
  ``past_key_values.N.key/value [batch, 4, past_sequence_length, 16]``; outputs ``logits`` and
  ``present.N.key/value``. Needs the project's environment (torch 2.13, transformers 5.x).
* ``gpt2_merged_decoder``: optimum's merged decoder: optimum-onnx exports GPT-2 without past
  (``text-generation``) and with past (``text-generation-with-past``), and
  ``optimum.onnx.graph_transformations.merge_decoders`` joins the two in one ``If`` on the bool
  input ``use_cache_branch``. optimum-onnx 0.1.0 needs transformers 4.x, so this one is made in an
  environment of its own::

      python -m venv /tmp/venv-optimum
      /tmp/venv-optimum/bin/pip install 'torch==2.13.0' 'optimum-onnx==0.1.0' onnxruntime onnxscript accelerate
      /tmp/venv-optimum/bin/python models/make/export_decoder_models.py --only gpt2_merged_decoder whisper_merged_decoder

* ``whisper_merged_decoder``: what ``optimum-cli export onnx --task
  automatic-speech-recognition-with-past`` writes as ``decoder_model_merged.onnx`` for a Whisper
  (the file ONNX Runtime deployments of Whisper load): the decoder without and with past merged
  in one ``If`` on ``use_cache_branch``, the shared weights in the outer graph, both branches
  reusing value names, the LM head tied to the token table (read through a ``Transpose``: optimum
  deduplicates tied weights when ``accelerate`` is installed, as it is here). Config: ``WhisperConfig`` with d_model 64, 2 decoder layers, 4 heads, vocab
  512, 128 target positions (optimum's dummy audio needs ``max_source_positions`` 1500; the
  encoder is not kept). Made in the same environment as ``gpt2_merged_decoder``.

The GPT-2 models use the weights of ``export_models.py``'s GPT-2 config (hidden 64, 2 layers, 4 heads, vocab
512), perturbed off their init the same way. Each model is checked in onnxruntime against torch at
two sizes, saved as one file with ``<name>.inputs.npz`` / ``<name>.outputs.npz`` (batch 2; the
merged decoder's reference inputs take the cached branch), and gets an entry in ``manifest.json``.

Usage::

    python models/make/export_decoder_models.py [--only NAME ...] [--out-dir models]
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import onnx
import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parent))
import export_models as em  # noqa: E402

HEAD_DIM = em.HIDDEN // em.HEADS
TOL = 1e-4


def _build_gpt2(name: str) -> transformers.GPT2LMHeadModel:
    seed = em.seed_for(name)
    torch.manual_seed(seed)
    config = em._gpt2_config(attn_implementation="eager")
    config.use_cache = True
    model = transformers.GPT2LMHeadModel(config).eval()
    em.perturb(model, seed)
    return model


def _past_names() -> list[str]:
    return [f"past_key_values.{i}.{kv}" for i in range(em.LAYERS) for kv in ("key", "value")]


def _present_names() -> list[str]:
    return [f"present.{i}.{kv}" for i in range(em.LAYERS) for kv in ("key", "value")]


def _decode_step_inputs(batch: int, past: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {
        "input_ids": rng.integers(0, em.VOCAB, size=(batch, 1), dtype=np.int64),
        "attention_mask": np.ones((batch, past + 1), dtype=np.int64),
    }
    for name in _past_names():
        feeds[name] = rng.standard_normal((batch, em.HEADS, past, HEAD_DIM)).astype(np.float32)
    return feeds


class _DecodeStep(torch.nn.Module):  # the dynamo export writes forward()'s line number into each node's metadata
    """GPT-2 with its cache as flat tensors in and out (torch.export needs a fixed arity)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, k0, v0, k1, v1):
        cache = transformers.DynamicCache(config=self.model.config)
        for layer, (k, v) in enumerate(((k0, v0), (k1, v1))):
            cache.update(k, v, layer)
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, past_key_values=cache, use_cache=True)
        result = [out.logits]
        for layer in out.past_key_values.layers:
            result += [layer.keys, layer.values]
        return tuple(result)


def _torch_outputs(module, feeds, names) -> dict[str, np.ndarray]:
    with torch.no_grad():
        outs = module(*[torch.from_numpy(v) for v in feeds.values()])
    return {n: o.numpy() for n, o in zip(names, outs)}


def _check(path: Path, expected: dict[str, np.ndarray], feeds: dict[str, np.ndarray]) -> float:
    got = em.run_ort(path, feeds)
    diff = em.max_diff(expected, {k: got[k] for k in expected})
    if not diff < TOL:
        raise RuntimeError(f"{path.name}: onnxruntime differs from torch by {diff:.3g}")
    return diff


def _check_merged(name: str, path: Path, out_dir: Path, feeds_for, torch_outputs) -> dict[str, float]:
    """A merged decoder against torch, through its cached branch (batch 2, 3 tokens after 5 cached)
    and its uncached one at two sizes; the cached branch's feeds and outputs are saved as the
    reference. The differences by label."""
    ref_in = feeds_for(em.REF_BATCH, 3, 5, True)
    expected = torch_outputs(ref_in)
    diffs = {"batch2_seq3_past5_cache": _check(path, expected, ref_in)}
    for batch, seq, label in ((em.REF_BATCH, em.REF_SEQ, "batch2_seq8_nocache"), (em.ALT_BATCH, em.ALT_SEQ, "batch3_seq5_nocache")):
        feeds = feeds_for(batch, seq, 0, False)
        diffs[label] = _check(path, torch_outputs(feeds), feeds)
    np.savez(out_dir / f"{name}.inputs.npz", **ref_in)
    np.savez(out_dir / f"{name}.outputs.npz", **expected)
    return diffs


@contextlib.contextmanager
def _saved(model):
    """A temporary folder with `model` saved in hf/, where optimum's main_export reads it."""
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(f"{tmp}/hf")
        yield tmp


def _optimum_export(tmp: str, output: str, task: str, **options) -> None:
    """optimum-onnx's main_export of the model `_saved` in `tmp` into tmp/`output`, on CPU, its warnings silenced."""
    from optimum.exporters.onnx import main_export

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        main_export(f"{tmp}/hf", output=f"{tmp}/{output}", task=task, device="cpu", **options)


def export_gpt2_kv_cache(out_dir: Path) -> dict:
    name = "gpt2_kv_cache"
    assert em.LAYERS == 2, "_DecodeStep takes the cache of two layers"
    module = _DecodeStep(_build_gpt2(name)).eval()
    seed = em.seed_for(name)
    ref_in = _decode_step_inputs(em.REF_BATCH, 7, seed + 10)
    alt_in = _decode_step_inputs(em.ALT_BATCH, 4, seed + 20)
    outputs = ["logits", *_present_names()]
    batch = torch.export.Dim("batch", min=1, max=64)
    past = torch.export.Dim("past_sequence_length", min=1, max=em.MAX_POS - 2)
    dynamic = ({0: batch}, {0: batch, 1: past + 1}) + tuple({0: batch, 2: past} for _ in _past_names())
    path = out_dir / f"{name}.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module,
            tuple(torch.from_numpy(v) for v in ref_in.values()),
            str(path),
            dynamo=True,
            opset_version=em.OPSET_DYNAMO,
            input_names=list(ref_in),
            output_names=outputs,
            dynamic_shapes=dynamic,
            external_data=False,
            optimize=True,
        )
    model = em.finalize_onnx(path)
    expected = _torch_outputs(module, ref_in, outputs)
    diffs = {
        "batch2_past7": _check(path, expected, ref_in),
        "batch3_past4": _check(path, _torch_outputs(module, alt_in, outputs), alt_in),
    }
    np.savez(out_dir / f"{name}.inputs.npz", **ref_in)
    np.savez(out_dir / f"{name}.outputs.npz", **expected)
    return _entry(name, model, path, "dynamo", diffs, "GPT2LMHeadModel, one decode step with past key/values (dynamo)")


def export_gpt2_merged_decoder(out_dir: Path) -> dict:
    from optimum.exporters.onnx.model_configs import GPT2OnnxConfig
    from optimum.onnx.graph_transformations import merge_decoders

    name = "gpt2_merged_decoder"
    model = _build_gpt2(name)
    path = out_dir / f"{name}.onnx"
    with _saved(model) as tmp:
        # The decoder without past must return the cache it starts (optimum's own merged exports
        # did, before optimum-onnx exported one with-past model only): use_past without past inputs.
        no_past = GPT2OnnxConfig(model.config, task="text-generation", use_past=True, use_past_in_inputs=False)
        for task, custom in (("text-generation", {"model": no_past}), ("text-generation-with-past", None)):
            _optimum_export(tmp, task, task, opset=em.OPSET_DYNAMO, custom_onnx_configs=custom)
        merge_decoders(
            f"{tmp}/text-generation/model.onnx", f"{tmp}/text-generation-with-past/model.onnx", strict=False, save_path=path
        )
    merged = em.finalize_onnx(path)

    seed = em.seed_for(name)
    rng = np.random.default_rng(seed + 10)
    graph_inputs = [i.name for i in merged.graph.input]
    outputs = [o.name for o in merged.graph.output]

    def feeds_for(batch: int, seq: int, past: int, use_cache: bool) -> dict[str, np.ndarray]:
        feeds = {
            "input_ids": rng.integers(0, em.VOCAB, size=(batch, seq), dtype=np.int64),
            "attention_mask": np.ones((batch, past + seq), dtype=np.int64),
            "position_ids": np.tile(np.arange(past, past + seq, dtype=np.int64), (batch, 1)),
            "use_cache_branch": np.array([use_cache]),
        }
        for n in _past_names():
            feeds[n] = rng.standard_normal((batch, em.HEADS, past, HEAD_DIM)).astype(np.float32)
        if not use_cache:
            # Without the cache the past inputs are ignored (optimum feeds a length-1 placeholder).
            for n in _past_names():
                feeds[n] = np.zeros((batch, em.HEADS, 1, HEAD_DIM), dtype=np.float32)
        return {k: feeds[k] for k in graph_inputs}

    def torch_outputs(feeds) -> dict[str, np.ndarray]:
        cache = None
        if feeds["use_cache_branch"][0]:
            cache = transformers.DynamicCache()
            for layer in range(em.LAYERS):
                cache.update(
                    torch.from_numpy(feeds[f"past_key_values.{layer}.key"]),
                    torch.from_numpy(feeds[f"past_key_values.{layer}.value"]),
                    layer,
                )
        with torch.no_grad():
            out = model(
                input_ids=torch.from_numpy(feeds["input_ids"]),
                attention_mask=torch.from_numpy(feeds["attention_mask"]),
                position_ids=torch.from_numpy(feeds["position_ids"]),
                past_key_values=cache,
                use_cache=True,
            )
        result = {"logits": out.logits.numpy()}
        for layer in range(em.LAYERS):
            keys, values = out.past_key_values[layer][:2]
            result[f"present.{layer}.key"], result[f"present.{layer}.value"] = keys.numpy(), values.numpy()
        return {k: result[k] for k in outputs}

    diffs = _check_merged(name, path, out_dir, feeds_for, torch_outputs)
    note = "GPT2LMHeadModel, optimum-onnx decoder + decoder with past merged by optimum's merge_decoders (If on use_cache_branch)"
    return _entry(name, merged, path, "optimum-onnx (TorchScript) + merge_decoders", diffs, note)


WHISPER_LAYERS, WHISPER_HEADS = em.LAYERS, em.HEADS
WHISPER_ENCODER_SEQ = 6  # frames of encoder_hidden_states in the reference inputs (any length works)


def _build_whisper(name: str) -> transformers.WhisperForConditionalGeneration:
    seed = em.seed_for(name)
    torch.manual_seed(seed)
    config = transformers.WhisperConfig(
        vocab_size=em.VOCAB, d_model=em.HIDDEN, encoder_layers=em.LAYERS, decoder_layers=WHISPER_LAYERS,
        encoder_attention_heads=em.HEADS, decoder_attention_heads=WHISPER_HEADS, encoder_ffn_dim=em.INTER,
        decoder_ffn_dim=em.INTER, num_mel_bins=16, max_source_positions=1500, max_target_positions=em.MAX_POS,
        pad_token_id=em.VOCAB - 1, bos_token_id=em.VOCAB - 2, eos_token_id=em.VOCAB - 1,
        decoder_start_token_id=em.VOCAB - 2,
    )
    model = transformers.WhisperForConditionalGeneration(config).eval()
    em.perturb(model, seed)
    return model


def export_whisper_merged_decoder(out_dir: Path) -> dict:
    name = "whisper_merged_decoder"
    model = _build_whisper(name)
    path = out_dir / f"{name}.onnx"
    with _saved(model) as tmp:
        _optimum_export(tmp, "onnx", "automatic-speech-recognition-with-past")
        shutil.copy(f"{tmp}/onnx/decoder_model_merged.onnx", path)
    merged = em.finalize_onnx(path)

    rng = np.random.default_rng(em.seed_for(name) + 10)
    head_dim = em.HIDDEN // WHISPER_HEADS
    kinds = [(i, part, kv) for i in range(WHISPER_LAYERS) for part in ("decoder", "encoder") for kv in ("key", "value")]

    def feeds_for(batch: int, seq: int, past: int, use_cache: bool) -> dict[str, np.ndarray]:
        feeds = {
            "input_ids": rng.integers(0, em.VOCAB, size=(batch, seq), dtype=np.int64),
            "encoder_hidden_states": rng.standard_normal((batch, WHISPER_ENCODER_SEQ, em.HIDDEN)).astype(np.float32),
            "use_cache_branch": np.array([use_cache]),
        }
        for i, part, kv in kinds:
            # Without the cache the past inputs are ignored (optimum feeds a length-1 placeholder).
            length = (past if part == "decoder" else WHISPER_ENCODER_SEQ) if use_cache else 1
            feeds[f"past_key_values.{i}.{part}.{kv}"] = rng.standard_normal((batch, WHISPER_HEADS, length, head_dim)).astype(np.float32)
        return {k: feeds[k] for k in (i.name for i in merged.graph.input)}

    def torch_outputs(feeds) -> dict[str, np.ndarray]:
        """What the branch `use_cache_branch` selects computes: with the cache, the logits and the
        decoder's presents (the merge pads the encoder's, which the cached branch does not make)."""
        use_cache = bool(feeds["use_cache_branch"][0])
        cache = transformers.EncoderDecoderCache(transformers.DynamicCache(), transformers.DynamicCache())
        if use_cache:
            for i in range(WHISPER_LAYERS):
                past = {
                    (part, kv): torch.from_numpy(feeds[f"past_key_values.{i}.{part}.{kv}"])
                    for part in ("decoder", "encoder")
                    for kv in ("key", "value")
                }
                cache.self_attention_cache.update(past["decoder", "key"], past["decoder", "value"], i)
                cache.cross_attention_cache.update(past["encoder", "key"], past["encoder", "value"], i)
                cache.is_updated[i] = True
        with torch.no_grad():
            out = model.model.decoder(
                input_ids=torch.from_numpy(feeds["input_ids"]),
                encoder_hidden_states=torch.from_numpy(feeds["encoder_hidden_states"]),
                past_key_values=cache,
                use_cache=True,
            )
            logits = model.proj_out(out.last_hidden_state)
        result = {"logits": logits.numpy()}
        presents = out.past_key_values
        for i in range(WHISPER_LAYERS):
            self_layer = presents.self_attention_cache.layers[i]
            result[f"present.{i}.decoder.key"], result[f"present.{i}.decoder.value"] = self_layer.keys.numpy(), self_layer.values.numpy()
            if not use_cache:
                cross_layer = presents.cross_attention_cache.layers[i]
                result[f"present.{i}.encoder.key"], result[f"present.{i}.encoder.value"] = cross_layer.keys.numpy(), cross_layer.values.numpy()
        return result

    diffs = _check_merged(name, path, out_dir, feeds_for, torch_outputs)
    note = (
        "WhisperForConditionalGeneration decoder, optimum-cli's decoder_model_merged.onnx "
        "(automatic-speech-recognition-with-past: If on use_cache_branch, branches reuse value names)"
    )
    entry = _entry(name, merged, path, "optimum-onnx (TorchScript) main_export, merged decoder", diffs, note)
    entry["versions"]["optimum-onnx"] = _version("optimum-onnx")
    return entry


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


def _entry(name: str, model: onnx.ModelProto, path: Path, exporter: str, diffs: dict, note: str) -> dict:
    return {
        "file": path.name,
        "inputs_file": f"{name}.inputs.npz",
        "outputs_file": f"{name}.outputs.npz",
        "generator": "models/make/export_decoder_models.py",
        "note": note,
        "exporter": exporter,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "onnx": onnx.__version__},
        "opset": next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
        "inputs": [{"name": i.name, "shape": em.shape_of(i)} for i in model.graph.input],
        "outputs": [o.name for o in model.graph.output],
        "layernorm_count": em.count_op(model, "LayerNormalization"),
        "file_size_bytes": path.stat().st_size,
        "ort_max_abs_diff": diffs,
    }


EXPORTS = {
    "gpt2_kv_cache": export_gpt2_kv_cache,
    "gpt2_merged_decoder": export_gpt2_merged_decoder,
    "whisper_merged_decoder": export_whisper_merged_decoder,
}


def main(argv=None) -> int:
    if os.environ.get("PYTHONHASHSEED") != "0":
        # optimum's merge names the weights it deduplicates in set order: the same bytes every run
        # only with string hashing fixed.
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, "PYTHONHASHSEED": "0"})
    args, out_dir = em.exporter_args(__doc__, EXPORTS, argv)
    manifest_path = out_dir / "manifest.json"
    source = manifest_path if manifest_path.exists() else Path(__file__).resolve().parents[1] / "manifest.json"
    doc = json.loads(source.read_text())
    for name in args.only or sorted(EXPORTS):
        print(f"exporting {name}", flush=True)
        doc["models"][name] = EXPORTS[name](out_dir)
    manifest_path.write_text(json.dumps(doc, indent=2) + "\n")
    shutil.rmtree(out_dir / "__pycache__", ignore_errors=True)
    print(f"wrote {manifest_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
