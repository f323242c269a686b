"""Both models in ONNX Runtime on every input set, the fold compared with the original there.

One session at a time for a large model: the original's outputs are kept and its session released
before the folded model's is made (two sessions would hold its weights twice). A small model's two
sessions are made at once, on threads of their own, while the read-back and the float64 twins are
made (`verify.passes.EachAlone.begin`). An input set the
original does not run on is tried in its other readings of the shapes; a set that is not required
is left out, with a note, where none runs. How the passes run (each alone, or side by side for a
model larger than memory) is chosen here, once (`verify.passes`).
"""

from __future__ import annotations

import logging
import time

from onnx_lnfold.core.errors import InvalidInput
from onnx_lnfold.verify.case import Case, Compared
from onnx_lnfold.verify.oracle.shadow import float32_shadow, widen_feeds
from onnx_lnfold.verify.passes import FOLD, ORIGINAL, EachAlone, Passes
from onnx_lnfold.verify.seeded import seeded
from onnx_lnfold.verify.sessions import (
    ORT_MESSAGE_CHARS,
    compare,
    first_line,
    onnxruntime_missing,
    refuses_model,
    run_session,
)
from onnx_lnfold.verify.side_by_side import side_by_side
from onnx_lnfold.verify.verdict import Verification, rtol_for

logger = logging.getLogger(__name__)

# (number from 1, feeds as given, as ONNX Runtime took them, the original's outputs, seconds)
_Run = tuple[int, dict, dict, dict, float]


def run_both(case: Case, weights: int) -> Verification | None:
    """Run the original, then the fold (holding `weights` bytes of weights), on `case`'s input
    sets, filling `case.compared` and `case.worst`; None where both ran, else the verdict:
    'unverified' where the check cannot run (no onnxruntime, no shadows, the original does not load
    or run), 'failed' where the fold does not load or run. Raises `InvalidInput` where ONNX Runtime refuses to load the original as an
    invalid model (`sessions.refuses_model`): not a check that cannot run, a model to refuse."""
    missing = onnxruntime_missing()
    if missing:
        return Verification("unverified", missing, case.request.rtol, way_out="install")
    try:
        case.ort_original = float32_shadow(case.original) if case.shadow else case.original
        ort_folded = float32_shadow(case.folded) if case.shadow else case.folded
    except Exception as e:  # noqa: BLE001 - e.g. a shadow over 2 GB
        return case.verdict("unverified", f"cannot build the float32 shadows: {first_line(e)}", way_out="decline")
    if case.random_ops:  # seeded alike in both (`verify.seeded`): each model's session would draw its own
        case.ort_original, note = seeded(case.ort_original)
        ort_folded, _ = seeded(ort_folded)
        case.notes.extend([note] if note else [])
    case.ort_folded = ort_folded
    passes: Passes = EachAlone(case.original, case.folded, case.request)
    if not case.shadow:
        try:
            passes = side_by_side(passes, [s.feeds for s in case.input_sets]) or passes
        except Exception as e:  # noqa: BLE001 - a model whose blocks cannot be made: each alone says so below
            logger.info("the passes do not run side by side: %s", first_line(e))
    case.passes = passes
    passes.begin(case.ort_original, ort_folded, weights)
    try:
        runs = _run_original(case, passes)
        if isinstance(runs, Verification):
            return runs
        return _run_folded(case, passes, runs)
    finally:
        passes.end()


def _run_original(case: Case, passes: Passes) -> list[_Run] | Verification:
    try:
        session = passes.session(ORIGINAL, case.ort_original)  # type: ignore[arg-type]
    except Exception as e:  # noqa: BLE001
        if refuses_model(e) and not case.shadow:  # the model as given, not our float32 shadow of it
            where = "" if isinstance(case.original, bytes) else f"{case.original}: "
            raise InvalidInput(
                f"{where}invalid model: onnxruntime refuses it: {first_line(e, ORT_MESSAGE_CHARS)}"
            ) from None
        reason = f"the original model does not load in onnxruntime: {first_line(e, ORT_MESSAGE_CHARS)}"
        return case.verdict("unverified", reason, way_out="decline")
    runs: list[_Run] = []
    ahead = passes.runs_ahead(
        ORIGINAL, session, [widen_feeds(s.feeds) if case.shadow else s.feeds for s in case.input_sets]
    )
    for number, input_set in enumerate(case.input_sets, 1):
        where = case.where(number)
        error: Exception | None = None
        for candidate_feeds in (input_set.feeds, *input_set.alternatives):
            feeds = widen_feeds(candidate_feeds) if case.shadow else candidate_feeds
            try:
                started = time.perf_counter()
                reference, seconds = ahead(number - 1, candidate_feeds is input_set.feeds), ahead.seconds
                if reference is None:
                    reference, seconds = run_session(session, feeds), time.perf_counter() - started
            except Exception as e:  # noqa: BLE001 - another reading of the shapes may run
                error = error or e
                continue
            note = input_set.settle(candidate_feeds)
            if note and note not in case.notes:
                case.notes.append(note)
            case.labels[number - 1] = input_set.label
            runs.append((number, candidate_feeds, feeds, reference, seconds))
            break
        else:  # nothing to compare against
            reason = f"the original model does not run in onnxruntime on {where}: {first_line(error)}"  # type: ignore[arg-type]
            if input_set.required:
                return case.verdict("unverified", reason, way_out="inputs")
            case.dropped.append(number - 1)
            case.notes.append(f"left out: {reason}")
    return runs


def _run_folded(case: Case, passes: Passes, runs: list[_Run]) -> Verification | None:
    try:
        session = passes.session(FOLD, case.ort_folded)  # type: ignore[arg-type]
    except Exception as e:  # noqa: BLE001
        return case.verdict("failed", f"the folded model does not load in onnxruntime: {first_line(e)}")
    rtol = case.request.rtol
    ahead = passes.runs_ahead(FOLD, session, [feeds for _, _, feeds, _, _ in runs])
    for index, (number, given, feeds, reference, seconds) in enumerate(runs):
        try:
            candidate = ahead(index)
            if candidate is None:
                candidate = run_session(session, feeds)
        except Exception as e:  # noqa: BLE001
            reason = f"the folded model does not run in onnxruntime on {case.where(number)}: {first_line(e)}"
            return case.verdict("failed", reason)
        case.compared.append(Compared(given, feeds, reference, candidate, seconds))
        for diff in compare(reference, candidate):
            diff.rtol = rtol if rtol is not None else rtol_for(case.output_types.get(diff.name))
            if diff.name in case.worst:
                case.worst[diff.name].merge(diff)
            else:
                case.worst[diff.name] = diff
    return None
