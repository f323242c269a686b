"""The README's commands and code run as written, so the docs cannot rot."""

import re
import shutil
import subprocess
import sys

import pytest

from conftest import MODELS, ROOT

README = (ROOT / "README.md").read_text()


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
    proc = subprocess.run([sys.executable, *args], cwd=workdir, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "LayerNorm nodes: 5 folded, 0 kept (of 5)" in proc.stdout
    assert "Verification (passed" in proc.stdout


@pytest.mark.parametrize("block", re.findall(r"```python\n(.*?)```", README, flags=re.S))
def test_readme_python_blocks(workdir, block, monkeypatch):
    monkeypatch.chdir(workdir)
    exec(compile(block, "README.md", "exec"), {})
