"""docs/DESIGN.md section 8 ("Where to add") against the tree: every file it names exists, each
kind of change's count is the range of its lists, and the tables it says a new form, target op,
option, cost kind or judgment goes into hold every one there is."""

import ast
import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import pytest

import onnx_lnfold

from conftest import ROOT

PACKAGE = Path(onnx_lnfold.__file__).parent  # the installed package where CI tests the wheel
SECTION = (ROOT / "docs" / "DESIGN.md").read_text().split("## 8. Where to add", 1)[1].split("\n## ", 1)[0]

# The kinds of change the section must cover (issue: form, carry op, producer, target op, cost
# kind, judgment, report field, option).
REQUIRED = {
    "A new carry op",
    "A new producer kind",
    "A new LN form",
    "A new target op",
    "A new cost kind",
    "A new verification judgment",
    "A new report field",
    "A new fold option",
    "A new check option",
}


def _kinds() -> dict[str, dict]:
    """Each `- **A new ...**, N(-M) file(s).` bullet: its range and its sub-bullets' text by label."""
    kinds = {}
    for block in re.split(r"\n(?=- \*\*)", SECTION)[1:]:
        head = re.match(r"- \*\*(.+?)\*\*.*?, (\d+)(?:-(\d+))? files?\.", block, re.S)
        assert head, f"a bullet without its count: {block[:80]!r}"
        lists = {}
        for item in re.split(r"\n  - ", block)[1:]:
            label, _, text = item.partition(":")
            lists[label.strip()] = " ".join(text.split())
        low = int(head.group(2))
        kinds[head.group(1)] = {"range": (low, int(head.group(3) or low)), **lists}
    return kinds


KINDS = _kinds()
_PATH = re.compile(r"`([\w./-]+?(?:/|\.py|\.md|\.json))`")


def _paths(text: str) -> list[str]:
    return _PATH.findall(text)


def _resolve(path: str) -> Path:
    """A path inside the package is given from onnx_lnfold/, any other from the repository's root."""
    for base in (ROOT, PACKAGE, PACKAGE.parent):  # PACKAGE.parent: `onnx_lnfold/` itself, installed
        if (base / path).exists():
            return base / path
    return PACKAGE / path


def _items(text: str) -> list[str]:
    """The files a list names: one per semicolon-separated item that names a path."""
    return [item for item in text.split("; ") if _paths(item)]


def test_the_section_covers_every_kind_of_change():
    assert REQUIRED <= set(KINDS), sorted(REQUIRED - set(KINDS))
    assert all("Always" in lists for lists in KINDS.values()), [k for k, v in KINDS.items() if "Always" not in v]


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_each_count_is_its_lists_range(kind):
    """`N-M files`: N items always, M - N more where they apply."""
    lists = KINDS[kind]
    always, where = len(_items(lists["Always"])), len(_items(lists.get("Where it applies", "")))
    assert lists["range"] == (always, always + where), (always, where)


def test_every_path_the_section_names_exists():
    named = set(_paths(SECTION))
    assert len(named) >= 30  # the parse found the lists (a broken pattern finds none)
    assert not [path for path in sorted(named) if not _resolve(path).exists()]


def _assigned(path: str) -> set[str]:
    """The names a module assigns at its top level."""
    tree = ast.parse(_resolve(path).read_text())
    names = set()
    for node in tree.body:
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


@pytest.mark.parametrize(
    "path, table",
    [
        ("carry/rules.py", "RULES"),
        ("forms/__init__.py", "FORMS"),
        ("core/ops.py", "TARGETS"),
        ("decide/emission.py", "EMITTERS"),
        ("decide/costs.py", "KINDS"),
        ("decide/costs.py", "LAYOUT_KINDS"),
        ("decide/costs.py", "LAYOUT_FALLBACK"),
        ("benchmarks/emission_costs.py", "KINDS"),
        ("benchmarks/emission_costs.py", "LAYOUT_KINDS"),
        ("bench/calibrate.py", "CHAIN_OF"),
        ("verify/judges/__init__.py", "LADDER"),
        ("verify/verdict.py", "Judgment"),
        ("verify/verdict.py", "JUDGMENT_WORDS"),
        ("core/options.py", "OPTIONS"),
        ("core/blocked.py", "CODES"),
        ("report/kept.py", "HEADINGS"),
    ],
)
def test_each_table_is_in_the_file_the_section_names(path, table):
    # In the same item: the path, then the table before the next semicolon or bullet.
    assert re.search(rf"`{re.escape(path)}`(?:(?!\n  - |\n- )[^;])*?`{table}`", SECTION), (
        f"the section names {table} elsewhere"
    )
    assert table in _assigned(path)


def test_every_form_class_is_in_forms():
    """A form class left out of `FORMS` would recognize nothing."""
    from onnx_lnfold import forms
    from onnx_lnfold.forms import FORMS, LnForm

    classes = set()
    for info in pkgutil.iter_modules(forms.__path__):
        module = importlib.import_module(f"onnx_lnfold.forms.{info.name}")
        classes |= {
            c
            for _, c in inspect.getmembers(module, inspect.isclass)
            if issubclass(c, LnForm) and c is not LnForm and c.__module__ == module.__name__
        }
    assert len(classes) >= 6
    assert classes <= {type(form) for form in FORMS}, sorted(c.__name__ for c in classes - {type(f) for f in FORMS})


def test_every_target_has_its_ops_in_emit():
    """Each `--target` emits ops `decide/emission.py` `EMITTERS` writes down, and the options offer it."""
    from onnx_lnfold.core import ops
    from onnx_lnfold.core.options import TARGETS
    from onnx_lnfold.decide.emission import EMITTERS

    for target in ops.TARGETS:
        emitted = [op.qualified for op in ops.NORM_OPS if op.target == target.name]
        if target.name == ops.PRIMITIVE_TARGET:
            emitted.append(ops.PRIMITIVE_RMS)
        assert emitted and set(emitted) <= set(EMITTERS), target.name
    assert set(TARGETS) == {t.name for t in ops.TARGETS}
    assert len(EMITTERS) == len({op.qualified for op in ops.NORM_OPS if op.target}) + 1  # + the primitive spelling


def test_every_option_is_in_the_options_table():
    from onnx_lnfold.core.options import FOLD_OPTIONS, OPTION_NAMES

    assert sorted(option.name for option in FOLD_OPTIONS) == sorted(OPTION_NAMES)


def test_every_cost_kind_is_in_each_of_its_tables():
    """A kind the rule prices is measured by the built-in table's benchmark and by `calibrate`."""
    from benchmarks import emission_costs
    from onnx_lnfold.bench.calibrate import CHAIN_OF
    from onnx_lnfold.decide.costs import KINDS, LAYOUT_FALLBACK, LAYOUT_KINDS, builtin_table

    assert set(KINDS) == set(emission_costs.KINDS)
    assert set(LAYOUT_KINDS) == set(emission_costs.LAYOUT_KINDS) == set(LAYOUT_FALLBACK)
    assert set(KINDS) | set(LAYOUT_KINDS) == set(CHAIN_OF)
    assert set(KINDS) | set(LAYOUT_KINDS) <= set(builtin_table().to_dict()["costs"])


def test_every_judge_is_on_the_ladder_and_every_judgment_has_its_words():
    from typing import get_args

    from onnx_lnfold.verify import judges, verdict

    modules = [info.name for info in pkgutil.iter_modules(judges.__path__)]
    judging = [importlib.import_module(f"onnx_lnfold.verify.judges.{name}") for name in modules]
    judging = [m for m in judging if hasattr(m, "judge")]
    assert len(judging) >= 2
    assert {m.judge for m in judging} == set(judges.LADDER)
    assert set(get_args(verdict.Judgment)) == set(verdict.JUDGMENT_WORDS)
