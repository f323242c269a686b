"""The plan callers get is plain data (names, axes, codes, figures): it holds no IR object of the
model it was made on, so it outlives that model, copies and pickles whole. The IR objects that
carry it out are the bound plan's, in the plan's own order."""

import dataclasses
import pickle

import onnx_ir as ir
import pytest

import onnx_lnfold
from onnx_lnfold import _pipeline
from onnx_lnfold.core.options import FoldOptions
from onnx_lnfold.load.model import load_path

from conftest import MODELS

PLAIN = (str, int, float, bool, type(None))
COMMITTED = sorted(path.stem for path in MODELS.glob("*.onnx"))

# ONNX Runtime's fusion checks take seconds a model and add records of their own (a fusion-cost
# refusal, the order advice, the `optimizer_first` facts): they run on the models that show each
# of those, and are off elsewhere.
NO_FUSION_CHECK = {"keep_ort_fusions": False}
FUSION_CHECKED = ("bert_torchscript", "gpt2", "whisper_encoder")
# Every committed model, under the defaults and with no explicit centering (post-LN models keep
# most of their LNs then, each with the refusal that kept it).
EVERY_MODEL = {"defaults": {}, "auxiliary_centering=False": {"auxiliary_centering": False}}
# Every other option that shapes the plan's records, on models where each one changes the plan:
# kept and folded LNs, centered constants (untied, derived, in blocks), explicit centerings,
# fused residual Adds, a converted opset.
EVERY_OPTION = {
    "fold_costly=True": {"fold_costly": True},
    "target=onnx": {"target": "onnx"},
    "tied_weights=center": {"tied_weights": "center"},
    "tied_weights=untie": {"tied_weights": "untie"},
    "tied_weights=derive": {"tied_weights": "derive"},
    "fuse_residual=always": {"fuse_residual": "always"},
}
EVERY_OPTION_MODELS = (
    "bert",
    "gpt2",
    "mbart_torchscript",
    "opt_pre_ln",
    "stablelm_qk_dynamo",
    "whisper_merged_decoder",
)


def _plain(value, where: str) -> list[str]:
    """Where `value` holds anything but plain values, lists, tuples, dicts and dataclasses of them.
    Types are matched exactly: a numpy scalar or an IR enum is no plain value, whatever it subclasses."""
    if type(value) in PLAIN:
        return []
    if type(value) in (list, tuple):
        return [bad for i, item in enumerate(value) for bad in _plain(item, f"{where}[{i}]")]
    if type(value) is dict:
        return [bad for key, item in value.items() for bad in _plain(key, where) + _plain(item, f"{where}[{key!r}]")]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [bad for f in dataclasses.fields(value) for bad in _plain(getattr(value, f.name), f"{where}.{f.name}")]
    return [f"{where}: {type(value).__module__}.{type(value).__name__}"]


def _pickle_budget(plan) -> int:
    """The most bytes a plan of plain data pickles to. A decision is a few sentences and names,
    an edit or an explicit centering a few names, a per-channel weight one float: every committed
    model's plan stays under half of this. An IR object anywhere in a plan drags its whole model
    along: a kept LN's refusal holding the tensor where its proof stopped overshoots this budget
    many times over on every committed model that keeps such an LN."""
    records = len(plan.edits) + len(plan.centerings)
    weights = sum(len(edit.weights or ()) for edit in plan.edits)
    return 2048 + 2048 * len(plan.decisions) + 512 * records + 16 * weights


def _check(name: str, options: dict) -> onnx_lnfold.CenteringPlan:
    plan = onnx_lnfold.analyze(MODELS / f"{name}.onnx", **options)
    assert _plain(plan, "plan") == []
    data = pickle.dumps(plan)
    assert pickle.loads(data).to_dict() == plan.to_dict()
    assert len(data) <= _pickle_budget(plan), f"{name} {options}: the plan pickles to {len(data):,} B"
    return plan


@pytest.mark.parametrize("name", COMMITTED)
def test_every_committed_plan_is_plain_data(name):
    for options in EVERY_MODEL.values():
        _check(name, {**NO_FUSION_CHECK, **options})


def test_every_option_leaves_the_plan_plain_data():
    plans = [
        _check(name, {**NO_FUSION_CHECK, **options})
        for name in EVERY_OPTION_MODELS
        for options in EVERY_OPTION.values()
    ]
    # Each kind of record was there to check.
    decisions = [d for plan in plans for d in plan.decisions]
    edits = [e for plan in plans for e in plan.edits]
    assert any(d.blocked is not None for d in decisions) and any(d.folded for d in decisions)
    assert any(d.residual_add for d in decisions) and any(d.beta_sites for d in decisions)
    assert any(plan.centerings for plan in plans) and any(plan.converted_from is not None for plan in plans)
    assert any(e.untie and not e.means_name for e in edits) and any(e.means_name for e in edits)
    assert any(e.block is not None for e in edits)


def test_the_fusion_checks_records_are_plain_data():
    plans = {name: _check(name, EVERY_MODEL["defaults"]) for name in FUSION_CHECKED}
    assert any(d.code == "fusion-cost" for d in plans["bert_torchscript"].decisions)
    assert plans["bert_torchscript"].optimizer_first is not None and plans["gpt2"].advice


def test_an_ln_kept_where_its_proof_stopped_names_that_tensor():
    """Where a proof stops at a tensor an explicit centering could stand in for (none allowed here:
    a post-LN model keeps its LNs), the refusal names that tensor, as a name."""
    plan = _check("bert", {**NO_FUSION_CHECK, "auxiliary_centering": False})
    stopped = [d for d in plan.kept if d.code == "normalization-output"]
    assert stopped and all(type(d.blocking_tensor) is str for d in stopped)


def test_the_bound_plan_follows_the_plan_order():
    model = load_path(MODELS / "bert.onnx")
    bound = _pipeline.analyze_for_target(model, FoldOptions(fold_costly=True))[1]
    plan = bound.plan
    assert [b.edit for b in bound.edits] == plan.edits and bound.edits
    assert [b.centering for b in bound.centerings] == plan.centerings
    assert [f.decision for f in bound.folds] == plan.folded and bound.folds
    for b in bound.edits:
        assert b.value.name == b.edit.tensor and len(b.uses) == len(b.edit.uses)
    for fold in bound.folds:
        assert bound.rewrite_for(fold.decision.node) is fold.rewrite
        assert fold.rewrite.op == fold.decision.rewrite


@pytest.mark.parametrize("name", ["deberta_masked_torchscript", "bert_qdq_int8", "gpt2", "vit_torchscript", "wav2vec2_stable"])
def test_the_analysis_changes_nothing_of_the_model(name):
    """Reading a constant names no tensor and the analysis writes nothing back: the model it read
    serializes to the same bytes after it (onnx-ir's Constant getter names the attribute's tensor
    after its output, which the export had left unnamed in these models)."""
    model = load_path(MODELS / f"{name}.onnx")
    before = ir.to_proto(model).SerializeToString()
    _pipeline.analyze_for_target(model, FoldOptions(keep_ort_fusions=False))
    assert ir.to_proto(model).SerializeToString() == before
