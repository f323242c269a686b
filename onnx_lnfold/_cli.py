"""`python -m onnx_lnfold IN.onnx [-o OUT.onnx]`: fold, verify, write, report.

Exit codes: 0 done (also when nothing folds), 1 verification failed (nothing written),
2 bad input or usage (one line on stderr, nothing written).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from onnx_lnfold import __version__
from onnx_lnfold._analyze import TIED_WEIGHTS, analyze
from onnx_lnfold._errors import LnFoldError
from onnx_lnfold._fold import check_equivalence, fold_loaded
from onnx_lnfold._inputs import load_inputs, parse_input_shape
from onnx_lnfold._load import external_data_files, load_path
from onnx_lnfold._progress import Progress
from onnx_lnfold._report import FoldReport, count_ops
from onnx_lnfold._save import StagedModel, check_destination, default_output
from onnx_lnfold._targets import FUSE_RESIDUAL, TARGETS
from onnx_lnfold._verify import Verification

EXIT_OK, EXIT_VERIFY, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, no usage block
        raise LnFoldError(f"{message} (see --help)")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="python -m onnx_lnfold",
        description="Replace LayerNormalization with RMSNorm (SimplifiedLayerNormalization) wherever "
        "centering upstream weights makes it exact; verify with onnxruntime; report why the rest stay.",
    )
    p.add_argument("model", help="input .onnx file")
    p.add_argument("-o", "--output", help="output path (default: IN.lnfold.onnx beside the input)")
    p.add_argument("--in-place", action="store_true", help="allow the output to replace the input file")
    p.add_argument("--json", metavar="REPORT.json", help="also write the report as JSON")
    p.add_argument("--dry-run", action="store_true", help="analyze and print the plan; write nothing")
    p.add_argument(
        "--target",
        choices=TARGETS,
        default="ort",
        help="ort: SimplifiedLayerNormalization / SkipSimplifiedLayerNormalization (ONNX Runtime ops; default); "
        "onnx: the standard RMSNormalization (models at opset >= 23)",
    )
    p.add_argument(
        "--fuse-residual",
        choices=FUSE_RESIDUAL,
        default="auto",
        help="which residual Adds become SkipSimplifiedLayerNormalization: auto (where ONNX Runtime "
        "fuses the original's Add + LayerNormalization; default), always, never",
    )
    p.add_argument(
        "--tied-weights",
        choices=TIED_WEIGHTS,
        default="auto",
        help="an embedding table the LM head shares: untie (center a copy; the file grows by the table), "
        "center (x - ReduceMean(x) after the Gather: no copy, two nodes per run), or auto (default: untie "
        "where the LM head reads it through a Transpose, which ONNX Runtime folds into its own copy anyway)",
    )
    p.add_argument(
        "--no-aux-centering",
        action="store_true",
        help="never insert an explicit x - ReduceMean(x) (to unlock LNs whose stream no weight edit can "
        "center, or for tied weights: they are untied)",
    )
    p.add_argument("--no-verify", action="store_true", help="skip the onnxruntime equivalence check")
    p.add_argument("--rtol", type=float, help="max |diff|/max|ref| allowed (default 1e-4 fp32, 1e-2 fp16)")
    p.add_argument(
        "--input-shape",
        action="append",
        default=[],
        metavar="NAME:D1,D2,...",
        help="shape of a graph input for verification (repeatable)",
    )
    p.add_argument("--inputs", metavar="FILE.npz", help="verification inputs, keyed by graph input name")
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")
    p.add_argument("--debug", action="store_true", help="log the analysis; show tracebacks of internal errors")
    p.add_argument("--version", action="version", version=f"onnx_lnfold {__version__}")
    return p


def _destination(args: argparse.Namespace, source: Path) -> Path | None:
    if args.dry_run:
        return None
    if args.in_place:
        if args.output and Path(args.output).resolve() != source.resolve():
            raise LnFoldError("--in-place and --output name different files; give one of them")
        return source
    return Path(args.output) if args.output else default_output(source)


def _check_json_path(args: argparse.Namespace, source: Path, destination: Path | None, input_data: set[Path]) -> None:
    if not args.json:
        return
    target = Path(args.json)
    resolved = target.resolve()
    taken = {source.resolve(), *input_data}
    if destination is not None:
        taken |= {destination.resolve(), destination.resolve().with_name(destination.name + ".data")}
    if resolved in taken:
        raise LnFoldError(f"{target}: --json would overwrite the input or output model")
    if target.is_dir():
        raise LnFoldError(f"{target}: --json path is a directory")
    if not target.parent.is_dir():
        raise LnFoldError(f"{target.parent}: folder of --json does not exist")


def _emit(report: FoldReport, args: argparse.Namespace) -> None:
    if args.json:
        try:
            Path(args.json).write_text(report.to_json() + "\n")
        except OSError as e:
            raise LnFoldError(f"{args.json}: cannot write the report: {e.strerror or e}") from None
    if not args.quiet:
        try:
            print(report.format_text(), flush=True)
        except BrokenPipeError:  # `... | head`: the reader left; the exit code still tells
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def run(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.debug:
        logging.basicConfig(level=logging.DEBUG, format="%(name)s: %(message)s")
    progress = Progress(enabled=False if args.quiet else None)
    try:
        return _run(args, progress)
    finally:
        progress.close()


def _run(args: argparse.Namespace, progress: Progress) -> int:
    source = Path(args.model)
    shapes = dict(parse_input_shape(s) for s in args.input_shape)
    if args.rtol is not None and not args.rtol > 0:
        raise LnFoldError("--rtol must be a positive number")
    destination = _destination(args, source)
    if destination is not None:
        check_destination(source, destination, args.in_place)
    inputs = load_inputs(args.inputs) if args.inputs else None

    progress.phase(f"Loading {source}")
    model = load_path(source)
    input_data = external_data_files(model, source.parent)
    if destination is not None:
        check_destination(source, destination, args.in_place, input_data)
    _check_json_path(args, source, destination, input_data)

    if args.dry_run:
        ops = count_ops(model)
        progress.phase("Analyzing")
        report = FoldReport(
            plan=analyze(
                model,
                target=args.target,
                auxiliary_centering=not args.no_aux_centering,
                fuse_residual=args.fuse_residual,
                tied_weights=args.tied_weights,
            ),
            ops_before=ops,
            ops_after=ops,
            verification=Verification("skipped", "dry run: nothing was changed"),
            source=str(source),
        )
        progress.close()
        _emit(report, args)
        return EXIT_OK

    progress.phase("Folding")
    result = fold_loaded(
        model,
        source,
        verify=False,
        inputs=inputs,
        target=args.target,
        auxiliary_centering=not args.no_aux_centering,
        fuse_residual=args.fuse_residual,
        tied_weights=args.tied_weights,
    )
    report = result.report
    # Written (to a temporary folder beside the destination) before verification: onnxruntime
    # reads the staged file, so a model with external data is written once.
    staged = StagedModel(result.model, destination, progress=progress, rebind=True)  # type: ignore[arg-type]
    try:
        if args.no_verify:
            report.verification = Verification("skipped", "disabled by --no-verify")
        elif not report.plan.folded:
            report.verification = Verification("skipped", "nothing was folded: the model is unchanged")
        else:
            progress.phase("Verifying in onnxruntime")
            report.verification = check_equivalence(
                source, staged.path, result.model, rtol=args.rtol, input_shapes=shapes, inputs=inputs, plan=report.plan
            )
        progress.close()
        if report.verification.status in ("failed", "unverified"):  # only a passed check writes a fold
            staged.discard()
            why = "not equivalent" if report.verification.status == "failed" else "not verified"
            report.notes.append(f"Refused to write {destination}: the folded model is {why}.")
            _emit(report, args)
            print(f"onnx_lnfold: {report.verification.refusal('cli')}", file=sys.stderr)
            return EXIT_VERIFY
        report.output = str(staged.commit())
    except BaseException:
        staged.discard()
        raise
    if args.in_place and staged.data_name is not None:
        new_data = (source.parent / staged.data_name).resolve()
        for old in sorted(input_data - {new_data}):
            report.notes.append(f"The input's old external data file {old.name} is no longer used by {source.name}.")
    _emit(report, args)
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    try:
        return run(argv)
    except LnFoldError as e:
        print(f"onnx_lnfold: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("onnx_lnfold: interrupted; nothing written", file=sys.stderr)
        return 130

    except Exception as e:  # an internal error: one line unless --debug asked for the traceback
        if argv is None and "--debug" in sys.argv or argv is not None and "--debug" in argv:
            raise
        msg = f"{type(e).__name__}: {e}".splitlines()[0]
        print(f"onnx_lnfold: internal error: {msg} (rerun with --debug for details)", file=sys.stderr)
        return EXIT_INTERNAL
