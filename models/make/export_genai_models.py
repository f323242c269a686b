#!/usr/bin/env python
"""Build the decoders of models/genai/ with ONNX Runtime GenAI's model builder, as a user would.

Tiny random-weight Phi-2 and Nemotron checkpoints (LayerNorm, partial rotary embedding; Nemotron
with grouped KV heads) are written with transformers, then `python -m onnxruntime_genai.models.builder`
makes each variant: fp32 and int4 for CPU, fp16 for CUDA (the CUDA builds run on ONNX Runtime's CPU
provider too). Each output folder holds model.onnx, model.onnx.data and genai_config.json.

    pip install onnxruntime-genai==0.18.0 torch==2.13.0 transformers tokenizers
    python models/make/export_genai_models.py [--out-dir models/genai] [--only NAME ...]

Constraints the configs meet: GroupQueryAttention on CPU needs head_size % 16 == 0 and half the
rotary dims a multiple of 8 (head 32, partial rotary 0.5); the vocabulary differs from every Linear's
width (the builder takes a Linear as wide as the vocabulary for the LM head); a tokenizer sits beside
the weights (the builder loads one).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

VARIANTS = {  # output name -> (checkpoint, precision, execution provider)
    "phi2_tiny_fp32_cpu": ("phi2_tiny", "fp32", "cpu"),
    "nemotron_tiny_fp32_cpu": ("nemotron_tiny", "fp32", "cpu"),
    "nemotron_tiny_int4_cpu": ("nemotron_tiny", "int4", "cpu"),
    "phi2_tiny_fp16_cuda": ("phi2_tiny", "fp16", "cuda"),
}
KEEP = ("model.onnx", "model.onnx.data", "genai_config.json")


def checkpoints(folder: Path) -> None:
    """The tiny Phi-2 and Nemotron checkpoints, with LayerNorm weights away from 1 and 0."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import NemotronConfig, NemotronForCausalLM, PhiConfig, PhiForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    common = dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                  max_position_embeddings=128, partial_rotary_factor=0.5, tie_word_embeddings=False,
                  bos_token_id=1, eos_token_id=2)  # fmt: skip
    for name, model in (
        ("phi2_tiny", PhiForCausalLM(PhiConfig(num_key_value_heads=4, layer_norm_eps=1e-5, **common))),
        ("nemotron_tiny", NemotronForCausalLM(NemotronConfig(num_key_value_heads=2, head_dim=32, norm_eps=1e-5, **common))),
    ):
        with torch.no_grad():
            for parameter_name, parameter in model.named_parameters():
                if "norm" in parameter_name:
                    parameter.add_(torch.randn_like(parameter) * 0.1)
        model.eval().save_pretrained(folder / name)
        vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, 512)}}
        tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
        tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
        PreTrainedTokenizerFast(
            tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>", model_max_length=128
        ).save_pretrained(folder / name)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", type=Path, default=Path(__file__).resolve().parents[1] / "genai")
    ap.add_argument("--only", nargs="+", choices=sorted(VARIANTS))
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        checkpoints(work)
        for name in args.only or VARIANTS:
            checkpoint, precision, provider = VARIANTS[name]
            built = work / name
            subprocess.run(
                [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(work / checkpoint), "-o", str(built),
                 "-p", precision, "-e", provider, "-c", str(work / "cache")],
                check=True,
            )  # fmt: skip
            out = args.out_dir / name
            out.mkdir(parents=True, exist_ok=True)
            for file in KEEP:
                (out / file).write_bytes((built / file).read_bytes())
            print(f"{name}: {sum((out / f).stat().st_size for f in KEEP):,} bytes")


if __name__ == "__main__":
    main()
