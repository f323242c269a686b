"""The judgment: a ladder of judges, from the strongest to the weakest (docs/DESIGN.md section 6).
Each gives the verdict or declines (`verify.case.Declined`), saying why; the next judges with that
reason, which the report gives as why the verdict rests on a weaker judgment:

1. `float64.judge`: the fold's float64 twins against the original's (judgment `FLOAT64`);
2. `sensitivity.judge`: the fold within rtol plus a multiple of the original's own float32
   sensitivity (`SENSITIVITY`);
3. `sensitivity.judge_by_rtol`: rtol alone (`RTOL_ONLY`), which never declines.

How long the float64 judge may take is `allowance`'s.
"""

from __future__ import annotations

from onnx_lnfold.verify.case import Case, Declined
from onnx_lnfold.verify.judges import float64, sensitivity
from onnx_lnfold.verify.verdict import Verification

# The judges that may decline, in order; `sensitivity.judge_by_rtol` is the last.
LADDER = (float64.judge, sensitivity.judge)


def judge(case: Case) -> Verification:
    """The verdict of the strongest judge that can judge `case`."""
    why = ""
    for rung in LADDER:
        found = rung(case, why)
        if not isinstance(found, Declined):
            return found
        why = found.reason
    return sensitivity.judge_by_rtol(case, why)
