"""The one orchestration behind every entry point (`fold()`, `analyze()`, `LnFoldPass`, the
command line, the Olive pass), on a loaded model and one `FoldRequest`:
analyze -> [proof, for `-v`] -> apply -> [stage the output] -> verify -> [commit or discard].

`analyze_model` is the analysis each of them runs (the inputs checked against the graph, the
shapes they give, the model at its target's opset, the plan); `run_pipeline` runs it and the rest
and fills the report; `FoldRun.finish` commits the staged output of a fold that was not refused, or
discards it, and records which (`commit_staged` is the one place a write is committed and recorded,
for `FoldResult.save` too). Loading stays with the callers. What is verified, what is skipped and
why, and what is refused is decided here once."""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path

import onnx
import onnx_ir as ir

from onnx_lnfold.analysis.bound import BoundPlan
from onnx_lnfold.analysis.plan import CenteringPlan
from onnx_lnfold.analysis.planner import Planner, candidates
from onnx_lnfold.apply.apply_plan import apply_plan
from onnx_lnfold.core.errors import NotVerified, VerificationFailed
from onnx_lnfold.core.fold_request import FoldRequest
from onnx_lnfold.core.ir import weight_bytes
from onnx_lnfold.core.options import FoldOptions, RunShapes, target_op_names, target_opset
from onnx_lnfold.core.progress import Progress
from onnx_lnfold.feeds.given import check_input_shapes, check_input_sizes, check_inputs
from onnx_lnfold.io import scratch
from onnx_lnfold.io.external_data import external_data_files, release_mapped
from onnx_lnfold.load.opset import convert_opset, default_opset
from onnx_lnfold.ort_fusions.fusion_cost import FusionCheck
from onnx_lnfold.ort_fusions.order import advise
from onnx_lnfold.report.fold_report import FoldReport, count_ops, model_bytes
from onnx_lnfold.report.trace import explain
from onnx_lnfold.save.provenance import drop_provenance, provenance
from onnx_lnfold.save.staged import StagedModel, check_destination
from onnx_lnfold.shapes.table import ShapeTable
from onnx_lnfold.verify.fold_check import Check
from onnx_lnfold.verify.original_ahead import OriginalAhead
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
            commit_staged(StagedModel(self.model, Path(path), rebind=True), self.report)


@dataclass
class FoldRun:
    """What the pipeline did: the model (folded in place, unless a dry run), its report, and the
    output staged for writing when the request named one (`finish` commits or discards it)."""

    model: ir.Model
    report: FoldReport
    staged: StagedModel | None = None
    started: float | None = None  # when the caller's wait began, for the report's elapsed time
    input_data: frozenset[Path] = frozenset()  # the input's external data files
    in_place: bool = False  # the output replaces the input
    provenance: dict[str, str] = field(default_factory=dict)  # what the written model says of the fold

    @property
    def refused(self) -> bool:
        """A fold that was to be verified and was not shown equivalent is neither written nor
        returned."""
        return self.report.verification.status not in ("passed", "skipped")

    def finish(self) -> Path | None:
        """Write the staged output in place of its destination, for a fold that was not refused
        (the report records the write), else remove it (the report says why nothing was written).
        Returns the file written."""
        if self.staged is None:
            return None
        if self.refused:
            self.discard()
            why = "not equivalent" if self.report.verification.status == "failed" else "not verified"
            self.report.notes.append(f"Refused to write {self.staged.destination}: the folded model is {why}.")
            return None
        try:
            written = commit_staged(self.staged, self.report, self.started, self.provenance)
        except BaseException:
            self.discard()
            raise
        if self.in_place and self.staged.data_name is not None:  # the input's data file may be another name
            new_data = (written.parent / self.staged.data_name).resolve()
            for old in sorted(self.input_data - {new_data}):
                self.report.notes.append(
                    f"The input's old external data file {old.name} is no longer used by {written.name}."
                )
        return written

    def discard(self) -> None:
        if self.staged is not None:
            self.staged.discard()


def commit_staged(
    staged: StagedModel, report: FoldReport, started: float | None = None, provenance: dict[str, str] | None = None
) -> Path:
    """Commit `staged`, with the `metadata_props` entries `provenance` (`save.provenance`) added,
    and record the write in `report`: where, whether the input's own bytes were copied, the size
    written (external data included) and, given when the wait began, the elapsed time with the
    write in it. The one place an output is committed."""
    written = staged.commit(provenance or None)
    report.output, report.output_identical = str(staged.destination), staged.identical
    data = [staged.destination.parent / staged.data_name] if staged.data_name else []
    report.size_after = model_bytes(staged.destination, data)
    if started is not None:
        report.elapsed_s = time.monotonic() - started
    return written


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
    why = f"{{target={options.target}}} writes {target_op_names(options.target)} (opset {needed})"
    converted = convert_opset(model, needed, why)
    return Prepared(converted, default_opset(model), ShapeTable(converted, given=shapes.given))


def analyze_model(
    model: ir.Model,
    options: FoldOptions,
    shapes: RunShapes,
    *,
    synthesizing: bool = False,
    found_lns: Callable[[], object] | None = None,
    meanwhile: Callable[[], object] | None = None,
) -> tuple[ir.Model, BoundPlan]:
    """The analysis every entry point runs: the inputs or input shapes `shapes` holds checked against
    the graph (what a real run refuses, a dry run and `analyze()` refuse too; `synthesizing`: the
    check will make inputs at the graph's sizes, which must fit its budget), then
    `analyze_for_target` at the shapes they give (the cost rule prices each LN there). Work of the
    caller's: `found_lns`, started once the model is found to have an LN (before it is planned);
    `meanwhile`, done while the fusion check waits for ONNX Runtime (`FusionCheck.start`)."""
    if shapes.inputs is not None:
        check_inputs(model, dict(shapes.inputs))
    check_input_shapes(model, dict(shapes.input_shapes or {}))
    if synthesizing and shapes.inputs is None:
        check_input_sizes(model, dict(shapes.input_shapes or {}))
    return analyze_for_target(model, options, ShapeTable(model, given=shapes.given), found_lns, meanwhile)


def analyze_for_target(
    model: ir.Model,
    options: FoldOptions,
    shapes: ShapeTable | None = None,
    found_lns: Callable[[], object] | None = None,
    meanwhile: Callable[[], object] | None = None,
) -> tuple[ir.Model, BoundPlan]:
    """`prepare`, then plan the model prepared: (that model, its plan). The plan is bound to the
    model returned, which is `model` unless it was converted."""
    prepared = prepare(model, options, shapes)
    bound = _plan(prepared.model, options, prepared.shapes, found_lns, meanwhile)
    if prepared.converted_from is not None:
        bound.plan.converted_from, bound.plan.converted_to = prepared.converted_from, default_opset(prepared.model)
    return prepared.model, bound


def _plan(
    model: ir.Model,
    options: FoldOptions,
    shapes: ShapeTable | None = None,
    found_lns: Callable[[], object] | None = None,
    meanwhile: Callable[[], object] | None = None,
) -> BoundPlan:
    """Recognize every LayerNorm of `model` and decide whether it folds and how; mutate nothing.

    LNs whose fold would cost an ONNX Runtime fusion stay LNs (`FusionCheck.settle`, docs/DESIGN.md
    section 10, handed the apply step to fold its weightless clones), and the plan says in which
    order to run the fold and ONNX Runtime's transformers optimizer (`ort_fusions.order.advise`).
    The model must be at the opset the target needs (`prepare`)."""
    # its child starts while the LNs are found
    with FusionCheck.start(model, options.keep_ort_fusions, meanwhile) as fusions:
        planner = Planner.start(model, options, shapes or ShapeTable(model))
        if planner.lns and found_lns is not None:
            found_lns()
        bound = fusions.settle(planner, apply_plan)
        advise(fusions, planner, bound.plan)
    return bound


def run_pipeline(
    model: ir.Model,
    source: Path | None,
    request: FoldRequest,
    *,
    progress: Progress | None = None,
    started: float | None = None,
    after_apply: Callable[[ir.Model, CenteringPlan], None] | None = None,
) -> FoldRun:
    """Fold `model` (owned: changed in place) once, as `request` asks. `source` is the file it was
    read from, if any (ONNX Runtime then reads the original from there). With `request.output` the
    fold is staged there before the check, which reads the staged file (a model with external data
    is written once); `FoldRun.finish` commits or discards it. `started` is when the caller's wait
    began (`time.monotonic()`; default: now): the report's elapsed time counts from there.
    `after_apply` changes the folded model before it is staged and checked (the faults of the
    check's mutation campaign, `benchmarks.mutation`). The report's sizes are the input's on disk,
    external data included."""
    with collecting_per_phase(), _frozen_while_folding():
        return _run_pipeline(model, source, request, progress=progress, started=started, after_apply=after_apply)


@contextmanager
def _frozen_while_folding() -> Iterator[None]:
    """What is alive when the fold starts (the model, which it keeps to its end, with the process's
    own objects) left out of every collection until it ends (`gc.freeze`): each full collection
    walks every object not frozen, and a large graph's model is most of them. Not where objects are
    frozen already (a server's, say): unfreezing after would thaw theirs too."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    owned = _OWN_FREEZE.set(True)
    try:
        yield
    finally:
        _OWN_FREEZE.reset(owned)
        gc.unfreeze()


@contextmanager
def collecting_per_phase() -> Iterator[None]:
    """Python's full collections, each a walk of every live object, run once per phase of the
    pipeline (`_phase_done`), where the objects of a model's clones and copies are let go, rather
    than each time a quarter of the heap is new: a large graph's millions of objects made those
    walks a large share of the time. The collector's thresholds are restored after. A caller that
    loads the model enters it around the load too."""
    thresholds = gc.get_threshold()
    gc.set_threshold(thresholds[0], thresholds[1], max(thresholds[2], _FULL_COLLECTION_EVERY))
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)


# Young collections between full ones: the pipeline's own `_phase_done` runs the full ones.
_FULL_COLLECTION_EVERY = 1000
# Python's default third threshold: a phase that made fewer young collections than it leaves the
# full collection to Python (a small model's in a process whose heap is large, a test run's).
_FULL_COLLECTION_AFTER = 10


# Whether this fold froze the heap (`_frozen_while_folding`), in this thread's context.
_OWN_FREEZE: ContextVar[bool] = ContextVar("onnx_lnfold_own_freeze", default=False)


def _phase_done() -> None:
    """A phase's clones and copies (cyclic, as IR graphs are) collected at once, where it made
    enough objects for Python to have run a full collection itself. Where the fold froze the
    heap, what survives is frozen too: the next phase's collection walks only what it made."""
    if gc.get_count()[2] > _FULL_COLLECTION_AFTER:
        gc.collect()
        _lives_on()


def _lives_on() -> None:
    """What is alive now is kept to the fold's end: frozen where the fold froze the heap, so that
    no later collection walks it."""
    if _OWN_FREEZE.get():
        gc.freeze()


def _run_pipeline(
    model: ir.Model,
    source: Path | None,
    request: FoldRequest,
    *,
    progress: Progress | None,
    started: float | None,
    after_apply: Callable[[ir.Model, CenteringPlan], None] | None,
) -> FoldRun:
    progress = progress or Progress(enabled=False)
    started = time.monotonic() if started is None else started
    input_data = frozenset(external_data_files(model, source.parent)) if source else frozenset()
    if request.output is not None:  # the one check of where the fold goes, with every file the input reads
        check_destination(source, request.output, request.in_place, input_data)
    # The check's session of the original, made while the LNs are planned, and its float64 twin,
    # made while the fusion check waits for ONNX Runtime: neither depends on the fold.
    verifying = request.verifying
    ahead = OriginalAhead.for_check(request.check, source, weight_bytes(model), progress.phase) if verifying else None
    try:
        return _fold_and_check(model, source, request, progress, started, after_apply, input_data, ahead)
    finally:
        if ahead is not None:
            ahead.close()


def _fold_and_check(
    model: ir.Model,
    source: Path | None,
    request: FoldRequest,
    progress: Progress,
    started: float,
    after_apply: Callable[[ir.Model, CenteringPlan], None] | None,
    input_data: frozenset[Path],
    ahead: OriginalAhead | None,
) -> FoldRun:
    """`_run_pipeline` once the destination is checked: analyze, apply, write, check."""
    # What a killed run left (its staged output, its check's copies) goes before this run adds its own.
    swept = scratch.sweep() + (scratch.sweep(request.output.parent) if request.output is not None else [])
    size_before = model_bytes(source, sorted(input_data)) if source else None
    ops_before = count_ops(model)
    progress.phase("Analyzing" if (request.dry_run or request.proof) else "Folding")
    given = model

    def meanwhile() -> None:
        """While the fusion check waits for ONNX Runtime: the clone the check let go collected,
        then the original's twin made, which the check keeps to its end."""
        _phase_done()
        if ahead is not None:
            ahead.make()
            _lives_on()

    model, bound = analyze_model(
        model,
        request.options,
        request.shapes,
        synthesizing=request.check.verify,
        found_lns=ahead.start_session if ahead is not None else None,
        meanwhile=meanwhile,
    )
    plan = bound.plan
    _phase_done()
    # From the model as it was: the rewrite removes IR objects the proof walks.
    trace = explain(model, bound) if request.proof else []
    if not plan.folded:
        model = given  # a model converted for its target, with nothing to fold, stays as given

    def report_of(verification: Verification) -> FoldReport:
        report = FoldReport(
            plan, ops_before, count_ops(model), verification, source=str(source) if source else None, trace=trace
        )
        report.dry_run = request.dry_run
        report.notes.extend(swept)
        report.size_before = size_before
        return report

    if request.dry_run:
        apply_plan(model, bound)  # owned: its op counts are the fold's; nothing is written
        report = report_of(Verification("skipped", "dry run: nothing was changed"))
        report.elapsed_s = time.monotonic() - started
        return FoldRun(model, report, started=started)
    checking = request.verifying and bool(plan.folded)
    check = (
        Check.before_apply(
            request.check, request.shapes, source or given, model, bound, progress=progress.phase, original_ahead=ahead
        )
        if checking
        else None
    )
    staged: StagedModel | None = None
    try:
        if request.proof:
            progress.phase("Folding")
        apply_plan(model, bound)
        if after_apply is not None:
            after_apply(model, plan)
        release_mapped(model)  # pages of the constants the analysis read (gammas, betas, scales)
        if plan.folded:  # an earlier fold's account describes the model before this one
            drop_provenance(model)
        skipped = (
            "nothing was folded: the model is unchanged" if request.check.verify else request.check.disabled_because
        )
        report = report_of(Verification("skipped", skipped))
        _phase_done()

        def written() -> Path | None:
            nonlocal staged
            if request.output is not None:
                staged = _stage(model, source, request.output, plan, progress)
                return staged.path
            return None

        if check is None:
            written()
        else:
            progress.phase("Verifying in onnxruntime")
            report.verification = check.after_apply(model, written, lambda: time.monotonic() - started)
    except BaseException:
        if staged is not None:
            staged.discard()
        raise
    finally:
        if check is not None:
            check.close()
    report.elapsed_s = time.monotonic() - started
    said = provenance(report, request.options) if plan.folded else {}
    if staged is None:
        model.metadata_props.update(said)  # a staged model takes them when committed
    return FoldRun(model, report, staged, started, input_data, request.in_place, said)


def _stage(
    model: ir.Model, path: Path | None, destination: Path, plan: CenteringPlan, progress: Progress
) -> StagedModel:
    """Stage the output: the folded model, or, when nothing was folded, the input file's own bytes
    (a model with external data is written again instead, its weights into `OUT.data` as for any
    output: an equivalent copy, not an identical one)."""
    unchanged = not plan.folded and path is not None and not external_data_files(model, path.parent)
    return StagedModel(model, destination, progress=progress, rebind=True, copy_of=path if unchanged else None)


def raise_unless_passed(run: FoldRun) -> None:
    """The library's refusal: an exception carrying the report, instead of the model; a staged
    output is removed."""
    if not run.refused:
        return
    run.finish()
    verification = run.report.verification
    error_type = VerificationFailed if verification.status == "failed" else NotVerified
    error = error_type(verification.refusal("api"))
    error.report = run.report  # type: ignore[attr-defined]
    raise error


def fold_loaded(model: ir.Model, source: Path | None, request: FoldRequest, started: float | None = None) -> FoldResult:
    """`fold()` on a model already loaded (and owned: it is changed in place); `source` is the file
    it was read from, if any. With `request.output`, the fold is written there once it passed."""
    run = run_pipeline(model, source, request, started=started)
    raise_unless_passed(run)
    run.finish()
    return FoldResult(run.model, run.report, source, run.input_data)


__all__ = [
    "FoldRequest",
    "FoldResult",
    "FoldRun",
    "analyze_for_target",
    "analyze_model",
    "commit_staged",
    "fold_loaded",
    "raise_unless_passed",
    "run_pipeline",
]
