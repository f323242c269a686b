"""The one orchestration behind every entry point (`fold()`, `analyze()`, `LnFoldPass`, the
command line, the Olive pass), on a loaded model:
analyze -> [proof, for `-v`] -> apply -> [stage the output] -> verify.

`analyze_model` is the analysis each of them runs (the inputs checked against the graph, the
shapes they give, the model at its target's opset, the plan); `run_pipeline` runs it and the rest,
and sets every fact of the report (sizes, elapsed time) but those of the write, which
`record_output` sets where the output is committed. Loading and the final write stay with the
callers: the command line checks its output paths between loading and folding, and writes (commits
the staged model) only a fold that was not refused; `fold()` hands the model back to be saved by the
caller; the pass changes the model it is given. What is verified, what is skipped and why, and what
is refused is decided here once."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import onnx
import onnx_ir as ir

from onnx_lnfold.analysis.bound import BoundPlan
from onnx_lnfold.analysis.plan import CenteringPlan
from onnx_lnfold.analysis.planner import Planner, candidates
from onnx_lnfold.apply.apply_plan import apply_plan
from onnx_lnfold.core.errors import NotVerified, VerificationFailed
from onnx_lnfold.core.options import FoldOptions, target_op_names, target_opset
from onnx_lnfold.core.progress import Progress
from onnx_lnfold.feeds.given import check_input_shapes, check_input_sizes, check_inputs
from onnx_lnfold.io import scratch
from onnx_lnfold.io.external_data import external_data_files, release_mapped
from onnx_lnfold.load.opset import convert_opset, default_opset
from onnx_lnfold.ort_fusions.fusion_cost import FusionCheck
from onnx_lnfold.ort_fusions.order import advise
from onnx_lnfold.report.fold_report import FoldReport, count_ops, model_bytes
from onnx_lnfold.report.trace import explain
from onnx_lnfold.save.staged import StagedModel, check_destination
from onnx_lnfold.shapes.table import ShapeTable
from onnx_lnfold.verify.check import check_equivalence
from onnx_lnfold.verify.oracle import blockwise
from onnx_lnfold.verify.oracle.reference import exact_tensors
from onnx_lnfold.verify.readback import planned_changes
from onnx_lnfold.verify.request import VerifyRequest
from onnx_lnfold.verify.sessions import ModelBytesOrPath, OrtSource
from onnx_lnfold.verify.verdict import Verification


@dataclass
class FoldResult:
    """The folded model (an `onnx_ir.Model`, owned by the caller) and what was done to it.

    Its repr is one line (what was folded, the verification, the sizes); the detail is one
    attribute away: `.plan.decisions`, `.report.format_text()`, `.model`.
    """

    model: ir.Model
    report: FoldReport
    # The files the input was read from: `save` never writes over its external data.
    source: Path | None = field(default=None, repr=False)
    input_data: frozenset[Path] = field(default=frozenset(), repr=False)

    def __repr__(self) -> str:
        return f"<FoldResult {self.report.brief()}>"

    @property
    def plan(self) -> CenteringPlan:
        return self.report.plan

    @property
    def model_proto(self) -> onnx.ModelProto:
        return ir.to_proto(self.model)

    def save(self, path: str | os.PathLike) -> None:
        """Write the model (re-serialized, also when nothing was folded) and its external data
        file, if any, beside it; the report records where and the size written. Over the input
        model itself when asked (as the command line's --in-place), never over a data file it or
        the model now reads."""
        reads = self.input_data | external_data_files(self.model)
        check_destination(self.source, Path(path), True, reads)
        with scratch.removed_on_sigterm():
            staged = StagedModel(self.model, Path(path), rebind=True)
            staged.commit()
        record_output(self.report, staged)


@dataclass
class FoldRun:
    """What the pipeline did: the model (folded in place, unless a dry run), its report, and the
    output staged for writing when a destination was given (the caller commits or discards it)."""

    model: ir.Model
    report: FoldReport
    staged: StagedModel | None = None
    started: float | None = None  # when the caller's wait began, for the report's elapsed time

    @property
    def refused(self) -> bool:
        """A fold that was to be verified and was not shown equivalent is neither written nor
        returned."""
        return self.report.verification.status not in ("passed", "skipped")

    def commit(self) -> Path:
        """Write the staged output in place of its destination; the report records it."""
        assert self.staged is not None, "a dry run stages nothing"
        written = self.staged.commit()
        record_output(self.report, self.staged, self.started)
        return written

    def discard(self) -> None:
        if self.staged is not None:
            self.staged.discard()


def record_output(report: FoldReport, staged: StagedModel, started: float | None = None) -> None:
    """The facts of a write, once `staged` is committed: where, whether the input's own bytes were
    copied, the size written (external data included) and, given when the wait began, the elapsed
    time with the write in it."""
    report.output, report.output_identical = str(staged.destination), staged.identical
    data = [staged.destination.parent / staged.data_name] if staged.data_name else []
    report.size_after = model_bytes(staged.destination, data)
    if started is not None:
        report.elapsed_s = time.monotonic() - started


@dataclass(frozen=True)
class Prepared:
    """The model the analysis reads for a target: `model` itself, or (`converted_from` set) a new
    model converted to the opset the target's ops need, which shares the caller's tensors."""

    model: ir.Model
    converted_from: int | None = None
    shapes: ShapeTable | None = None  # of `model`, where it was computed on the way


def prepare(model: ir.Model, options: FoldOptions, shapes: ShapeTable | None = None) -> Prepared:
    """`model` at the opset its target needs (docs/DESIGN.md section 4): a model below it, with
    LayerNorms to fold, converted by `onnx.version_converter` (`load.opset`); one without any is
    left as it is, since nothing would be written. Raises `InvalidInput` naming the op that blocks
    the conversion. Changes nothing of `model`."""
    needed = target_opset(options.target)
    if needed is None or default_opset(model) >= needed:
        return Prepared(model, None, shapes)
    shapes = shapes or ShapeTable(model)
    if not candidates(model, shapes):
        return Prepared(model, None, shapes)
    why = f"--target {options.target} writes {target_op_names(options.target)} (opset {needed})"
    converted = convert_opset(model, needed, why)
    return Prepared(converted, default_opset(model), ShapeTable(converted, given=shapes.given))


def analyze_model(model: ir.Model, options: FoldOptions, check: VerifyRequest) -> tuple[ir.Model, BoundPlan]:
    """The analysis every entry point runs: the inputs or input shapes `check` holds checked
    against the graph (what a real run refuses, a dry run and `analyze()` refuse too), then
    `analyze_for_target` at the shapes they give (the cost rule prices each LN there)."""
    if check.inputs is not None:
        check_inputs(model, check.inputs)
    check_input_shapes(model, dict(check.input_shapes or {}))
    if check.enabled and check.inputs is None:
        check_input_sizes(model, dict(check.input_shapes or {}))
    return analyze_for_target(model, options, ShapeTable(model, given=check.run_shapes))


def analyze_for_target(model: ir.Model, options: FoldOptions, shapes: ShapeTable | None = None) -> tuple[ir.Model, BoundPlan]:
    """`prepare`, then plan the model prepared: (that model, its plan). The plan is bound to the
    model returned, which is `model` unless it was converted."""
    prepared = prepare(model, options, shapes)
    bound = _plan(prepared.model, options, prepared.shapes)
    if prepared.converted_from is not None:
        bound.plan.converted_from, bound.plan.converted_to = prepared.converted_from, default_opset(prepared.model)
    return prepared.model, bound


def _plan(model: ir.Model, options: FoldOptions, shapes: ShapeTable | None = None) -> BoundPlan:
    """Recognize every LayerNorm of `model` and decide whether it folds and how; mutate nothing.

    LNs whose fold would cost an ONNX Runtime fusion stay LNs (`FusionCheck.settle`, docs/DESIGN.md
    section 10, handed the apply step to fold its weightless clones), and the plan says in which
    order to run the fold and ONNX Runtime's transformers optimizer (`ort_fusions.order.advise`).
    The model must be at the opset the target needs (`prepare`)."""
    with FusionCheck.start(model, options.keep_ort_fusions) as fusions:  # its child starts while the LNs are found
        planner = Planner.start(model, options, shapes or ShapeTable(model))
        bound = fusions.settle(planner, apply_plan)
        advise(fusions, planner, bound.plan)
    return bound


def run_pipeline(
    model: ir.Model,
    path: Path | None,
    options: FoldOptions,
    check: VerifyRequest,
    *,
    dry_run: bool = False,
    proof: bool = False,
    destination: Path | None = None,
    progress: Progress | None = None,
    after_apply: Callable[[ir.Model, CenteringPlan], None] | None = None,
    started: float | None = None,
) -> FoldRun:
    """Fold `model` (owned: changed in place) once. `path` is the file it was read from, if any
    (onnxruntime then reads the original from there). `proof` adds the per-LN proof to the report;
    `dry_run` stops after the rewrite, for the node counts (nothing is verified or staged);
    `destination` stages the folded model there before the check, which then reads the staged file
    (a model with external data is written once). `after_apply` changes the folded model before it is
    staged and verified (the faults of the check's mutation campaign, `benchmarks.mutation`).
    `started` is when the caller's wait began (`time.monotonic()`; default: now): the report's
    elapsed time counts from there. The report's sizes are the input's on disk, external data
    included."""
    progress = progress or Progress(enabled=False)
    started = time.monotonic() if started is None else started
    # What a killed run left (its staged output, its check's copies) goes before this run adds its own.
    swept = scratch.sweep() + (scratch.sweep(destination.parent) if destination is not None else [])
    size_before = model_bytes(path, external_data_files(model, path.parent)) if path else None
    ops_before = count_ops(model)
    source = str(path) if path else None
    verifying = check.enabled and not dry_run
    # onnxruntime reads the original from its file, else from a copy taken before the rewrite.
    original_src = OrtSource(model) if (verifying and path is None) else None
    try:
        progress.phase("Analyzing" if (dry_run or proof) else "Folding")
        given = model
        model, bound = analyze_model(model, options, check)
        plan = bound.plan
        # From the model as it was: the rewrite removes IR objects the proof walks.
        trace = explain(model, bound) if proof else []
        if not plan.folded:
            model = given  # a model converted for its target, with nothing to fold, stays as given
        if dry_run:
            skipped = Verification("skipped", "dry run: nothing was changed")
            apply_plan(model, bound)  # owned: its op counts are the fold's; nothing is written
            report = FoldReport(plan, ops_before, count_ops(model), skipped, source=source, dry_run=True, trace=trace)
            report.notes.extend(swept)
            report.size_before, report.elapsed_s = size_before, time.monotonic() - started
            return FoldRun(model, report, started=started)
        if proof:
            progress.phase("Folding")
        # What the plan changes, read before the rewrite removes the IR objects it names: the check reads the fold back against it.
        planned = planned_changes(model, bound) if check.enabled and plan.folded else None
        apply_plan(model, bound)
        if after_apply is not None:
            after_apply(model, plan)
        release_mapped(model)  # pages of the constants the analysis read (gammas, betas, scales)
        skipped = Verification("skipped", check.disabled_because)
        report = FoldReport(plan, ops_before, count_ops(model), skipped, source=source, trace=trace)
        report.notes.extend(swept)
        report.size_before = size_before
        # The check's exact twin needs the computed constants as computed: staging rebinds them.
        computed = exact_tensors(model) if check.enabled else {}
        staged = _stage(model, path, destination, plan, progress) if destination else None
        try:
            if check.enabled and not plan.folded:
                report.verification = Verification("skipped", "nothing was folded: the model is unchanged")
            elif check.enabled:
                progress.phase("Verifying in onnxruntime")
                original = path if path else original_src.source  # type: ignore[union-attr]
                with blockwise.reporting(progress.phase):  # which block the check is on
                    folder = original.parent if isinstance(original, Path) else None
                    request = check.for_fold(plan, planned, computed, time.monotonic() - started, folder)
                    report.verification = _check_folded(model, original, staged, request)
        except BaseException:
            if staged is not None:
                staged.discard()
            raise
        report.elapsed_s = time.monotonic() - started
        return FoldRun(model, report, staged, started)
    finally:
        if original_src:
            original_src.close()


def _stage(model: ir.Model, path: Path | None, destination: Path, plan: CenteringPlan, progress: Progress) -> StagedModel:
    """Stage the output: the folded model, or, when nothing was folded, the input file's own bytes
    (a model with external data is written again instead, its weights into `OUT.data` as for any
    output: an equivalent copy, not an identical one)."""
    unchanged = not plan.folded and path is not None and not external_data_files(model, path.parent)
    return StagedModel(model, destination, progress=progress, rebind=True, copy_of=path if unchanged else None)


def _check_folded(
    model: ir.Model, original: ModelBytesOrPath, staged: StagedModel | None, request: VerifyRequest
) -> Verification:
    """The check of `request` on the staged file, else on the folded model in memory."""
    folded_src = None if staged is not None else OrtSource(model)
    try:
        folded = staged.path if staged is not None else folded_src.source  # type: ignore[union-attr]
        return check_equivalence(original, folded, model, request)
    finally:
        if folded_src is not None:
            folded_src.close()


def raise_unless_passed(run: FoldRun) -> None:
    """The library's refusal: an exception carrying the report, instead of the model."""
    if not run.refused:
        return
    verification = run.report.verification
    error_type = VerificationFailed if verification.status == "failed" else NotVerified
    error = error_type(verification.refusal("api"))
    error.report = run.report  # type: ignore[attr-defined]
    raise error


def fold_loaded(
    model: ir.Model, path: Path | None, options: FoldOptions, check: VerifyRequest, started: float | None = None
) -> FoldResult:
    """`fold()` on a model already loaded (and owned: it is changed in place); `path` is the file
    it was read from, if any."""
    input_data = frozenset(external_data_files(model, path.parent if path else None))
    run = run_pipeline(model, path, options, check, started=started)
    raise_unless_passed(run)
    return FoldResult(run.model, run.report, path, input_data)


__all__ = [
    "FoldResult",
    "FoldRun",
    "VerifyRequest",
    "analyze_for_target",
    "analyze_model",
    "check_equivalence",
    "fold_loaded",
    "raise_unless_passed",
    "record_output",
    "run_pipeline",
]
