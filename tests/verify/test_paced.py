"""Passes advanced together (verify.oracle.paced): the one furthest behind steps next, each pass's
steps run in order and never two at once, what each returns or raises is kept, the others go on."""

from __future__ import annotations

import threading
import time

import pytest

from onnx_lnfold.verify.oracle.paced import Pass, drain, run_together


def _pass(label: str, shares: list[float], log: list, running: dict, fail_at: int | None = None):
    def steps():
        for index, share in enumerate(shares):
            with lock:
                assert not running.get(label), f"two steps of {label} at once"
                running[label] = True
            time.sleep(0.002)
            log.append((label, index))
            with lock:
                running[label] = False
            if index == fail_at:
                raise ValueError(f"{label} failed")
            yield share
        return f"{label} done"

    return Pass(label, steps())


lock = threading.Lock()


@pytest.mark.parametrize("workers", [1, 2])
def test_passes_step_in_order_and_keep_what_they_give(workers):
    log: list = []
    running: dict = {}
    passes = [
        _pass("coarse", [0.25, 0.5, 0.75, 1.0], log, running),
        _pass("fine", [i / 16 for i in range(1, 17)], log, running),
        _pass("failing", [0.1, 0.2, 0.3], log, running, fail_at=2),
    ]
    run_together(passes, workers)
    for p in passes:  # each pass's steps, in order, all of them (up to the failure)
        assert [i for label, i in log if label == p.label] == list(range(len([x for x in log if x[0] == p.label])))
    assert passes[0].result == "coarse done" and passes[1].result == "fine done"
    assert isinstance(passes[2].error, ValueError) and passes[2].result is None
    assert all(p.seconds > 0 for p in passes)


def test_alone_the_one_furthest_behind_steps():
    log: list = []
    running: dict = {}
    passes = [_pass("coarse", [0.5, 1.0], log, running), _pass("fine", [0.25, 0.5, 0.75, 1.0], log, running)]
    run_together(passes)
    assert log == [("coarse", 0), ("fine", 0), ("fine", 1), ("coarse", 1), ("fine", 2), ("fine", 3)]


def test_drain_returns_what_the_pass_returns():
    log: list = []
    assert drain(_pass("alone", [0.5, 1.0], log, {}).steps) == "alone done"
    assert log == [("alone", 0), ("alone", 1)]
