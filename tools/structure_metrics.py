"""Figures a maintainer reads the structure by: modules and lines per step, long functions, long
parameter lists, and private names read across modules.

    python tools/structure_metrics.py            # the table
    python tools/structure_metrics.py --json     # the same as JSON
    python tools/structure_metrics.py --list     # also name every long function and private read

A private read is `obj._name` (not `self._name` or `cls._name`) in a module that defines no
`_name` of its own: one module reaching into another's private fields.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
PACKAGE = HERE.parent / "onnx_lnfold"
LONG_FUNCTION = 80  # lines
MANY_PARAMETERS = 8


def _defined_private_names(tree: ast.AST) -> set[str]:
    """Private names a module defines: functions, classes, class fields, `self._x = ...`."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def _parameters(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = fn.args
    names = [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs]
    return len([n for n in names if n not in ("self", "cls")]) + bool(a.vararg) + bool(a.kwarg)


def measure(package: Path = PACKAGE) -> dict:
    lines_per_step: Counter[str] = Counter()
    modules = 0
    long_functions: list[str] = []
    many_parameters: list[str] = []
    private_reads: list[str] = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package)
        text = path.read_text()
        tree = ast.parse(text, str(path))
        modules += 1
        step = rel.parts[0] if len(rel.parts) > 1 else "(drivers)"
        lines_per_step[step] += len(text.splitlines())
        own = _defined_private_names(tree)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > LONG_FUNCTION:
                    long_functions.append(f"{rel}:{node.lineno} {node.name} ({length} lines)")
                if _parameters(node) >= MANY_PARAMETERS:
                    many_parameters.append(f"{rel}:{node.lineno} {node.name} ({_parameters(node)} parameters)")
            elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                base = node.value
                if isinstance(base, ast.Name) and base.id in ("self", "cls"):
                    continue
                if node.attr not in own:
                    private_reads.append(f"{rel}:{node.lineno} .{node.attr}")
    return {
        "modules": modules,
        "lines": sum(lines_per_step.values()),
        "lines_per_step": dict(sorted(lines_per_step.items())),
        "long_functions": long_functions,
        "many_parameters": many_parameters,
        "private_reads": private_reads,
        "readme_lines": len((package.parent / "README.md").read_text().splitlines()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--list", action="store_true", help="name each long function and private read")
    args = parser.parse_args(argv)
    m = measure()
    if args.json:
        json.dump(m, sys.stdout, indent=2)
        print()
        return 0
    print(f"modules: {m['modules']}, lines: {m['lines']}, README.md lines: {m['readme_lines']}")
    print("lines per step: " + ", ".join(f"{k} {v}" for k, v in m["lines_per_step"].items()))
    for key, title in (
        ("long_functions", f"functions over {LONG_FUNCTION} lines"),
        ("many_parameters", f"functions with {MANY_PARAMETERS}+ parameters"),
        ("private_reads", "private names read across modules"),
    ):
        print(f"{title}: {len(m[key])}")
        if args.list:
            for row in m[key]:
                print(f"  {row}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
