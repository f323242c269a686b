"""The public entry points: `fold()` and `analyze()` take the same inputs (a path, an
`onnx.ModelProto` or an `onnx_ir.Model`) and never change the caller's model.

Both take the fields of `FoldOptions` as keywords (`target=`, ...: the table `core.options.OPTIONS`
says what each does, the check's settings beside them), or a whole `options=FoldOptions(...)`;
keywords given beside `options` replace its fields. Each call makes one `FoldRequest`, validated
before any work, and runs the one orchestration (`_pipeline`).
"""

from __future__ import annotations

import os
import time

import numpy as np
import onnx_ir as ir

from onnx_lnfold import _pipeline
from onnx_lnfold.analysis.plan import CenteringPlan
from onnx_lnfold.core.fold_request import FoldRequest
from onnx_lnfold.core.options import (
    FLOAT64_BUDGET_S,
    CheckSettings,
    FoldOptions,
    RunShapes,
    keywords_to_options,
    takes_option_keywords,
)
from onnx_lnfold.io import scratch
from onnx_lnfold.load.model import ModelSource, load_model


@takes_option_keywords
def analyze(
    model: ModelSource,
    *,
    input_shapes: dict[str, tuple[int, ...]] | None = None,
    inputs: dict[str, np.ndarray] | None = None,
    options: FoldOptions | None = None,
    **option_keywords,
) -> CenteringPlan:
    """Decide, for every LayerNorm, whether it folds and how, and why not; change nothing.

    Takes what `fold()` takes. An `onnx_ir.Model` is read as it is (the analysis mutates nothing;
    for `target="onnx"` below opset 23 the plan is made on a converted copy, as `fold()` makes it);
    a path or a ModelProto is loaded first, with the same one-line errors as `fold()`. `inputs` or
    `input_shapes`, as `fold()` takes them, say what shapes the model runs at: the cost rule prices
    each LN at the tokens they give it where the graph does not fix them (docs/DESIGN.md 4.1); they
    are checked against the graph inputs as `fold()` checks them. The analysis is the one every
    entry point runs (`_pipeline.analyze_model`).
    """
    options = keywords_to_options(options, option_keywords, "analyze")
    shapes = RunShapes(input_shapes=input_shapes, inputs=inputs)
    with scratch.removed_on_sigterm():
        if not isinstance(model, ir.Model):
            model, _ = load_model(model)
        return _pipeline.analyze_model(model, options, shapes, synthesizing=True)[1].plan


@takes_option_keywords
def fold(
    model: ModelSource,
    *,
    output: str | os.PathLike | None = None,
    verify: bool = True,
    rtol: float | None = None,
    input_shapes: dict[str, tuple[int, ...]] | None = None,
    inputs: dict[str, np.ndarray] | None = None,
    float64_budget: float | None = FLOAT64_BUDGET_S,
    deployed_check: str = "auto",
    options: FoldOptions | None = None,
    **option_keywords,
) -> _pipeline.FoldResult:
    """Fold every LayerNorm that can be folded exactly; verify with onnxruntime unless told not to;
    with `output`, write the fold there once it passed (staged beside it and checked as written,
    so a large model is written once; `result.save(path)` writes it again elsewhere).

    Accepts a path, an `onnx.ModelProto` or an `onnx_ir.Model`; the caller's object is never
    changed. Raises `VerificationFailed` (with the report as `.report`) instead of returning a
    model whose outputs differ beyond `rtol` (judged in float64: docs/DESIGN.md section 6; the
    float64 evaluation may take `float64_budget` seconds, 0 for none, by default 3x what the fold took, at least 60 s; with `deployed_check`, also at ORT_ENABLE_ALL: `verify.deployed`), its subclass `NotVerified` when something was folded
    but the check could not run (no onnxruntime, the original does not run on the inputs: pass
    `inputs` or `input_shapes`, or `verify=False` to accept an unverified model), and
    `InvalidInput` for bad input (all three are `LnFoldError`s).

    The result's repr is one line (`<FoldResult gpt2.onnx: 5/5 LNs folded, verified (rel 4.9e-07),
    0.86 MB>`); the detail is `.plan.decisions`, `.report.format_text()`, `.model`.

    The options are `FoldOptions`' fields; `core.options.OPTIONS` says what each does.

    A SIGTERM during the call removes the temporary folders it made before the process ends
    (`io.scratch.removed_on_sigterm`).
    """
    request = FoldRequest(
        options=keywords_to_options(options, option_keywords, "fold"),
        shapes=RunShapes(input_shapes=input_shapes, inputs=inputs),
        check=CheckSettings(verify=verify, rtol=rtol, float64_budget=float64_budget, deployed_check=deployed_check),
        output=output,
        in_place=True,  # as `save` allows: asked for by naming the input
    )
    started = time.monotonic()  # the report's elapsed time counts the load, as the command line's does
    with scratch.removed_on_sigterm():
        ir_model, path = load_model(model)
        return _pipeline.fold_loaded(ir_model, path, request, started)
