"""The node-count benchmark (`python -m benchmarks.node_count`) cannot rot between its long runs: its
arithmetic on made-up runs, and an end-to-end run on chains of 50 and 100 nodes. No timing is asserted."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from benchmarks.node_count import summarize, table

from conftest import ROOT


def test_the_figures_of_one_size():
    folds = [
        {"rc": 0, "wall_s": 20.0, "cpu_s": 18.0, "peak_gb": 1.0},
        {"rc": 0, "wall_s": 30.0, "cpu_s": 19.0, "peak_gb": 1.5},
        {"rc": 0, "wall_s": 25.0, "cpu_s": 20.0, "peak_gb": 2.0},
        {"rc": 1, "wall_s": 1.0, "cpu_s": 1.0, "peak_gb": 0.1},  # a failed run is counted, not measured
    ]
    sessions = {
        "ort_session_s": [{"rc": 0, "session_s": 3.0}, {"rc": 0, "session_s": 5.0}, {"rc": 1, "session_s": float("nan")}],
        "ort_session_off_s": [{"rc": 0, "session_s": 9.0}, {"rc": 0, "session_s": 11.0}],
    }
    s = summarize(50_000, folds, sessions)
    assert (s["runs"], s["failed"]) == (4, 1)
    assert s["wall_s"] == {"min": 20.0, "median": 25.0, "max": 30.0}
    assert s["s_per_1000_nodes"] == pytest.approx({"min": 0.4, "median": 0.5, "max": 0.6})
    assert s["peak_gb"]["median"] == 1.5 and s["cpu_s"]["max"] == 20.0
    assert s["ort_session_s"] == {"min": 3.0, "median": 4.0, "max": 5.0}
    assert s["ort_session_off_s"] == {"min": 9.0, "median": 10.0, "max": 11.0}
    (row,) = table([s])[2:]
    assert row == (
        "| 50,000 | 4 (1 failed) | 25.0 [20.0-30.0] | 19.0 [18.0-20.0] | 1.50 [1.00-2.00] | 0.500 [0.400-0.600] "
        "| 4.00 [3.00-5.00] | 10.00 [9.00-11.00] |"
    )


def test_the_benchmark_runs_every_size_every_round(tmp_path):
    out = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.node_count", "--sizes", "50", "100", "--reps", "2",
         "--dir", str(tmp_path / "models"), "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((out / "node_count.json").read_text())
    assert [s["nodes"] for s in results["summaries"]] == [50, 100]
    for s in results["summaries"]:
        assert (s["runs"], s["failed"]) == (2, 0)
        assert 0 < s["wall_s"]["min"] <= s["wall_s"]["median"] <= s["wall_s"]["max"]
        assert s["s_per_1000_nodes"]["median"] == pytest.approx(s["wall_s"]["median"] * 1000 / s["nodes"])
        assert s["peak_gb"]["min"] > 0 and s["ort_session_s"]["min"] > 0 and s["ort_session_off_s"]["min"] > 0
    for runs in results["folds"].values():
        assert all("verified (in float64" in r["summary"] for r in runs)
    text = (out / "README.md").read_text()
    assert "| 50 | 2 |" in text and "| 100 | 2 |" in text and "onnx_lnfold at git" in text
    assert not list((tmp_path / "models").glob("*/o.onnx*"))  # the fold's outputs are not left behind
