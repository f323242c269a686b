"""Judging a fold (docs/DESIGN.md section 6): the float64 figures of the original's twin, the
fold's twin as written and its exact twin, each against ONNX Runtime's runs, and the three
checks on them (`judge_float64`); or, without a float64 run, the original's own float32
sensitivity measured (`measure_sensitivity`) and the fold held to it (`judge_sensitivity`)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from onnx_lnfold.verify.oracle.reference import Deadline, Float64Model, Float64Unavailable
from onnx_lnfold.verify.runner import ModelBytesOrPath, compare, first_line, run_sets, session_for
from onnx_lnfold.verify.verdict import (
    EXACT_RTOL,
    FLOAT64,
    ORT_NOISE_FACTOR,
    SENSITIVITY,
    SENSITIVITY_FACTOR,
    OutputDiff,
    Verification,
)

# How long the float64 evaluation may take (FLOAT64_BUDGET_S, three twins on every input set) is
# estimated from ONNX Runtime's time for the original times FLOAT64_COST (onnx.reference in
# float64 over ONNX Runtime in float32, one run each, wall clock: 12 to 13 on Whisper tiny.en's
# encoder), then again from the first float64 run.
FLOAT64_COST = 15.0
# The float64 evaluation's allowance grows with the model, as the fold's own time does (analysis,
# rewrite, writing the output: about a load + save), so that the default run stays a few times a
# load + save at any size: the first input set's three twins (each reads the weights once, as the
# fold does) may take FLOAT64_FIRST_SHARE times what the fold took, at least FLOAT64_FIRST_S; each
# further set is judged in float64 while all of them stay within FLOAT64_SHARE times the fold's
# time, at least FLOAT64_FLOOR_S. A budget asked for (`--float64-budget`) replaces the first and
# caps the others.
FLOAT64_FIRST_SHARE = 3.0
FLOAT64_SHARE = 2.0
FLOAT64_FIRST_S = 60.0
FLOAT64_FLOOR_S = 10.0


def float64_estimate(original_seconds: float, twins: int = 3) -> float:
    """Seconds the float64 twins would take, from ONNX Runtime's time for the original."""
    return twins * FLOAT64_COST * original_seconds


def float64_allowance(budget: float | None, fold_seconds: float | None) -> float:
    """Seconds the float64 evaluation of every input set may take: FLOAT64_SHARE times what the
    fold took (at least FLOAT64_FLOOR_S) when that is known, and no more than `budget` when one
    was asked for."""
    if fold_seconds is None:
        return first_allowance(budget, fold_seconds)
    scaled = max(FLOAT64_FLOOR_S, FLOAT64_SHARE * fold_seconds)
    return scaled if budget is None else min(budget, scaled)


def first_allowance(budget: float | None, fold_seconds: float | None) -> float:
    """Seconds the float64 evaluation of the first input set may take: `budget` when one was asked
    for, else FLOAT64_FIRST_SHARE times what the fold took, at least FLOAT64_FIRST_S."""
    if budget is not None:
        return budget
    return max(FLOAT64_FIRST_S, FLOAT64_FIRST_SHARE * (fold_seconds or 0.0))


# --------------------------------------------------------------------------- the check
@dataclass
class Compared:
    """One input set as ONNX Runtime ran it: the feeds the original accepted (as given, and as
    ONNX Runtime took them: widened for float32 shadows), both models' outputs, and the seconds
    the original took on it."""

    feeds: dict[str, np.ndarray]
    ort_feeds: dict[str, np.ndarray]
    original: dict[str, np.ndarray]
    fold: dict[str, np.ndarray]
    seconds: float = 0.0


def relative(reference: np.ndarray, candidate: np.ndarray) -> float:
    return compare({"": reference}, {"": candidate})[0].rel_diff


def float64_figures(
    original: ModelBytesOrPath,
    folded: ModelBytesOrPath,
    compared: list[Compared],
    worst: dict[str, OutputDiff],
    exact: dict[str, Any] | None,
    budget: float,
) -> int:
    """Run the float64 twins on every input set ONNX Runtime ran (all sets at once, node by node:
    each weight read once per twin), and add their figures to `worst`. Raises `Float64Unavailable`
    when they cannot run (nothing added then), or when the original's twin shows the three would
    take more than `budget` seconds (the first set alone is judged where all would not fit: the
    number of sets judged is returned)."""
    try:
        twins = [Float64Model(original), Float64Model(folded)]
        if exact is not None:
            twins.append(Float64Model(folded, exact))
        for twin, label in zip(twins, ("the original", "the fold as written", "the fold, exact")):
            twin.label = label
        started = time.perf_counter()
        truths = twins[0].run_many([run.feeds for run in compared], Deadline(started, budget, len(twins)))
        compared = compared[: len(truths)]  # the sets that fit
        feeds = [run.feeds for run in compared]
        written, *exactly = (twin.run_many(feeds) for twin in twins[1:])
        figures: list[dict[str, OutputDiff]] = []
        for number, (run, truth) in enumerate(zip(compared, truths)):
            per_output = {}
            for name, ref in truth.items():
                if name not in run.original or run.original[name].shape != ref.shape:
                    raise Float64Unavailable(
                        f"the float64 twin's output '{name}' has another shape than in onnxruntime"
                    )
                diff = OutputDiff(name, ref.shape, 0.0, 1.0)
                diff.written = relative(ref, written[number][name])
                diff.exact = relative(ref, exactly[0][number][name]) if exactly else None
                diff.original_error = relative(ref, run.original[name])
                diff.fold_error = relative(ref, run.fold[name])
                per_output[name] = diff
            figures.append(per_output)
    except Float64Unavailable:
        raise
    except Exception as e:  # noqa: BLE001 - e.g. an op the reference implements but not for these inputs
        where = failing_node(e)
        at = f" at {where}" if where else ""
        raise Float64Unavailable(f"the float64 evaluation failed{at}: {first_line(e)}") from None
    for per_output in figures:
        for name, diff in per_output.items():
            worst[name].merge(diff)
    return len(figures)


def failing_node(error: BaseException) -> str | None:
    """`Pad 'time_shift'`: the node whose evaluation raised `error` inside `Float64Model.run_many`
    (its loop variable `node`, read from the traceback: onnx.reference's own messages, such as
    "index can't contain negative values" for a Pad with negative pads, name no op); None where the
    error came from elsewhere."""
    found = None
    tb = error.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code is Float64Model.run_many.__code__:
            proto = getattr(frame.f_locals.get("node"), "onnx_node", None)
            if proto is not None:
                domain = f"{proto.domain}::" if proto.domain not in ("", "ai.onnx") else ""
                found = f"{domain}{proto.op_type} '{proto.name}'" if proto.name else f"{domain}{proto.op_type}"
        tb = tb.tb_next
    return found


def over_budget(estimate: float, allowance: float) -> str:
    return f"a float64 evaluation would take about {estimate:.0f} s, over its allowance of {allowance:.0f} s"


def judge_float64(outputs: list[OutputDiff], result, partial: bool = False) -> Verification:
    """The three checks of docs/DESIGN.md section 6 on the sets judged in float64; `partial`: some
    sets were compared in ONNX Runtime only, where the fold must be as close to the original as the
    original's own error against the truth allows (measured on the float64 sets)."""
    not_exact = [o for o in outputs if o.exact is not None and not o.exact <= EXACT_RTOL]
    if not_exact:
        o = max(not_exact, key=lambda o: o.exact)  # type: ignore[arg-type, return-value]
        reason = (
            f"the fold is not exact: in float64, output '{o.name}' differs from the original by {o.exact:.2g} "
            f"relative (tolerance {EXACT_RTOL:g})"
        )
        return result("failed", reason, outputs, judgment=FLOAT64)
    over = [o for o in outputs if not o.written <= o.rtol]  # type: ignore[operator]
    if over:
        o = max(over, key=lambda o: o.written / o.rtol)  # type: ignore[operator]
        reason = (
            f"output '{o.name}' differs: in float64, the fold as written (its weights rounded to their type) is "
            f"{o.written:.3g} relative from the original > rtol {o.rtol:g}"
        )
        return result("failed", reason, outputs, judgment=FLOAT64)
    def allowed(o: OutputDiff) -> float:
        return o.rtol + ORT_NOISE_FACTOR * o.original_error  # type: ignore[operator]

    noisy = [o for o in outputs if not o.fold_error <= allowed(o)]  # type: ignore[operator]
    if noisy:
        o = max(noisy, key=lambda o: o.fold_error / allowed(o))  # type: ignore[operator]
        reason = (
            f"output '{o.name}' differs: in onnxruntime, the fold is {o.fold_error:.3g} relative from the float64 "
            f"reference, the original {o.original_error:.3g} > rtol {o.rtol:g} + {ORT_NOISE_FACTOR:g} x the original's"
        )
        return result("failed", reason, outputs, judgment=FLOAT64)
    if partial:
        far = [o for o in outputs if not o.rel_diff <= allowed(o) + o.original_error]  # type: ignore[operator]
        if far:
            o = max(far, key=lambda o: o.rel_diff / (allowed(o) + o.original_error))  # type: ignore[operator]
            reason = (
                f"output '{o.name}' differs: in onnxruntime, the fold is {o.rel_diff:.3g} relative from the original > "
                f"rtol {o.rtol:g} + {ORT_NOISE_FACTOR + 1:g} x the original's own error {o.original_error:.3g}"
            )
            return result("failed", reason, outputs, judgment=FLOAT64)
    return result("passed", "", outputs, judgment=FLOAT64)


def measure_sensitivity(original: ModelBytesOrPath, compared: list[Compared], worst: dict[str, OutputDiff]) -> None:
    """The original's own change, on each input set, when every float weight of two or more
    elements moves by up to one rounding step (`perturb`; scalars stay: a mask's lowest value, a
    scale compared with another are the graph's logic, not its weights). Run block by block
    (`verify.oracle.blockwise`), each block's weights perturbed in memory: no copy is written."""
    session = session_for(original, perturbed=True)
    results = run_sets(session, [run.ort_feeds for run in compared])
    del session
    for run, moved in zip(compared, results):
        if isinstance(moved, Exception):
            raise moved
        for name, ref in run.original.items():
            diff = OutputDiff(name, ref.shape, 0.0, 1.0)
            diff.sensitivity = relative(ref, moved[name])
            worst[name].merge(diff)


def judge_sensitivity(outputs: list[OutputDiff], result, why: str, judgment: str = SENSITIVITY) -> Verification:
    """Within rtol plus `SENSITIVITY_FACTOR` times the original's sensitivity; `judgment` RTOL_ONLY
    when none could be measured (then rtol alone, and the verdict says so)."""
    def allowed(o: OutputDiff) -> float:
        return o.rtol + SENSITIVITY_FACTOR * (o.sensitivity or 0.0)  # type: ignore[operator]

    over = [o for o in outputs if not o.rel_diff <= allowed(o)]
    if over:
        o = max(over, key=lambda o: o.rel_diff / allowed(o))
        sensitivity = (
            f" + {SENSITIVITY_FACTOR:g} x the original's sensitivity {o.sensitivity:.3g}" if o.sensitivity else ""
        )
        reason = (
            f"output '{o.name}' differs: max|diff| {o.max_abs_diff:.3g}, relative {o.rel_diff:.3g} > rtol {o.rtol:g}"
            f"{sensitivity} (no float64 reference: {why})"
        )
        return result("failed", reason, outputs, judgment=judgment, judgment_reason=why)
    return result("passed", "", outputs, judgment=judgment, judgment_reason=why)
