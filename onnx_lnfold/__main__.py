"""`python -m onnx_lnfold` and the `onnx-lnfold` command.

The CLI's imports (numpy, onnx, onnx_ir) take a while; a Ctrl-C during them ends like one
later on: one line, exit 130, no traceback. `-V` and `--help` answer before them.
"""

import gc
import sys
import time

# The user's wait, as the report's elapsed time counts it: from here, before the tool's own
# modules are imported (and numpy, onnx, onnx_ir with them); only the interpreter's start
# (`python -c pass`: a few tens of ms) comes before. A second call of main() counts from its own start.
_started: float | None = time.monotonic()


def main() -> int:
    global _started
    started, _started = (_started if _started is not None else time.monotonic()), None
    try:
        from onnx_lnfold._cli import main as cli_main
    except KeyboardInterrupt as e:
        from onnx_lnfold.core.errors import stopped

        word, code = stopped(e)
        print(f"onnx_lnfold: {word}; nothing written", file=sys.stderr)
        return code
    code = cli_main(started=started)
    # The process ends here: what it still holds (a large graph's millions of objects) is left to
    # the system rather than walked by the collector at exit (seconds for a 200,000-node model).
    gc.freeze()
    return code


if __name__ == "__main__":
    sys.exit(main())
