"""What the check needs of the original model file and the fold does not decide, made before the
check asks for it (docs/DESIGN.md section 6).

The original's ONNX Runtime session (optimizations off) and its float64 twin depend only on the
file. On two cores the check's own phase keeps both busy (the fold's session on a thread, the
read-back and the fold's twin in Python), while the analysis before it is Python alone and
leaves one idle. `start_session` is called once the analysis has found an LN (`found_lns` of
`analyze_model`): the original's session is made on a thread while the LNs are planned. `make` is
handed to the fusion check (`FusionCheck.start`'s `meanwhile`), which calls it once it has a plan
that folds, while ONNX Runtime makes a session of its folded copy: the original's twin is made
then, while the interpreter is free. The check takes each for the same file only
(`take_session`, `take_twin`), or makes its own as before; `close` waits for a session nobody
took and drops it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from onnx_lnfold.core.ahead import Ahead, Outcome
from onnx_lnfold.core.options import CheckSettings
from onnx_lnfold.verify.oracle.reference import Float64Model
from onnx_lnfold.verify.passes import SESSIONS_THREAD, made_ahead
from onnx_lnfold.verify.sessions import onnxruntime_missing, session_for


class OriginalAhead:
    """The session and the float64 twin of the model file `source`, each made once: the session on
    a thread (`start_session`, or `make` where it was not), the twin by `make` (their failures
    kept, raised by `take_*`)."""

    def __init__(self, source: Path, progress: Callable[[str], None] | None = None, twin: bool = True):
        self.source = source
        self._progress = progress
        self._twin_wanted = twin
        self._made = False
        self._started = False
        self._twin: Outcome | None = None
        self._session: Ahead | None = None

    @classmethod
    def for_check(
        cls, settings: CheckSettings, source: Path | None, weights: int, progress: Callable[[str], None] | None = None
    ) -> OriginalAhead | None:
        """What to make ahead for a check of `source` (a model of `weights` bytes), where the check
        makes its passes ahead (`verify.passes.made_ahead`) and can run ONNX Runtime; the twin only
        where its float64 budget is not 0. Else None."""
        if not settings.verify or source is None or not made_ahead(weights) or onnxruntime_missing():
            return None
        return cls(source, progress, twin=settings.float64_budget != 0)

    def start_session(self) -> None:
        if self._started:
            return
        self._started = True
        source = self.source
        self._session = Ahead([lambda: session_for(source)], SESSIONS_THREAD)

    def make(self) -> None:
        if self._made:
            return
        self._made = True
        self.start_session()
        if self._twin_wanted:
            self._twin = Outcome(lambda: Float64Model(self.source, progress=self._progress))

    def take_twin(self, source: object) -> Float64Model | None:
        """The twin made, for a check of `source` (this one's file), once; None where none was
        made or `source` is another; raises what making it raised."""
        made, self._twin = self._twin, None
        if made is None or source != self.source:
            return None
        return made.get()

    def take_session(self, source: object) -> Ahead | None:
        """The session being made (its `result()`), for ONNX Runtime's reading of `source` (this
        one's file, not a float32 shadow or a seeded copy), once; else None."""
        if self._session is None or source != self.source:
            return None
        made, self._session = self._session, None
        return made

    def close(self) -> None:
        """Wait for a session nobody took, and drop it and the twin."""
        made, self._session, self._twin = self._session, None, None
        if made is not None:
            made.join()


__all__ = ["OriginalAhead"]
