"""Without a float64 run, each weight edit is read back from both files and must be a centering
(verify.edits): the end-to-end comparison alone, judged by the original's sensitivity, passes a
centering that is off by a small constant."""

import numpy as np
import pytest

import onnx_lnfold
from onnx_lnfold.apply import centering
from onnx_lnfold.verify import check
from onnx_lnfold.verify.verdict import SENSITIVITY

from conftest import MODELS


def _one_edit_off(monkeypatch, name: str, relative: float = 1e-6) -> None:
    """The centered `name` written off by `relative` of its largest entry (a mean not quite removed)."""
    blocks = centering.CenteredTensor._float64_blocks

    def wrong(self, block_bytes):
        for rows, wide in blocks(self, block_bytes):
            yield rows, (wide - relative * np.abs(wide).max()) if self.name == name and wide.size else wide

    monkeypatch.setattr(centering.CenteredTensor, "_float64_blocks", wrong)


def test_a_correct_fold_reads_back_every_plain_edit_as_a_centering():
    result = onnx_lnfold.fold(MODELS / "gpt2.onnx", float64_budget=0)
    verification = result.report.verification
    assert verification.passed and verification.judgment == SENSITIVITY
    plain = [e for e in result.plan.edits if e.block is None and e.weights is None and not e.means_name]
    assert verification.edits_checked == len(plain) > 0
    assert verification.edits_unchecked == len(result.plan.edits) - len(plain)  # the table derived at load
    assert "edits read back" in result.report.format_summary()
    assert any(note.startswith("each weight edit read back in float64") for note in verification.notes)


def test_one_edit_off_by_a_small_constant_is_refused_without_float64(monkeypatch):
    _one_edit_off(monkeypatch, "model.transformer.h.1.mlp.c_proj.weight")
    with pytest.raises(onnx_lnfold.VerificationFailed) as info:
        onnx_lnfold.fold(MODELS / "gpt2.onnx", float64_budget=0)
    verification = info.value.report.verification
    assert verification.status == "failed" and verification.judgment == SENSITIVITY
    assert "'model.transformer.h.1.mlp.c_proj.weight' centered along axis 1: off by" in verification.reason


def test_the_sensitivity_alone_would_pass_that_fold(monkeypatch):
    """Why the read-back is needed: without it the same wrong fold is within the tolerance."""
    _one_edit_off(monkeypatch, "model.transformer.h.1.mlp.c_proj.weight")
    monkeypatch.setattr(check, "check_edits", lambda *args: check.EditsChecked(0, 0))
    result = onnx_lnfold.fold(MODELS / "gpt2.onnx", float64_budget=0)
    assert result.report.verification.passed and result.report.verification.judgment == SENSITIVITY
