"""Read a CTranslate2 Whisper ``model.bin`` into a transformers ``WhisperForConditionalGeneration``.

CTranslate2 stores a model as one binary file written by ``ModelSpec._serialize``
(``python/ctranslate2/specs/model_spec.py`` in OpenNMT/CTranslate2; read back by
``src/models/model.cc``), all little-endian:

* ``uint32`` binary version (6 today), the spec name (a string), ``uint32`` spec revision;
* ``uint32`` number of variables, then per variable: its name (a string), ``uint8`` rank,
  ``uint32`` per dimension, ``uint8`` dtype id (0 float32, 1 int8, 2 int16, 3 int32,
  4 float16, 5 bfloat16), ``uint32`` byte count, the bytes;
* ``uint32`` number of aliases, then per alias two strings (alias, aliased variable).

A string is a ``uint16`` length that counts a trailing NUL, then the bytes and the NUL.

The Whisper layout is the one ``ctranslate2.converters.transformers.WhisperLoader`` writes from
a transformers model (BartLoader's layers): self-attention ``linear_0`` is q, k and v fused along
the output axis (k has no bias in Whisper, so its third of the fused bias is zero),
cross-attention ``linear_0`` is q and ``linear_1`` is k and v fused, the last linear is the
output projection; queries are not pre-scaled. This module inverts that mapping.
"""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import numpy as np

_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}


def read_ct2_variables(path: str | Path) -> tuple[str, int, dict[str, np.ndarray]]:
    """(spec name, spec revision, {variable name: array}); aliases resolved to their array."""
    data = Path(path).read_bytes()
    offset = 0

    def take(fmt: str):
        nonlocal offset
        (value,) = struct.unpack_from("<" + fmt, data, offset)
        offset += struct.calcsize("<" + fmt)
        return value

    def take_string() -> str:
        nonlocal offset
        length = take("H")
        text = data[offset : offset + length - 1].decode("utf-8")
        offset += length
        return text

    version = take("I")
    if version < 5:
        raise ValueError(f"{path}: CTranslate2 binary version {version}; this reader knows versions 5 and 6")
    spec_name = take_string()
    revision = take("I")
    variables: dict[str, np.ndarray] = {}
    for _ in range(take("I")):
        name = take_string()
        shape = [take("I") for _ in range(take("B"))]
        dtype_id = take("B")
        num_bytes = take("I")
        if dtype_id not in _DTYPES:
            raise ValueError(f"{path}: variable {name} has dtype id {dtype_id} (bfloat16 is not read here)")
        array = np.frombuffer(data, dtype=_DTYPES[dtype_id], count=num_bytes // np.dtype(_DTYPES[dtype_id]).itemsize,
                              offset=offset)
        variables[name] = array.reshape(shape).copy()
        offset += num_bytes
    for _ in range(take("I")):
        alias = take_string()
        variables[alias] = variables[take_string()]
    if offset != len(data):
        raise ValueError(f"{path}: {len(data) - offset} trailing bytes after the aliases")
    return spec_name, revision, variables


def _count_layers(variables: dict[str, np.ndarray], stack: str) -> int:
    return len({match[1] for name in variables if (match := re.match(rf"{stack}/layer_(\d+)/", name))})


def whisper_config(variables: dict[str, np.ndarray], ct2_config: dict):
    """The transformers WhisperConfig of a CTranslate2 Whisper model (sizes read off the weights)."""
    import transformers

    vocab_size, d_model = variables["decoder/embeddings/weight"].shape
    num_mel_bins = variables["encoder/conv1/weight"].shape[1]
    ffn_dim = variables["encoder/layer_0/ffn/linear_0/weight"].shape[0]
    # Whisper's multilingual vocabulary has 51865 tokens, the English-only one 51864; only the
    # English-only models start the decoder with <|startoftranscript|> = 50257 and end with 50256.
    english_only = vocab_size == 51864
    return transformers.WhisperConfig(
        vocab_size=vocab_size,
        num_mel_bins=num_mel_bins,
        d_model=d_model,
        encoder_layers=_count_layers(variables, "encoder"),
        decoder_layers=_count_layers(variables, "decoder"),
        encoder_attention_heads=int(variables["encoder/num_heads"]),
        decoder_attention_heads=int(variables["decoder/num_heads"]),
        encoder_ffn_dim=ffn_dim,
        decoder_ffn_dim=variables["decoder/layer_0/ffn/linear_0/weight"].shape[0],
        max_source_positions=variables["encoder/position_encodings/encodings"].shape[0],
        max_target_positions=variables["decoder/position_encodings/encodings"].shape[0],
        activation_function="gelu",
        scale_embedding=bool(variables["decoder/scale_embeddings"]),
        tie_word_embeddings=True,
        bos_token_id=50257,
        eos_token_id=50256,
        pad_token_id=50256,
        decoder_start_token_id=50257 if english_only else 50258,
        suppress_tokens=ct2_config.get("suppress_ids"),
        begin_suppress_tokens=ct2_config.get("suppress_ids_begin"),
    )


def _split_rows(array: np.ndarray, parts: int) -> list[np.ndarray]:
    return np.split(array, parts, axis=0)


def whisper_state_dict(variables: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """transformers WhisperForConditionalGeneration state dict (float32) from CTranslate2 variables."""
    state: dict[str, np.ndarray] = {}

    def put(name: str, value: np.ndarray) -> None:
        state[name] = np.asarray(value, dtype=np.float32)

    def linear(hf: str, ct2: str, bias: bool = True) -> None:
        put(f"{hf}.weight", variables[f"{ct2}/weight"])
        if bias:
            put(f"{hf}.bias", variables[f"{ct2}/bias"])

    def layer_norm(hf: str, ct2: str) -> None:
        put(f"{hf}.weight", variables[f"{ct2}/gamma"])
        put(f"{hf}.bias", variables[f"{ct2}/beta"])

    def attention(hf: str, ct2: str, fused_qkv: bool) -> None:
        if fused_qkv:
            weights = _split_rows(variables[f"{ct2}/linear_0/weight"], 3)
            biases = _split_rows(variables[f"{ct2}/linear_0/bias"], 3)
            out = "linear_1"
        else:
            weights = [variables[f"{ct2}/linear_0/weight"], *_split_rows(variables[f"{ct2}/linear_1/weight"], 2)]
            biases = [variables[f"{ct2}/linear_0/bias"], *_split_rows(variables[f"{ct2}/linear_1/bias"], 2)]
            out = "linear_2"
        if np.any(biases[1]):
            raise ValueError(f"{ct2}: the key projection has a non-zero bias; Whisper's k_proj has none")
        for proj, weight, bias in zip(("q_proj", "k_proj", "v_proj"), weights, biases):
            put(f"{hf}.{proj}.weight", weight)
            if proj != "k_proj":
                put(f"{hf}.{proj}.bias", bias)
        linear(f"{hf}.out_proj", f"{ct2}/{out}")

    def layers(hf_stack: str, stack: str, cross_attention: bool) -> None:
        """Every layer of the encoder or decoder stack; the decoder's attend to the encoder too."""
        for i in range(_count_layers(variables, stack)):
            hf, ct2 = f"{hf_stack}.layers.{i}", f"{stack}/layer_{i}"
            attention(f"{hf}.self_attn", f"{ct2}/self_attention", fused_qkv=True)
            layer_norm(f"{hf}.self_attn_layer_norm", f"{ct2}/self_attention/layer_norm")
            if cross_attention:
                attention(f"{hf}.encoder_attn", f"{ct2}/attention", fused_qkv=False)
                layer_norm(f"{hf}.encoder_attn_layer_norm", f"{ct2}/attention/layer_norm")
            linear(f"{hf}.fc1", f"{ct2}/ffn/linear_0")
            linear(f"{hf}.fc2", f"{ct2}/ffn/linear_1")
            layer_norm(f"{hf}.final_layer_norm", f"{ct2}/ffn/layer_norm")
        layer_norm(f"{hf_stack}.layer_norm", f"{stack}/layer_norm")

    enc, dec = "model.encoder", "model.decoder"
    linear(f"{enc}.conv1", "encoder/conv1")
    linear(f"{enc}.conv2", "encoder/conv2")
    put(f"{enc}.embed_positions.weight", variables["encoder/position_encodings/encodings"])
    layers(enc, "encoder", cross_attention=False)

    put(f"{dec}.embed_tokens.weight", variables["decoder/embeddings/weight"])
    put(f"{dec}.embed_positions.weight", variables["decoder/position_encodings/encodings"])
    layers(dec, "decoder", cross_attention=True)
    put("proj_out.weight", variables["decoder/projection/weight"])
    return state


def load_whisper(model_dir: str | Path):
    """WhisperForConditionalGeneration (float32, eval, eager attention) from a CTranslate2 model directory."""
    import torch
    import transformers

    model_dir = Path(model_dir)
    spec_name, _, variables = read_ct2_variables(model_dir / "model.bin")
    if spec_name != "WhisperSpec":
        raise ValueError(f"{model_dir}: spec {spec_name}, not WhisperSpec")
    ct2_config = json.loads((model_dir / "config.json").read_text())
    for flag in ("decoder/pre_norm", "decoder/alibi", "decoder/start_from_zero_embedding"):
        expected = flag == "decoder/pre_norm"
        if flag in variables and bool(variables[flag]) != expected:
            raise ValueError(f"{model_dir}: {flag} is {bool(variables[flag])}; Whisper has {expected}")
    config = whisper_config(variables, ct2_config)
    config._attn_implementation = "eager"
    model = transformers.WhisperForConditionalGeneration(config).eval()
    state = {name: torch.from_numpy(value) for name, value in whisper_state_dict(variables).items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    # proj_out is tied to embed_tokens, so it may be reported either way.
    missing = [name for name in missing if name != "proj_out.weight"]
    if missing or unexpected:
        raise ValueError(f"{model_dir}: state dict mismatch: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    return model
