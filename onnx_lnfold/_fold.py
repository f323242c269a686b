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
from onnx_lnfold._errors import LnFoldError, VerificationFailed
from onnx_lnfold._inputs import check_inputs, synthesize_inputs
from onnx_lnfold._load import ModelSource, load_model
from onnx_lnfold._plan import CenteringPlan
from onnx_lnfold._report import FoldReport, count_ops
from onnx_lnfold._save import release_mapped, save_with_external_data, uses_external_data, weight_bytes
from onnx_lnfold._verify import DEFAULT_RTOL, ModelBytesOrPath, Verification, verify


# Above this many weight bytes, onnxruntime reads a model for verification from a temporary file.
_IN_MEMORY_LIMIT = 64 << 20


def default_rtol(model: ir.Model) -> float:
    low = {ir.DataType.FLOAT16, ir.DataType.BFLOAT16}
    dtypes = {v.dtype for v in model.graph.outputs} | {v.dtype for v in model.graph.initializers.values()}
    return DEFAULT_RTOL["float16"] if dtypes & low else DEFAULT_RTOL["float32"]


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
) -> Verification:
    feeds = inputs if inputs is not None else synthesize_inputs(spec_model, input_shapes)
    return verify(original, folded, feeds, rtol if rtol is not None else default_rtol(spec_model))


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
    model whose outputs differ beyond `rtol`, and `LnFoldError` for bad input.

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
                    original, folded_src.source, ir_model, rtol=rtol, input_shapes=input_shapes, inputs=inputs
                )
            finally:
                folded_src.close()
    finally:
        if original_src:
            original_src.close()
    if report.verification.status == "failed":
        error = VerificationFailed(report.verification.reason)
        error.report = report  # type: ignore[attr-defined]
        raise error
    return FoldResult(ir_model, report)


__all__ = ["FoldResult", "fold", "fold_loaded", "check_equivalence", "LnFoldError"]
