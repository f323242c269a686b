"""How the check's passes over both models run (docs/DESIGN.md section 6): the original and the
fold in ONNX Runtime, their float64 twins, the read-back of the fold against its plan. `Passes`
says what the check asks of them; `EachAlone` runs each pass alone, when it is asked for, one after
another; `verify.side_by_side.SideBySide`, for a model larger than memory, gives what the passes
gave running side by side, each file read about once. The check chooses one (`verify.ort_runs`)
and asks it alike: `verify.ort_runs` for the sessions and their runs, the float64 judge for the
twins, the check for the read-back.
"""

from __future__ import annotations

import os
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from onnx_lnfold.core.ahead import Ahead, Outcome
from onnx_lnfold.verify.oracle import blockwise
from onnx_lnfold.verify.oracle.reference import Deadline, Float64Model
from onnx_lnfold.verify.readback import ReadBack, read_back
from onnx_lnfold.verify.readback.folded import model_of
from onnx_lnfold.verify.request import VerifyRequest
from onnx_lnfold.verify.sessions import ModelBytesOrPath, is_blockwise, run_sets, session_for

# The two models, as `Passes` names them.
ORIGINAL, FOLD = 0, 1
# Both models' sessions are made at once, on threads of their own, where the fold's weights are at
# most this many bytes (`EachAlone.begin`): two sessions then hold the weights twice, which is
# little beside the process; a larger model's are made one after the other.
AHEAD_WEIGHT_BYTES = 128 << 20
SESSIONS_THREAD = "lnfold-sessions"


def made_ahead(weights: int, sources: tuple[ModelBytesOrPath, ...] = ()) -> bool:
    """Whether a check makes its passes ahead (`EachAlone.begin`): the fold's `weights` and every
    model given as bytes at most `AHEAD_WEIGHT_BYTES`, and each model run in one session."""
    largest = max([weights, *(len(s) for s in sources if isinstance(s, bytes))])
    # Above it, a model runs block by block, one block's session at a time.
    one_session = blockwise.blockwise_above()
    return largest <= AHEAD_WEIGHT_BYTES and (one_session is None or largest <= one_session)


Arrays = dict[str, np.ndarray]  # by name: an input set, or a model's outputs on one
# The twins' outputs on each input set they ran on: the original's, the fold's as written, and the
# fold's with its computed constants exact (None where those are not at hand).
Twins = tuple[list[Arrays], list[Arrays], list[Arrays] | None]


class RunsAhead:
    """A model's runs of every input set, made before the sets are gone through one by one: by a
    `BlockwiseSession` at once (each block's weights read once for all sets), or `ready`, the runs
    the passes made side by side (with their seconds). Called with i, it gives set i's outputs
    (raising what its run raised), None where the session runs the sets one by one or `first` is
    false (another reading of the shapes is tried); `seconds` is a set's share of the time they took."""

    def __init__(self, session, feeds_list: list[Arrays], ready: tuple[list, float] | None = None):
        self._results, self.seconds = None, 0.0
        if ready is not None:
            self._results, self.seconds = ready[0], ready[1] / max(len(feeds_list), 1)
        elif is_blockwise(session):
            started = time.perf_counter()
            self._results = run_sets(session, feeds_list)
            self.seconds = (time.perf_counter() - started) / max(len(feeds_list), 1)

    def __call__(self, index: int, first: bool = True) -> dict | None:
        if self._results is None or not first:
            return None
        result = self._results[index]
        if isinstance(result, Exception):
            raise result
        return result


class Passes(ABC):
    """What the check asks of its passes over both models, however they run."""

    def begin(self, original: ModelBytesOrPath, folded: ModelBytesOrPath, weights: int) -> None:  # noqa: B027 - most passes have nothing to start
        """Start what can run before the sessions are asked for: `original` and `folded` as ONNX
        Runtime runs them, the fold holding `weights` bytes of weights."""

    def end(self) -> None:  # noqa: B027
        """Wait for what `begin` started and was not asked for, and drop it."""

    @abstractmethod
    def session(self, model: int, source: ModelBytesOrPath):
        """The ONNX Runtime session of `model` (`ORIGINAL` or `FOLD`), `source` as ONNX Runtime runs
        it (a float32 shadow of a bfloat16 model); raises where it does not load. The caller holds
        it: where each pass runs alone, one model's session is released before the other's is made."""

    @abstractmethod
    def runs_ahead(self, model: int, session, feeds_list: list[Arrays]) -> RunsAhead:
        """`model`'s runs in `session` of the input sets `feeds_list` (as ONNX Runtime takes them),
        where they are made before the sets are gone through one by one."""

    @abstractmethod
    def float64_sets(self, feeds_list: list[Arrays], fitting: Callable[[], tuple[int, str]]) -> tuple[int, str]:
        """How many of the input sets `feeds_list` (the first ones) the float64 twins are to judge,
        and why not all where fewer: those the twins ran on already, else `fitting()`'s (the float64
        judge's choice by its allowance)."""

    @abstractmethod
    def twins(self, feeds_list: list[Arrays], budget: float) -> Twins:
        """The float64 twins' outputs on the first of the input sets `feeds_list` (as many as fit
        `budget` seconds, the original's twin timed as it runs); raises what stopped them
        (`verify.oracle.reference.Float64Unavailable`, or what an op raised)."""

    @abstractmethod
    def read_back(self) -> ReadBack | None:
        """The fold read back against its plan (`verify.readback`), None where there is no plan;
        raises what the read-back raised."""


@dataclass
class EachAlone(Passes):
    """Each pass runs alone, when it is asked for, on the models as given (`original`, `folded`).
    For a model whose weights are small (`AHEAD_WEIGHT_BYTES`), `begin` makes both sessions on
    threads of their own while the read-back and the float64 twins' structures are made."""

    original: ModelBytesOrPath
    folded: ModelBytesOrPath
    request: VerifyRequest
    _making: dict[int, tuple[Ahead, int]] = field(default_factory=dict, init=False, repr=False)
    _read: Outcome | None = field(default=None, init=False, repr=False)  # the read-back, made in `begin`
    _twin_models: Outcome | None = field(default=None, init=False, repr=False)  # the twins, made in `begin`

    def begin(self, original: ModelBytesOrPath, folded: ModelBytesOrPath, weights: int) -> None:
        sources = (original, folded)
        if not made_ahead(weights, sources):
            return
        progress = self.request.progress
        ahead = self.request.original_ahead
        made = ahead.take_session(original) if ahead is not None else None  # begun during the fusion check
        if made is not None:
            self._making = {ORIGINAL: (made, 0)}
        todo = [(model, source) for model, source in enumerate(sources) if model not in self._making]
        makes = [lambda s=source: session_for(s, progress=progress) for _, source in todo]
        # A thread for each where there are two cores: the check's Python work then waits for
        # neither, where one thread for both kept it waiting (docs/DESIGN.md section 6).
        if (os.cpu_count() or 1) >= len(todo):
            self._making.update({model: (Ahead([make], SESSIONS_THREAD), 0) for (model, _), make in zip(todo, makes)})
        else:
            both = Ahead(makes, SESSIONS_THREAD)
            self._making.update({model: (both, i) for i, (model, _) in enumerate(todo)})
        self._read = Outcome(self._reading)
        budget = self.request.float64_budget
        if budget is None or budget > 0:
            self._twin_models = Outcome(self._twins_made)

    def end(self) -> None:
        making, self._making = self._making, {}
        for made, _ in making.values():
            made.join()  # a session not asked for is dropped, and what made it fail says nothing

    def session(self, model: int, source: ModelBytesOrPath):
        making = self._making.pop(model, None)
        if making is not None:
            made, index = making
            return made.result(index)
        return session_for(source, progress=self.request.progress)

    def runs_ahead(self, model: int, session, feeds_list: list[Arrays]) -> RunsAhead:
        return RunsAhead(session, feeds_list)

    def float64_sets(self, feeds_list: list[Arrays], fitting: Callable[[], tuple[int, str]]) -> tuple[int, str]:
        return fitting()

    def twins(self, feeds_list: list[Arrays], budget: float) -> Twins:
        """The original's twin on the sets that fit `budget`, then the fold's on those, as written
        and, where the fold's computed constants are at hand, exact."""
        made, self._twin_models = self._twin_models, None
        original, folded = made.get() if made is not None else self._twins_made()
        exact = self.request.computed
        started = time.perf_counter()
        # The fold's two readings share one pass (each weight read once), at most twice the
        # original's work: three of its passes bound all.
        truths = original.run_many(feeds_list, Deadline(started, budget, 3))
        feeds = feeds_list[: len(truths)]
        if exact is not None:
            return truths, *folded.run_as_written_and_exact(feeds)
        return truths, folded.run_many(feeds), None

    def _twins_made(self) -> tuple[Float64Model, Float64Model]:
        """The original's float64 twin and the fold's."""
        exact, progress = self.request.computed, self.request.progress
        ahead = self.request.original_ahead
        original = ahead.take_twin(self.original) if ahead is not None else None
        original = original or Float64Model(self.original, progress=progress)
        folded = Float64Model(self.folded, exact, progress=progress)
        original.label = "the original"
        folded.label = "the fold, as written and exact" if exact is not None else "the fold as written"
        return original, folded

    def read_back(self) -> ReadBack | None:
        made, self._read = self._read, None
        return made.get() if made is not None else self._reading()

    def _reading(self) -> ReadBack | None:
        planned = self.request.planned
        if planned is None:
            return None
        return read_back(model_of(self.folded), planned)
