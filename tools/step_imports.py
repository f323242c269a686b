"""Which step of onnx_lnfold imports which: the package is one folder per step, in pipeline order,
and a step may import only the steps before it (and itself).

    python tools/step_imports.py            # the matrix, then any import of a later step (exit 1)

The drivers on top of the steps (`_api`, `_pipeline`, `_pass`, `_cli`, `olive`, `__init__`,
`__main__`) compose them and may import any; so may the tool packages beside the pipeline (`TOOLS`:
`bench`, which times models and measures cost tables), which are no step: no step may import them.
tests/test_layout.py runs this check.
"""

from __future__ import annotations

import ast
import sys
from collections import Counter
from pathlib import Path

# The steps in the order the pipeline runs them; shared layers first (docs/DESIGN.md section 7).
STEPS = ("core", "io", "load", "shapes", "carry", "forms", "decide", "analysis", "ort_fusions", "apply", "feeds", "verify", "save", "report")
# Subpackages on top of the steps, like the drivers: they may import any step, and no step imports them.
TOOLS = ("bench",)


def package_dir() -> Path:
    import onnx_lnfold

    return Path(onnx_lnfold.__file__).resolve().parent


def imported_steps(path: Path) -> list[tuple[str, int]]:
    """(step, line) for every import of a step of onnx_lnfold in `path`, nested ones included."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        modules: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules = [node.module] + [f"{node.module}.{a.name}" for a in node.names] * (node.module == "onnx_lnfold")
        elif isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        for module in modules:
            parts = module.split(".")
            if parts[0] == "onnx_lnfold" and len(parts) > 1 and parts[1] in STEPS + TOOLS:
                found.append((parts[1], node.lineno))
    return found


def step_of(path: Path, root: Path) -> str | None:
    rel = path.relative_to(root).parts
    return rel[0] if len(rel) > 1 and rel[0] in STEPS else None


def check(root: Path) -> tuple[dict[str, Counter], list[str]]:
    """The import counts between steps, and every import of a later step."""
    matrix: dict[str, Counter] = {step: Counter() for step in STEPS}
    later = []
    for path in sorted(root.rglob("*.py")):
        step = step_of(path, root)
        if step is None:
            continue
        for imported, line in imported_steps(path):
            if imported == step:
                continue
            if imported in TOOLS:
                later.append(f"{path.relative_to(root.parent)}:{line}: {step} imports {imported}, a tool on top of the steps")
                continue
            matrix[step][imported] += 1
            if STEPS.index(imported) > STEPS.index(step):
                later.append(f"{path.relative_to(root.parent)}:{line}: {step} imports {imported}, a later step")
    return matrix, later


def main() -> int:
    root = package_dir()
    matrix, later = check(root)
    for step in STEPS:
        files = sorted(p for p in (root / step).glob("*.py"))
        lines = sum(len(p.read_text().splitlines()) for p in files)
        uses = ", ".join(f"{s} {n}" for s, n in sorted(matrix[step].items(), key=lambda kv: STEPS.index(kv[0])))
        print(f"{step:<12} {len(files):>2} files {lines:>5} lines   imports: {uses or '-'}")
    for line in later:
        print(line)
    return 1 if later else 0


if __name__ == "__main__":
    sys.exit(main())
