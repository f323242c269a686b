"""onnx_lnfold: fold LayerNormalization into RMSNorm in ONNX models, exactly or not at all.

    result = onnx_lnfold.fold("model.onnx")      # analyze, center, rewrite, verify
    result.save("model.lnfold.onnx")
    print(result.report.format_text())

`analyze(model)` returns the `CenteringPlan` alone; `LnFoldPass` runs the fold inside an
`onnx_ir.passes.PassManager`. All three take the options as keywords (`target=`, ...) or as one
`options=FoldOptions(...)`.

Errors form one family: `LnFoldError`, with `InvalidInput`, `CannotWrite` and
`VerificationFailed` (and its `NotVerified`) under it.

The names below are imported on first use: `import onnx_lnfold` (and so the command line's
start-up, `-V` and `--help`) loads neither numpy nor onnx nor onnx_ir.
"""

import importlib as _importlib
import typing as _typing

from onnx_lnfold.core.version import VERSION as __version__

# public name -> module that defines it
_EXPORTS = {
    "CannotWrite": "onnx_lnfold.core.errors",
    "CenteringEdit": "onnx_lnfold.analysis.plan",
    "CenteringPlan": "onnx_lnfold.analysis.plan",
    "FoldReport": "onnx_lnfold.report.fold_report",
    "FoldOptions": "onnx_lnfold.core.options",
    "FoldResult": "onnx_lnfold._pipeline",
    "InvalidInput": "onnx_lnfold.core.errors",
    "LnDecision": "onnx_lnfold.analysis.plan",
    "LnFoldError": "onnx_lnfold.core.errors",
    "LnFoldPass": "onnx_lnfold._pass",
    "NotVerified": "onnx_lnfold.core.errors",
    "Verification": "onnx_lnfold.verify.check",
    "VerificationFailed": "onnx_lnfold.core.errors",
    "analyze": "onnx_lnfold._api",
    "fold": "onnx_lnfold._api",
}

__all__ = sorted(_EXPORTS)

if _typing.TYPE_CHECKING:
    from onnx_lnfold._api import analyze, fold
    from onnx_lnfold._pass import LnFoldPass
    from onnx_lnfold._pipeline import FoldResult
    from onnx_lnfold.analysis.plan import CenteringEdit, CenteringPlan, LnDecision
    from onnx_lnfold.core.errors import CannotWrite, InvalidInput, LnFoldError, NotVerified, VerificationFailed
    from onnx_lnfold.core.options import FoldOptions
    from onnx_lnfold.report.fold_report import FoldReport
    from onnx_lnfold.verify.verdict import Verification


def __getattr__(name: str) -> _typing.Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'onnx_lnfold' has no attribute {name!r}")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    """The public names only (what `help()` and tab completion offer), not the helpers above."""
    return [*__all__, "__version__"]
