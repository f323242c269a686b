"""The original's float64 twin made before the check (`verify.twin_ahead`): while ONNX Runtime makes
the fusion check's session of the folded copy, for a check of that same file only, and the verdict
the one a twin made by the check gives."""

from __future__ import annotations

import threading
from pathlib import Path

import onnx_lnfold
from onnx_lnfold.core.options import CheckSettings
from onnx_lnfold.ort_fusions import fusion_cost
from onnx_lnfold.verify import passes, twin_ahead
from onnx_lnfold.verify.twin_ahead import OriginalTwin

from conftest import MODELS


def _twins_made(monkeypatch) -> list[tuple[str, str, bool]]:
    """(file name, thread, whether the fusion check was waiting for its folded copy's session) of
    each twin made."""
    made: list[tuple[str, str, bool]] = []
    real = twin_ahead.Float64Model
    waiting = {"now": False}
    folded_session = fusion_cost.FusionCheck._folded_session

    def recording_wait(self, path):
        waiting["now"] = True
        try:
            return folded_session(self, path)
        finally:
            waiting["now"] = False

    def recording(model, *args, **kwargs):
        made.append((Path(str(model)).name, threading.current_thread().name, waiting["now"]))
        return real(model, *args, **kwargs)

    monkeypatch.setattr(fusion_cost.FusionCheck, "_folded_session", recording_wait)
    monkeypatch.setattr(twin_ahead, "Float64Model", recording)
    monkeypatch.setattr(passes, "Float64Model", recording)
    return made


def _figures(result) -> list[tuple]:
    v = result.report.verification
    return [(o.name, o.written, o.exact, o.original_error, o.fold_error) for o in v.outputs] + [v.status, v.judgment]


def test_the_originals_twin_is_made_while_the_fusion_check_waits_and_judges_alike(tmp_path, monkeypatch):
    made = _twins_made(monkeypatch)
    ahead = onnx_lnfold.fold(MODELS / "gpt2.onnx", output=tmp_path / "a.onnx")
    main = threading.main_thread().name
    assert made[0] == ("gpt2.onnx", main, True)  # the original's, during the folded copy's session
    assert made[1:] == [("a.onnx", main, False)]  # the fold's, by the check; the original's not again
    made.clear()
    alone = onnx_lnfold.fold(MODELS / "gpt2.onnx", output=tmp_path / "b.onnx", keep_ort_fusions=False)
    assert [name for name, _, _ in made] == ["gpt2.onnx", "b.onnx"]  # no fusion check: the check made both
    assert _figures(alone) == _figures(ahead)


def test_no_twin_is_made_ahead_where_the_check_would_not_use_it(monkeypatch):
    on = CheckSettings(verify=True)
    gpt2 = MODELS / "gpt2.onnx"
    assert OriginalTwin.for_check(on, gpt2, 1000) is not None
    assert OriginalTwin.for_check(CheckSettings(verify=False), gpt2, 1000) is None
    assert OriginalTwin.for_check(CheckSettings(verify=True, float64_budget=0), gpt2, 1000) is None
    assert OriginalTwin.for_check(on, None, 1000) is None  # a model given in memory
    assert OriginalTwin.for_check(on, gpt2, passes.AHEAD_WEIGHT_BYTES + 1) is None  # its passes one at a time
    twin = OriginalTwin(gpt2)
    assert twin.take(gpt2) is None  # never made
    twin.make()
    assert twin.take(MODELS / "bert.onnx") is None  # another file: the check makes its own
    twin.make()
    assert twin.take(gpt2) is not None and twin.take(gpt2) is None  # given once
