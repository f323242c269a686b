"""KV-cache decoders as ONNX Runtime GenAI's model builder writes them (GroupQueryAttention with
rotary embedding inside, int4 MatMulNBits; models/genai/, made by models/make/export_genai_models.py):
they fold and verify with no --input-shape, on a prompt and a decode step over a past at two
shapes each, judged in float64 (docs/DESIGN.md section 6)."""

import numpy as np
import onnx_ir as ir
import pytest

import onnx_lnfold
from onnx_lnfold.feeds.kv_cache import kv_cache
from onnx_lnfold.feeds.sets import verification_input_sets
from onnx_lnfold.verify.oracle.reference import Float64Model
from onnx_lnfold.verify.sessions import run_model
from onnx_lnfold.verify.verdict import FLOAT64

from conftest import MODELS
from helpers import run_cli

GENAI = MODELS / "genai"
# name -> (LNs folded by default, LNs, KV heads)
EXPECTED = {
    "phi2_tiny_fp32_cpu": (2, 3, 4),
    "nemotron_tiny_fp32_cpu": (4, 5, 2),
    "nemotron_tiny_int4_cpu": (4, 5, 2),
    "phi2_tiny_fp16_cuda": (2, 3, 4),
}


def _model(name):
    return GENAI / name / "model.onnx"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_kv_cache_is_read_from_the_graph(name):
    """The head size is a symbol of its own (`kv_cache_dim`) the builder shares between the past
    inputs: it comes from the packed QKV projection's width, not from the sequence length."""
    cache = kv_cache(ir.load(_model(name)))
    assert cache is not None and cache.head_size == 32 and cache.heads == EXPECTED[name][2]
    assert cache.masks == ("attention_mask",) and cache.tokens == ("input_ids",) and cache.max_total == 128
    assert sorted(cache.past) == sorted(f"past_key_values.{i}.{kv}" for i in range(2) for kv in ("key", "value"))


def test_the_checks_steps_are_a_prompt_and_a_decode_step_at_two_shapes():
    sets = verification_input_sets(ir.load(_model("phi2_tiny_fp32_cpu")), folder=GENAI / "phi2_tiny_fp32_cpu")
    steps = [(s.kind, s.feeds["input_ids"].shape, s.feeds["past_key_values.0.key"].shape) for s in sets]
    assert steps == [
        ("prompt", (2, 8), (2, 4, 0, 32)),
        ("decode step", (2, 1), (2, 4, 8, 32)),
        ("prompt", (3, 5), (3, 4, 0, 32)),
        ("decode step", (3, 1), (3, 4, 5, 32)),
        ("prompt, realistic scale", (1, 64), (1, 4, 0, 32)),
    ]
    assert all(s.feeds["attention_mask"].shape[1] == s.feeds["input_ids"].shape[1] + s.feeds["past_key_values.0.key"].shape[2] for s in sets)


@pytest.mark.parametrize("name", ["phi2_tiny_fp32_cpu", "nemotron_tiny_int4_cpu", "phi2_tiny_fp16_cuda"])
def test_the_float64_attention_and_int4_matmul_are_onnx_runtimes(name):
    """GroupQueryAttention and MatMulNBits in float64 agree with ONNX Runtime's CPU kernels to
    their rounding on every step, the present KV outputs included."""
    sets = verification_input_sets(ir.load(_model(name)), folder=GENAI / name)
    truths = Float64Model(_model(name)).run_many([s.feeds for s in sets])
    limit = 3e-3 if "fp16" in name else 3e-6
    for s, truth in zip(sets, truths):
        ort = run_model(_model(name), s.feeds)
        for output, expected in truth.items():
            if expected.size:
                worst = np.abs(ort[output].astype(np.float64) - expected).max() / np.abs(expected).max()
                assert worst < limit, (s.kind, output, worst)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_builder_decoders_fold_and_verify_in_float64_by_default(name, tmp_path):
    code, out, err = run_cli(_model(name), "-o", tmp_path / "model.onnx")
    assert code == 0, err
    folded, total, _ = EXPECTED[name]
    assert f"{folded}/{total} LayerNorms folded" in out.splitlines()[0]
    assert "verified (in float64" in out.splitlines()[0]
    text = " ".join(out.split())
    assert "batch 2, 1 new token, past 8 [decode step]" in text and "batch 2, 8 new tokens, past 0 [prompt]" in text


def test_the_int4_verdict_rests_on_float64_whatever_the_shapes():
    """With int4 weights the kernel rounds its inputs (accuracy_level 4): the verdict is taken in
    float64, where the fold is exact, on the default steps and on shapes of the user's alike."""
    for shapes in (None, {"input_ids": (1, 3), "attention_mask": (1, 3), **{
        f"past_key_values.{i}.{kv}": (1, 2, 0, 32) for i in range(2) for kv in ("key", "value")}}):
        # At the user's 3 tokens no fold pays (the cost rule prices each LN there): fold them anyway
        result = onnx_lnfold.fold(_model("nemotron_tiny_int4_cpu"), input_shapes=shapes, fold_costly=shapes is not None)
        assert result.plan.folded
        verification = result.report.verification
        assert verification.passed and verification.judgment == FLOAT64
        assert max(o.exact for o in verification.outputs) < 1e-12
