"""onnx_lnfold: fold LayerNormalization into RMSNorm in ONNX models, exactly or not at all.

    result = onnx_lnfold.fold("model.onnx")      # analyze, center, rewrite, verify
    result.save("model.lnfold.onnx")
    print(result.report.format_text())

`analyze(model)` returns the `CenteringPlan` alone; `LnFoldPass` runs the fold inside an
`onnx_ir.passes.PassManager`.
"""

from onnx_lnfold._analyze import analyze
from onnx_lnfold._errors import LnFoldError, NotVerified, VerificationFailed
from onnx_lnfold._fold import FoldResult, fold
from onnx_lnfold._pass import LnFoldPass
from onnx_lnfold._plan import CenteringEdit, CenteringPlan, LnDecision
from onnx_lnfold._report import FoldReport
from onnx_lnfold._verify import Verification

__version__ = "0.1.0"

__all__ = [
    "CenteringEdit",
    "CenteringPlan",
    "FoldReport",
    "FoldResult",
    "LnDecision",
    "LnFoldError",
    "LnFoldPass",
    "NotVerified",
    "Verification",
    "VerificationFailed",
    "analyze",
    "fold",
]
