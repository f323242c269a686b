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


def test_the_floor_is_the_copy_and_the_checks_runs_over_the_copy():
    runs = {k: [{"run_s": s}, {"run_s": 2 * s}] for k, s in zip(VARIANTS, (10.0, 20.0, 5.0, 6.0, 2.0))}
    found = floors(runs)
    assert found["onnxruntime"] == [pytest.approx(2.1), pytest.approx(2.1)]  # (10 + 5 + 6) / 10
    assert found["with twins"] == [pytest.approx(2.5), pytest.approx(2.5)]  # the fold's twin costs the original's


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
        assert (0 < run["run_s"] < run["wall_s"]) if variant in RUNS else run["run_s"] == run["wall_s"]
    assert all(len(v) == 1 and v[0] > 1 for v in results["floors"].values())
    text = (out / "CHECK_FLOOR.md").read_text()
    assert all(f"| {v} |" in text for v in VARIANTS) and "two float64 twins" in text
    assert not list((tmp_path / "models").glob("floor_out.onnx*"))  # the fold's output is not left behind
