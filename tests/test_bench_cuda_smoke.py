"""The CUDA sweep (`python -m benchmarks.cuda`) cannot rot before a GPU arrives: its smoke mode runs
the same code on the CPU EP, and its refusals (no CUDA; CPU figures into the CUDA results) hold."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytest.importorskip("onnxruntime")


def _run(*args: str, timeout: int = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "benchmarks.cuda", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path_factory.mktemp("cuda_smoke")
    return _run("--smoke=min", "--out", str(out)), out


def test_smoke_runs_every_section(smoke):
    from benchmarks.cuda import E2E_VARIANTS, FUSE_CHOICES, KERNEL_KINDS, SMOKE_MIN

    proc, out = smoke
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads((out / "results.json").read_text())
    assert res["mode"] == "cpu" and res["device"]["execution_provider"] == "CPUExecutionProvider"
    assert "SMOKE TEST: not CUDA figures" in (out / "RESULTS.md").read_text()
    if importlib.util.find_spec("matplotlib"):
        assert (out / "cuda.png").stat().st_size > 0

    kernels = {(k["dtype"], k["hidden"], k["rows"]) for k in res["kernels"]}
    assert kernels == {(d, h, r) for d in SMOKE_MIN.dtypes for h in SMOKE_MIN.kernel_hidden for r in SMOKE_MIN.kernel_rows}
    for k in res["kernels"]:
        assert set(k["median_us"]) == set(KERNEL_KINDS) and all(v > 0 for v in k["median_us"].values())
        assert all(len(v) == k["rounds"] >= SMOKE_MIN.min_rounds for v in k["samples_us"].values())

    shape = SMOKE_MIN.e2e_shapes[0]
    e2e = {(e["dtype"], e["batch"], e["seq"]) for e in res["e2e"]}
    assert e2e == {(d, b, s) for d in SMOKE_MIN.dtypes for b in SMOKE_MIN.batches for s in SMOKE_MIN.seqs}
    for e in res["e2e"]:
        assert set(e["median_ms"]) == set(E2E_VARIANTS)
        for fuse in FUSE_CHOICES:  # every fold folds every LN of the pre-LN model: 2 per block + the final one
            assert e["folds"][fuse]["folded"] == e["folds"][fuse]["layer_norms"] == 2 * shape.layers + 1
        # the fuse-residual choices are different graphs (else the comparison would compare nothing)
        assert len({e["graph_digest"][f"folded_{c}"] for c in FUSE_CHOICES}) == 3
        tol = 1e-4 if e["dtype"] == "float32" else 1e-2
        for variant, eq in e["equivalence"].items():
            assert eq["finite"] and eq["rel"] <= tol, (variant, eq)
        assert e["equivalence"]["resaved"]["max_abs_diff"] == 0.0
    assert res["fuse_residual"]["recommended"] in FUSE_CHOICES


def test_smoke_refuses_to_write_cpu_figures_as_cuda(tmp_path):
    target = ROOT / "benchmarks" / "results" / "cuda"
    before = sorted(p.name for p in target.iterdir()) if target.exists() else None
    proc = _run("--smoke=min", "--out", str(target), timeout=60)
    assert proc.returncode == 2
    assert "not written to" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert (sorted(p.name for p in target.iterdir()) if target.exists() else None) == before


def test_without_cuda_says_why_and_writes_nothing(tmp_path):
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("onnxruntime here has the CUDA provider")
    out = tmp_path / "cuda"
    proc = _run("--out", str(out), timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("error: not run on CUDA: ")
    assert "CUDAExecutionProvider" in proc.stderr
    assert not out.exists()
