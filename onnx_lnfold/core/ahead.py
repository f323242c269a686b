"""Work started ahead, on a thread of its own, while the caller goes on: ONNX Runtime releases the
interpreter while it makes a session, so a session made so costs the caller's Python work nothing.
The calls run in order on one thread; `result(i)` waits for the i-th and raises what it raised.
`Outcome` is work done ahead on the caller's own thread, given out (or raised) alike."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class _Raised:
    error: BaseException


class Outcome:
    """`call()` made now: `get` gives its result once, or raises what it raised (an `Exception`;
    anything else is raised at once)."""

    def __init__(self, call: Callable[[], Any]):
        try:
            self._found: Any = call()
        except Exception as e:  # noqa: BLE001 - raised where its result is asked for
            self._found = _Raised(e)

    def get(self) -> Any:
        found, self._found = self._found, None
        if isinstance(found, _Raised):
            raise found.error
        return found


class Ahead:
    """`calls` made in order on a thread named `name`."""

    def __init__(self, calls: list[Callable[[], Any]], name: str):
        self._results: list[Any] = [None] * len(calls)
        self._done = [threading.Event() for _ in calls]
        self._thread = threading.Thread(target=self._run, args=(calls,), name=name, daemon=True)
        self._thread.start()

    def _run(self, calls: list[Callable[[], Any]]) -> None:
        for i, call in enumerate(calls):
            try:
                self._results[i] = call()
            except BaseException as e:  # noqa: BLE001 - raised where its result is asked for
                self._results[i] = _Raised(e)
            self._done[i].set()

    def result(self, i: int = 0) -> Any:
        """The i-th call's result, once made (given out once); raises what the call raised."""
        self._done[i].wait()
        found, self._results[i] = self._results[i], None
        if isinstance(found, _Raised):
            raise found.error
        return found

    def join(self) -> None:
        """Wait for every call, and drop what was not asked for."""
        self._thread.join()
        self._results = [None] * len(self._results)
