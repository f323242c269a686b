"""The float64 judge, the first of the ladder (docs/DESIGN.md section 6): the original's float64
twin, and the fold's twin read twice in one pass, as written and with its computed constants exact
(`verify.oracle.reference`), on the input sets that fit the allowance (`verify.judges.allowance`), each against ONNX Runtime's runs, and three
checks on their figures (`float64_failure`):

1. the fold's exact twin (every constant the fold computed at its unrounded float64 value) vs the
   original's: an exact transformation differs by float64 rounding alone, so any wrong fold, however
   small, is over `EXACT_RTOL`;
2. the fold as written (its centered weights rounded to their type) vs the original's twin: the
   fold's own error against the truth, held to the tolerance of the output's type (`rtol`);
3. the fold in ONNX Runtime vs the original's twin, within `rtol` plus `ORT_NOISE_FACTOR` times the
   original's own error there: what runs is ONNX Runtime's kernels, not the twin's.

It declines where no float64 run fits: none asked for, over its allowance, an op `onnx.reference`
cannot evaluate, or a twin far from ONNX Runtime's run of the original (an op evaluated otherwise).
"""

from __future__ import annotations

import math

from onnx_lnfold.verify.case import Case, Compared, Declined
from onnx_lnfold.verify.judges.allowance import (
    first_allowance,
    float64_allowance,
    float64_estimate,
    over_budget,
    within,
)
from onnx_lnfold.verify.oracle.reference import Float64Unavailable, failing_node
from onnx_lnfold.verify.sessions import first_line, relative
from onnx_lnfold.verify.verdict import (
    EXACT_RTOL,
    FLOAT64,
    ORT_NOISE_FACTOR,
    TWIN_DISAGREES_FACTOR,
    OutputDiff,
    Verification,
    rtol_for,
)


def judge(case: Case, why: str = "") -> Verification | Declined:
    """The verdict in float64, on the first input sets that fit the allowance (the others compared in
    ONNX Runtime against the original, with a note), or why there is none. `why` is empty: no judge
    comes before this one."""
    budget, fold_seconds = case.request.float64_budget, case.request.fold_seconds
    allowance = float64_allowance(budget, fold_seconds)
    first = first_allowance(budget, fold_seconds)

    def fitting() -> tuple[int, str]:
        # The first set's twins are timed as they run when no budget was asked for (ONNX Runtime's
        # time for a model run block by block is mostly its weights being read, no guide to float64's).
        fit = within(case.compared, allowance, first if budget is not None else math.inf)
        whole = float64_estimate(sum(run.seconds for run in case.compared))
        return len(fit), f"float64 on all would take about {whole:.0f} s, over its allowance of {allowance:.0f} s"

    # Where the twins ran already (beside ONNX Runtime's passes, `verify.side_by_side`), the sets they ran on.
    count, not_all = case.passes.float64_sets([run.feeds for run in case.compared], fitting)  # type: ignore[union-attr]
    chosen = case.compared[:count]
    if budget is not None and budget <= 0:
        return Declined("none asked for (a float64 budget of 0 s)")
    if not chosen:
        return Declined(over_budget(float64_estimate(case.compared[0].seconds), first))
    try:
        chosen = chosen[: float64_figures(case, chosen, first)]
    except Float64Unavailable as e:
        return Declined(str(e))
    disagrees = twin_disagrees(case.outputs, case.output_types)
    if disagrees:
        return Declined(disagrees)
    partial = len(chosen) < len(case.compared)
    if partial:
        case.notes.append(
            f"judged in float64 on the first {len(chosen)} of {len(case.compared)} input sets, the others in "
            f"onnxruntime against the original: {not_all}"
        )
    reason = float64_failure(case.outputs, partial)
    return case.verdict("failed" if reason else "passed", reason, judgment=FLOAT64)


def float64_figures(case: Case, compared: list[Compared], budget: float) -> int:
    """The float64 twins on the input sets `compared` (`verify.passes.Passes.twins`: all sets at
    once, node by node, each weight read once by the original's twin, once for both readings of the
    fold's), their figures added to `case.worst`. Raises `Float64Unavailable`
    when they cannot run (nothing added then), or when the original's twin shows the three would
    take more than `budget` seconds (the first set alone is judged where all would not fit: the
    number of sets judged is returned)."""
    try:
        truths, written, exactly = case.passes.twins([run.feeds for run in compared], budget)  # type: ignore[union-attr]
        compared = compared[: len(truths)]  # the sets that fit
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
                diff.exact = relative(ref, exactly[number][name]) if exactly is not None else None
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
            case.worst[name].merge(diff)
    return len(figures)


def twin_disagrees(outputs: list[OutputDiff], output_types: dict[str, int]) -> str:
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


def float64_failure(outputs: list[OutputDiff], partial: bool = False) -> str:
    """Why the fold fails the three checks of docs/DESIGN.md section 6 on the sets judged in float64,
    "" where it passes; `partial`: some sets were compared in ONNX Runtime only, where the fold must
    be as close to the original as the original's own error against the truth allows (measured on
    the float64 sets)."""
    not_exact = [o for o in outputs if o.exact is not None and not o.exact <= EXACT_RTOL]
    if not_exact:
        o = max(not_exact, key=lambda o: o.exact)  # type: ignore[arg-type, return-value]
        reason = (
            f"the fold is not exact: in float64, output '{o.name}' differs from the original by {o.exact:.2g} "
            f"relative (tolerance {EXACT_RTOL:g})"
        )
        return reason
    over = [o for o in outputs if not o.written <= o.rtol]  # type: ignore[operator]
    if over:
        o = max(over, key=lambda o: o.written / o.rtol)  # type: ignore[operator]
        reason = (
            f"output '{o.name}' differs: in float64, the fold as written (its weights rounded to their type) is "
            f"{o.written:.3g} relative from the original > rtol {o.rtol:g}"
        )
        return reason

    def allowed(o: OutputDiff) -> float:
        return o.rtol + ORT_NOISE_FACTOR * o.original_error  # type: ignore[operator]

    noisy = [o for o in outputs if not o.fold_error <= allowed(o)]  # type: ignore[operator]
    if noisy:
        o = max(noisy, key=lambda o: o.fold_error / allowed(o))  # type: ignore[operator]
        reason = (
            f"output '{o.name}' differs: in onnxruntime, the fold is {o.fold_error:.3g} relative from the float64 "
            f"reference, the original {o.original_error:.3g} > rtol {o.rtol:g} + {ORT_NOISE_FACTOR:g} x the original's"
        )
        return reason
    if partial:
        far = [o for o in outputs if not o.rel_diff <= allowed(o) + o.original_error]  # type: ignore[operator]
        if far:
            o = max(far, key=lambda o: o.rel_diff / (allowed(o) + o.original_error))  # type: ignore[operator]
            reason = (
                f"output '{o.name}' differs: in onnxruntime, the fold is {o.rel_diff:.3g} relative from the original > "
                f"rtol {o.rtol:g} + {ORT_NOISE_FACTOR + 1:g} x the original's own error {o.original_error:.3g}"
            )
            return reason
    return ""
