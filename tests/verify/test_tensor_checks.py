"""The fold is read back against its plan (verify.readback, verify.tensor_checks), whatever the judgment:
without a float64 run, the end-to-end comparison alone, judged by the original's sensitivity, passes
a centering that is off by a small constant."""

import numpy as np
import pytest

import onnx_lnfold
from onnx_lnfold.apply import centering
from onnx_lnfold.decide.targets import BETA_SITE_WORDS
from onnx_lnfold.verify import passes
from onnx_lnfold.verify.readback import ReadBack
from onnx_lnfold.verify.verdict import FLOAT64, SENSITIVITY

from conftest import MODELS


def _one_edit_off(monkeypatch, name: str, relative: float = 1e-6) -> None:
    """The centered `name` written off by `relative` of its largest entry (a mean not quite removed)."""
    blocks = centering.CenteredTensor._float64_blocks

    def wrong(self, block_bytes):
        for rows, wide in blocks(self, block_bytes):
            yield rows, (wide - relative * np.abs(wide).max()) if self.name == name and wide.size else wide

    monkeypatch.setattr(centering.CenteredTensor, "_float64_blocks", wrong)


@pytest.mark.parametrize("budget", [0, 60])
def test_a_correct_fold_reads_back_every_planned_change(budget):
    """Every edit (the table derived at load among them), every rewritten LN, every consumer bias
    that took a beta: none left unread, on either judgment."""
    result = onnx_lnfold.fold(MODELS / "gpt2.onnx", float64_budget=budget)
    verification, plan = result.report.verification, result.plan
    assert verification.passed and verification.judgment == (SENSITIVITY if budget == 0 else FLOAT64)
    betas = [s for d in plan.folded for s in d.beta_sites if not s.endswith(BETA_SITE_WORDS["softmax"])]
    centered_biases = 0  # a bias both centered and given a beta is read back once, with its beta
    assert verification.edits_checked == len(plan.edits) - centered_biases + len(plan.folded) + len(betas) > 0
    assert "edits_unchecked" not in verification.to_dict()
    assert ("edits read back" in result.report.format_summary()) == (budget == 0)
    assert any(note.startswith("the fold read back against its plan") for note in verification.notes) == (budget == 0)


def test_one_edit_off_by_a_small_constant_is_refused_without_float64(monkeypatch):
    _one_edit_off(monkeypatch, "model.transformer.h.1.mlp.c_proj.weight")
    with pytest.raises(onnx_lnfold.VerificationFailed) as info:
        onnx_lnfold.fold(MODELS / "gpt2.onnx", float64_budget=0)
    verification = info.value.report.verification
    assert verification.status == "failed" and verification.reason.startswith("the folded model is not what the plan wrote")
    assert "'model.transformer.h.1.mlp.c_proj.weight' centered along axis 1: it is off by" in verification.reason


def test_the_sensitivity_alone_would_pass_that_fold(monkeypatch):
    """Why the read-back is needed: without it the same wrong fold is within the tolerance."""
    _one_edit_off(monkeypatch, "model.transformer.h.1.mlp.c_proj.weight")
    monkeypatch.setattr(passes, "read_back", lambda *args: ReadBack())
    result = onnx_lnfold.fold(MODELS / "gpt2.onnx", float64_budget=0)
    assert result.report.verification.passed and result.report.verification.judgment == SENSITIVITY
