"""onnx_lnfold: fold LayerNormalization into RMSNorm in ONNX models, exactly or not at all.

    result = onnx_lnfold.fold("model.onnx")      # analyze, center, rewrite, verify
    result.save("model.lnfold.onnx")
    print(result.report.format_text())

`analyze(model)` returns the `CenteringPlan` alone; `LnFoldPass` runs the fold inside an
`onnx_ir.passes.PassManager`. All three take the options as keywords (`target=`, ...) or as one
`options=FoldOptions(...)`.

The names below are imported on first use: `import onnx_lnfold` (and so the command line's
start-up, where a Ctrl-C must end in one line) loads neither numpy nor onnx_ir.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    "CenteringEdit": "onnx_lnfold._plan",
    "CenteringPlan": "onnx_lnfold._plan",
    "FoldReport": "onnx_lnfold._report",
    "FoldOptions": "onnx_lnfold._options",
    "FoldResult": "onnx_lnfold._fold",
    "LnDecision": "onnx_lnfold._plan",
    "LnFoldError": "onnx_lnfold._errors",
    "LnFoldPass": "onnx_lnfold._pass",
    "NotVerified": "onnx_lnfold._errors",
    "Verification": "onnx_lnfold._verify",
    "VerificationFailed": "onnx_lnfold._errors",
    "analyze": "onnx_lnfold._api",
    "fold": "onnx_lnfold._api",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from onnx_lnfold._api import analyze, fold
    from onnx_lnfold._errors import LnFoldError, NotVerified, VerificationFailed
    from onnx_lnfold._fold import FoldResult
    from onnx_lnfold._options import FoldOptions
    from onnx_lnfold._pass import LnFoldPass
    from onnx_lnfold._plan import CenteringEdit, CenteringPlan, LnDecision
    from onnx_lnfold._report import FoldReport
    from onnx_lnfold._verify import Verification


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'onnx_lnfold' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
