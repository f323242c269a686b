"""`python -m onnx_lnfold` and the `onnx-lnfold` command.

The CLI's imports (numpy, onnx, onnx_ir) take a while; a Ctrl-C during them ends like one
later on: one line, exit 130, no traceback.
"""

import sys


def main() -> int:
    try:
        from onnx_lnfold._cli import main as cli_main
    except KeyboardInterrupt:
        print("onnx_lnfold: interrupted; nothing written", file=sys.stderr)
        return 130
    return cli_main()


if __name__ == "__main__":
    sys.exit(main())
