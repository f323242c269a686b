"""The judges below float64, where no float64 run could be had (docs/DESIGN.md section 6): the
original's own float32 sensitivity is measured on the same inputs (its float weights moved by up to
one rounding step, `measure_sensitivity`) and the fold, in ONNX Runtime, held to rtol plus
`SENSITIVITY_FACTOR` times it (`judge`); where the perturbed original does not run, to rtol alone
(`judge_by_rtol`, the last judge: it never declines)."""

from __future__ import annotations

import numpy as np

from onnx_lnfold.verify.case import Case, Compared, Declined
from onnx_lnfold.verify.oracle.paced import Progress
from onnx_lnfold.verify.sessions import ModelBytesOrPath, first_line, relative, run_sets, session_for
from onnx_lnfold.verify.verdict import RTOL_ONLY, SENSITIVITY, SENSITIVITY_FACTOR, Judgment, OutputDiff, Verification


def judge(case: Case, why: str) -> Verification | Declined:
    """The verdict against the original's sensitivity, or why it could not be measured. `why`: why
    the float64 judge declined."""
    try:
        measure_sensitivity(case.ort_original, case.compared, case.worst, case.request.progress)  # type: ignore[arg-type]
    except Exception as e:  # noqa: BLE001 - the perturbed original does not run: rtol alone, said so
        return Declined(f"{why}; the original's sensitivity could not be measured: {first_line(e)}")
    return _judged(case, why, SENSITIVITY)


def judge_by_rtol(case: Case, why: str) -> Verification:
    """The verdict by rtol alone, the report saying why (`why`: why the judges above declined)."""
    return _judged(case, why, RTOL_ONLY)


def _judged(case: Case, why: str, judgment: Judgment) -> Verification:
    reason = sensitivity_failure(case.outputs, why)
    return case.verdict("failed" if reason else "passed", reason, judgment=judgment, judgment_reason=why)


def measure_sensitivity(
    original: ModelBytesOrPath, compared: list[Compared], worst: dict[str, OutputDiff], progress: Progress | None = None
) -> None:
    """The original's own change, on each input set, when every float weight of two or more
    elements moves by up to one rounding step (`perturb`; scalars stay: a mask's lowest value, a
    scale compared with another are the graph's logic, not its weights). Run block by block
    (`verify.oracle.blockwise`), each block's weights perturbed in memory: no copy is written.
    Raises where the perturbed original does not run or gives another shape (a length it rounds
    from its weights: a duration predictor); `worst` is then as it was, so no partial measure
    loosens the rtol the next judge holds the fold to. Which block it is on is said to `progress`."""
    session = session_for(original, perturbed=True, progress=progress)
    results = run_sets(session, [run.ort_feeds for run in compared])
    del session
    measured = []
    for run, moved in zip(compared, results):
        if isinstance(moved, Exception):
            raise moved
        for name, ref in run.original.items():
            if name not in moved or np.shape(moved[name]) != ref.shape:
                got = np.shape(moved[name]) if name in moved else "none"
                raise ValueError(f"output '{name}' comes out {got}, not {ref.shape}, with its weights perturbed")
            diff = OutputDiff(name, ref.shape, 0.0, 1.0)
            diff.sensitivity = relative(ref, moved[name])
            measured.append(diff)
    for diff in measured:
        worst[diff.name].merge(diff)


def sensitivity_failure(outputs: list[OutputDiff], why: str) -> str:
    """Why the fold is not within rtol plus `SENSITIVITY_FACTOR` times the original's sensitivity
    (rtol alone where none was measured), "" where it is; `why`: why there is no float64 reference."""

    def allowed(o: OutputDiff) -> float:
        return o.rtol + SENSITIVITY_FACTOR * (o.sensitivity or 0.0)  # type: ignore[operator]

    over = [o for o in outputs if not o.rel_diff <= allowed(o)]
    if over:
        o = max(over, key=lambda o: o.rel_diff / allowed(o))
        sensitivity = (
            f" + {SENSITIVITY_FACTOR:g} x the original's sensitivity {o.sensitivity:.3g}" if o.sensitivity else ""
        )
        return (
            f"output '{o.name}' differs: max|diff| {o.max_abs_diff:.3g}, relative {o.rel_diff:.3g} > rtol {o.rtol:g}"
            f"{sensitivity} (no float64 reference: {why})"
        )
    return ""
