"""`onnx-lnfold IN.onnx [-o OUT.onnx]` (or `python -m onnx_lnfold`): fold, verify, write, report.

Exit codes: 0 done (also when nothing folds), 1 a fold that did not pass verification (nothing written;
`VerificationFailed`), 2 bad input or usage, or an output that cannot be written (one line on stderr,
nothing written; every other `LnFoldError`), 3 internal error, 130 interrupted.

The parser is built from `core.options`' table alone: `-V`, `--help` and a usage error answer
before numpy, onnx and onnx_ir are imported (they take about a second); `_run` imports them.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from onnx_lnfold import __version__
from onnx_lnfold.core.errors import CannotWrite, InvalidInput, LnFoldError, Terminated, VerificationFailed, stopped
from onnx_lnfold.core.options import OPTIONS, check_from, options_from
from onnx_lnfold.core.progress import Progress

if TYPE_CHECKING:
    from onnx_lnfold.report.fold_report import FoldReport

EXIT_OK, EXIT_VERIFY, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3  # a stopped run's: `core.errors.stopped`

STDOUT = "-"  # `--json -`: the JSON report on stdout, the text report on stderr

_EPILOG = """\
exit codes:
  0    done (also when nothing folds)
  1    a fold that did not pass verification (failed, or could not run): nothing written
  2    bad input or usage, or the output cannot be written: one line on stderr, nothing written
  3    internal error (rerun with --debug for the traceback)
  130  interrupted: nothing written
  143  terminated (SIGTERM): nothing written

examples:
  {prog} model.onnx
      fold into model.lnfold.onnx beside the input, verified in onnxruntime
  {prog} model.onnx --dry-run -v
      write nothing; show what would fold, and the proof for each LayerNorm

subcommands (see {prog} bench --help):
  {prog} bench ORIGINAL FOLDED [--provider NAME] [--inputs FILE.npz | --input-shape ...]
      does the fold pay on this model, on this machine: both controls, intervals, a verdict
  {prog} calibrate --provider NAME -o COSTS.json
      measure the kernel costs the never-slower rule reads on one provider; fold with --costs COSTS.json
  (a model file named bench or calibrate is folded, as any model file is)
"""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, no usage block
        raise InvalidInput(f"{message} (see --help)")


def program_name(argv0: str | None = None) -> str:
    """The command as the user typed it: `onnx-lnfold`, or `python -m onnx_lnfold`."""
    name = os.path.basename(argv0 if argv0 is not None else sys.argv[0])
    return "python -m onnx_lnfold" if name in ("__main__.py", "-m", "-c", "") else name


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    prog = prog or program_name()
    p = _Parser(
        prog=prog,
        description="Replace LayerNormalization with RMSNorm (SimplifiedLayerNormalization) wherever\n"
        "centering upstream weights makes it exact; verify with onnxruntime; report why the rest stay.",
        epilog=_EPILOG.format(prog=prog),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model", help="input .onnx file")
    p.add_argument("-o", "--output", help="output path (default: IN.lnfold.onnx beside the input)")
    p.add_argument("--in-place", action="store_true", help="allow the output to replace the input file")
    p.add_argument(
        "--json",
        metavar="REPORT.json",
        help="also write the report as JSON ('-': to stdout, the text report to stderr)",
    )
    p.add_argument("--dry-run", action="store_true", help="analyze and print the plan; write nothing")
    for option in OPTIONS:  # the fold's and the check's options, from their one table
        option.add_to(p)
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")
    p.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="add the proof per LN to the report: the producers centered, each carry op passed, what blocked",
    )
    p.add_argument("--debug", action="store_true", help="log the analysis; show tracebacks of internal errors")
    p.add_argument("-V", "--version", action="version", version=f"onnx_lnfold {__version__}")
    return p


def _destination(args: argparse.Namespace, source: Path) -> Path | None:
    from onnx_lnfold.save.staged import default_output

    if args.dry_run:
        return None
    if args.in_place:
        if args.output and Path(args.output).resolve() != source.resolve():
            raise InvalidInput("--in-place and --output name different files; give one of them")
        return source
    return Path(args.output) if args.output else default_output(source)


def _check_source(model: str) -> Path:
    """The input must name a file before an output name is derived from it (`.`, `/`, `""` have
    no file name to derive one from)."""
    source = Path(model)
    shown = model if model else "''"
    if not source.exists():
        raise InvalidInput(f"{shown}: no such file")
    if source.is_dir():
        raise InvalidInput(f"{shown}: is a directory, not an ONNX model")
    return source


def _check_writable(folder: Path, what: str, way_out: str = "") -> None:
    """Create and remove a file in `folder`, before any work: permission bits say nothing when run
    as root or on a read-only mount, and a failure after folding would come too late. `way_out`
    ends the message when there is one (an output beside the input can be written elsewhere)."""
    import tempfile  # here, not at the top: -V and --help do without it

    try:
        fd, probe = tempfile.mkstemp(prefix=".lnfold-probe-", dir=folder)
    except OSError as e:
        way_out = f"; {way_out}" if way_out else ""
        raise CannotWrite(f"{folder}: cannot write to the {what} folder ({e.strerror or e}){way_out}") from None
    os.close(fd)
    os.unlink(probe)


def _check_json_path(args: argparse.Namespace, source: Path, destination: Path | None, input_data: set[Path]) -> None:
    if not args.json or args.json == STDOUT:
        return
    target = Path(args.json)
    resolved = target.resolve()
    taken = {source.resolve(), *input_data}
    if destination is not None:
        taken |= {destination.resolve(), destination.resolve().with_name(destination.name + ".data")}
    if resolved in taken:
        raise InvalidInput(f"{target}: --json would overwrite the input or output model")
    if target.is_dir():
        raise InvalidInput(f"{target}: --json path is a directory")
    if not target.parent.is_dir():
        raise InvalidInput(f"{target.parent}: folder of --json does not exist")
    if target.exists() and not os.access(target, os.W_OK):
        raise InvalidInput(f"{target}: --json file is not writable")
    _check_writable(target.parent, "--json")


def _print(text: str, stream) -> None:
    try:
        print(text, file=stream, flush=True)
    except BrokenPipeError:  # `... | head`: the reader left; the exit code still tells
        os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())


def _emit(report: FoldReport, args: argparse.Namespace) -> None:
    if args.json == STDOUT:
        _print(report.to_json(), sys.stdout)
    elif args.json:
        try:
            Path(args.json).write_text(report.to_json() + "\n")
        except OSError as e:
            raise CannotWrite(f"{args.json}: cannot write the report: {e.strerror or e}") from None
    if not args.quiet:
        _print(report.format_text(), sys.stderr if args.json == STDOUT else sys.stdout)


def _quiet_onnxruntime() -> None:
    """Keep ONNX Runtime's own log lines (warnings at environment creation) off stderr: what goes
    wrong in a verification run is raised, and reported by the tool."""
    try:
        import onnxruntime
    except ImportError:
        return
    onnxruntime.set_default_logger_severity(3)


def run(argv: list[str] | None = None, started: float | None = None) -> int:
    """`started`: when the user's wait began, on `time.monotonic()`'s clock (the command's entry
    point stamps it before importing anything); the report's elapsed time counts from there."""
    started = time.monotonic() if started is None else started
    args = build_parser().parse_args(argv)
    if args.debug:
        import logging

        logging.basicConfig(level=logging.DEBUG, format="%(name)s: %(message)s")
    if args.verify and not args.dry_run:
        _quiet_onnxruntime()
    progress = Progress(enabled=False if args.quiet else None)
    try:
        return _run(args, progress, started)
    finally:
        progress.close()


def _run(args: argparse.Namespace, progress: Progress, started: float) -> int:
    # The heavy imports (numpy, onnx, onnx_ir: about a second), once the arguments are known good.
    from onnx_lnfold._pipeline import collecting_per_phase, run_pipeline
    from onnx_lnfold.core.fold_request import FoldRequest
    from onnx_lnfold.core.options import RunShapes
    from onnx_lnfold.feeds.given import load_inputs
    from onnx_lnfold.io import scratch
    from onnx_lnfold.load.model import load_model
    from onnx_lnfold.save.staged import check_destination

    source = _check_source(args.model)
    destination = _destination(args, source)
    # Validated here, before the model is loaded: a setting out of range is a usage error.
    request = FoldRequest(
        options=options_from(args),
        shapes=RunShapes(
            input_shapes=dict(args.input_shapes), inputs=load_inputs(args.inputs) if args.inputs else None
        ),
        check=check_from(args, disabled_because="disabled by --no-verify"),
        output=destination,
        in_place=args.in_place,
        dry_run=args.dry_run,
        proof=args.verbose,
    )
    if destination is not None:
        check_destination(source, destination, args.in_place)  # before the load; with its data files in the fold
        if destination.parent.is_dir():  # a missing folder is reported when staging, as before
            # The default output goes beside the input: a read-only input folder has a way out.
            way_out = "" if (args.output or args.in_place) else "use -o PATH to write elsewhere"
            _check_writable(destination.parent, "output", way_out)
    rehearsal = None
    if args.costs is not None:
        from onnx_lnfold.bench.tables import rehearsal_of
        from onnx_lnfold.decide.costs import load_table

        load_table(args.costs)  # a bad table is a usage error before any work
        if rehearsal := rehearsal_of(args.costs):
            rehearsal = f"--costs {args.costs} is {rehearsal}; measure one with `onnx-lnfold calibrate` without --quick"
            if not args.quiet:
                print(f"onnx_lnfold: warning: {rehearsal}", file=sys.stderr, flush=True)

    progress.phase(f"Loading {source}")
    with collecting_per_phase(), scratch.removed_when_interrupted():
        model, _ = load_model(source)  # checked by ONNX's checker, as every entry point's model
        _check_json_path(args, source, destination, _input_data(model, source))
        run = run_pipeline(model, source, request, progress=progress, started=started)
    report = run.report
    if rehearsal:
        report.notes.append(f"Warning: {rehearsal}.")
    progress.close()
    run.finish()  # commits a fold that passed, else discards it
    _emit(report, args)
    if run.refused:
        print(f"onnx_lnfold: {report.verification.refusal('cli')}", file=sys.stderr)
        return EXIT_VERIFY
    return EXIT_OK


def _input_data(model, source: Path) -> set[Path]:
    from onnx_lnfold.io.external_data import external_data_files

    return external_data_files(model, source.parent)


def _terminate(signum, frame) -> None:
    raise Terminated


def main(argv: list[str] | None = None, started: float | None = None) -> int:
    if threading.current_thread() is not threading.main_thread():  # where no handler can be set
        return _main(argv, started)
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        return _main(argv, started)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _main(argv: list[str] | None, started: float | None) -> int:
    from onnx_lnfold.bench.cli import is_subcommand  # argparse alone: the start-up stays light

    args = sys.argv[1:] if argv is None else list(argv)
    if is_subcommand(args):
        from onnx_lnfold.bench.cli import main as subcommand

        return subcommand(args, prog=program_name())
    try:
        return run(argv, started)
    except VerificationFailed as e:  # the pipeline reports refusals itself; kept for the mapping
        print(f"onnx_lnfold: {e}", file=sys.stderr)
        return EXIT_VERIFY
    except LnFoldError as e:
        print(f"onnx_lnfold: error: {e.said('cli')}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt as e:
        word, code = stopped(e)
        print(f"onnx_lnfold: {word}; nothing written", file=sys.stderr)
        return code
    except Exception as e:  # an internal error: one line unless --debug asked for the traceback
        if argv is None and "--debug" in sys.argv or argv is not None and "--debug" in argv:
            raise
        msg = f"{type(e).__name__}: {e}".splitlines()[0]
        print(f"onnx_lnfold: internal error: {msg} (rerun with --debug for details)", file=sys.stderr)
        return EXIT_INTERNAL
