"""The floor of the default run at scale (`python -m benchmarks.check_floor`) cannot rot between its
long runs: it runs end to end on a tiny model, and every variant, its own run's seconds and the
floor sums must be there. No timing is asserted."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from benchmarks.check_floor import RUNS, VARIANTS, floors

from conftest import ROOT


def test_the_floor_spreads_the_checks_cpu_over_the_cores():
    cpu = dict(zip(VARIANTS, (4.0, 30.0, 10.0, 12.0, 3.0, 50.0)))
    runs = {k: [{"wall_s": w, "run_cpu_s": cpu[k]}] for k, w in zip(VARIANTS, (10.0, 20.0, 6.0, 7.0, 2.0, 40.0))}
    found = floors(runs, cores=2)
    assert found["fold, then onnxruntime"] == [pytest.approx(3.1)]  # the fold's 20 s, then (10 + 12) / 2, over 10
    assert found["default run's CPU"] == [pytest.approx(2.5)]  # 50 / 2 over 10
    assert found["one pass"] == [pytest.approx(1.6)]  # (4 + 10 + 12 + 2 x 3) / 2 over 10: the fold's twin is the original's
    assert floors(runs, cores=64)["one pass"] == [pytest.approx(1.0)]  # never under the copy


def test_the_benchmark_writes_every_variant_and_the_floor(tmp_path):
    out = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.check_floor", "--hidden", "32", "--layers", "2", "--reps", "1",
         "--wait-quiet", "0", "--dir", str(tmp_path / "models"), "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((out / "check_floor.json").read_text())
    assert sorted(results["runs"]) == sorted(VARIANTS)
    for variant, (run,) in results["runs"].items():
        assert run["rc"] == 0 and run["wall_s"] > 0
        # a check's run is timed by itself, inside its process; the others are the whole process
        if variant in RUNS:
            assert 0 < run["run_s"] < run["wall_s"] and 0 < run["run_cpu_s"] < run["cpu_s"]
        else:
            assert (run["run_s"], run["run_cpu_s"]) == (run["wall_s"], run["cpu_s"])
    assert sorted(results["floors"]) == ["default run's CPU", "fold, then onnxruntime", "one pass"]
    assert all(len(v) == 1 and v[0] > 0 for v in results["floors"].values()) and results["floors"]["one pass"][0] >= 1
    text = (out / "CHECK_FLOOR.md").read_text()
    assert all(f"| {v} |" in text for v in VARIANTS) and "| fold, then onnxruntime |" in text
    assert "verified (in float64" in results["runs"]["default"][0]["summary"]
    assert not list((tmp_path / "models").glob("floor_out.onnx*"))  # the fold's output is not left behind
