"""What the docs, docstrings and comments name exists, so a rename leaves no reference behind:

- a module, and a name in it after the module: `onnx_lnfold.verify.readback`, or relative to the
  package (`verify.readback`, `_pipeline.prepare`) or, in a module of the package, to its own
  folder (`synthesize.kv_cache` in `feeds`); `benchmarks.mutation`;
- a file or folder of the checkout: `docs/DESIGN.md`, `benchmarks/results/...`, `tools/x.py`,
  `onnx_lnfold/decide/tables/`, `tests/x/test_y.py::test_name`.

Read: the package's, the benchmarks' and the tools' docstrings and comments, README.md and
docs/*.md. Not read as references: URLs, a step's name before a file suffix (`report.json`),
one-letter placeholders (`onnx_lnfold.x`), the model metadata keys the fold writes. A step's name
means the module in prose, never a variable of that name.

A private name in backticks in the package (`_decoder_steps`) is one its code has: private names
are the package's own. docs/COMMAND_LINE.md's options table is what its generator makes now.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import io
import re
import subprocess
import sys
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest

import onnx_lnfold
from onnx_lnfold.analysis.plan import CenteringPlan
from onnx_lnfold.core.options import FoldOptions
from onnx_lnfold.save.provenance import provenance
from onnx_lnfold.verify.verdict import Verification

from conftest import ROOT

# The package's sources: the installed ones where CI tests the wheel (the checkout's otherwise).
PACKAGE = Path(onnx_lnfold.__file__).resolve().parent


def _in_tree(path: Path) -> Path:
    """`path` as the tree names it: from the package's parent for its modules, else from the root."""
    return path.relative_to(PACKAGE.parent if PACKAGE in path.parents else ROOT)


def _tree_path(name: str) -> Path:
    """The file a reference `onnx_lnfold/x.py` or `docs/X.md` names."""
    return PACKAGE.parent / name if name == "onnx_lnfold" or name.startswith("onnx_lnfold/") else ROOT / name

# References that name nothing, in files being rewritten elsewhere: file -> names. An entry goes
# when its file is fixed (the test fails on one that resolves): this table must shrink to empty.
KNOWN_DANGLING: dict[str, set[str]] = {}  # none: a reference that names nothing is fixed, not listed

# The package's folders (its steps and tool packages) and its drivers, which name modules
# relative to the package: `verify.readback`, `_pipeline.prepare`.
PACKAGE_ROOTS = sorted(
    {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    | {p.stem for p in PACKAGE.glob("_*.py") if p.stem != "__init__"}
)
# A step's name before one of these is a file's name (`report.json`), not a module.
FILE_SUFFIXES = {"csv", "data", "html", "json", "md", "npy", "npz", "onnx", "png", "py", "toml", "txt", "yaml"}
# Names that look like module paths and are not: the model metadata keys the fold writes.
METADATA_KEYS = set(
    provenance(SimpleNamespace(plan=CenteringPlan([], []), verification=Verification("skipped")), FoldOptions())
)
# Folders a command makes rather than the checkout holds: .gitignore's folders under the root.
MADE = [
    line.strip("/")
    for line in ((ROOT / ".gitignore").read_text() if (ROOT / ".gitignore").is_file() else "").splitlines()
    if line.startswith("/") and line.endswith("/")
]

URL = re.compile(r"\b[a-z][a-z+.-]*://\S+")
PATH = re.compile(r"(?<![\w./-])((?:docs|benchmarks|tools|tests|onnx_lnfold)/(?:\w[\w.-]*/?)*)(?:::(\w+))?")
# A path followed by a placeholder or a glob (`results/<model>.json`, `cpu_run*.json`): its folder is checked.
PATTERN_CHARS = "<*?[{"


def _dotted(roots: list[str]) -> re.Pattern:
    return re.compile(rf"(?<![\w./-])(?:{'|'.join(roots)})(?:\.\w+)+")


PACKAGE_DOTTED = _dotted(["onnx_lnfold"])
RELATIVE_DOTTED = _dotted(PACKAGE_ROOTS)
BENCHMARKS_DOTTED = _dotted(["benchmarks"])


@dataclass(frozen=True)
class Reference:
    file: str  # relative to the checkout
    line: int
    name: str  # as written
    kind: str  # "path", "module" or "benchmarks"
    targets: tuple[str, ...] = ()  # a module reference: the full dotted names it may stand for
    # `plan.edits` in a module beside analysis/plan.py: also an attribute of a class that module
    # defines (the variable named as its module), as (module, attribute).
    instance_of: tuple[str, str] | None = None


def _python_texts(path: Path) -> Iterator[tuple[int, str]]:
    """(line, text) of each docstring and comment of a Python file."""
    source = path.read_text()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                for i, line in enumerate(first.value.value.splitlines()):
                    yield first.lineno + i, line
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string


def _imported_names(path: Path) -> dict[str, str]:
    """The names a Python file binds by import (`ir` -> `onnx_ir`): a name of a step or of a
    module beside it means what the file imported under it."""
    names = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update({a.asname: a.name for a in node.names if a.asname})
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names})
    return names


def _own_folder(path: Path) -> tuple[str, re.Pattern] | None:
    """For a module in a folder of the package: that folder's dotted name, and its modules' names."""
    folder = path.parent
    if folder == PACKAGE or PACKAGE not in path.parents:
        return None
    names = [p.stem for p in folder.glob("*.py") if p.stem != "__init__"]
    names += [p.parent.name for p in folder.glob("*/__init__.py")]
    return ".".join(_in_tree(folder).parts), _dotted(sorted(names))


def _sources() -> Iterator[tuple[Path, Iterator[tuple[int, str]]]]:
    for path in [
        *sorted(PACKAGE.rglob("*.py")),
        *sorted((ROOT / "benchmarks").rglob("*.py")),
        *sorted((ROOT / "tools").glob("*.py")),
    ]:
        yield path, _python_texts(path)
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        yield path, enumerate(path.read_text().splitlines(), 1)


def _placeholder(name: str) -> bool:
    parts = name.split(".")
    return parts[-1] in FILE_SUFFIXES or any(len(part) == 1 for part in parts) or name in METADATA_KEYS


def references() -> list[Reference]:
    found = []
    for path, texts in _sources():
        file = _in_tree(path).as_posix()
        own = _own_folder(path)
        imported = _imported_names(path) if path.suffix == ".py" else {}
        for line, text in texts:
            text = URL.sub(" ", text)
            for m in PATH.finditer(text):
                name = m.group(1).rstrip(".-") + (f"::{m.group(2)}" if m.group(2) else "")
                if text[m.end() : m.end() + 1] in tuple(PATTERN_CHARS):
                    name = name.rsplit("/", 1)[0] + "/"
                found.append(Reference(file, line, name, "path"))
            modules: dict[int, tuple[str, set[str]]] = {}  # start -> (name, targets)
            for m in PACKAGE_DOTTED.finditer(text):
                modules[m.start()] = (m.group(0), {m.group(0)})
            for m in RELATIVE_DOTTED.finditer(text):
                modules.setdefault(m.start(), (m.group(0), set()))[1].add(f"onnx_lnfold.{m.group(0)}")
            instance_of = {}
            if own is not None:
                for m in own[1].finditer(text):
                    modules.setdefault(m.start(), (m.group(0), set()))[1].add(f"{own[0]}.{m.group(0)}")
                    module, _, rest = m.group(0).partition(".")
                    if "." not in rest:
                        instance_of[m.start()] = (f"{own[0]}.{module}", rest)
            for start, (name, targets) in modules.items():
                first, _, rest = name.partition(".")
                if first in imported:
                    targets.add(f"{imported[first]}.{rest}")
                if not _placeholder(name):
                    found.append(Reference(file, line, name, "module", tuple(sorted(targets)), instance_of.get(start)))
            for m in BENCHMARKS_DOTTED.finditer(text):
                if not _placeholder(m.group(0)):
                    found.append(Reference(file, line, m.group(0), "benchmarks"))
    return found


def _defines(file: Path, name: str) -> bool:
    """Whether a Python file defines `name` at its top level (read, not imported)."""
    for node in ast.parse(file.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return True
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return True
    return False


def _path_exists(name: str) -> bool:
    path, _, test = name.partition("::")
    if any(path == made or path.startswith(made + "/") for made in MADE):
        return True
    target = _tree_path(path)
    if not target.exists():
        # `tests/hostile_models.identity_chain`: a module's file and a name it defines
        module, _, attr = path.rpartition(".")
        return bool(module) and _tree_path(f"{module}.py").is_file() and _defines(_tree_path(f"{module}.py"), attr)
    if test:
        return re.search(rf"^\s*(?:async )?def {test}\b|^class {test}\b", target.read_text(), re.M) is not None
    return True


_INSTANCE = object()  # an attribute of instances (a dataclass field, `self.x = ...`): what follows it is not checked
_MISSING = object()


def _attribute(obj: object, name: str) -> object:
    if hasattr(obj, name):
        return getattr(obj, name)
    if isinstance(obj, type):
        if (is_dataclass(obj) and name in {f.name for f in fields(obj)}) or name in getattr(obj, "__annotations__", {}):
            return _INSTANCE
        try:
            if re.search(rf"\bself\.{name}\b", inspect.getsource(obj)):
                return _INSTANCE
        except (OSError, TypeError):
            pass
    return _MISSING


def _module_resolves(dotted: str) -> bool:
    """Some prefix of `dotted` is a module and the rest names attributes in it."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        module = ".".join(parts[:n])
        try:
            obj = importlib.import_module(module)
        except ImportError as e:
            if e.name and (module == e.name or module.startswith(e.name + ".")):
                continue  # no such module: a shorter prefix may be one
            return True  # the module is there; an optional dependency of it is not installed
        for attr in parts[n:]:
            obj = _attribute(obj, attr)
            if obj is _MISSING:
                return False
            if obj is _INSTANCE:
                return True
        return True
    return False


def _benchmarks_resolves(dotted: str) -> bool:
    """`benchmarks.x[.name]`: a module of the benchmarks folder and a name it defines (read, not
    imported: benchmarks import what they measure)."""
    parts = dotted.split(".")
    for n in range(len(parts), 1, -1):
        path = ROOT.joinpath(*parts[:n])
        file = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        if file.is_file():
            return n == len(parts) or _defines(file, parts[n])
    return False


def resolves(ref: Reference) -> bool:
    if ref.kind == "path":
        return _path_exists(ref.name)
    if ref.kind == "benchmarks":
        return _benchmarks_resolves(ref.name)
    if any(_module_resolves(target) for target in ref.targets):
        return True
    if ref.instance_of is None:
        return False
    module, attr = ref.instance_of
    classes = [
        c for c in vars(importlib.import_module(module)).values() if isinstance(c, type) and c.__module__ == module
    ]
    return any(_attribute(c, attr) is not _MISSING for c in classes)


REFERENCES = references()


def test_the_scan_reads_every_kind_of_reference():
    kinds = {(ref.kind, ref.name.split("/", 1)[0] if ref.kind == "path" else "") for ref in REFERENCES}
    assert {("path", root) for root in ("docs", "benchmarks", "tools", "tests", "onnx_lnfold")} <= kinds
    assert ("module", "") in kinds and ("benchmarks", "") in kinds
    relative = [ref for ref in REFERENCES if ref.kind == "module" and not ref.name.startswith("onnx_lnfold.")]
    assert len(relative) > 100 and len(REFERENCES) > 700
    assert not [p for p in PACKAGE.rglob("*.py") if len(p.stem) == 1]  # one letter is a placeholder, never a module


@pytest.mark.parametrize(
    "name, targets",
    [
        ("verify.no_such_module", ("onnx_lnfold.verify.no_such_module",)),
        ("onnx_lnfold.core.options.NO_SUCH_NAME", ("onnx_lnfold.core.options.NO_SUCH_NAME",)),
        ("plan.CenteringPlan.no_such", ("onnx_lnfold.analysis.plan.CenteringPlan.no_such",)),
    ],
)
def test_a_module_name_that_resolves_to_nothing_is_dangling(name, targets):
    assert not resolves(Reference("probe", 1, name, "module", targets))
    assert resolves(Reference("probe", 1, name, "module", tuple(t.rsplit(".", 1)[0] for t in targets)))


@pytest.mark.parametrize(
    "name", ["docs/NO_SUCH.md", "tests/report/test_report.py::no_such_test", "benchmarks/no_such/"]
)
def test_a_path_that_names_nothing_is_dangling(name):
    assert not resolves(Reference("probe", 1, name, "path"))


def test_every_reference_names_something_that_exists():
    dangling: dict[str, dict[str, int]] = {}  # file -> name -> first line
    for ref in REFERENCES:
        if not resolves(ref):
            dangling.setdefault(ref.file, {}).setdefault(ref.name, ref.line)
    unexpected = [
        f"{file}:{line}: {name}"
        for file, names in sorted(dangling.items())
        for name, line in sorted(names.items())
        if name not in KNOWN_DANGLING.get(file, set())
    ]
    assert not unexpected
    fixed = [
        f"{file}: {name}"
        for file, names in KNOWN_DANGLING.items()
        for name in sorted(names - set(dangling.get(file, {})))
    ]
    assert not fixed, "resolved now: remove from KNOWN_DANGLING"


def _code_names() -> set[str]:
    """Every name the package's code spells (not its comments or strings)."""
    names = set()
    for path in PACKAGE.rglob("*.py"):
        tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
        names |= {token.string for token in tokens if token.type == tokenize.NAME}
    return names


def test_the_private_names_the_package_names_exist():
    """`_decoder_steps` in a docstring or comment of the package is a name its code has."""
    named = [
        (_in_tree(path).as_posix(), line, m.group(1))
        for path in sorted(PACKAGE.rglob("*.py"))
        for line, text in _python_texts(path)
        for m in re.finditer(r"`(?:\w+\.)*(_\w+)(?:\(\))?`", text)
    ]
    assert len(named) > 30
    code = _code_names()
    missing = [
        f"{file}:{line}: {name}"
        for file, line, name in named
        if name not in code and name not in KNOWN_DANGLING.get(file, set())
    ]
    assert not missing


def test_the_options_table_is_what_its_generator_makes():
    """docs/COMMAND_LINE.md's options table is made from `core.options.OPTIONS` by
    tools/gen_options_doc.py, which says so (exit 0) where the doc holds what it makes now."""
    check = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gen_options_doc.py"), "--check"], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr
