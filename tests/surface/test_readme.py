"""The README's commands and code run as written, so the docs cannot rot."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import MODELS, ROOT

README = (ROOT / "README.md").read_text()
# The commands run in a scratch folder: import this checkout, not whatever copy is installed.
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def _fold_commands():
    """`$ ...` console lines that call the tool (install steps are CI's job, not the test's)."""
    cmds = []
    for line in re.findall(r"^\$ (.+)$", README, flags=re.M):
        for part in line.split("&&"):
            part = part.strip()
            if part.startswith("python -m onnx_lnfold"):
                cmds.append(part)
    return cmds


@pytest.fixture
def workdir(tmp_path):
    (tmp_path / "models").mkdir()
    shutil.copy(MODELS / "gpt2.onnx", tmp_path / "models" / "gpt2.onnx")
    return tmp_path


def test_readme_has_the_two_quick_start_commands():
    lines = re.findall(r"^\$ (.+)$", README, flags=re.M)
    assert any("python -m onnx_lnfold models/" in line for line in lines)
    assert any("python -m pytest" in line for line in lines)


@pytest.mark.parametrize("command", _fold_commands())
def test_readme_fold_command(workdir, command):
    args = command.split()[1:]
    proc = subprocess.run([sys.executable, *args], cwd=workdir, capture_output=True, text=True, env=ENV)
    assert proc.returncode == 0, proc.stderr
    assert "LayerNorm nodes: 5 folded, 0 kept (of 5)" in proc.stdout
    assert "Verification (passed" in proc.stdout


DOCS = {path.relative_to(ROOT).as_posix(): path.read_text() for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]}
# Every Python recipe of the README and docs/, as written (a `py` block needs what the suite does not
# install: Olive, say).
RECIPES = [(name, block) for name, text in DOCS.items() for block in re.findall(r"```python\n(.*?)```", text, flags=re.S)]


@pytest.mark.parametrize("name, block", RECIPES, ids=[f"{name}-{i}" for i, (name, _) in enumerate(RECIPES)])
def test_documented_python_recipes_run_as_written(workdir, name, block, monkeypatch):
    monkeypatch.chdir(workdir)
    exec(compile(block, name, "exec"), {})


def _elapsed_masked(line: str) -> str:
    return re.sub(r", \d+\.\d s$", ", <elapsed> s", line)


def _as_text(lines: list[str]) -> str:
    """The lines as one run of words, each float-noise figure (4.03e-07) kept to its order of
    magnitude: ONNX Runtime's float32 rounding and numpy's float64 sums differ by CPU (and the
    report's line breaks with the width of a figure), the rest of the report does not."""
    text = " ".join(" ".join(_elapsed_masked(line) for line in lines).split())
    return re.sub(r"\b\d(?:\.\d+)?e-(\d+)\b", r"<1e-\1>", text)


def test_readme_quick_start_output_is_what_the_command_prints(workdir):
    """The output block after the quick start is the fold's output today: each run of lines
    between `...` marks appears, in order, in what the command prints (the elapsed time aside, the
    noise figures to their order of magnitude)."""
    block = re.search(r"The fold prints this.*?```\n(.*?)```", README, flags=re.S).group(1)
    command = next(c for c in _fold_commands() if "models/gpt2.onnx" in c)
    proc = subprocess.run([sys.executable, *command.split()[1:]], cwd=workdir, capture_output=True, text=True, env=ENV)
    printed = proc.stdout.splitlines()
    chunks = [chunk.strip("\n").splitlines() for chunk in block.split("  ...\n")]
    assert len(chunks) >= 2 and chunks[0][0].startswith("onnx_lnfold: models/gpt2.onnx -> gpt2.lnfold.onnx, 5/5")
    whole, at = _as_text(printed), 0
    for chunk in chunks:
        text = _as_text(chunk)
        found = whole.find(text, at)
        assert found >= 0, f"README lines not printed (in this order) by `{command}`:\n" + "\n".join(chunk)
        at = found + len(text)
    assert _elapsed_masked(chunks[0][0]) == _elapsed_masked(printed[0]) and chunks[-1][-1] == printed[-1]


def test_readme_mentions_the_command_the_version_and_a_venv():
    assert "onnx-lnfold" in README and "--version" in README
    lines = re.findall(r"^\$ (.+)$", README, flags=re.M)
    venv = next(i for i, line in enumerate(lines) if "-m venv" in line)
    assert venv < next(i for i, line in enumerate(lines) if "pip install" in line)


def test_readme_is_a_newcomers_page():
    """At most 300 lines: the detail lives in docs/, linked from it."""
    assert len(README.splitlines()) <= 300
    for doc in re.findall(r"\]\((docs/[\w.]+\.md)", README):
        assert (ROOT / doc).is_file(), doc


def test_the_command_line_doc_lists_every_option():
    from onnx_lnfold._cli import build_parser

    doc = (ROOT / "docs" / "COMMAND_LINE.md").read_text()
    for action in build_parser("onnx-lnfold")._actions:
        if action.option_strings and action.dest != "help":
            assert f"`{action.option_strings[-1]}" in doc or f", {action.option_strings[-1]}" in doc, action.option_strings


def _fold_summary():
    import importlib.util

    spec = importlib.util.spec_from_file_location("fold_summary", ROOT / "tools" / "fold_summary.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_the_what_folds_table_is_a_run_of_fold_summary():
    """The README's table of what folds is today's default plan of every committed model."""
    summary = _fold_summary()
    assert summary.readme_block(README) == summary.markdown(summary.committed_models())


@pytest.mark.slow
def test_the_trained_models_table_is_a_run_of_fold_summary():
    summary = _fold_summary()
    folder = Path(os.environ.get("LNFOLD_TRAINED_DIR") or ROOT / "models" / "trained")
    if not (folder / "MANIFEST.json").is_file():
        pytest.skip(f"no trained models in {folder}: run `python models/make/fetch_trained_models.py`")
    paths = summary.trained_models(folder)
    manifest = json.loads((folder / "MANIFEST.json").read_text())["models"]
    if len(paths) < len(manifest):
        pytest.skip(f"{len(manifest) - len(paths)} trained model(s) missing in {folder}")
    assert summary.readme_block(README, "trained") == summary.markdown(paths)

