"""Graphs real exporters produce: the committed models in models/ (made by models/export_models.py)."""

import subprocess
import sys

import numpy as np
import onnx
import pytest

import onnx_lnfold
from conftest import MODELS
from graphs import assert_equivalent, ops
from onnx_lnfold._verify import run_model

# name: (folded, total, fragment of the reason every kept LN gives first)
EXPECTED = {
    "gpt2": (5, 5, None),
    "gpt2_hidden_states": (0, 5, "would change, and it is a graph output"),
    "bert": (1, 5, "is the output of LayerNormalization"),
    "opt_pre_ln": (5, 5, None),
    "opt_post_ln": (0, 4, None),
    "gpt_neox": (5, 5, None),
    "bloom": (1, 6, "is the output of LayerNormalization"),
    "vit": (5, 5, None),
}


@pytest.fixture(scope="module", params=sorted(EXPECTED))
def folded(request):
    name = request.param
    return name, onnx_lnfold.fold(MODELS / f"{name}.onnx")


def test_fold_count_and_reasons(folded):
    name, result = folded
    n_folded, total, reason = EXPECTED[name]
    plan = result.plan
    assert len(plan.decisions) == total
    assert len(plan.folded) == n_folded, [(d.node, d.reason) for d in plan.kept]
    if reason:
        assert all(reason in d.reason for d in plan.kept), [d.reason for d in plan.kept]
    counts = ops(result.model_proto)
    assert counts.get("LayerNormalization", 0) == total - n_folded
    assert counts.get("SimplifiedLayerNormalization", 0) == n_folded


def test_equivalent_at_two_sequence_lengths(folded):
    name, result = folded
    original = onnx.load(MODELS / f"{name}.onnx")
    if result.plan.folded:
        assert result.report.verification.status == "passed"
        assert result.report.verification.max_rel_diff < 1e-5
    assert_equivalent(original, result.model_proto, rtol=1e-5, batch_size=2, sequence_length=8, sequence_length2=5)


def test_folded_model_matches_torch(folded):
    """Against the outputs torch computed at export time, not only against the ONNX original."""
    name, result = folded
    with np.load(MODELS / f"{name}.inputs.npz") as f:
        feeds = {k: f[k] for k in f.files}
    with np.load(MODELS / f"{name}.outputs.npz") as f:
        expected = {k: f[k] for k in f.files}
    got = run_model(result.model_proto.SerializeToString(), feeds)
    for key, ref in expected.items():
        np.testing.assert_allclose(got[key], ref, rtol=0, atol=2e-5 * np.abs(ref).max())


def test_gpt2_tied_lm_head_is_untied():
    result = onnx_lnfold.fold(MODELS / "gpt2.onnx", verify=False)
    untied = [e for e in result.plan.edits if e.untie]
    assert len(untied) == 1
    (edit,) = untied
    assert edit.role == "embedding table" and edit.axis == 1
    assert edit.copy_bytes == 512 * 64 * 4 == result.plan.untied_bytes
    # The LM head still reads the original table.
    head_uses = [n for n in result.model.graph if n.op_type == "Transpose" and n.inputs[0].name == edit.tensor]
    assert head_uses


def test_post_ln_opt_names_the_attention_input():
    plan = onnx_lnfold.fold(MODELS / "opt_post_ln.onnx", verify=False).plan
    first = plan.decisions[0]
    assert "would change, and it feeds MatMul" in first.reason
    assert all("is the output of LayerNormalization" in d.reason for d in plan.decisions[1:])


def test_bert_folds_the_embeddings_layer_norm():
    plan = onnx_lnfold.fold(MODELS / "bert.onnx", verify=False).plan
    assert plan.decisions[0].folded
    assert {e.role for e in plan.edits} == {"embedding table"}


@pytest.mark.slow
def test_export_script_reproduces_a_model(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    subprocess.run(
        [sys.executable, str(MODELS / "export_models.py"), "--only", "gpt2", "--out-dir", str(tmp_path)],
        check=True,
    )
    result = onnx_lnfold.fold(tmp_path / "gpt2.onnx")
    assert len(result.plan.folded) == 5
    assert result.report.verification.status == "passed"
