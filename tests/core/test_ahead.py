"""`core.ahead.Ahead`: calls made in order on a thread of their own, each result given once, each
failure raised where its result is asked for."""

from __future__ import annotations

import threading

import pytest

from onnx_lnfold.core.ahead import Ahead, Outcome


def test_calls_run_in_order_on_their_thread_and_their_results_are_given_once():
    ran: list[tuple[str, str]] = []

    def call(tag: str):
        def made() -> str:
            ran.append((tag, threading.current_thread().name))
            return tag

        return made

    ahead = Ahead([call("a"), call("b")], "test-ahead")
    assert ahead.result(1) == "b" and ahead.result(0) == "a"
    assert ran == [("a", "test-ahead"), ("b", "test-ahead")]
    assert ahead.result(0) is None  # given out once: the caller holds it now


def test_a_failure_is_raised_where_its_result_is_asked_for_and_the_next_call_still_runs():
    def failing() -> None:
        raise ValueError("made badly")

    ahead = Ahead([failing, lambda: 2], "test-ahead")
    with pytest.raises(ValueError, match="made badly"):
        ahead.result(0)
    assert ahead.result(1) == 2


def test_join_waits_for_every_call_and_drops_what_was_not_asked_for():
    release = threading.Event()
    ahead = Ahead([lambda: release.wait(5) and "late"], "test-ahead")
    release.set()
    ahead.join()
    assert not [t for t in threading.enumerate() if t.name == "test-ahead"]
    assert ahead.result(0) is None


def test_an_outcome_is_made_at_once_and_gives_its_result_or_failure_once():
    made: list[int] = []
    outcome = Outcome(lambda: made.append(1) or "done")
    assert made == [1]  # made when it is created, not when asked for
    assert outcome.get() == "done" and outcome.get() is None

    def failing() -> None:
        raise ValueError("made badly")

    with pytest.raises(ValueError, match="made badly"):
        Outcome(failing).get()
