"""How the check's passes run each alone (`verify.passes.EachAlone`): a small model's two sessions
are made on a thread of their own while the read-back and the float64 twins are made, and the
verdict is the one the sessions made one after the other give, failures included."""

from __future__ import annotations

import threading

import pytest

import onnx_lnfold
from onnx_lnfold.core.errors import InvalidInput
from onnx_lnfold.verify import passes, sessions
from onnx_lnfold.verify.check import check_equivalence
from onnx_lnfold.verify.oracle.reference import exact_tensors
from onnx_lnfold.verify.request import VerifyRequest
from onnx_lnfold.verify.verdict import FLOAT64

from conftest import MODELS


def _threads_making_sessions(monkeypatch) -> list[str]:
    """The names of the threads `session_for` is called on, from now on."""
    made: list[str] = []
    real = passes.session_for

    def recording(*args, **kwargs):
        made.append(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(passes, "session_for", recording)
    return made


def _check(tmp_path, name: str = "gpt2.onnx", **request):
    result = onnx_lnfold.fold(MODELS / name, verify=False)
    computed = exact_tensors(result.model)  # before it is written: writing rounds them
    result.save(tmp_path / "folded.onnx")
    folded_request = VerifyRequest(computed=computed, plan=result.plan, **request)
    return check_equivalence(MODELS / name, tmp_path / "folded.onnx", result.model, folded_request)


def _figures(verification) -> list[tuple]:
    return [(o.name, o.rel_diff, o.written, o.exact, o.original_error, o.fold_error) for o in verification.outputs]


def test_a_small_models_sessions_are_made_ahead_on_a_thread_and_judge_as_one_after_the_other(tmp_path, monkeypatch):
    made = _threads_making_sessions(monkeypatch)
    ahead = _check(tmp_path)
    assert ahead.status == "passed" and ahead.judgment == FLOAT64
    assert made == ["lnfold-sessions"] * 2
    assert not [t for t in threading.enumerate() if t.name == "lnfold-sessions"]
    made.clear()
    monkeypatch.setattr(passes, "AHEAD_WEIGHT_BYTES", 0)  # every model is "large": one after the other
    alone = _check(tmp_path)
    assert made == [threading.main_thread().name] * 2
    assert _figures(alone) == _figures(ahead) and alone.notes == ahead.notes


def test_a_float64_budget_of_zero_makes_no_twins_ahead(tmp_path, monkeypatch):
    made: list[str] = []
    real = passes.EachAlone._twins_made

    def recording(self):
        made.append("twins")
        return real(self)

    monkeypatch.setattr(passes.EachAlone, "_twins_made", recording)
    verification = _check(tmp_path, float64_budget=0)
    assert verification.status == "passed" and verification.judgment != FLOAT64 and made == []


@pytest.mark.parametrize("failing", ["original", "folded"])
def test_a_session_made_ahead_fails_as_one_made_when_asked_for(tmp_path, monkeypatch, failing):
    """The original's refusal is the model's (InvalidInput), the fold's a failed check; neither
    leaves a thread behind."""
    real = sessions.session_for

    def refusing(source, *args, **kwargs):
        if str(source).endswith("folded.onnx") == (failing == "folded"):
            raise RuntimeError("[ONNXRuntimeError] : 10 : INVALID_GRAPH : This is an invalid model.")
        return real(source, *args, **kwargs)

    monkeypatch.setattr(passes, "session_for", refusing)
    if failing == "original":
        with pytest.raises(InvalidInput, match="invalid model: onnxruntime refuses it"):
            _check(tmp_path)
    else:
        verification = _check(tmp_path)
        assert verification.status == "failed"
        assert verification.reason.startswith(
            "the folded model does not load in onnxruntime: This is an invalid model."
        )
    assert not [t for t in threading.enumerate() if t.name == "lnfold-sessions"]
