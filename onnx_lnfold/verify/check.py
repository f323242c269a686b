"""Verification: decide whether the folded model computes what the original computes, before
anything is written (docs/DESIGN.md section 6).

Both models run in ONNX Runtime (graph optimizations off, so that its fusions can neither hide nor
cause a difference) on every input set (`verify.inputs`): the fold must load and run there, and the figures
users see come from there. But a float32 run is one rounding of the truth, and a deep model's own
float32 error can exceed the tolerance while the fold is exact (or the fold can be wrong by less
than that error). So the decision is taken in float64 (`verify.oracle.reference`), against three twins:

1. the original's twin vs the fold's twin with every constant the fold computed at its unrounded
   float64 value (`apply.centering`'s `exact_float64`): an exact transformation differs by float64
   rounding alone, so any wrong fold, however small, is over `EXACT_RTOL`;
2. the fold as written (its centered weights rounded to their type) vs the original's twin: the
   fold's own error against the truth, held to the tolerance of the output's type (`rtol`);
3. the fold in ONNX Runtime vs the original's twin, within `rtol` plus `ORT_NOISE_FACTOR` times
   the original's own error there: what runs is ONNX Runtime's kernels, not the twin's.

Where no float64 run fits (an op `onnx.reference` cannot evaluate, an estimated time over the
budget), the original's own float32 sensitivity on the same inputs is measured instead (its float
weights moved by up to one rounding step) and the fold is accepted when it differs from the original
in ONNX Runtime by at most `rtol` plus `SENSITIVITY_FACTOR` times that; the report says which
judgment was used and why.

A fold is written only when this check *passed*. When it cannot run (no onnxruntime, the original
does not run on the inputs, no inputs can be made), the status is "unverified" and the fold is
refused like a failed one, with the way out named (`refusal`).

bfloat16 models run in ONNX Runtime through float32 shadows (`verify.oracle.shadow`). `check_equivalence` is the
step as the pipeline runs it: inputs synthesized from the graph (`verify.inputs`), both models handed to
ONNX Runtime as bytes or, when large, as files (`OrtSource`).
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir

from onnx_lnfold.analysis.plan import CenteringPlan
from onnx_lnfold.core.options import FLOAT64_BUDGET_S
from onnx_lnfold.feeds.sets import verification_input_sets
from onnx_lnfold.feeds.synthesize import InputsUnavailable
from onnx_lnfold.verify.judge import (
    Compared,
    first_allowance,
    float64_allowance,
    float64_estimate,
    float64_figures,
    judge_float64,
    judge_sensitivity,
    measure_sensitivity,
    over_budget,
)
from onnx_lnfold.verify.oracle.reference import Float64Unavailable, exact_tensors
from onnx_lnfold.verify.oracle.shadow import bfloat16_rounding, float32_shadow, has_bfloat16, widen_feeds
from onnx_lnfold.verify.readback import PlannedChanges, ReadBack, read_back
from onnx_lnfold.verify.runner import (
    ModelBytesOrPath,
    compare,
    first_line,
    is_blockwise,
    onnxruntime_missing,
    run_session,
    run_sets,
    session_for,
)
from onnx_lnfold.verify.verdict import (
    FLOAT64,
    LOW_PRECISION,
    RTOL_ONLY,
    TWIN_DISAGREES_FACTOR,
    OutputDiff,
    Verification,
    rtol_for,
)

logger = logging.getLogger(__name__)


# --------------------------------------------------------------------------- what the model holds
def output_types(model: ir.Model) -> dict[str, int]:
    """The element type each graph output is computed in: its tolerance follows it. An fp32 output
    is held to the fp32 tolerance even when some weights are fp16; but an output that is only a
    widening Cast of an fp16/bf16 tensor (an fp16 model converted with `keep_io_types`) carries
    fp16 rounding, and gets the fp16 tolerance."""
    types = {}
    for v in model.graph.outputs:
        if not v.name or v.dtype is None:
            continue
        computed, dtype = v, v.dtype
        while computed.producer() is not None and computed.producer().op_type in ("Cast", "Identity"):
            source = computed.producer().inputs[0]
            if source is None:
                break
            computed, dtype = source, _elem_type(source)
        types[v.name] = int(dtype if dtype in LOW_PRECISION else v.dtype)
    return types


def _elem_type(value: ir.Value, depth: int = 0) -> int | None:
    """`value`'s element type, declared or, where intermediate types were not written, read off
    its producer: a Cast's `to`, else the type of the producer's first typed input."""
    if value.dtype is not None:
        return int(value.dtype)
    node = value.producer()
    if node is None or depth > 16:
        return None
    if node.op_type == "Cast" and "to" in node.attributes:
        return node.attributes.get_int("to")
    for inp in node.inputs:
        if inp is not None and (found := _elem_type(inp, depth + 1)) is not None:
            return found
    return None


def verify(
    original: ModelBytesOrPath,
    folded: ModelBytesOrPath,
    input_sets: list,
    rtol: float | None,
    output_types: dict[str, int] | None = None,
    shadow: bool = False,
    exact: dict[str, Any] | None = None,
    float64_budget: float | None = FLOAT64_BUDGET_S,
    fold_seconds: float | None = None,
    planned: PlannedChanges | None = None,
) -> Verification:
    """Compare the two models on every input set (`verify.inputs.InputSet`s).

    `rtol` applies to every output when given; else each output gets the tolerance of its
    element type in `output_types` (the original's). `shadow`: run float32 shadows in ONNX
    Runtime. `exact`: the constants the fold computed, by name (`verify.oracle.reference.exact_tensors`: they
    give their float64 values), for the exact twin; without it that check is not made. `float64_budget`: seconds the float64
    evaluation may take (0: none, judge by the sensitivity; None: scaled with `fold_seconds`, what the
    fold took: `first_allowance`, `float64_allowance`). The float64 twins run on the input sets that
    fit, the first always. `planned`: what the plan changes (`verify.readback.planned_changes`, taken before
    the fold was applied): the folded model is read back against it first, whatever the judgment
    (`verify.readback`). 'failed' when a check fails or the
    folded model does not run; 'unverified' when the check cannot run at all.
    """
    output_types = output_types or {}
    labels = [s.label for s in input_sets]
    dropped: list[int] = []
    notes: list[str] = []
    how = "float32 shadows (bfloat16 widened)" if shadow else ""

    def result(status, reason="", outputs=(), way_out="", judgment="", judgment_reason=""):
        used = [o.rtol for o in outputs if o.rtol is not None]
        top = rtol if rtol is not None else (max(used) if used else None)
        first = {k: list(v.shape) for k, v in input_sets[0].feeds.items()} if input_sets else {}
        run = [label for i, label in enumerate(labels) if i not in dropped]
        return Verification(
            status, reason, top, first, list(outputs), run, how, list(notes), way_out, judgment, judgment_reason
        )

    missing = onnxruntime_missing()
    if missing:
        return Verification("unverified", missing, rtol, way_out="install")
    try:
        original_model = float32_shadow(original) if shadow else original
        folded_model = float32_shadow(folded) if shadow else folded
    except Exception as e:  # noqa: BLE001 - e.g. a shadow over 2 GB
        return result("unverified", f"cannot build the float32 shadows: {first_line(e)}", way_out="decline")
    # One session at a time: the original's outputs are kept, its session released, before the
    # folded model's is made (two sessions of a large model would hold its weights twice).
    try:
        session = session_for(original_model)
    except Exception as e:  # noqa: BLE001
        return result("unverified", f"the original model does not load in onnxruntime: {first_line(e)}", way_out="decline")
    runs: list[tuple[int, dict, dict, dict, float]] = []  # (number, feeds as given, as ORT took them, outputs, s)
    ahead = _ahead(session, [widen_feeds(s.feeds) if shadow else s.feeds for s in input_sets])
    for number, input_set in enumerate(input_sets, 1):
        where = f"input set {number} of {len(input_sets)} ({input_set.label})"
        error: Exception | None = None
        for candidate_feeds in (input_set.feeds, *input_set.alternatives):
            feeds = widen_feeds(candidate_feeds) if shadow else candidate_feeds
            try:
                started = time.perf_counter()
                reference, seconds = ahead(number - 1, candidate_feeds is input_set.feeds), ahead.seconds
                if reference is None:
                    reference, seconds = run_session(session, feeds), time.perf_counter() - started
            except Exception as e:  # noqa: BLE001 - another reading of the shapes may run
                error = error or e
                continue
            input_set.feeds, input_set.alternatives = candidate_feeds, []
            labels[number - 1] = input_set.label
            runs.append((number, candidate_feeds, feeds, reference, seconds))
            break
        else:  # nothing to compare against
            reason = f"the original model does not run in onnxruntime on {where}: {first_line(error)}"  # type: ignore[arg-type]
            if input_set.required:
                return result("unverified", reason, way_out="inputs")
            dropped.append(number - 1)
            notes.append(f"left out: {reason}")
    del session
    try:
        session = session_for(folded_model)
    except Exception as e:  # noqa: BLE001
        return result("failed", f"the folded model does not load in onnxruntime: {first_line(e)}")
    worst: dict[str, OutputDiff] = {}
    compared: list[Compared] = []
    ahead = _ahead(session, [feeds for _, _, feeds, _, _ in runs])
    for index, (number, given, feeds, reference, seconds) in enumerate(runs):
        try:
            candidate = ahead(index)
            if candidate is None:
                candidate = run_session(session, feeds)
        except Exception as e:  # noqa: BLE001
            where = f"input set {number} of {len(input_sets)} ({labels[number - 1]})"
            return result("failed", f"the folded model does not run in onnxruntime on {where}: {first_line(e)}", worst.values())
        compared.append(Compared(given, feeds, reference, candidate, seconds))
        for diff in compare(reference, candidate):
            diff.rtol = rtol if rtol is not None else rtol_for(output_types.get(diff.name))
            if diff.name in worst:
                worst[diff.name].merge(diff)
            else:
                worst[diff.name] = diff
    del session
    read = read_back(folded, planned) if planned is not None else None
    if read is not None and read.problem:
        return result("failed", f"the folded model is not what the plan wrote: {read.problem}", worst.values())
    allowance = float64_allowance(float64_budget, fold_seconds)
    first = first_allowance(float64_budget, fold_seconds)
    # The first set's twins are timed as they run when no budget was asked for (ONNX Runtime's time
    # for a model run block by block is mostly its weights being read, no guide to float64's).
    chosen = _within(compared, allowance, first if float64_budget is not None else math.inf)
    reason64 = ""
    if float64_budget is not None and float64_budget <= 0:
        reason64 = "none asked for (a float64 budget of 0 s)"
    elif not chosen:
        reason64 = over_budget(float64_estimate(compared[0].seconds), first)
    else:
        try:
            chosen = chosen[: float64_figures(original, folded, chosen, worst, exact, first)]
            reason64 = _twin_disagrees(list(worst.values()), output_types)
        except Float64Unavailable as e:
            reason64 = str(e)
    outputs = list(worst.values())
    if not reason64:
        if len(chosen) < len(compared):
            whole = float64_estimate(sum(run.seconds for run in compared))
            notes.append(
                f"judged in float64 on the first {len(chosen)} of {len(compared)} input sets, the others in "
                f"onnxruntime against the original: float64 on all would take about {whole:.0f} s, over "
                f"its allowance of {allowance:.0f} s"
            )
        return _read_back(judge_float64(outputs, result, partial=len(chosen) < len(compared)), read)
    try:
        measure_sensitivity(original_model, compared, worst)
    except Exception as e:  # noqa: BLE001 - the perturbed original does not run: rtol alone, said so
        why = f"{reason64}; the original's sensitivity could not be measured: {first_line(e)}"
        return _read_back(judge_sensitivity(outputs, result, why, RTOL_ONLY), read)
    return _read_back(judge_sensitivity(outputs, result, reason64), read)


class _ahead:
    """A `BlockwiseSession`'s runs of every input set, made at once (each block's weights read once
    for all sets): `ahead(i)` is set i's outputs (raising what its run raised), None where the
    session runs sets one by one or `first` is false (another reading of the shapes is tried)."""

    def __init__(self, session, feeds_list: list[dict]):
        self._results, self.seconds = None, 0.0
        if is_blockwise(session):
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


def _read_back(verification: Verification, read: ReadBack | None) -> Verification:
    """The verdict with what reading the fold back showed (`verify.readback`): a count, and without
    float64, where it is part of what the verdict rests on, a note."""
    if read is not None:
        verification.edits_checked = read.checked
        if verification.judgment != FLOAT64:
            verification.notes.append(
                f"the fold read back against its plan, in float64, tensor by tensor: {read.checked} planned changes as "
                f"planned (centered weights, biases with beta, rewritten and inserted nodes), {read.unchanged} other "
                "tensors and every other node as they were"
            )
    return verification


def _twin_disagrees(outputs: list[OutputDiff], output_types: dict[str, int]) -> str:
    """Why the float64 evaluation cannot be the judge, where it is far from ONNX Runtime's run of
    the original on some output (by the default tolerance of the output's type, whatever rtol was
    asked for); "" where it agrees."""

    def bound(o: OutputDiff) -> float:
        return TWIN_DISAGREES_FACTOR * rtol_for(output_types.get(o.name))

    far = [o for o in outputs if o.original_error is not None and o.original_error > bound(o)]
    if not far:
        return ""
    o = max(far, key=lambda o: o.original_error / bound(o))  # type: ignore[operator]
    return (
        f"the float64 evaluation is {o.original_error:.3g} relative from ONNX Runtime's run of the original on "
        f"'{o.name}' (over {bound(o):g}): some op is evaluated otherwise there"
    )


def _within(compared: list[Compared], allowance: float, budget: float) -> list[Compared]:
    """The input sets to judge in float64, estimated from ONNX Runtime's time for the original on
    each: the first whenever it fits the `budget` asked for, the next ones while they all fit the
    `allowance`."""
    chosen, total = [], 0.0
    for run in compared:
        total += float64_estimate(run.seconds)
        if total > (budget if not chosen else allowance):
            break
        chosen.append(run)
    return chosen


def check_equivalence(
    original: ModelBytesOrPath,
    folded: ModelBytesOrPath,
    spec_model: ir.Model,
    *,
    rtol: float | None = None,
    input_shapes: dict[str, tuple[int, ...]] | None = None,
    inputs: dict[str, np.ndarray] | None = None,
    plan: CenteringPlan | None = None,
    planned: PlannedChanges | None = None,
    float64_budget: float | None = FLOAT64_BUDGET_S,
    computed: dict[str, Any] | None = None,
    fold_seconds: float | None = None,
    folder: Path | None = None,
) -> Verification:
    """Run both models on the verification inputs; never raises for a check that cannot run
    (the status is then "unverified", with the reason and the way out). `spec_model` is the
    folded model in memory: its inputs are synthesized from it. `computed`: the constants the
    fold computed (`verify.oracle.reference.exact_tensors`, taken before the model was written), which give
    the exact twin their unrounded values; by default those `spec_model` still holds. `planned`: what
    the plan changes, taken before it was applied (`verify.readback.planned_changes`). `folder`:
    where the model was read from (a genai_config.json there describes its KV cache)."""
    computed = exact_tensors(spec_model) if computed is None else computed
    try:
        input_sets = verification_input_sets(spec_model, input_shapes, inputs, folder)
    except InputsUnavailable as e:
        return Verification("unverified", f"cannot synthesize verification inputs: {e}", rtol, way_out="inputs")
    shadow = has_bfloat16(spec_model)
    verification = verify(
        original,
        folded,
        input_sets,
        rtol,
        output_types(spec_model),
        shadow=shadow,
        exact=computed,
        float64_budget=float64_budget,
        fold_seconds=fold_seconds,
        planned=planned,
    )
    if shadow and plan is not None and verification.status == "passed":
        verification.notes.extend(bfloat16_rounding(spec_model, plan))
    return verification
