"""The fold-cost sweep at scale (`python -m benchmarks.fold_cost --sizes ...`) cannot rot between its
long runs: here it runs end to end on a tiny model, once per variant, and its table and JSON must
hold every variant, the process tree's peak and the verification's verdict. No timing is asserted."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import ROOT


def test_the_sweep_writes_every_variant_and_the_verdict(tmp_path):
    out = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.fold_cost", "--hidden", "32", "--layers", "2", "--vocab", "64",
         "--positions", "32", "--reps", "1", "--wait-quiet", "0", "--dir", str(tmp_path / "models"), "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((out / "fold_cost.json").read_text())
    (size,) = results["sizes"]
    assert results["command"].startswith("python -m benchmarks.fold_cost --hidden 32")
    assert {"logical_cores", "memory", "git_commit", "date"} <= set(results["machine"])
    assert "foreign_cpu" in results and results["loadavg_start"]
    runs = {r["variant"]: r for r in size["runs"]}
    assert sorted(runs) == ["baseline", "default", "no_verify"]
    for r in runs.values():
        assert r["rc"] == 0 and r["wall_s"] > 0 and r["output_written"]  # (deleted after the run)
        assert r["durable_s"] >= r["wall_s"]  # until its output is on disk
        assert r["tree_peak_bound_bytes"] >= r["tree_peak_rss_bytes"] >= r["peak_rss_bytes"] > 0
        assert 0 < r["tree_peak_rss_anon_bytes"] <= r["tree_peak_rss_bytes"]
        assert 0 < r["tree_peak_rss_file_bytes"] <= r["tree_peak_rss_bytes"]
        assert r["processes"] >= 1 and "foreign_cpu" in r and "mem_available_before" in r
    verdict = runs["default"]["verdict"]
    assert verdict["status"] == "passed" and verdict["judgment"] == "float64 reference"
    assert verdict["summary"].startswith("onnx_lnfold: ") and "verified (in float64" in verdict["summary"]
    assert runs["no_verify"]["verdict"]["status"] == "skipped"
    summary = size["summary"]
    assert summary["default_vs_baseline_wall"] > 0 and summary["no_verify_vs_baseline_wall"] > 0
    assert summary["rss_target_met"] is not None and summary["wall_target_met"] is not None
    assert summary["default_vs_baseline_durable"] > 0 and summary["durable_target_met"] is not None
    md = (out / "FOLD_COST.md").read_text()
    for title in ("onnx.load + onnx.save", "fold (default, verified)", "fold --no-verify"):
        assert f"| {title} |" in md
    assert "| peak RssAnon GB | peak RssFile GB |" in md and "| on disk s | x baseline |" in md
    assert "judged on: float64 reference" in md and "## Against the targets (default run)" in md
    assert list((tmp_path / "models").glob("cost_*")) == []  # outputs, reports and logs removed
