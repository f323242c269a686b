"""The check of a model larger than memory, its passes side by side (docs/DESIGN.md section 6).

Where both models run in ONNX Runtime block by block and the float64 judge is to run on its own
allowance (no `--float64-budget` given), the five passes that read the weights (the original in
ONNX Runtime and its float64 twin, the fold in ONNX Runtime and its twin as written and exact, the
read-back of the fold against its plan) run together, a block apart (`verify.oracle.paced`): each
file is read from disk about once, where one pass after another reads each model once a pass (the
read-back both). What they give is kept (`SideBySide`, the check's `verify.passes.Passes` then)
and read by `verify.ort_runs`, the check and the float64 judge as they read each pass run alone;
they get the same figures. A run the passes did not make (a set taken in another reading of the
shapes, the twins on other sets) is made alone when asked for, as `verify.passes.EachAlone` does.

The twins run on the first input set, the others compared in ONNX Runtime against the original
(as the float64 judge does where the twins on every set would not fit their allowance); the
original's twin keeps its deadline (`verify.oracle.reference.Deadline`), timed by its own steps.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from onnx_lnfold.verify.judges.allowance import first_allowance
from onnx_lnfold.verify.oracle.blas_threads import blas_threads_at_most
from onnx_lnfold.verify.oracle.blockwise import BlockwiseSession
from onnx_lnfold.verify.oracle.paced import Pass, one_at_a_time, run_together
from onnx_lnfold.verify.oracle.reference import Deadline, Float64Model
from onnx_lnfold.verify.passes import Arrays, EachAlone, Passes, RunsAhead, Twins
from onnx_lnfold.verify.readback import ReadBack, read_back_steps
from onnx_lnfold.verify.sessions import ModelBytesOrPath, blockwise_session, ort_run_options

logger = logging.getLogger(__name__)

# The input sets the twins run on beside ONNX Runtime's passes: the first.
TWIN_SETS = 1
# Steps of different passes run at once: ONNX Runtime, the products and the reads release the
# interpreter, and one pass's single-threaded stretches (a block's session made, a tensor widened)
# leave a core to another's. OpenBLAS then keeps to the cores left to each (`blas_threads_at_most`).
PASS_WORKERS = min(2, os.cpu_count() or 1)


class _OriginalTwinStopped(Exception):
    """The original's twin stopped: the fold's has nothing to be compared with."""


# Why the float64 twins judged the first input set alone, where they ran side by side.
TWINS_BESIDE = "the model runs block by block, its float64 twins on the first set beside onnxruntime's runs"


@dataclass
class SideBySide(Passes):
    """What the passes gave on the input sets `feeds` (the sets as given, in order): each model's
    ONNX Runtime outputs per set (or the exception its run raised) and the seconds of its pass;
    the float64 twins' outputs on the first sets (as many as fitted), or why there are none; the
    read-back. What they did not run, `alone` runs when asked for."""

    alone: EachAlone
    feeds: list[Arrays]
    sessions: tuple[BlockwiseSession, BlockwiseSession]  # the original's and the fold's, for their other runs
    runs: tuple[list[dict | Exception], list[dict | Exception]]  # the original's and the fold's
    seconds: tuple[float, float]
    truths: list[Arrays] | None = None
    written: list[Arrays] | None = None
    exactly: list[Arrays] | None = None
    twin_error: BaseException | None = None  # why the twins gave nothing (None: they ran, or were not asked for)
    read: ReadBack | None = None  # the fold read back against its plan (`verify.readback`), where planned
    read_error: BaseException | None = None  # what the read-back raised, for the check to raise

    def ran_on(self, feeds: list[Arrays]) -> bool:
        """Whether these passes ran on the sets `feeds`: these very sets, in order, from the first
        (none taken in another reading of the shapes, none left out before them)."""
        return len(feeds) <= len(self.feeds) and all(a is b for a, b in zip(feeds, self.feeds))

    def twins_for(self, feeds: list[Arrays]) -> bool:
        """Whether the twins ran, on the sets `feeds` (`ran_on`)."""
        return (self.truths is not None or self.twin_error is not None) and self.ran_on(feeds)

    def session(self, model: int, source: ModelBytesOrPath) -> BlockwiseSession:
        return self.sessions[model]

    def runs_ahead(self, model: int, session, feeds_list: list[Arrays]) -> RunsAhead:
        if len(feeds_list) == len(self.feeds) and self.ran_on(feeds_list):
            return RunsAhead(session, feeds_list, (self.runs[model], self.seconds[model]))
        return self.alone.runs_ahead(model, session, feeds_list)

    def float64_sets(self, feeds_list: list[Arrays], fitting: Callable[[], tuple[int, str]]) -> tuple[int, str]:
        if self.twins_for(feeds_list):
            return len(feeds_list), TWINS_BESIDE
        return self.alone.float64_sets(feeds_list, fitting)

    def twins(self, feeds_list: list[Arrays], budget: float) -> Twins:
        if not self.twins_for(feeds_list):
            return self.alone.twins(feeds_list, budget)
        if self.twin_error is not None:
            raise self.twin_error
        return self.truths, self.written, self.exactly  # type: ignore[return-value]

    def read_back(self) -> ReadBack | None:
        if self.read_error is not None:
            raise self.read_error
        return self.read


def side_by_side(alone: EachAlone, feeds: list[Arrays]) -> SideBySide | None:
    """Run both models in ONNX Runtime (`alone`'s models as given: no float32 shadows) and their
    float64 twins on `feeds`, and the read-back, side by side; None where they do not run so (a
    model that runs in one session, a float64 budget asked for): each then runs alone (`alone`)."""
    request = alone.request
    budget = request.float64_budget
    if budget is not None:  # an asked-for budget is estimated from ONNX Runtime's time before the twins
        return None
    progress = one_at_a_time(request.progress)
    made = blockwise_session(alone.original, progress), blockwise_session(alone.folded, progress)
    if made[0] is None or made[1] is None:
        return None
    sessions = (made[0], made[1])
    started = time.perf_counter()
    passes = [
        Pass("the original in onnxruntime", sessions[0].steps(feeds, ort_run_options())),
        Pass("the fold in onnxruntime", sessions[1].steps(feeds, ort_run_options())),
    ]
    twins: list[Pass] = []
    twin_error: BaseException | None = None
    try:
        truth_model = Float64Model(alone.original, progress=progress)
        fold_model = Float64Model(alone.folded, request.computed, progress=progress)
    except Exception as e:  # noqa: BLE001 - an op it cannot evaluate, or worse: the judge words it (`float64_figures`)
        twin_error = e
    else:
        truth_model.label, fold_model.label = "the original", "the fold, as written and exact"
        # The first input set alone: a model this large is judged in float64 on it, the others in
        # ONNX Runtime against the original (`judges.float64`), which keeps the twins' time to
        # that of one set (a few rows per weight read).
        first = feeds[:TWIN_SETS]
        truth_pass = Pass("the original in float64", iter(()))  # its steps need its clock: set below
        deadline = Deadline(started, first_allowance(budget, request.fold_seconds), 3, clock=truth_pass.clock)
        truth_pass.steps = truth_model.steps(first, deadline)

        def keep() -> int:
            if truth_pass.error is not None:
                raise _OriginalTwinStopped()
            return len(first)

        twins = [truth_pass, Pass("the fold in float64", fold_model.written_and_exact_steps(first, keep))]
    planned = request.planned
    reading = [Pass("the read-back", read_back_steps(alone.folded, planned))] if planned is not None else []
    with blas_threads_at_most(max(1, (os.cpu_count() or 1) // PASS_WORKERS)):
        run_together(passes + twins + reading, PASS_WORKERS)
    for p in passes:
        if p.error is not None:  # a failure of the driver itself, not of a set: raised as it was
            raise p.error
    runs, seconds = (passes[0].result, passes[1].result), (passes[0].seconds, passes[1].seconds)
    found = SideBySide(alone, feeds, sessions, runs, seconds)
    if twins:
        truth_pass, fold_pass = twins
        twin_error = truth_pass.error or fold_pass.error
        if twin_error is None:
            found.truths = truth_pass.result
            found.written, found.exactly = fold_pass.result
    found.twin_error = twin_error
    if reading:
        found.read, found.read_error = reading[0].result, reading[0].error
    logger.info(
        "side by side, each pass's own seconds: %s",
        ", ".join(f"{p.label} {p.seconds:.1f}" for p in passes + twins + reading),
    )
    return found
