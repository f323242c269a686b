"""The folded models in OpenVINO (CPU plugin), as a user runs them: every target's output loads,
runs the function of the original (f32 inference precision: OpenVINO's default on CPUs with
bf16 units is bf16), and its RMSNorms run as OpenVINO's own RMS kernel (docs/DESIGN.md section 4).

Needs `openvino` (in the `test` extra: CI installs it); skipped without it. The timings are
`python -m benchmarks.runtimes` (benchmarks/results/runtimes/)."""

import numpy as np
import onnxruntime as ort
import pytest

import onnx_lnfold

from conftest import MODELS

ov = pytest.importorskip("openvino")

F32 = {"INFERENCE_PRECISION_HINT": "f32"}
TARGETS = ["ort", "onnx", "primitive"]


def _compiled(path, config=F32):
    return ov.Core().compile_model(str(path), "CPU", config)


def _layer_types(compiled) -> list[str]:
    """The kernels OpenVINO's CPU plugin runs, after its own fusions."""
    return [op.get_rt_info()["layerType"].astype(str) for op in compiled.get_runtime_model().get_ops()]


def _max_rel(outputs, reference) -> float:
    return max(float(np.abs(np.asarray(o, np.float64) - r).max() / np.abs(r).max()) for o, r in zip(outputs, reference))


@pytest.mark.parametrize("name", ["gpt2", "vit", "whisper_encoder"])
@pytest.mark.parametrize("target", TARGETS)
def test_each_target_loads_runs_exactly_and_fuses_rms_in_openvino(tmp_path, name, target):
    source = MODELS / f"{name}.onnx"
    feeds = dict(np.load(MODELS / f"{name}.inputs.npz"))
    reference = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"]).run(None, feeds)
    original = _compiled(source)
    assert "RMS" not in _layer_types(original)
    out = tmp_path / f"{name}.{target}.onnx"
    # The image and audio stand-ins priced at a batch of 512: per item (17 / 32 tokens) their
    # centerings do not pay, and this test is about how OpenVINO runs the folds.
    shapes = {"vit": {"pixel_values": (512, 3, 32, 32)}, "whisper_encoder": {"input_features": (512, 16, 64)}}.get(name)
    result = onnx_lnfold.fold(source, target=target, input_shapes=shapes)
    result.save(out)
    folded = _compiled(out)
    types = _layer_types(folded)
    assert types.count("RMS") == len(result.plan.folded) == 5, types
    assert "MVN" not in types  # OpenVINO's LayerNorm kernel: none left
    got = folded(feeds)
    outputs = [got[folded.outputs[i]] for i in range(len(reference))]
    assert _max_rel(outputs, reference) < 1e-5


def test_skip_simplified_layer_normalization_loads_and_fuses_too(tmp_path):
    """`--fuse-residual always`: 4 SkipSimplifiedLayerNormalization (their output 3 the residual sum
    the next block reads) and one SimplifiedLayerNormalization, all OpenVINO RMS kernels."""
    source = MODELS / "gpt2.onnx"
    feeds = dict(np.load(MODELS / "gpt2.inputs.npz"))
    out = tmp_path / "gpt2.skip.onnx"
    result = onnx_lnfold.fold(source, fuse_residual="always")
    assert sum(d.rewrite.endswith("SkipSimplifiedLayerNormalization") for d in result.plan.folded) == 4
    result.save(out)
    folded = _compiled(out)
    assert _layer_types(folded).count("RMS") == 5
    reference = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"]).run(None, feeds)
    assert _max_rel([folded(feeds)[folded.outputs[0]]], reference[:1]) < 1e-5


def test_the_default_precision_runs_the_fold_within_its_own_noise(tmp_path):
    """OpenVINO's default inference precision (bf16 where the CPU has bf16 units; measured on a
    Xeon with avx512_bf16: the original 7.2e-3 from its f32 run, each target's fold 6.8e-3): the
    fold is no further from the original's f32 run than twice the original's own distance."""
    source = MODELS / "gpt2.onnx"
    feeds = dict(np.load(MODELS / "gpt2.inputs.npz"))
    truth = [_compiled(source)(feeds)[0].astype(np.float64)]
    noise = _max_rel([_compiled(source, {})(feeds)[0]], truth)
    for target in TARGETS:
        out = tmp_path / f"gpt2.{target}.onnx"
        onnx_lnfold.fold(source, target=target).save(out)
        assert _max_rel([_compiled(out, {})(feeds)[0]], truth) <= max(2 * noise, 1e-5), target
