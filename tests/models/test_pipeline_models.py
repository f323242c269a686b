"""What deployment pipelines hand the fold: fp16-converted, shape-inferred, ORT-optimized and
TorchScript models (committed in models/ by models/make/export_pipeline_models.py)."""

import json

import numpy as np
import onnx
import pytest

import onnx_lnfold
from onnx_lnfold.core.fold_request import FoldRequest
from onnx_lnfold.core.options import CheckSettings
from onnx_lnfold.load.model import load_path
from onnx_lnfold.verify.sessions import compare, run_model

from conftest import MODELS
from graphs import assert_fold_count, ops

# name: (folded, total, fragment of the reason every kept LN gives). LNs whose beta would stay an
# Add over the stream (it feeds a Conv, a Pad, the next LN, a bias-free head) are kept: that Add
# costs ONNX Runtime more than the LN saves (code "costs-more", docs/DESIGN.md section 4.1). ORT
# fuses none of these models' residual Adds with their LN (its shape inference cannot name their
# dims), so their final LNs are plain LNs too.
COSTS_MORE = "costs more than LayerNormalization on ONNX Runtime's CPU EP"
EXPECTED = {
    "opt_fp16": (8, 9, COSTS_MORE),  # the final LN, before the tied LM head
    "gpt2_fp16": (8, 9, COSTS_MORE),  # ln_f
    "gpt2_inferred": (8, 9, COSTS_MORE),  # ln_f
    "vit_fp16": (8, 9, COSTS_MORE),  # the final LN (a graph output)
    # The vision tower starts at pre_layrnorm's output: one explicit centering there, in fp16.
    # pre_layrnorm itself, the text model's final LN and post_layernorm (before the bias-free
    # projection) are kept.
    # Its vision LNs' batch dim is left open by ONNX inference even with the inputs given: priced
    # per item (17 tokens), where the vision tower's centering does not pay (was 16 at 8192 tokens).
    "clip_fp16": (8, 19, None),
    "gpt2_eager_ort_opt0": (9, 9, None),
    # As clip_fp16, but one LN feeds ORT's fused Attention (no bias from it) where the text
    # model's final LN folds.
    "clip_ort": (16, 19, COSTS_MORE),
    "vit_torchscript": (8, 9, COSTS_MORE),
    # Stage 1 reads the embeddings LN's output (kept: its beta feeds the next LN) and feeds patch
    # merging, whose Concat along the channels no shift survives; the merging LN reads that
    # Concat; two LNs feed a Pad; the final LN.
    "swin_torchscript": (2, 11, None),
    # The patch-embedding LNs feed the next LN or a Reshape: kept; the blocks behind them read their
    # outputs, which a centering would unlock only for LNs whose fold does not pay for it.
    "segformer_torchscript": (1, 9, None),
    # Folded at its committed inputs (16 and 12 tokens), where the cost rule prices its LNs: the
    # explicit centerings that unlock its post-LN streams do not pay there (a node's dispatch weighs
    # most at few tokens), so every LN stays; at 64 tokens and more 11 of 14 fold (the test below).
    "mbart_torchscript": (0, 14, None),
    # One explicit centering of the sum `projection + GELU(grouped positional conv)` unlocks the
    # encoder; the feature projection LN reads the conv stem's GELU output (it alone would gain);
    # the conv stem's LNs feed a Transpose: kept.
    "wav2vec2_stable": (8, 12, None),
}
NORMALIZATIONS = ("LayerNormalization", "SkipLayerNormalization")
RMS = ("SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization")


def _feeds(name: str, which: str) -> dict[str, np.ndarray]:
    with np.load(MODELS / f"{name}.{which}.npz") as f:
        return {k: f[k] for k in f.files}


def _is_fp16(model: onnx.ModelProto) -> bool:
    return any(t.data_type == onnx.TensorProto.FLOAT16 for t in model.graph.initializer)


def test_every_pipeline_model_is_listed():
    manifest = json.loads((MODELS / "pipeline_manifest.json").read_text())
    assert sorted(manifest["models"]) == sorted(EXPECTED)


@pytest.fixture(scope="module", params=sorted(EXPECTED))
def folded(request):
    name = request.param
    return name, onnx_lnfold.fold(MODELS / f"{name}.onnx", inputs=_feeds(name, "inputs"))


def test_fold_count_and_reasons(folded):
    name, result = folded
    n_folded, total, reason = EXPECTED[name]
    plan = result.plan
    assert_fold_count(plan, n_folded, total)
    for d in plan.kept:
        assert d.reason and "unknown" not in d.reason, (d.node, d.reason)  # shapes never the obstacle
        assert "does not keep the normalized axis whole" not in d.reason, (d.node, d.reason)
        if reason:
            assert reason in d.reason, (d.node, d.reason)
    counts = ops(result.model_proto)
    assert sum(counts.get(op, 0) for op in NORMALIZATIONS) == total - n_folded
    assert sum(counts.get(op, 0) for op in RMS) == n_folded
    assert result.report.verification.status == ("passed" if n_folded else "skipped")


def test_mbart_folds_through_its_centerings_at_a_deployment_length():
    """At 64 tokens (and the default 8192) the centerings pay: 11 of 14 fold, the embeddings LNs
    (their beta feeds the next LN) and the decoder's final LN stay for their cost. (The encoder's
    embeddings LN reads a sum whose batch dim ONNX inference leaves open, positions broadcast over
    it: priced at the default, and its reason says so.)"""
    shapes = {"input_ids": (1, 64), "decoder_input_ids": (1, 64)}
    result = onnx_lnfold.fold(MODELS / "mbart_torchscript.onnx", input_shapes=shapes)
    assert_fold_count(result.plan, 11, 14)
    assert all(COSTS_MORE in d.reason for d in result.plan.kept)
    assert [d.priced_at for d in result.plan.kept] == [
        "at 8192 tokens (the default)", "at 64 tokens (the given inputs)", "at 64 tokens (the given inputs)"]
    assert result.report.verification.status == "passed"


def test_equivalent_at_two_input_sizes(folded):
    """Original and folded model in ONNX Runtime on the two committed input sets (batch 2 and 3,
    different sequence or audio lengths), held to the tolerance of the model's dtype."""
    name, result = folded
    original = onnx.load(MODELS / f"{name}.onnx")
    rtol = 1e-2 if _is_fp16(original) else 1e-5
    sizes = set()
    for which in ("inputs", "inputs_alt"):
        feeds = _feeds(name, which)
        sizes.add(tuple(v.shape for v in feeds.values()))
        ref = run_model(original.SerializeToString(), feeds)
        got = run_model(result.model_proto.SerializeToString(), feeds)
        for diff in compare(ref, got):
            assert diff.rel_diff <= rtol, (name, which, diff)
    assert len(sizes) == 2


def test_fp16_models_fold_as_fully_as_their_fp32_export():
    """The fp16 converter's value_info (dims `unk__N`) must not hide what the graph computes."""
    for fp16, fp32 in (("gpt2_fp16", "gpt2_inferred"),):
        a = onnx_lnfold.fold(MODELS / f"{fp16}.onnx", verify=False).plan
        b = onnx_lnfold.fold(MODELS / f"{fp32}.onnx", verify=False).plan
        assert [d.node for d in a.folded] == [d.node for d in b.folded]


def test_ort_optimized_torchscript_bert_gives_the_post_ln_reason():
    """Issue: its SkipLayerNorms were kept because "the ranks of its input and skip are unknown"
    (ONNX inference stops at EmbedLayerNormalization); ORT's symbolic inference knows them."""
    plan = onnx_lnfold.fold(MODELS / "bert_torchscript_ort_opt1.onnx", verify=False, auxiliary_centering=False).plan
    skips = [d for d in plan.kept if d.op_type.endswith("SkipLayerNormalization")]
    assert len(skips) == 4
    for d in skips:
        assert "whose gamma*n+beta has a data-dependent mean" in d.reason, d.reason


def test_flatten2_is_followed_without_an_explicit_centering():
    """TorchScript's flatten(2) with every pixel dim dynamic: the patch conv is centered, where
    the Reshape used to stop the proof and cost an explicit centering of its output."""
    plan = onnx_lnfold.fold(MODELS / "vit_torchscript.onnx", verify=False).plan
    assert not plan.centerings
    assert any(e.role == "Conv weight" for e in plan.edits)


def test_the_pipeline_runs_full_collections_per_phase_and_restores_the_collector():
    import gc

    from onnx_lnfold._pipeline import collecting_per_phase

    before = gc.get_threshold()
    with pytest.raises(RuntimeError), collecting_per_phase():
        assert gc.get_threshold()[:2] == before[:2] and gc.get_threshold()[2] > before[2]
        raise RuntimeError
    assert gc.get_threshold() == before


def test_the_model_is_frozen_while_folding_unless_objects_are_frozen_already(monkeypatch):
    """The objects alive when the fold starts are left out of the collections while it runs, and
    thawed after; a process that froze objects of its own keeps them as they were."""
    import gc

    from onnx_lnfold import _pipeline

    seen: list[int] = []
    real = _pipeline._run_pipeline
    monkeypatch.setattr(_pipeline, "_run_pipeline", lambda *a, **k: seen.append(gc.get_freeze_count()) or real(*a, **k))
    model = load_path(MODELS / "gpt2.onnx")
    assert gc.get_freeze_count() == 0
    _pipeline.run_pipeline(model, None, FoldRequest(check=CheckSettings(verify=False)))
    assert seen[0] > 0 and gc.get_freeze_count() == 0
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        _pipeline.run_pipeline(model, None, FoldRequest(check=CheckSettings(verify=False)))
        assert seen[1] == frozen and gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()


def test_what_outlives_a_phase_is_frozen_where_the_fold_froze_the_heap_only(monkeypatch):
    """After a phase's full collection, what survived is frozen too where the fold froze the heap
    itself (the next phase's collection walks only what it made), and thawed when it ends; a
    process that froze objects of its own gets nothing more frozen."""
    import gc

    from onnx_lnfold import _pipeline

    monkeypatch.setattr(_pipeline, "_FULL_COLLECTION_AFTER", -1)  # every phase collects
    with _pipeline._frozen_while_folding():
        before = gc.get_freeze_count()
        made = [[] for _ in range(1000)]
        _pipeline._phase_done()
        assert gc.get_freeze_count() >= before + len(made)
    assert gc.get_freeze_count() == 0
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with _pipeline._frozen_while_folding():
            more = [[] for _ in range(1000)]
            _pipeline._phase_done()
            assert gc.get_freeze_count() == frozen and more
    finally:
        gc.unfreeze()
