"""How the check's passes over both models run (docs/DESIGN.md section 6): the original and the
fold in ONNX Runtime, their float64 twins, the read-back of the fold against its plan. `Passes`
says what the check asks of them; `EachAlone` runs each pass alone, when it is asked for, one after
another; `verify.side_by_side.SideBySide`, for a model larger than memory, gives what the passes
gave running side by side, each file read about once. The check chooses one (`verify.ort_runs`)
and asks it alike: `verify.ort_runs` for the sessions and their runs, the float64 judge for the
twins, the check for the read-back.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from onnx_lnfold.verify.oracle.reference import Deadline, Float64Model
from onnx_lnfold.verify.readback import ReadBack, read_back
from onnx_lnfold.verify.readback.folded import model_of
from onnx_lnfold.verify.request import VerifyRequest
from onnx_lnfold.verify.sessions import ModelBytesOrPath, is_blockwise, run_sets, session_for

# The two models, as `Passes` names them.
ORIGINAL, FOLD = 0, 1

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
    The fold as the read-back read it is kept for its float64 twin: the file is parsed once."""

    original: ModelBytesOrPath
    folded: ModelBytesOrPath
    request: VerifyRequest
    _folded_read: ir.Model | None = field(default=None, init=False, repr=False)

    def session(self, model: int, source: ModelBytesOrPath):
        return session_for(source, progress=self.request.progress)

    def runs_ahead(self, model: int, session, feeds_list: list[Arrays]) -> RunsAhead:
        return RunsAhead(session, feeds_list)

    def float64_sets(self, feeds_list: list[Arrays], fitting: Callable[[], tuple[int, str]]) -> tuple[int, str]:
        return fitting()

    def twins(self, feeds_list: list[Arrays], budget: float) -> Twins:
        """The original's twin on the sets that fit `budget`, then the fold's on those, as written
        and, where the fold's computed constants are at hand, exact."""
        exact, progress = self.request.computed, self.request.progress
        original = Float64Model(self.original, progress=progress)
        read, self._folded_read = self._folded_read, None
        folded = Float64Model(read if read is not None else self.folded, exact, progress=progress)
        original.label = "the original"
        folded.label = "the fold, as written and exact" if exact is not None else "the fold as written"
        started = time.perf_counter()
        # The fold's two readings share one pass (each weight read once), at most twice the
        # original's work: three of its passes bound all.
        truths = original.run_many(feeds_list, Deadline(started, budget, 3))
        feeds = feeds_list[: len(truths)]
        if exact is not None:
            return truths, *folded.run_as_written_and_exact(feeds)
        return truths, folded.run_many(feeds), None

    def read_back(self) -> ReadBack | None:
        planned = self.request.planned
        if planned is None:
            return None
        self._folded_read = model_of(self.folded)
        return read_back(self._folded_read, planned)
