"""Figures a maintainer reads the structure by: modules and lines per step, long functions, long
parameter lists, and private names read across modules.

    python tools/structure_metrics.py            # the table
    python tools/structure_metrics.py --json     # the same as JSON
    python tools/structure_metrics.py --list     # also name every long function and private read

A private read across modules is one module reaching into another's private names: `obj._name`
(not `self._name` or `cls._name`) where another module of the package defines `_name` and the
reading module defines none, or `from onnx_lnfold.x import _name` of a name that is not a module
(the drivers `_pipeline`, `_api`, ... are private modules the package composes). `obj._name` of
a name no module of the package defines reaches into another library (onnxruntime's symbolic
shape inference, driven step by step): counted apart. tests/surface/test_private_names.py runs
`private_reads` and fails on any read across modules.
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


def _private_modules(package: Path) -> set[str]:
    """The dotted names of the package's modules and folders whose own name is private."""
    out = set()
    for path in package.rglob("*"):
        rel = path.relative_to(package.parent)
        name = rel.stem if path.suffix == ".py" else rel.name if path.is_dir() else None
        if name and name.startswith("_") and not name.startswith("__"):
            out.add(".".join((*rel.parts[:-1], name)))
    return out


def private_reads(package: Path = PACKAGE) -> tuple[list[str], list[str]]:
    """(private names one module of `package` reads of another, private names of other libraries
    it reads), each as `module.py:line .name`."""
    trees = {path: ast.parse(path.read_text(), str(path)) for path in sorted(package.rglob("*.py"))}
    own = {path: _defined_private_names(tree) for path, tree in trees.items()}
    defined_anywhere = set().union(*own.values()) if own else set()
    modules = _private_modules(package)
    across: list[str] = []
    foreign: list[str] = []
    for path, tree in trees.items():
        rel = path.relative_to(package)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == package.name:
                for alias in node.names:
                    private = alias.name.startswith("_") and not alias.name.startswith("__")
                    if private and f"{node.module}.{alias.name}" not in modules:
                        across.append(f"{rel}:{node.lineno} {node.module}.{alias.name}")
            elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                base = node.value
                if isinstance(base, ast.Name) and base.id in ("self", "cls"):
                    continue
                if node.attr in own[path] or any(m.endswith(f".{node.attr}") for m in modules):
                    continue
                (across if node.attr in defined_anywhere else foreign).append(f"{rel}:{node.lineno} .{node.attr}")
    return across, foreign


def measure(package: Path = PACKAGE) -> dict:
    lines_per_step: Counter[str] = Counter()
    modules = 0
    long_functions: list[str] = []
    many_parameters: list[str] = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package)
        text = path.read_text()
        tree = ast.parse(text, str(path))
        modules += 1
        step = rel.parts[0] if len(rel.parts) > 1 else "(drivers)"
        lines_per_step[step] += len(text.splitlines())
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > LONG_FUNCTION:
                    long_functions.append(f"{rel}:{node.lineno} {node.name} ({length} lines)")
                if _parameters(node) >= MANY_PARAMETERS:
                    many_parameters.append(f"{rel}:{node.lineno} {node.name} ({_parameters(node)} parameters)")
    across, foreign = private_reads(package)
    return {
        "modules": modules,
        "lines": sum(lines_per_step.values()),
        "lines_per_step": dict(sorted(lines_per_step.items())),
        "long_functions": long_functions,
        "many_parameters": many_parameters,
        "private_reads": across,
        "foreign_private_reads": foreign,
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
        ("foreign_private_reads", "private names of other libraries read"),
    ):
        print(f"{title}: {len(m[key])}")
        if args.list:
            for row in m[key]:
                print(f"  {row}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
