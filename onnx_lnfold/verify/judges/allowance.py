"""How long the float64 judge may take: an allowance that grows with the model, as the fold's own
time does, estimated from ONNX Runtime's time for the original (`float64_estimate`) and checked
again as the float64 evaluation runs (`verify.oracle.reference.Deadline`)."""

from __future__ import annotations

from onnx_lnfold.verify.case import Compared

# How long the float64 evaluation may take (FLOAT64_BUDGET_S; three evaluations on every input set,
# the fold's two readings in one pass) is
# estimated from ONNX Runtime's time for the original times FLOAT64_COST (onnx.reference in
# float64 over ONNX Runtime in float32, one run each, wall clock: 12 to 13 on Whisper tiny.en's
# encoder), then again from the first float64 run.
FLOAT64_COST = 15.0
# The float64 evaluation's allowance grows with the model, as the fold's own time does (analysis,
# rewrite, writing the output: about a load + save), so that the default run stays a few times a
# load + save at any size: the first input set's three evaluations (in two passes over the weights,
# each read once a pass, as the fold reads them) may take FLOAT64_FIRST_SHARE times what the fold took, at least FLOAT64_FIRST_S; each
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


def over_budget(estimate: float, allowance: float) -> str:
    return f"a float64 evaluation would take about {estimate:.0f} s, over its allowance of {allowance:.0f} s"


def within(compared: list[Compared], allowance: float, budget: float) -> list[Compared]:
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
