"""The plan callers get is plain data (names, axes, codes, figures): it holds no IR object of the
model it was made on, so it outlives that model, copies and pickles whole. The IR objects that
carry it out are the bound plan's, in the plan's own order."""

import dataclasses
import pickle

import pytest

import onnx_lnfold
from onnx_lnfold import _pipeline
from onnx_lnfold.core.options import FoldOptions
from onnx_lnfold.load.model import load_path

from conftest import MODELS

PLAIN = (str, int, float, bool, type(None))


def _plain(value, where: str) -> list[str]:
    """Where `value` holds anything but plain values, lists, tuples, dicts and dataclasses of them."""
    if isinstance(value, PLAIN):
        return []
    if isinstance(value, (list, tuple)):
        return [bad for i, item in enumerate(value) for bad in _plain(item, f"{where}[{i}]")]
    if isinstance(value, dict):
        return [bad for key, item in value.items() for bad in _plain(key, where) + _plain(item, f"{where}[{key!r}]")]
    if dataclasses.is_dataclass(value):
        return [bad for f in dataclasses.fields(value) for bad in _plain(getattr(value, f.name), f"{where}.{f.name}")]
    return [f"{where}: {type(value).__module__}.{type(value).__name__}"]


@pytest.mark.parametrize("name", ["gpt2", "bert"])
def test_the_plan_holds_plain_data_only(name):
    plan = onnx_lnfold.analyze(MODELS / f"{name}.onnx", fold_costly=True)
    assert plan.folded and plan.edits
    assert _plain(plan, "plan") == []
    assert pickle.loads(pickle.dumps(plan)).to_dict() == plan.to_dict()


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
