"""The check's passes over models larger than memory, advanced together so that each file is read
from disk about once (docs/DESIGN.md section 6).

Each pass (ONNX Runtime's block-by-block run of a model, a float64 twin) is a generator that reads
its model's weights in graph order and yields, after each step, the share of them it has read.
`run_together` always steps the pass furthest behind: all of them move through the weights side
by side, a block apart, so a block's pages read from disk by the first pass are still in the page
cache when the others read them. Run one after the other, each pass over a model larger than the
page cache reads the whole file from disk again.

Each pass says where it is (which block, what share of the weights: `telling`) in the log and to
the caller's progress line, where one was given (`VerifyRequest.progress`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

# A line for the caller's progress display: where a pass is.
Progress = Callable[[str], None]


def telling(progress: Progress | None, logger: logging.Logger) -> Progress:
    """How a pass says where it is: to `logger`, and to `progress` where one is given."""

    def say(text: str) -> None:
        logger.info(text)
        if progress is not None:
            progress(text)

    return say


def one_at_a_time(progress: Progress | None) -> Progress | None:
    """`progress` said to by one pass at a time: `run_together`'s passes report from their own threads."""
    if progress is None:
        return None
    saying = threading.Lock()

    def said(text: str) -> None:
        with saying:
            progress(text)

    return said


def drain(steps: Generator[Any, None, Any]) -> Any:
    """Run a pass to its end alone: what it returns."""
    while True:
        try:
            next(steps)
        except StopIteration as stop:
            return stop.value


@dataclass
class Pass:
    """One pass of `run_together`: its steps, then what it returned or the exception it raised, and
    the seconds spent in its own steps."""

    label: str
    steps: Generator[float, None, Any]
    result: Any = None
    error: BaseException | None = None
    seconds: float = 0.0
    share: float = field(default=0.0, repr=False)  # of its weights read so far

    def clock(self) -> float:
        """Seconds spent in this pass's steps so far, the current one included: its own time, the
        others' left out (a float64 twin's deadline is paced by its own work)."""
        return self.seconds + (time.perf_counter() - self._started if self._started is not None else 0.0)

    _started: float | None = field(default=None, repr=False)


def run_together(passes: list[Pass], workers: int = 1) -> None:
    """Run `passes` to their ends, each step the pass that has read the smallest share of its
    weights; a pass that raises stops there (its `error`), the others go on. With `workers` > 1,
    that many steps run at once, each of another pass (a pass's steps one at a time, in order):
    ONNX Runtime, the products and the reads release the interpreter while they run."""
    if workers <= 1:
        live = list(passes)
        while live:
            current = min(live, key=lambda p: p.share)
            if _step(current):
                live.remove(current)
        return
    state = threading.Condition()
    waiting, busy = list(passes), set()

    def work() -> None:
        while True:
            with state:
                while True:
                    if not waiting and not busy:
                        return
                    ready = [p for p in waiting if id(p) not in busy]
                    if ready:
                        break
                    state.wait()
                current = min(ready, key=lambda p: p.share)
                busy.add(id(current))
            finished = _step(current)
            with state:
                busy.discard(id(current))
                if finished:
                    waiting.remove(current)
                state.notify_all()

    threads = [threading.Thread(target=work, name=f"onnx-lnfold-pass-{i}", daemon=True) for i in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _step(current: Pass) -> bool:
    """One step of `current`; whether it has ended (returned or raised)."""
    current._started = time.perf_counter()
    try:
        current.share = next(current.steps)
        return False
    except StopIteration as stop:
        current.result = stop.value
        return True
    except Exception as e:  # noqa: BLE001 - the pass's own failure, given to its reader
        current.error = e
        return True
    finally:
        current.seconds += time.perf_counter() - current._started
        current._started = None
