"""The report as a user reads it: the summary line, grouped reasons, wording, and the JSON fields."""

import json
import os
import re

import onnx_ir as ir
import pytest

import onnx_lnfold
from onnx_lnfold import _pipeline
from onnx_lnfold.analysis.plan import LnDecision
from onnx_lnfold.core.blocked import CODES, Blocked
from onnx_lnfold.core.options import FoldOptions
from onnx_lnfold.load.model import load_path
from onnx_lnfold.report.fold_report import FoldReport, count_ops
from onnx_lnfold.report.kept import explain_kept
from onnx_lnfold.report.trace import NAMED_OPS, explain
from onnx_lnfold.verify.verdict import FLOAT64, OutputDiff, Verification

from conftest import MODELS
from hostile_models import identity_chain


def _report(name: str, options: dict | None = None, **fields) -> FoldReport:
    model = load_path(MODELS / name)
    ops = count_ops(model)
    plan = onnx_lnfold.analyze(model, **(options or {}))
    verification = fields.pop("verification", Verification("skipped", "dry run: nothing was changed"))
    return FoldReport(plan, ops, ops, verification, source=name, **fields)


def _passed(rel: float = 3.7e-7) -> Verification:
    return Verification("passed", "", 1e-4, {"input_ids": [2, 8]}, [OutputDiff("logits", (2, 8, 64), rel, 1.0)])


def test_summary_line_comes_first_with_lns_sizes_verdict_and_time():
    report = _report("gpt2.onnx", verification=_passed(), size_before=327_654_321, size_after=482_043_825, elapsed_s=12.34)
    report.output = "gpt2.lnfold.onnx"
    first = report.format_text().splitlines()[0]
    assert first == (
        "onnx_lnfold: gpt2.onnx -> gpt2.lnfold.onnx, 5/5 LayerNorms folded at 8192 tokens (the default guess; "
        "--input-shape or --inputs sets it), 328 -> 482 MB, "
        "verified (worst relative diff 3.7e-07), 12.3 s"
    )


def test_summary_line_of_a_failed_and_of_a_dry_run():
    failed = Verification("failed", "output 'logits' differs", 1e-15, {}, [OutputDiff("logits", (2,), 3e-7, 1.0)])
    line = _report("gpt2.onnx", verification=failed, size_before=860_897).format_summary()
    assert "(nothing written)" in line and "verification FAILED (worst relative diff 3e-07 > rtol 1e-15)" in line
    dry = _report("gpt2.onnx", {"tied_weights": "untie"}, dry_run=True, size_before=860_897)
    assert dry.format_summary() == (
        "onnx_lnfold: gpt2.onnx (dry run, nothing written), would fold 5/5 LayerNorms at 8192 tokens (the default "
        "guess; --input-shape or --inputs sets it), "
        "0.86 MB (+0.13 MB once written), verification skipped (dry run)"
    )
    assert "LayerNorm nodes: 5 would fold, 0 kept (of 5)" in dry.format_text()
    assert "Verification: skipped (dry run: nothing was changed)" in dry.format_text()


def test_summary_line_names_the_deciding_shape_and_the_flag_for_a_guess():
    guessed = _report("gpt2.onnx").format_summary()
    assert "5/5 LayerNorms folded at 8192 tokens (the default guess; --input-shape or --inputs sets it)" in guessed
    given = _report("gpt2.onnx", {"input_shapes": {"input_ids": (1, 64)}}).format_summary()
    assert "5/5 LayerNorms folded at 64 tokens (the given inputs), " in given and "guess" not in given
    # Nothing priced (no LN the cost rule looked at): no shape named.
    assert " at " not in _report("keras_ln_axis1_3d.onnx").format_summary().split(", ")[1]


def test_json_names_the_figure_the_verdict_rests_on():
    """The summary's figure is in the JSON under its own name: in float64, the fold as written vs
    the reference, which is not `max_rel_diff` (the fold vs the original in ONNX Runtime)."""
    diff = OutputDiff("logits", (2, 8, 64), 4.7e-7, 1.0, exact=1e-16, written=2.8e-8, original_error=4e-7, fold_error=4e-7)
    in_float64 = Verification("passed", "", 1e-4, {"input_ids": [2, 8]}, [diff], judgment=FLOAT64)
    report = _report("gpt2.onnx", verification=in_float64)
    data = report.to_dict()["verification"]
    assert data["max_rel_diff"] == pytest.approx(4.7e-7) and data["verdict_rel_diff"] == pytest.approx(2.8e-8)
    assert data["verdict_figure"].startswith("outputs[].float64_written")
    assert "in float64, worst relative diff 2.8e-08" in report.format_summary()
    without = _report("gpt2.onnx", verification=_passed()).to_dict()["verification"]
    assert without["verdict_rel_diff"] == without["max_rel_diff"] and without["verdict_figure"].startswith("max_rel_diff")


def test_every_refusal_says_nothing_written_the_same_way():
    """A failed check and one that could not run both refuse the fold: the summary says so alike."""
    failed = Verification("failed", "output 'logits' differs", 1e-4, {}, [OutputDiff("logits", (2,), 1.0, 1.0)])
    unverified = Verification("unverified", "onnxruntime is not installed", 1e-4, way_out="install")
    lines = [_report("gpt2.onnx", verification=v).format_summary() for v in (failed, unverified)]
    assert [line.split(", ")[0] for line in lines] == ["onnx_lnfold: gpt2.onnx (nothing written)"] * 2
    assert lines[1].endswith("not verified (the check could not run)")


def test_nothing_folded_summary_and_detail_agree_on_verification():
    skipped = Verification("skipped", "nothing was folded: the model is unchanged")
    text = _report("opt_post_ln.onnx", {"auxiliary_centering": False}, verification=skipped).format_text()
    assert "0/4 LayerNorms folded" in text.splitlines()[0]
    assert text.splitlines()[0].endswith("verification skipped (nothing was folded)")
    assert "Verification: skipped (nothing was folded: the model is unchanged)" in text


def test_node_totals_then_the_ops_that_changed():
    report = _report("gpt2.onnx")
    report.ops_after = {**report.ops_before, "LayerNormalization": 0, "SimplifiedLayerNormalization": 5}
    text = report.format_text()
    before = sum(report.ops_before.values())
    assert f"Nodes: {before} -> {before}; LayerNormalization 5 -> 0; SimplifiedLayerNormalization 0 -> 5" in text


def test_already_folded_model_says_so():
    folded = onnx_lnfold.fold(MODELS / "gpt2.onnx", verify=False)
    again = onnx_lnfold.fold(folded.model_proto, verify=False).report
    again.output, again.output_identical = "again.onnx", True  # the input file's bytes (the CLI)
    text = again.format_text()
    assert "already folded (5 SimplifiedLayerNormalization)" in text.splitlines()[0]
    assert "(unchanged copy)" in text.splitlines()[0]
    assert "Wrote again.onnx (an unchanged copy of the input: nothing was folded)" in text
    again.output_identical = False  # re-serialized (result.save(), or a model with external data)
    text = again.format_text()
    assert "(equivalent copy)" in text.splitlines()[0]
    assert "Wrote again.onnx (an equivalent copy of the input, re-serialized: nothing was folded)" in text


def test_identical_reasons_are_grouped_under_plain_words_in_graph_order():
    # without explicit centerings, the four post-LN LNs are kept for one reason
    text = _report("bert.onnx", {"auxiliary_centering": False}).format_text()
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("  4 kept: (normalization-output) post-LN: each"))
    members = [line.split()[0] for line in lines[header + 2 : header + 6]]
    assert members == ["node_layer_norm_1", "node_layer_norm_2", "node_layer_norm_3", "node_layer_norm_4"]
    assert "node_layer_norm_1  reads 'layer_norm', the output of LayerNormalization 'node_layer_norm'" in text
    assert text.count("post-LN") == 1


def _kept(reason: str, stage: str, code: str) -> LnDecision:
    return LnDecision("ln", "LayerNormalization", "kept", 2, 1e-5, blocked=Blocked(code, reason, stage=stage))


def test_lns_kept_for_one_code_share_its_meaning_as_heading_and_keep_their_own_reason():
    why = "Cast '{}' narrows to FLOAT16, whose rounding does not commute with centering"
    a = explain_kept(_kept(why.format("c1"), "proof", "narrowing-cast"))
    b = explain_kept(_kept(why.format("c2"), "proof", "narrowing-cast"))
    assert a[0] == b[0] == f"(narrowing-cast) {CODES['narrowing-cast']}"
    assert a[1] == why.format("c1") and b[1] == why.format("c2")  # no detail given: the whole reason


def test_headlines_are_chosen_by_stage_and_code_not_by_wording_alone():
    """A side effect and a broken proof can share a code (one carry rule answers both directions):
    the stage tells them apart, and a sentence shaped like another step's does not borrow its
    headline."""
    side = explain_kept(_kept("tensor 'h' would change, and it feeds Relu 'r', which does not pass a mean shift through", "side-effect", "not-carried"))
    proof = explain_kept(_kept("tensor 'h' comes from a node that breaks the chain: Relu 'r' does not carry a zero mean", "proof", "not-carried"))
    assert side[0] == "(not-carried) centering would change a tensor read where the change matters"
    assert proof[0] == f"(not-carried) {CODES['not-carried']}"
    misfiled = explain_kept(_kept("tensor 'h' would change, and it is a graph output", "proof", "graph-output"))
    assert misfiled[0] == f"(graph-output) {CODES['graph-output']}"


def test_each_ln_line_is_its_refusals_own_detail_not_a_parse_of_its_reason():
    """The analysis hands the report the words that are this LN's own: the report never takes
    them out of the sentence (whose wording may change)."""
    blocked = Blocked("graph-input", "any wording at all", "x", stage="proof", detail="'x'")
    decision = LnDecision("ln", "LayerNormalization", "kept", 2, 1e-5, blocked=blocked)
    assert explain_kept(decision) == ("(graph-input) the input is a graph input: its mean depends on the data", "'x'")


def test_long_lines_wrap_at_100_columns():
    text = _report("convnext_block.onnx").format_text()
    assert "(centering-costs-more)" in text and "would unlock 1 LN" in text
    assert max(len(line) for line in text.splitlines()[1:]) <= 100


@pytest.mark.parametrize("name,phrase", [("gpt2.onnx", "(1 untied copy,"), ("bert.onnx", "(0 untied copies,")])
def test_untied_copy_count_is_singular_or_plural(name, phrase):
    assert phrase in _report(name, {"tied_weights": "untie"}).format_text()


def test_json_carries_versions_absolute_paths_and_elapsed(monkeypatch):
    import onnxruntime  # the one verification ran with: the report names the loaded module's version

    monkeypatch.chdir(MODELS)
    report = _report("gpt2.onnx", verification=_passed(), elapsed_s=1.5, size_before=10, size_after=12)
    report.output = "out.onnx"
    data = json.loads(report.to_json())
    assert data["tool"] == "onnx_lnfold" and data["version"] == onnx_lnfold.__version__
    assert data["source"] == str(MODELS / "gpt2.onnx") and data["output"] == os.path.join(str(MODELS), "out.onnx")
    assert data["elapsed_s"] == 1.5 and data["size_before"] == 10 and data["size_after"] == 12
    assert data["nodes_before"] == sum(data["ops_before"].values())
    assert data["verification"]["passed"] is True
    assert data["verification"]["onnxruntime"] == onnxruntime.__version__


def test_verbose_trace_names_producers_carry_ops_and_blocks():
    model = load_path(MODELS / "bert.onnx")
    # folded whatever it costs, the embeddings LN folds; no explicit centering
    lines = explain(model, _pipeline.analyze_for_target(model, FoldOptions(fold_costly=True, auxiliary_centering=False))[1])
    assert lines[0] == "node_layer_norm (LayerNormalization, axis 2): folded -> SimplifiedLayerNormalization"
    assert "  producer: embedding table 'model.embeddings.word_embeddings.weight' read by node_embedding: centered along axis 1" in lines
    assert "  carried through 2 op(s): Add x2: node_add_14, node_add_22" in lines
    assert "node_layer_norm_1 (LayerNormalization, axis 2): kept" in lines
    assert "  'layer_norm' is produced by LayerNormalization 'node_layer_norm'" in lines
    # The walk follows the residual stream only: GPT-2's last LN passes 5 Adds and 4 Reshapes, 2
    # new ones for each LN after the first; each op and producer is told once, for the first LN
    # whose proof has it, so the proof grows with the depth, not with its square.
    gpt2 = load_path(MODELS / "gpt2.onnx")
    proof = explain(gpt2, _pipeline.analyze_for_target(gpt2, FoldOptions())[1])
    carried = [line.split(":")[0] for line in proof if "carried through" in line]
    assert carried == ["  carried through 1 op(s)"] + ["  carried through 2 op(s)"] * 4
    told = [line for line in proof if "told above" in line and "op(s)" in line]
    assert told[-1] == "  and through 7 op(s) told above, for node_layer_norm_3 and 3 LNs before it"
    assert sum(1 for line in proof if "producer: Gemm weight 'model.transformer.h.0.attn.c_proj.weight'" in line) == 1


def test_the_report_of_fold_carries_elapsed_time():
    result = onnx_lnfold.fold(MODELS / "gpt2.onnx", verify=False)
    assert result.report.elapsed_s is not None and result.report.elapsed_s > 0
    assert result.report.format_summary().endswith(" s")


def test_ir_model_input_reports_a_placeholder_source():
    model = ir.load(str(MODELS / "gpt2.onnx"))
    report = onnx_lnfold.fold(model, verify=False).report
    assert report.format_summary().startswith("onnx_lnfold: <model>, 5/5 LayerNorms folded")


def test_summary_and_decision_are_verbs_and_the_old_names_warn():
    result = onnx_lnfold.fold(MODELS / "gpt2.onnx", verify=False)
    with pytest.warns(DeprecationWarning, match="format_summary"):
        assert result.report.summary() == result.report.format_summary()
    with pytest.warns(DeprecationWarning, match="decision_for"):
        assert result.plan.decision("node_layer_norm") is result.plan.decision_for("node_layer_norm")
    with pytest.raises(KeyError):
        result.plan.decision_for("no_such_ln")


def test_reprs_are_one_line_summaries_with_the_detail_one_attribute_away(tmp_path):
    result = onnx_lnfold.fold(MODELS / "gpt2.onnx", tied_weights="untie")  # an untied copy to show
    rel = f"{result.report.verification.decisive_rel_diff:.2g}"
    assert repr(result) == f"<FoldResult gpt2.onnx: 5/5 LNs folded, verified (in float64, rel {rel}), 0.86 MB, {result.report.elapsed_s:.1f} s>"
    result.save(tmp_path / "g.onnx")
    after = (tmp_path / "g.onnx").stat().st_size / 1e6
    assert repr(result).startswith(f"<FoldResult gpt2.onnx -> g.onnx: 5/5 LNs folded, verified (in float64, rel {rel}), 0.86 -> {after:.2f} MB, ")
    assert repr(result.report) == "<FoldReport " + repr(result)[len("<FoldResult ") :]
    assert repr(result.plan) == "<CenteringPlan: 5 LNs, 5 fold, 0 kept; 10 constants centered, 1 untied (+131,072 B)>"
    assert repr(result.plan.decision_for("node_layer_norm")) == "<LnDecision node_layer_norm: folded -> SimplifiedLayerNormalization>"
    assert repr(result.report.verification).startswith(f"<Verification passed: in float64, worst relative diff {rel} <= rtol 0.0001, 1 output x 3 ")
    lm_head = next(e for e in result.plan.edits if e.untie)
    assert repr(lm_head) == (
        "<CenteringEdit model.lm_head.weight: axis 1, embedding table, untied -> model.lm_head.weight.centered "
        "(+131,072 B); for 5 LNs>"
    )
    kept = onnx_lnfold.analyze(MODELS / "opt_post_ln.onnx", auxiliary_centering=False)
    assert repr(kept) == "<CenteringPlan: 4 LNs, 0 fold, 4 kept (normalization-output 3, mixes-shift 1)>"
    assert repr(kept.kept[0]).startswith("<LnDecision node_layer_norm: kept, side-effect/mixes-shift: tensor 'add_88' would")
    centered = onnx_lnfold.analyze(MODELS / "gpt2.onnx", tied_weights="center")
    assert repr(centered) == "<CenteringPlan: 5 LNs, 5 fold, 0 kept; 9 constants centered; 1 explicit centering>"
    assert repr(centered.centerings[0]) == (
        "<AuxCentering embedding - ReduceMean(axis 2) -> embedding.centered, instead of untying "
        "model.lm_head.weight (-131,072 B); for 5 LNs>"
    )
    for obj in (result, result.report, result.plan, *result.plan.decisions, *result.plan.edits, result.report.verification):
        assert "\n" not in repr(obj) and len(repr(obj)) < 160
    # Equality and the data stay as they were: the repr is only how they print.
    assert result.plan == result.plan and result.plan.to_dict()["folded"] == 5


def test_the_pass_repr_names_its_options_and_its_last_run():
    fold_pass = onnx_lnfold.LnFoldPass(tied_weights="center", auxiliary_centering=False)
    assert repr(fold_pass) == (
        "<LnFoldPass target=ort auxiliary_centering=False fuse_residual=auto tied_weights=center keep_ort_fusions=True "
        "fold_costly=False costs=None; not run yet>"
    )
    ir.passes.PassManager([fold_pass])(ir.load(str(MODELS / "opt_post_ln.onnx")))
    assert repr(fold_pass).endswith("; last run: 0/4 LNs folded, 4 kept>")


def test_reasons_name_what_the_graph_holds():
    """A depthwise Conv is not said to mix the shift into every output, and no proof counts
    '0 constant(s)': an explicit centering alone is named as such."""
    # Without explicit centerings: by default the LN behind the depthwise Conv is priced for one instead.
    convnext = onnx_lnfold.analyze(MODELS / "convnext_block.onnx", auxiliary_centering=False)
    (mixes,) = [d for d in convnext.kept if d.code == "mixes-shift"]
    assert "a grouped Conv (group=64) that weighs the shift by each channel's own kernel" in mixes.reason
    assert "every output" not in mixes.reason
    plan = onnx_lnfold.analyze(MODELS / "wav2vec2_stable.onnx", fold_costly=True)
    proofs = [d.reason for d in plan.decisions]
    assert not [r for r in proofs if re.search(r"\b0 constant", r) or "constant(s)" in r]
    assert "input is zero-mean once '/model/encoder/Add_output_0' is centered explicitly" in proofs
    assert "input is zero-mean once 2 constants are centered and '/model/encoder/Add_output_0' is centered explicitly" in proofs


def test_a_long_carry_chain_is_named_in_part_and_counted(tmp_path):
    """A proof through thousands of Identity nodes names the first few and counts the rest."""
    model = load_path(identity_chain(500)(tmp_path))
    lines = explain(model, _pipeline.analyze_for_target(model, FoldOptions())[1])
    (carried,) = [line for line in lines if "carried through" in line]
    assert carried.startswith("  carried through 501 op(s): Add x1, Identity x500: bias, id0, id1,")
    assert carried.endswith(f", id{NAMED_OPS - 2} and {501 - NAMED_OPS} more")
