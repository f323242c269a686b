"""`onnx_lnfold.olive.OnnxLnFold` in real Olive workflows (skipped without `pip install '.[olive]'`)."""

from __future__ import annotations

import os
from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from conftest import MODELS

os.environ.setdefault("OLIVE_DISABLE_TELEMETRY", "1")  # before olive is imported
pytest.importorskip("olive", reason="Olive is not installed: pip install 'onnx_lnfold[olive]'")
from olive.workflows import run as olive_run  # noqa: E402

from onnx_lnfold.olive import package_config  # noqa: E402

CPU = {"local": {"type": "LocalSystem", "accelerators": [{"device": "cpu", "execution_providers": ["CPUExecutionProvider"]}]}}
OPTIMIZE_FOLD_FP16 = {
    "optimize": {"type": "OrtTransformersOptimization", "model_type": "gpt2", "num_heads": 4, "hidden_size": 64},
    "lnfold": {"type": "OnnxLnFold"},
    "fp16": {"type": "OnnxFloatToFloat16", "keep_io_types": True},
}


def run_workflow(input_model: dict, passes: dict, tmp_path) -> onnx.ModelProto:
    config = {
        "input_model": input_model,
        "systems": CPU,
        "host": "local",
        "target": "local",
        "passes": passes,
        "output_dir": str(tmp_path / "out"),
        "cache_dir": str(tmp_path / "cache"),
        "log_severity_level": 3,
    }
    olive_run(config, package_config=package_config())
    return onnx.load(tmp_path / "out" / "model.onnx")


def norm_ops(model: onnx.ModelProto) -> Counter:
    return Counter(n.op_type for n in model.graph.node if "Norm" in n.op_type)


def test_optimize_fold_fp16_workflow(tmp_path):
    out = run_workflow({"type": "ONNXModel", "model_path": str(MODELS / "gpt2.onnx")}, OPTIMIZE_FOLD_FP16, tmp_path)
    assert norm_ops(out) == {"SimplifiedLayerNormalization": 1, "SkipSimplifiedLayerNormalization": 4}
    weights = [t for t in out.graph.initializer if len(t.dims) == 2]
    assert weights and all(t.data_type == onnx.TensorProto.FLOAT16 for t in weights)
    feeds = dict(np.load(MODELS / "gpt2.inputs.npz"))
    (ref,) = ort.InferenceSession(str(MODELS / "gpt2.onnx"), providers=["CPUExecutionProvider"]).run(None, feeds)
    (got,) = ort.InferenceSession(out.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    assert np.abs(got - ref).max() / np.abs(ref).max() < 1e-2  # fp16 rounding, no more


@pytest.mark.slow
def test_export_optimize_fold_fp16_workflow_from_pytorch(tmp_path):
    """The whole pipeline from a transformers checkpoint (built from a config, saved locally)."""
    import torch
    import transformers

    config = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=512, n_positions=128, use_cache=False)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for p in model.parameters():  # off the init: no gamma=1 / beta=0, no zero biases
            p.add_(0.02 * torch.randn_like(p))
    model.save_pretrained(tmp_path / "hf")
    passes = {"export": {"type": "OnnxConversion", "target_opset": 18, "use_dynamo_exporter": True}, **OPTIMIZE_FOLD_FP16}
    out = run_workflow({"type": "HfModel", "model_path": str(tmp_path / "hf"), "task": "text-generation"}, passes, tmp_path)
    assert norm_ops(out) == {"SimplifiedLayerNormalization": 1, "SkipSimplifiedLayerNormalization": 4}
    ids = np.random.default_rng(0).integers(0, 512, size=(2, 8), dtype=np.int64)
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids), "position_ids": np.tile(np.arange(8), (2, 1))}
    feeds = {i.name: feeds[i.name] for i in out.graph.input}
    got = ort.InferenceSession(out.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    with torch.no_grad():
        ref = model(input_ids=torch.from_numpy(ids)).logits.numpy()
    assert np.abs(got - ref).max() / np.abs(ref).max() < 1e-2
