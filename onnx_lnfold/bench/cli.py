"""`onnx-lnfold bench` and `onnx-lnfold calibrate`: the command lines of the tools beside the fold.

`onnx-lnfold ARG ...` runs a subcommand when ARG is its name and no file of that name is there: a
model file named `bench` (or `calibrate`) is folded as it always was (`onnx-lnfold ./bench` says
the same), and `python -m onnx_lnfold.bench.cli bench ...` runs the subcommand in such a folder.
The parsers import nothing heavy: `--help` and usage errors answer before numpy, onnx or
onnxruntime are imported.

Exit codes: 0 done (whatever the verdict), 2 bad input or usage, or a provider the session did not
get (one line on stderr), 3 internal error, 130 interrupted.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

SUBCOMMANDS = ("bench", "calibrate")
EXIT_OK, EXIT_USAGE, EXIT_INTERNAL = 0, 2, 3  # a stopped run's: `core.errors.stopped`


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, no usage block
        raise UsageError(f"{message} (see --help)")


def is_subcommand(argv: list[str]) -> bool:
    """Whether `onnx-lnfold ARGV...` names a subcommand rather than a model file to fold."""
    return bool(argv) and argv[0] in SUBCOMMANDS and not Path(argv[0]).is_file()


def _subcommand_parser(prog: str, subcommand: str, description: str, examples: str) -> argparse.ArgumentParser:
    """A subcommand's parser: its help keeps the examples' line breaks."""
    return _Parser(
        prog=f"{prog} {subcommand}",
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"example:\n  {examples}",
    )


def bench_parser(prog: str) -> argparse.ArgumentParser:
    p = _subcommand_parser(
        prog,
        "bench",
        "Does the fold pay on this model, on this machine? Times ORIGINAL, its re-saved copy and "
        "FOLDED in fresh processes (sessions created in rotated order, rounds interleaved), prints original/folded "
        "and re-saved/folded with bootstrap 95% intervals, a verdict in words (faster / no change it can resolve / "
        "slower), and the normalizations' kernel time from ONNX Runtime's profiler.",
        f"{prog} model.onnx -o model.lnfold.onnx --inputs feeds.npz\n  {prog} bench model.onnx model.lnfold.onnx --inputs feeds.npz",
    )
    p.add_argument("original", help="the model as it was")
    p.add_argument("folded", help="its fold (onnx-lnfold ORIGINAL -o FOLDED)")
    p.add_argument("--provider", default="CPUExecutionProvider",
                   help="the execution provider to time on (CPU, CUDA, CUDAExecutionProvider, ...; default CPU): "
                   "refused when onnxruntime cannot give it, never timed on another")
    inputs = p.add_mutually_exclusive_group()
    inputs.add_argument("--inputs", metavar="FILE.npz", help="the inputs to time with, keyed by graph input name")
    inputs.add_argument("--input-shape", action="append", default=[], metavar="NAME:D1,D2,...",
                        help="the shape of a graph input, for synthesized inputs (repeatable)")
    p.add_argument("--processes", type=int, default=5, help="fresh processes, at least 2 (default 5)")
    p.add_argument("--rounds", type=int, default=20, help="interleaved rounds per process (default 20)")
    p.add_argument("--warmup", type=int, default=3, help="untimed runs of each session first (default 3)")
    p.add_argument("--threads", type=int, help="ONNX Runtime intra-op threads (default: the usable cores)")
    p.add_argument("--no-profile", action="store_true", help="skip the profiled runs (kernel time per op type)")
    p.add_argument("--json", metavar="FILE", help="also write every figure as JSON")
    return p


def calibrate_parser(prog: str) -> argparse.ArgumentParser:
    p = _subcommand_parser(
        prog,
        "calibrate",
        "Measure the kernel costs the never-slower rule decides by (LayerNormalization, "
        "SimplifiedLayerNormalization, their Skip forms, the residual Add, beta's Add, an explicit centering) on "
        "one execution provider, over the shapes the rule decides on, each with its spread, and write them as a "
        "cost table: `onnx-lnfold MODEL --costs COSTS.json` then folds by it.",
        f"{prog} calibrate --provider CUDA -o cuda_costs.json\n  {prog} model.onnx --costs cuda_costs.json",
    )
    p.add_argument("--provider", default="CPUExecutionProvider", help="the execution provider (default CPU)")
    p.add_argument("-o", "--output", required=True, metavar="COSTS.json", help="where to write the cost table")
    p.add_argument("--widths", type=int, nargs="+", metavar="D", help="widths (hidden sizes) to measure "
                   "(default 64 256 384 768 1024)")
    p.add_argument("--tokens", type=int, nargs="+", metavar="T", help="token counts (batch x sequence) to measure "
                   "(default 16 128 1024 8192; the largest shape sets the memory: about 2.2 GB at the defaults, where "
                   "8192 tokens x 1024 wide decides; the run prints its peak)")
    p.add_argument("--processes", type=int, default=2, help="fresh processes, at least 2 (default 2)")
    p.add_argument("--rounds", type=int, default=7, help="interleaved rounds per process (default 7)")
    p.add_argument("--threads", type=int, help="ONNX Runtime intra-op threads (default: the usable cores)")
    p.add_argument("--max-seconds", type=float, help="stop measuring new shapes after this long (the table then "
                   "holds the shapes measured; at least two per width)")
    p.add_argument("--dtype", choices=["float32", "float16"], default="float32",
                   help="the tensors' type (default float32, as the built-in table)")
    p.add_argument("--samples", metavar="FILE.json", help="also write every wall-clock sample, by process")
    p.add_argument("--from-samples", metavar="FILE.json", help="make the table from the samples a run kept "
                   "(--samples), measuring nothing")
    p.add_argument("--quick", action="store_true", help="fewer shapes and rounds: a rehearsal, not a table to fold by (the "
                   "table says so, and --costs warns when it reads it)")
    return p


def _parse_shapes(specs: list[str]) -> dict[str, tuple[int, ...]]:
    from onnx_lnfold.core.options import parse_input_shape

    return dict(parse_input_shape(s) for s in specs)


def _bench(args: argparse.Namespace) -> int:
    from onnx_lnfold.bench.compare import bench, write_json
    from onnx_lnfold.bench.placement import provider_name
    from onnx_lnfold.feeds.given import load_inputs

    inputs = load_inputs(args.inputs) if args.inputs else None
    result = bench(args.original, args.folded, provider=provider_name(args.provider), inputs=inputs,
                   input_shapes=_parse_shapes(args.input_shape) or None, processes=args.processes,
                   rounds=args.rounds, warmup=args.warmup, threads=args.threads, profile=not args.no_profile)
    if args.inputs:
        result.inputs_from = f"from {args.inputs}"
    print(result.format_text(), flush=True)
    if args.json:
        write_json(result, args.json)
    return EXIT_OK


def _calibrate(args: argparse.Namespace) -> int:
    from onnx_lnfold.bench.calibrate import calibrate_command

    return calibrate_command(args)


def main(argv: list[str] | None = None, prog: str = "onnx-lnfold") -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if not argv or argv[0] not in SUBCOMMANDS:
            raise UsageError(f"expected a subcommand: {', '.join(SUBCOMMANDS)} (see --help)")
        command, rest = argv[0], argv[1:]
        parser = bench_parser(prog) if command == "bench" else calibrate_parser(prog)
        args = parser.parse_args(rest)
        return _bench(args) if command == "bench" else _calibrate(args)
    except UsageError as e:
        print(f"onnx_lnfold {argv[0] if argv else ''}: error: {e}".replace("  ", " "), file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt as e:
        from onnx_lnfold.core.errors import stopped

        word, code = stopped(e)
        print(f"onnx_lnfold: {word}", file=sys.stderr)
        return code
    except BrokenPipeError:  # `... | head`: the reader left; what was measured is written already
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except Exception as e:  # noqa: BLE001 - one line, mapped to an exit code
        from onnx_lnfold.bench.placement import PlacementError
        from onnx_lnfold.core.errors import LnFoldError

        if isinstance(e, (LnFoldError, PlacementError)):
            print(f"onnx_lnfold {argv[0]}: error: {e}", file=sys.stderr)
            return EXIT_USAGE
        msg = f"{type(e).__name__}: {e}".splitlines()[0]
        print(f"onnx_lnfold {argv[0]}: internal error: {msg}", file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    raise SystemExit(main(prog="python -m onnx_lnfold.bench.cli"))
