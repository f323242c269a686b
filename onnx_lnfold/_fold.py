"""The pipeline behind `fold()` and the CLI: load -> analyze -> apply -> verify."""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir

from onnx_lnfold._analyze import analyze
from onnx_lnfold._apply import apply_plan
from onnx_lnfold._errors import LnFoldError, NotVerified, VerificationFailed
from onnx_lnfold._inputs import InputsUnavailable, check_inputs, verification_input_sets
from onnx_lnfold._load import ModelSource, load_model
from onnx_lnfold._plan import CenteringPlan
from onnx_lnfold._report import FoldReport, count_ops
from onnx_lnfold._save import release_mapped, save_with_external_data, uses_external_data, weight_bytes
from onnx_lnfold._verify import ModelBytesOrPath, Verification, bfloat16_rounding, has_bfloat16, output_types, verify


# Above this many weight bytes, onnxruntime reads a model for verification from a temporary file.
_IN_MEMORY_LIMIT = 64 << 20


@dataclass
class FoldResult:
    """The folded model (an `onnx_ir.Model`, owned by the caller) and what was done to it."""

    model: ir.Model
    report: FoldReport

    @property
    def plan(self) -> CenteringPlan:
        return self.report.plan

    @property
    def model_proto(self) -> onnx.ModelProto:
        return ir.to_proto(self.model)

    def save(self, path: str | os.PathLike) -> None:
        from onnx_lnfold._save import StagedModel

        StagedModel(self.model, Path(path), rebind=True).commit()
        self.report.output = str(path)


class _OrtSource:
    """A model as ONNX Runtime can read it: bytes for small models, else a temporary file with
    external data. Serializing to bytes holds the weights twice more (the proto and its bytes);
    the file is written tensor by tensor, untouched external tensors copied by the kernel
    (`copy_file_range`), never read into memory."""

    def __init__(self, model: ir.Model):
        self._dir: str | None = None
        if uses_external_data(model) or weight_bytes(model) > _IN_MEMORY_LIMIT:
            self._dir = tempfile.mkdtemp(prefix="lnfold-verify-")
            path = os.path.join(self._dir, "model.onnx")
            try:
                save_with_external_data(model, path, "model.onnx.data")
            except BaseException:
                self.close()
                raise
            self.source: ModelBytesOrPath = path
        else:
            self.source = ir.to_proto(model).SerializeToString()

    def close(self) -> None:
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)


def check_equivalence(
    original: ModelBytesOrPath,
    folded: ModelBytesOrPath,
    spec_model: ir.Model,
    *,
    rtol: float | None = None,
    input_shapes: dict[str, tuple[int, ...]] | None = None,
    inputs: dict[str, np.ndarray] | None = None,
    plan: CenteringPlan | None = None,
) -> Verification:
    """Run both models on the verification inputs; never raises for a check that cannot run
    (the status is then "unverified", with the reason and the way out)."""
    try:
        input_sets = verification_input_sets(spec_model, input_shapes, inputs)
    except InputsUnavailable as e:
        return Verification("unverified", f"cannot synthesize verification inputs: {e}", rtol, way_out="inputs")
    shadow = has_bfloat16(spec_model)
    verification = verify(original, folded, input_sets, rtol, output_types(spec_model), shadow=shadow)
    if shadow and plan is not None and verification.status == "passed":
        verification.notes.extend(bfloat16_rounding(spec_model, plan))
    return verification


def raise_unless_passed(report: FoldReport) -> None:
    """A fold that was asked to be verified and was not shown equivalent is not returned."""
    verification = report.verification
    if verification.status in ("passed", "skipped"):
        return
    error_type = VerificationFailed if verification.status == "failed" else NotVerified
    error = error_type(verification.refusal("api"))
    error.report = report  # type: ignore[attr-defined]
    raise error


def fold(
    model: ModelSource,
    *,
    verify: bool = True,
    rtol: float | None = None,
    input_shapes: dict[str, tuple[int, ...]] | None = None,
    inputs: dict[str, np.ndarray] | None = None,
    target: str = "ort",
    auxiliary_centering: bool = True,
    fuse_residual: str = "auto",
    tied_weights: str = "auto",
) -> FoldResult:
    """Fold every LayerNorm that can be folded exactly; verify with onnxruntime unless told not to.

    Accepts a path, an `onnx.ModelProto` or an `onnx_ir.Model`; the caller's object is never
    changed. Raises `VerificationFailed` (with the report as `.report`) instead of returning a
    model whose outputs differ beyond `rtol`, its subclass `NotVerified` when something was folded
    but the check could not run (no onnxruntime, the original does not run on the inputs: pass
    `inputs` or `input_shapes`, or `verify=False` to accept an unverified model), and
    `LnFoldError` for bad input.

    `target="onnx"` emits the standard RMSNormalization (opset >= 23 models only);
    `auxiliary_centering=False` never inserts an explicit centering node; `fuse_residual`
    ("auto", "always", "never") says which residual Adds become SkipSimplifiedLayerNormalization;
    `tied_weights` ("auto", "center", "untie") says how an embedding table the LM head shares is
    centered: as a copy ("untie": the file grows by the table; also what `auxiliary_centering=False`
    does), by `x - ReduceMean(x)` after the Gather ("center"), or the copy where ONNX Runtime
    would hold a transposed copy of its own anyway and the centering elsewhere ("auto").
    """
    ir_model, path = load_model(model)
    return fold_loaded(
        ir_model,
        path,
        verify=verify,
        rtol=rtol,
        input_shapes=input_shapes,
        inputs=inputs,
        target=target,
        auxiliary_centering=auxiliary_centering,
        fuse_residual=fuse_residual,
        tied_weights=tied_weights,
    )


def fold_loaded(
    ir_model: ir.Model,
    path: Path | None,
    *,
    verify: bool = True,
    rtol: float | None = None,
    input_shapes: dict[str, tuple[int, ...]] | None = None,
    inputs: dict[str, np.ndarray] | None = None,
    target: str = "ort",
    auxiliary_centering: bool = True,
    fuse_residual: str = "auto",
    tied_weights: str = "auto",
) -> FoldResult:
    """`fold()` on a model already loaded (and owned: it is changed in place); `path` is the file
    it was read from, if any (onnxruntime then reads the original from there)."""
    if inputs is not None:
        check_inputs(ir_model, inputs)
    ops_before = count_ops(ir_model)
    original_src = _OrtSource(ir_model) if (verify and path is None) else None
    try:
        plan = analyze(
            ir_model,
            target=target,
            auxiliary_centering=auxiliary_centering,
            fuse_residual=fuse_residual,
            tied_weights=tied_weights,
        )
        apply_plan(ir_model, plan)
        release_mapped(ir_model)  # pages of the constants the analysis read (gammas, betas, scales)
        report = FoldReport(
            plan=plan,
            ops_before=ops_before,
            ops_after=count_ops(ir_model),
            verification=Verification("skipped", "disabled by the caller"),
            source=str(path) if path else None,
        )
        if verify and not plan.folded:
            report.verification = Verification("skipped", "nothing was folded: the model is unchanged")
        elif verify:
            folded_src = _OrtSource(ir_model)
            try:
                original = str(path) if path else original_src.source  # type: ignore[union-attr]
                report.verification = check_equivalence(
                    original, folded_src.source, ir_model, rtol=rtol, input_shapes=input_shapes, inputs=inputs, plan=plan
                )
            finally:
                folded_src.close()
    finally:
        if original_src:
            original_src.close()
    raise_unless_passed(report)
    return FoldResult(ir_model, report)


__all__ = ["FoldResult", "fold", "fold_loaded", "check_equivalence", "raise_unless_passed", "LnFoldError"]
