"""The tree reads as the pipeline (docs/DESIGN.md section 7): one folder per step, each saying what it
takes and gives, no step importing a later one, and nothing outside the package reaching into its
private names."""

import ast
import importlib
import importlib.util

import onnx_lnfold

from conftest import ROOT

_spec = importlib.util.spec_from_file_location("step_imports", ROOT / "tools" / "step_imports.py")
step_imports = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(step_imports)  # type: ignore[union-attr]

# The drivers on top of the steps, which tests and scripts may call into (DESIGN.md section 7).
DRIVERS = {"_api", "_pipeline", "_pass", "_cli"}


def test_no_step_imports_a_later_step():
    """Nor a tool package on top of the steps (`bench`): tools import steps, never the reverse."""
    matrix, later = step_imports.check(step_imports.package_dir())
    assert later == []
    assert sum(map(sum, (c.values() for c in matrix.values()))) > 0  # the check saw the imports


def test_the_steps_are_the_package_folders_and_each_says_what_it_takes_and_gives():
    """Every folder is a step of the pipeline or a tool package on top of it (`bench`), and says
    what it takes and gives."""
    root = step_imports.package_dir()
    folders = {p.parent.name for p in root.glob("*/__init__.py")}
    assert folders == set(step_imports.STEPS) | set(step_imports.TOOLS)
    assert not set(step_imports.STEPS) & set(step_imports.TOOLS)
    for step in step_imports.STEPS + step_imports.TOOLS:
        doc = importlib.import_module(f"onnx_lnfold.{step}").__doc__
        assert doc and len(doc.split()) >= 20, step


def test_no_two_modules_of_one_name():
    """A module's name says what it is once in the package: two `check.py`s (or `runner.py`s) in
    different steps send a reader to the wrong one."""
    root = step_imports.package_dir()
    by_name: dict[str, list[str]] = {}
    for path in root.rglob("*.py"):
        if path.name != "__init__.py":
            by_name.setdefault(path.name, []).append(str(path.relative_to(root)))
    assert len(by_name) > 50  # the check saw the package
    assert {name: paths for name, paths in by_name.items() if len(paths) > 1} == {}


def test_scripts_and_tests_import_no_private_name_of_the_package():
    found = []
    for folder in ("tests", "models", "benchmarks", "tools"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("onnx_lnfold"):
                    private = [a.name for a in node.names if a.name.startswith("_") and a.name not in DRIVERS]
                    found += [f"{path.relative_to(ROOT)}:{node.lineno}: {node.module}.{n}" for n in private]
    assert found == []
    assert onnx_lnfold.__all__  # the public face: what onnx_lnfold itself exports


def _string_constants(path) -> set[str]:
    """The string constants of a module that are not docstrings."""
    tree = ast.parse(path.read_text())
    docs = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
    }
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs}


def test_each_normalization_op_is_named_in_core_ops_alone():
    """docs/DESIGN.md section 8: a target op is the places that section names; every other module
    reads the op's name from `core.ops`."""
    from onnx_lnfold.core.ops import NORM_OPS

    names = {op.op_type for op in NORM_OPS} | {op.qualified for op in NORM_OPS}
    root = step_imports.package_dir()
    naming = {str(p.relative_to(root)) for p in root.rglob("*.py") if names & _string_constants(p)}
    assert naming == {"core/ops.py"}


def test_a_step_that_imports_the_tool_package_is_caught(tmp_path):
    """`bench` sits on top like the drivers: a step importing it is reported as one importing a
    later step is."""
    package = tmp_path / "onnx_lnfold"
    (package / "decide").mkdir(parents=True)
    (package / "decide" / "x.py").write_text("from onnx_lnfold.bench import tables\nfrom onnx_lnfold.core import ops\n")
    (package / "bench").mkdir()
    (package / "bench" / "y.py").write_text("from onnx_lnfold.report import fold_report\n")
    _, later = step_imports.check(package)
    assert later == ["onnx_lnfold/decide/x.py:1: decide imports bench, a tool on top of the steps"]
