"""benchmarks.runtimes end to end on one small model: the table a user reruns is the one it writes."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("onnxruntime")


def test_a_short_run_writes_the_table_and_its_json(tmp_path):
    from benchmarks import runtimes

    runtimes_measured = ["onnxruntime-cpu"]
    try:
        import openvino  # noqa: F401

        runtimes_measured.append("openvino-cpu-f32")
    except ImportError:
        pass
    out = tmp_path / "out"
    argv = ["--models", "gpt2", "--runtimes", *runtimes_measured, "--processes", "2", "--seconds", "0.1",
            "--min-rounds", "3", "--warmup", "1", "--out", str(out), "--work", str(tmp_path / "work")]
    assert runtimes.main(argv) == 0
    data = json.loads((out / "runtimes.json").read_text())
    rows = {row["runtime"]: row for row in data["rows"]}
    assert set(rows) == set(runtimes_measured)
    for row in rows.values():
        assert set(row["variants"]) == {"original", "ort", "onnx", "primitive"}
        for variant, entry in row["variants"].items():
            assert entry["loads"], (row["runtime"], variant, entry.get("error"))
            if variant != "original":
                assert entry["max_rel_vs_original"] < 1e-5
                assert len(entry["timing"]["per_process"]) == 2
    # Priced at the feeds' 16 tokens, the final LN (its beta an Add) folds only where its residual
    # Add is fused in (the default target): the primitive form keeps it. Count what folded.
    folded = {t: json.loads((tmp_path / "work" / "gpt2" / f"gpt2.{t}.json").read_text())["folded"] for t in ("ort", "onnx", "primitive")}
    assert folded["ort"] == 5 and folded["primitive"] >= 4
    ort_cpu = rows["onnxruntime-cpu"]["variants"]
    # ONNX Runtime fuses each primitive RMSNorm into its SimplifiedLayerNormalization
    assert ort_cpu["primitive"]["kernels"]["SimplifiedLayerNormalization"] == folded["primitive"]
    assert sum(ort_cpu["ort"]["kernels"].get(op, 0) for op in ("SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization")) == 5
    if "openvino-cpu-f32" in rows:
        assert all(rows["openvino-cpu-f32"]["variants"][t]["kernels"].get("RMS") == folded[t] for t in folded)
    table = (out / "RUNTIMES.md").read_text()
    assert f"--target primitive ({folded['primitive']}/5 folded)" in table and data["command"].startswith("python -m benchmarks.runtimes")
