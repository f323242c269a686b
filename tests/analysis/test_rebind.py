"""A plan bound to a copy of its model (`BoundPlan.on_clone`, what the fusion check applies to its
weightless clone): every IR object it holds is the copy's, its plain plan is the same, and applying
it to the copy writes what applying the plan to the model writes, the model untouched meanwhile."""

import dataclasses
from dataclasses import replace

import onnx_ir as ir
import pytest

from onnx_lnfold import _pipeline
from onnx_lnfold.analysis.rebind import counterparts, rebound
from onnx_lnfold.apply.apply_plan import apply_plan
from onnx_lnfold.core.options import FoldOptions
from onnx_lnfold.load.model import load_path
from onnx_lnfold.ort_fusions.weightless import clone_model

from conftest import MODELS

# Folds with edits, explicit centerings, fused residual Adds, created biases, If bodies (the merged
# decoders), Cast-wrapped fp16 LNs, Conv weights, quantized units, Keras's decomposed forms.
MODELS_BOUND = (
    "adaln_torchscript",
    "bert",
    "bert_matmul_nbits_int4",
    "bloom",
    "clip_fp16",
    "convnext_block",
    "gpt2_merged_decoder",
    "keras_ln_last_axis_3d",
    "whisper_merged_decoder",
)
OPTIONS = FoldOptions(fold_costly=True, keep_ort_fusions=False)
# Each target's emission: the primitive one declares new tensors with the model's own dims.
TARGETS = ("ort", "onnx", "primitive")


def _ir_objects(obj, found: list, seen: set[int]) -> list:
    """Every IR node and value `obj` reaches through records and containers."""
    if isinstance(obj, (ir.Node, ir.Value)):
        found.append(obj)
    elif id(obj) not in seen and (
        isinstance(obj, (list, tuple, set, frozenset, dict)) or dataclasses.is_dataclass(obj)
    ):
        seen.add(id(obj))
        items = obj.items() if isinstance(obj, dict) else vars(obj).values() if dataclasses.is_dataclass(obj) else obj
        for item in items:
            _ir_objects(item, found, seen)
    return found


def _bytes(model: ir.Model) -> bytes:
    return ir.to_proto(model).SerializeToString()


@pytest.mark.parametrize(
    ("name", "target"), [(name, "ort") for name in MODELS_BOUND] + [("bert", t) for t in TARGETS[1:]]
)
def test_a_plan_bound_to_a_copy_writes_what_it_writes_on_the_model(name, target):
    model, bound = _pipeline.analyze_for_target(load_path(MODELS / f"{name}.onnx"), replace(OPTIONS, target=target))
    assert bound.folds, f"{name}: nothing folds, so nothing is bound"
    clone = clone_model(model)
    before = _bytes(model)

    on_clone = bound.on_clone(model, clone)

    theirs = set(counterparts(model, clone).values())
    held = _ir_objects(on_clone, [], set())
    assert held and all(obj in theirs for obj in held)
    assert on_clone.plan.to_dict() == bound.plan.to_dict()
    assert [b.edit for b in on_clone.edits] == on_clone.plan.edits  # shared records stay shared
    assert all(a.edit is b for a, b in zip(on_clone.edits, on_clone.plan.edits))
    apply_plan(clone, on_clone)
    assert _bytes(model) == before
    apply_plan(model, bound)
    assert _bytes(clone) == _bytes(model)


def test_a_copy_of_another_structure_is_refused():
    model = load_path(MODELS / "bert.onnx")
    clone = clone_model(model)
    clone.graph.remove(clone.graph[len(clone.graph) - 1], safe=False)
    with pytest.raises(ValueError, match="differs from its copy"):
        counterparts(model, clone)


def test_an_ir_object_without_a_counterpart_is_refused():
    model = load_path(MODELS / "bert.onnx")
    bound = _pipeline.analyze_for_target(model, OPTIONS)[1]
    pairs = counterparts(model, clone_model(model))
    del pairs[bound.folds[0].rewrite.cand.node]
    with pytest.raises(KeyError):
        rebound(bound, pairs)
