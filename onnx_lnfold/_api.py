"""The public entry points: `fold()` and `analyze()` take the same inputs (a path, an
`onnx.ModelProto` or an `onnx_ir.Model`) and never change the caller's model."""

from __future__ import annotations

import functools
import time

import onnx_ir as ir

from onnx_lnfold import _analyze, _fold
from onnx_lnfold._errors import VerificationFailed
from onnx_lnfold._load import ModelSource, load_model
from onnx_lnfold._plan import CenteringPlan
from onnx_lnfold._shapes import ShapeTable


def analyze(
    model: ModelSource,
    shapes: ShapeTable | None = None,
    *,
    target: str = "ort",
    auxiliary_centering: bool = True,
    fuse_residual: str = "auto",
    tied_weights: str = "auto",
) -> CenteringPlan:
    """Decide, for every LayerNorm, whether it folds and how, and why not; change nothing.

    Takes what `fold()` takes. An `onnx_ir.Model` is read as it is (the analysis mutates nothing);
    a path or a ModelProto is loaded first, with the same one-line errors as `fold()`.
    """
    if not isinstance(model, ir.Model):
        model, _ = load_model(model)
    return _analyze.analyze(
        model,
        shapes,
        target=target,
        auxiliary_centering=auxiliary_centering,
        fuse_residual=fuse_residual,
        tied_weights=tied_weights,
    )


@functools.wraps(_fold.fold)
def fold(model: ModelSource, **options) -> _fold.FoldResult:
    # The report carries the wall time, as the command line's does.
    started = time.monotonic()
    try:
        result = _fold.fold(model, **options)
    except VerificationFailed as e:
        report = getattr(e, "report", None)
        if report is not None:
            report.elapsed_s = time.monotonic() - started
        raise
    result.report.elapsed_s = time.monotonic() - started
    return result
