"""What the check needs of the original, made before it (`verify.original_ahead`): the original's
ONNX Runtime session on a thread once the analysis found an LN, and its float64 twin while the
fusion check waits for its folded copy's session; for a check of that same file only, and the
verdict the one a check that made its own gives."""

from __future__ import annotations

import threading
from pathlib import Path

import onnx

import onnx_lnfold
from onnx_lnfold.core.options import CheckSettings
from onnx_lnfold.ort_fusions import fusion_cost
from onnx_lnfold.verify import original_ahead, passes
from onnx_lnfold.verify.original_ahead import OriginalAhead

from conftest import MODELS


def _made(monkeypatch) -> list[tuple[str, str, str, bool]]:
    """(what, file name, thread, whether the fusion check was waiting for its folded copy's session)
    of each twin and verification session made."""
    made: list[tuple[str, str, str, bool]] = []
    waiting = {"now": False}
    folded_session = fusion_cost.FusionCheck._folded_session

    def recording_wait(self, path):
        waiting["now"] = True
        try:
            return folded_session(self, path)
        finally:
            waiting["now"] = False

    def recording(what, real):
        def made_now(model, *args, **kwargs):
            made.append((what, Path(str(model)).name, threading.current_thread().name, waiting["now"]))
            return real(model, *args, **kwargs)

        return made_now

    monkeypatch.setattr(fusion_cost.FusionCheck, "_folded_session", recording_wait)
    twin, session = recording("twin", original_ahead.Float64Model), recording("session", original_ahead.session_for)
    monkeypatch.setattr(original_ahead, "Float64Model", twin)
    monkeypatch.setattr(passes, "Float64Model", twin)
    monkeypatch.setattr(original_ahead, "session_for", session)
    monkeypatch.setattr(passes, "session_for", session)
    return made


def _figures(result) -> list[tuple]:
    v = result.report.verification
    return [(o.name, o.written, o.exact, o.original_error, o.fold_error) for o in v.outputs] + [v.status, v.judgment]


def test_the_originals_session_and_twin_are_made_while_the_fusion_check_waits_and_judge_alike(tmp_path, monkeypatch):
    made = _made(monkeypatch)
    ahead = onnx_lnfold.fold(MODELS / "gpt2.onnx", output=tmp_path / "a.onnx")
    main = threading.main_thread().name
    # the original's session on a thread once the LNs are found, its twin during the folded copy's
    # session; then the fold's
    assert ("session", "gpt2.onnx", passes.SESSIONS_THREAD, False) in made
    assert ("twin", "gpt2.onnx", main, True) in made
    assert [(what, name) for what, name, _, _ in made if name == "gpt2.onnx"] == [
        ("session", "gpt2.onnx"),
        ("twin", "gpt2.onnx"),
    ]
    assert sorted((what, name) for what, name, _, _ in made if name == "a.onnx") == [
        ("session", "a.onnx"),
        ("twin", "a.onnx"),
    ]
    assert not [t for t in threading.enumerate() if t.name == passes.SESSIONS_THREAD]
    made.clear()
    alone = onnx_lnfold.fold(MODELS / "gpt2.onnx", output=tmp_path / "b.onnx", keep_ort_fusions=False)
    assert all(not waiting for _, _, _, waiting in made) and len(made) == 4  # no fusion check: the check made all
    assert _figures(alone) == _figures(ahead)


def test_a_fold_without_a_check_makes_nothing_ahead(tmp_path, monkeypatch):
    made = _made(monkeypatch)
    onnx_lnfold.fold(MODELS / "gpt2.onnx", output=tmp_path / "a.onnx", verify=False)
    assert made == []


def test_a_model_without_a_layer_norm_makes_nothing_ahead(tmp_path, monkeypatch):
    made = _made(monkeypatch)
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 4])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 4])
    graph = onnx.helper.make_graph([onnx.helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    onnx.save(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)]), tmp_path / "m.onnx")
    result = onnx_lnfold.fold(tmp_path / "m.onnx", output=tmp_path / "o.onnx")
    assert not result.plan.folded and made == []


def test_nothing_is_made_ahead_where_the_check_would_not_use_it():
    on = CheckSettings(verify=True)
    gpt2 = MODELS / "gpt2.onnx"
    assert OriginalAhead.for_check(on, gpt2, 1000) is not None
    assert OriginalAhead.for_check(CheckSettings(verify=False), gpt2, 1000) is None
    assert OriginalAhead.for_check(on, None, 1000) is None  # a model given in memory
    assert OriginalAhead.for_check(on, gpt2, passes.AHEAD_WEIGHT_BYTES + 1) is None  # its passes one at a time
    no_twin = OriginalAhead.for_check(CheckSettings(verify=True, float64_budget=0), gpt2, 1000)
    no_twin.make()
    assert no_twin.take_twin(gpt2) is None and no_twin.take_session(gpt2) is not None
    ahead = OriginalAhead(gpt2)
    assert ahead.take_twin(gpt2) is None and ahead.take_session(gpt2) is None  # never made
    ahead.make()
    assert ahead.take_twin(MODELS / "bert.onnx") is None  # another file: the check makes its own
    assert ahead.take_session(MODELS / "bert.onnx") is None
    session = ahead.take_session(gpt2)
    assert session is not None and ahead.take_session(gpt2) is None  # given once
    session.result()
    ahead.close()
