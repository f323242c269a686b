"""Write the table of the fold's and the check's options into docs/COMMAND_LINE.md, from `core.options.OPTIONS`.

    python tools/gen_options_doc.py            # write the table between the doc's options markers
    python tools/gen_options_doc.py --check    # exit 1 where the doc's table is not the options table
    python tools/gen_options_doc.py --stdout   # print the table

The table is `core.options.options_markdown()`; tests/surface/test_options.py fails while the
doc's copy differs from it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "COMMAND_LINE.md"
sys.path.insert(0, str(ROOT))  # this checkout's onnx_lnfold, not whichever is installed

from onnx_lnfold.core.options import options_markdown  # noqa: E402

# The generated block: between these lines of the doc.
BEGIN, END = "<!-- begin options: core.options.OPTIONS -->\n", "\n<!-- end options -->"


def with_table(doc: str) -> str:
    """`doc` with the text between its options markers replaced by the options table."""
    start, end = doc.index(BEGIN) + len(BEGIN), doc.index(END)
    return doc[:start] + options_markdown() + doc[end:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--check", action="store_true", help="exit 1 where the doc's table is out of date")
    what.add_argument("--stdout", action="store_true", help="print the table instead of writing the doc")
    args = parser.parse_args(argv)
    if args.stdout:
        print(options_markdown())
        return 0
    doc = DOC.read_text()
    made = with_table(doc)
    if args.check:
        if made != doc:
            print(f"{DOC.relative_to(ROOT)}: the options table is out of date; run python tools/gen_options_doc.py")
            return 1
        return 0
    if made != doc:
        DOC.write_text(made)
        print(f"wrote {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
