"""The GPU host's cost table and bench part (benchmarks/cuda/costs.py), rehearsed with `--smoke` on the
CPU EP: a table, its comparisons against the built-in one, and `onnx-lnfold bench` of GPT-2 folded by
it; CPU figures never land in the CUDA results."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import ROOT

_ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "LNFOLD_TRAINED_DIR": "/nonexistent"}  # GPT-2 only: the real models take minutes


def test_smoke_writes_a_table_and_benches_the_fold_by_it(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "benchmarks.cuda.costs", "--smoke", "--out", str(tmp_path)],
                          capture_output=True, text=True, cwd=ROOT, env=_ENV)
    assert proc.returncode == 0, proc.stderr
    table = json.loads((tmp_path / "cpu_smoke_costs.json").read_text())
    assert table["provider"] == "CPUExecutionProvider" and table["unit"] == "us"
    costs = (tmp_path / "COSTS.md").read_text()
    assert "SMOKE: CPU EP at toy sizes, not CUDA" in costs and "LN -> SLN + beta Add" in costs
    bench = (tmp_path / "BENCH.md").read_text()
    assert "## gpt2" in bench and "verdict: " in bench and "re-saved / folded" in bench
    result = json.loads((tmp_path / "bench.json").read_text())["results"][0]
    assert result["provider"] == "CPUExecutionProvider" and result["processes"] == 3


def test_smoke_figures_are_not_written_to_the_cuda_results():
    out = ROOT / "benchmarks" / "results" / "cuda" / "costs"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.cuda.costs", "--smoke", "--out", str(out)],
                          capture_output=True, text=True, cwd=ROOT, env=_ENV)
    assert proc.returncode == 2 and "not written under" in proc.stderr and not out.exists()


def test_the_gpu_host_scripts_find_the_checkout():
    """Their ROOT is the checkout (they moved one folder down once, and found benchmarks/ instead: the
    wheels, the trained models and `python -m benchmarks...` then all missed)."""
    import re

    for script in ("prepare.sh", "run_on_host.sh"):
        path = ROOT / "benchmarks" / "cuda" / "gpu_host" / script
        line = next(ln for ln in path.read_text().splitlines() if ln.startswith("ROOT="))
        expr = re.match(r"ROOT=(\$\(.*\))", line.split("  #")[0]).group(1)
        out = subprocess.run(["bash", "-c", f"set -- ; echo {expr}", str(path)], capture_output=True, text=True)
        assert out.stdout.strip() == str(ROOT), script
