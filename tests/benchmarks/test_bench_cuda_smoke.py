"""The CUDA sweep (`python -m benchmarks.cuda`) cannot rot before a GPU arrives: its smoke mode runs the
same code on the CPU EP, and each guard that keeps a CUDA figure honest is rehearsed here on the CPU,
failure path included:

- placement: CPU fallback disabled, no silent retry on CPU, the provider asked for reported first,
  float nodes off the device named (asking for CUDA on this CPU-only onnxruntime);
- one `calls` count per configuration, from the slowest variant;
- kernel time from the profiler (CPU node events here; the torch.profiler plumbing of the GPU path);
- the memory level of a kernel's tensors, and no DRAM share unless they live in DRAM;
- equivalence of every variant on every configuration and every output, failing on a mismatch;
- end-to-end GPT-2 through the transformers optimizer (Attention fused), fp16, then the fold.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT

ort = pytest.importorskip("onnxruntime")

CPU_ONLY = "CUDAExecutionProvider" not in ort.get_available_providers()


def _run(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "benchmarks.cuda", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path_factory.mktemp("cuda_smoke")
    return _run("--smoke=min", "--no-trained", "--out", str(out)), out


def test_smoke_runs_every_section(smoke):
    from benchmarks.cuda.models import E2E_VARIANTS, FUSE_CHOICES
    from benchmarks.cuda.sweep import KERNEL_KINDS, SMOKE_MIN

    proc, out = smoke
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((out / "results.json").read_text())
    assert res["mode"] == "cpu" and res["device"]["execution_provider"] == "CPUExecutionProvider"
    md = (out / "RESULTS.md").read_text()
    assert "SMOKE TEST: not CUDA figures" in md and "CUDA: not measured" in md
    if importlib.util.find_spec("matplotlib"):
        assert (out / "cuda.png").stat().st_size > 0

    kernels = {(k["dtype"], k["hidden"], k["rows"]) for k in res["kernels"]}
    assert kernels == {(d, h, r) for d in SMOKE_MIN.kernel_dtypes for h in SMOKE_MIN.kernel_hidden
                       for r in SMOKE_MIN.kernel_rows}
    for k in res["kernels"]:
        # one `calls` for every kind of the configuration, set by the slowest one
        assert isinstance(k["calls"], int) and k["calibration"]["slowest"] in KERNEL_KINDS
        assert k["calibration"]["run_ms"][k["calibration"]["slowest"]] == max(k["calibration"]["run_ms"].values())
        # kernel time from the profiler, every kind in every kernel-time round (at least two), beside the wall clock
        assert k["kernel_source"] == "onnxruntime profiler Node events (CPU EP kernels)"
        for kind in KERNEL_KINDS:
            assert len(k["kernel_samples_us"][kind]) == k["kernel_rounds"] >= 2
            assert all(v is not None and v > 0 for v in k["kernel_samples_us"][kind])
            assert len(k["wall_samples_us"][kind]) == k["rounds"] >= SMOKE_MIN.min_rounds
            lo, hi = k["kernel_spread_us"][kind]
            assert lo <= k["kernel_us"][kind] <= hi
        assert k["ratios_kernel"]["ln/sln"]["n"] == k["kernel_rounds"] and k["ratios_wall"]["ln/sln"]["n"] == k["rounds"]
        # no L2 size on the CPU: no level, no DRAM share
        assert set(k["level"].values()) == {"?"} and not any(k["share_of_dram"].values())

    shape = SMOKE_MIN.gpt2_shapes[0]
    e2e = {(e["batch"], e["seq"]) for e in res["e2e"]}
    assert e2e == {(b, s) for b in SMOKE_MIN.batches for s in SMOKE_MIN.seqs}
    for e in res["e2e"]:
        assert set(e["wall_ms"]) == set(E2E_VARIANTS) == set(e["kernel_ms"])
        assert isinstance(e["calls"], int) and all(v > 0 for v in e["kernel_ms"].values())
        assert e["optimizer"]["fused"]["Attention"] == shape.layers  # the optimizer ran: attention is fused
        assert e["optimizer"]["float16"].startswith("OnnxModel.convert_float_to_float16(keep_io_types=True)")
        for fuse in FUSE_CHOICES:  # every LN folds, the SkipLayerNormalizations of the optimizer included
            assert e["folds"][fuse]["folded"] == e["folds"][fuse]["layer_norms"] == 2 * shape.layers + 1
        assert len({e["graph_digest"][f"folded_{c}"] for c in FUSE_CHOICES}) == 3
        # equivalence at this configuration, every variant, every output
        assert set(e["equivalence"]) == set(E2E_VARIANTS) - {"original"} and e["equivalent"]
        for eq in e["equivalence"].values():
            assert set(eq["outputs"]) == {"logits"} and eq["passed"]
            assert eq["outputs"]["logits"]["rtol"] == 1e-2  # an fp16 model's fp32 output: fp16 tolerance
    assert res["fuse_residual"]["recommended"] in FUSE_CHOICES
    assert res["models"][0]["optimizer"]["model_type"] == "gpt2" and res["models"][0]["optimizer"]["opt_level"] == 0


def test_smoke_refuses_to_write_cpu_figures_as_cuda(tmp_path):
    target = ROOT / "benchmarks" / "results" / "cuda"
    before = sorted(p.name for p in target.iterdir()) if target.exists() else None
    proc = _run("--smoke=min", "--out", str(target), timeout=60)
    assert proc.returncode == 2
    assert "not written to" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert (sorted(p.name for p in target.iterdir()) if target.exists() else None) == before


@pytest.mark.skipif(not CPU_ONLY, reason="onnxruntime here has the CUDA provider")
def test_without_cuda_says_why_and_writes_nothing(tmp_path):
    out = tmp_path / "cuda"
    proc = _run("--out", str(out), "--no-trained", timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("error: not run on CUDA: ")
    assert "CUDAExecutionProvider" in proc.stderr
    assert not out.exists()


# --------------------------------------------------------------------------- #
# Placement, rehearsed by asking for CUDA on a CPU-only onnxruntime
# --------------------------------------------------------------------------- #
@pytest.mark.skipif(not CPU_ONLY, reason="needs an onnxruntime without the CUDA provider")
def test_cpu_fallback_disabled_fails_in_one_line():
    from benchmarks.cuda.device import DISABLE_CPU_FALLBACK, Device, PlacementError
    from benchmarks.cuda.sweep import _kernel_model

    device = Device("cuda")
    so = device.session_options(optimize=False, strict=True)
    assert so.get_session_config_entry(DISABLE_CPU_FALLBACK) == "1"
    with pytest.warns(UserWarning, match="not in available provider names"):
        with pytest.raises(PlacementError) as err:
            device.session(_kernel_model("ln", 64, "float32", 2), "kernel ln", optimize=False, strict=True)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("kernel ln: ")
    # onnxruntime's own refusal (not its Python retry on the CPU EP, which would fail with "Conflicting
    # session configuration" instead: sessions are created with enable_fallback=0)
    assert "assigned nodes to the CPU EP" in msg and f"{DISABLE_CPU_FALLBACK}=1" in msg


@pytest.mark.skipif(not CPU_ONLY, reason="needs an onnxruntime without the CUDA provider")
def test_session_on_another_provider_fails_in_one_line():
    from benchmarks.cuda.device import Device, PlacementError
    from benchmarks.cuda.sweep import _kernel_model

    with pytest.warns(UserWarning), pytest.raises(PlacementError) as err:
        Device("cuda").session(_kernel_model("ln", 64, "float32", 2), "model x", strict=False)
    assert str(err.value) == ("model x: the session runs on CPUExecutionProvider, not CUDAExecutionProvider "
                              "(providers CPUExecutionProvider)")


def _profiled_cpu_session(tmp_path, model_path):
    from benchmarks.cuda.device import Device
    from benchmarks.gpt2_onnx import Gpt2Shape, make_inputs

    device = Device("cpu")
    sess = device.session(model_path, "gpt2", strict=False, profile_prefix=str(tmp_path / "prof"))
    sess.run(None, make_inputs(Gpt2Shape(hidden=64, layers=1, vocab=128, positions=64), 1, 8))
    events = json.loads(Path(sess.end_profiling()).read_text())
    return sess, events


def test_float_nodes_off_the_device_are_named(tmp_path, monkeypatch):
    """A profile of a CPU session read as if CUDA had been asked for: the shape arithmetic that
    onnxruntime keeps on the CPU on purpose passes, every node on float data is an offender."""
    from benchmarks.cuda.device import PlacementError, check_assignment, off_device_nodes
    from benchmarks.gpt2_onnx import Gpt2Shape, build_gpt2

    model = build_gpt2(Gpt2Shape(hidden=64, layers=1, vocab=128, positions=64), "float32", tmp_path / "g.onnx")
    sess, events = _profiled_cpu_session(tmp_path, model)
    assert check_assignment(sess, events, "CPUExecutionProvider", "gpt2") == []  # all on the provider asked for
    shape, offending = off_device_nodes(events, "CUDAExecutionProvider")
    assert {n["op"] for n in shape} >= {"Shape", "Gather", "Concat"}
    assert all(set(n["types"]) <= {"int64", "int32", "bool"} for n in shape)
    assert {"LayerNormalization", "MatMul", "Softmax"} <= {n["op"] for n in offending}
    assert all("float" in n["types"] for n in offending)
    with pytest.raises(PlacementError, match="the session runs on CPUExecutionProvider"):
        check_assignment(sess, events, "CUDAExecutionProvider", "gpt2")
    # the node check alone: as if the session reported CUDA first, with these nodes on the CPU EP
    from onnx_lnfold.bench import placement

    monkeypatch.setattr(placement, "check_providers", lambda *args: None)
    with pytest.raises(PlacementError) as err:
        check_assignment(sess, events, "CUDAExecutionProvider", "gpt2 folded_auto")
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("gpt2 folded_auto: node '") and "runs on CPUExecutionProvider" in msg
    assert "with float" in msg and f"(+{len(offending) - 1} more)" in msg


# --------------------------------------------------------------------------- #
# Timing: one `calls` per configuration; kernel time from the profiler
# --------------------------------------------------------------------------- #
def _kernel_timed(device, kind: str, hidden: int, rows: int, repeat: int, profile_prefix=None):
    from benchmarks.cuda.sweep import _kernel_model
    from benchmarks.cuda.timing import Timed

    sess = device.session(_kernel_model(kind, hidden, "float32", repeat), kind, optimize=False,
                          profile_prefix=profile_prefix)
    x = device.to_device(np.random.default_rng(0).standard_normal((1, rows, hidden), dtype=np.float32))
    feeds = {"x": x, "skip": x} if len(sess.get_inputs()) == 2 else {"x": x}
    return sess, Timed(device, sess, feeds)


def test_one_calls_count_from_the_slowest_variant():
    from benchmarks.cuda.device import Device
    from benchmarks.cuda.timing import calibrate_calls, interleave

    device = Device("cpu")
    timed = {"fast": _kernel_timed(device, "copy", 8, 4, 1)[1], "slow": _kernel_timed(device, "ln", 512, 2048, 8)[1]}
    cal = calibrate_calls(timed, sample_ms=200.0, warmup=1)
    assert cal["slowest"] == "slow" and cal["calibration_runs"] >= 3
    assert cal["calls"] == min(200, max(0, round(200.0 / cal["run_ms"]["slow"]) - 1))
    before = {k: t.runs for k, t in timed.items()}
    samples = interleave(timed, cal["calls"], min_rounds=1, max_rounds=1, budget_s=0.0)
    # at least two rounds, and every variant ran exactly as many runs
    assert {k: len(v) for k, v in samples.items()} == {"fast": 2, "slow": 2}
    assert {k: t.runs - before[k] for k, t in timed.items()} == {k: 2 * (cal["calls"] + 1) for k in timed}


def test_kernel_time_comes_from_the_profile_per_visit(tmp_path):
    from benchmarks.cuda.device import Device
    from benchmarks.cuda.timing import ProfiledPhase

    device = Device("cpu")
    small_s, small = _kernel_timed(device, "ln", 64, 16, 4, str(tmp_path / "a"))
    big_s, big = _kernel_timed(device, "ln", 512, 2048, 4, str(tmp_path / "b"))
    phase = ProfiledPhase("CPUExecutionProvider")
    for name, t in (("small", small), ("big", big)):
        phase.run(name, t, 1)  # warm-up: counted, not a visit
    for r in range(2):
        phase.round("cfg", [("small", small), ("big", big)][r:] + [("small", small), ("big", big)][:r], 3)
    profiles = {n: json.loads(Path(s.end_profiling()).read_text()) for n, s in (("small", small_s), ("big", big_s))}
    values, source = phase.finish(profiles)
    assert source == "onnxruntime profiler Node events (CPU EP kernels)"
    assert len(values["cfg"]["small"]) == len(values["cfg"]["big"]) == 2
    # 1024x the elements: every visit of the big one outlasts the small one's, and by 10x its quickest
    # (a loaded machine can stretch one small visit; it cannot make it outlast a big one's)
    assert min(values["cfg"]["big"]) > 10 * min(values["cfg"]["small"]) > 0
    assert min(values["cfg"]["big"]) > max(values["cfg"]["small"])

    # a run the phase did not see shifts the attribution: refused, never misattributed
    phase2 = ProfiledPhase("CPUExecutionProvider")
    s3, t3 = _kernel_timed(device, "sln", 64, 16, 2, str(tmp_path / "c"))
    t3.run_sync()
    phase2.round("cfg", [("x", t3)], 2)
    with pytest.raises(RuntimeError, match="cannot be attributed"):
        phase2.finish({"x": json.loads(Path(s3.end_profiling()).read_text())})


def test_kineto_round_plumbing_on_the_cpu(tmp_path):
    """The GPU path's torch.profiler window (one per round, split between visits by markers; trace
    export, JSON, per-run sums), rehearsed with the CPU activity: torch ops as visits, `aten::zeros`
    as the marker. A category that is absent gives None, never 0."""
    torch = pytest.importorskip("torch")
    from benchmarks.cuda.timing import kineto_round

    small, big = torch.ones(8, 8), torch.ones(384, 384)
    visits = [lambda: torch.mm(small, small), lambda: torch.mm(big, big), lambda: torch.mm(small, small)]
    marker = dict(activity="CPU", marker=lambda: torch.zeros(1), marker_name="aten::zeros")
    for visit in visits:  # warmed up, as the sweep's sessions are: a first mm pays torch's lazy setup (~10 ms)
        visit()
    values = kineto_round(visits, 3, tmp_path, category="cpu_op", **marker)
    assert len(values) == 3 and all(v is not None and v > 0 for v in values)
    assert values[1] > values[0] and values[1] > values[2]
    assert kineto_round(visits, 2, tmp_path, category="kernel", **marker) == [None] * 3


# --------------------------------------------------------------------------- #
# Bandwidth: memory level, no DRAM share for L2-resident tensors
# --------------------------------------------------------------------------- #
def test_dram_share_only_for_dram_resident_tensors():
    from benchmarks.cuda.device import L2_BYTES, by_name, memory_level
    from benchmarks.cuda.sweep import KERNEL_KINDS, bandwidth

    h200 = {"l2_bytes": int(by_name(L2_BYTES, "NVIDIA H200")), "nominal_gbps": 4800.0}
    assert h200["l2_bytes"] == 50 * 2**20
    us = dict.fromkeys(KERNEL_KINDS, 0.5)
    small = bandwidth(us, 512 * 768 * 2, h200)  # 0.75 MiB fp16: in L2, where 0.5 us means > 3 TB/s
    assert set(small["level"].values()) == {"L2"} and not any(small["share_of_dram"].values())
    assert small["gbps"]["sln"] > 3000 and small["share_of_copy"]["sln"] == pytest.approx(1.0)
    big = bandwidth(dict.fromkeys(KERNEL_KINDS, 300.0), 32768 * 8192 * 2, h200)  # 512 MiB per tensor
    assert big["level"]["sln"] == "DRAM" and big["share_of_dram"]["sln"] == pytest.approx(
        big["gbps"]["sln"] / 4800.0)
    assert memory_level(60 * 2**20, 120 * 2**20, h200["l2_bytes"]) == "L2+DRAM"
    assert bandwidth(dict.fromkeys(KERNEL_KINDS, None), 1024, h200)["gbps"]["ln"] is None  # no kernel time: no GB/s


# --------------------------------------------------------------------------- #
# Equivalence on every configuration and output; the optimizer's fusions
# --------------------------------------------------------------------------- #
def test_a_mismatching_variant_fails_its_configurations(tmp_path):
    import dataclasses

    from benchmarks.cuda.device import Device
    from benchmarks.cuda.models import E2E_VARIANTS, Prepared
    from benchmarks.cuda.sweep import SMOKE_MIN, equivalence_failure, measure_model
    from benchmarks.gpt2_onnx import Gpt2Shape, build_gpt2, make_inputs

    shape = Gpt2Shape(hidden=64, layers=1, vocab=128, positions=64)
    good = build_gpt2(shape, "float32", tmp_path / "good.onnx")
    other = build_gpt2(shape, "float32", tmp_path / "other.onnx", seed=1)  # other weights: other logits
    paths = {k: good for k in E2E_VARIANTS} | {"folded_always": other}
    prep = Prepared(name="gpt2_x", source="test", paths=paths, optimizer={}, folds={}, prepare_s=0.0,
                    graph_digest={}, feeds=lambda b, s: make_inputs(shape, b, s), info={})
    cfg = dataclasses.replace(SMOKE_MIN, min_rounds=2, max_rounds=2, profile_runs=1, warmup=1)
    results = measure_model(Device("cpu"), prep, [(1, 8), (2, 4)], cfg, tmp_path)
    assert [(r["batch"], r["seq"]) for r in results] == [(1, 8), (2, 4)]
    for r in results:
        assert not r["equivalent"] and not r["equivalence"]["folded_always"]["passed"]
        assert all(r["equivalence"][k]["passed"] for k in E2E_VARIANTS if k not in ("original", "folded_always"))
        assert r["equivalence"]["resaved"]["outputs"]["logits"]["max_abs_diff"] == 0.0
    line = equivalence_failure(results)
    assert line.startswith("equivalence: gpt2_x b1 s8 folded_always: output 'logits' max|diff|/max|ref| ")
    assert line.endswith("> rtol 0.0001 (+1 more)")


def test_gpt2_without_fused_attention_is_refused(tmp_path):
    from benchmarks.cuda.models import ModelPrepError, check_gpt2_fusions, optimize_fp16
    from benchmarks.gpt2_onnx import Gpt2Shape, build_gpt2

    shape = Gpt2Shape(hidden=64, layers=2, vocab=128, positions=64)
    fused = {}
    for style in ("torchscript", "dynamo"):
        src = build_gpt2(shape, "float32", tmp_path / f"{style}.onnx", style=style)
        fused[style] = optimize_fp16(src, tmp_path / f"{style}_opt.onnx", "gpt2", shape.n_heads, shape.hidden)["fused"]
    check_gpt2_fusions(shape, fused["torchscript"])
    with pytest.raises(ModelPrepError, match=r"fused 0 Attention \(expected 2\)"):
        check_gpt2_fusions(shape, fused["dynamo"])


def test_time_cap_skips_what_would_end_after_it():
    import time

    from benchmarks.cuda.sweep import FULL, Deadline, e2e_reserve_s, kernel_reserve_s

    deadline = Deadline(450.0, t0=time.perf_counter() - 400.0)
    skipped: list[str] = []
    assert not deadline.passed("kernels float16 d768", skipped, reserve_s=kernel_reserve_s(FULL))
    medium = e2e_reserve_s(FULL, 355e6, 6)
    assert medium > 50 and deadline.passed("gpt2_d1024_L24 (end to end)", skipped, reserve_s=medium)
    assert len(skipped) == 1 and skipped[0].startswith("gpt2_d1024_L24 (end to end) (time cap: 400 s + about ")


@pytest.mark.skipif(not CPU_ONLY, reason="needs an onnxruntime without the CUDA provider")
def test_a_placement_failure_fails_the_sweep_but_not_the_other_parts(tmp_path, monkeypatch):
    """A model whose session lands on the CPU is not reported, the next model still runs, and the
    sweep's failure (exit 2) names the first one."""
    from benchmarks.cuda import sweep as cuda
    from benchmarks.cuda.device import Device
    from benchmarks.cuda.models import E2E_VARIANTS, Prepared
    from benchmarks.gpt2_onnx import Gpt2Shape, build_gpt2, make_inputs

    shape = Gpt2Shape(hidden=64, layers=1, vocab=128, positions=64)
    model = build_gpt2(shape, "float32", tmp_path / "g.onnx")

    def prepared(path, work):
        return Prepared(name=path.stem, source=str(path), paths=dict.fromkeys(E2E_VARIANTS, model),
                        optimizer={"fused": {}}, folds={"auto": {"folded": 0, "layer_norms": 0}}, prepare_s=0.0,
                        graph_digest={}, feeds=lambda b, s: make_inputs(shape, b, s), info={})

    monkeypatch.setattr(cuda, "prepare_trained", prepared)
    failures, skipped = [], []
    for name in ("m1", "m2"):
        (tmp_path / f"{name}.onnx").write_bytes(model.read_bytes())
    results, models = cuda.run_e2e(Device("cuda"), cuda.SMOKE_MIN, [tmp_path / "m1.onnx", tmp_path / "m2.onnx"],
                                   True, cuda.Deadline(600.0), skipped, failures, tmp_path)
    assert results == [] and [m["model"] for m in models] == ["m1", "m2"]
    assert [f["kind"] for f in failures] == ["placement", "placement"]
    assert failures[0]["message"].startswith("m1 original: the session runs on CPUExecutionProvider")
    assert skipped == ["m1 (failed: placement, see `failures`)", "m2 (failed: placement, see `failures`)"]
    first = cuda.first_failure(failures + [{"kind": "equivalence", "message": "x"}])
    assert first["line"].startswith("placement: m1 original: ") and first["line"].endswith("(+2 more failures)")
    assert cuda.EXIT_CODES[first["kind"]] == 2


def test_onnxruntime_kernel_events_are_preferred_when_the_build_has_them(tmp_path):
    """In builds with --enable_cuda_profiling, onnxruntime's profile carries CUPTI's records as
    {"cat": "Kernel", "dur": µs, "args": {"op_name": ...}}, each placed right after its node's event
    (GPUProfilerBase::MergeEvents sets ts = node ts + 1, 2, ...). A real CPU profile with such
    records added is read from them, not from the Node events."""
    from benchmarks.cuda.device import Device
    from benchmarks.cuda.timing import ProfiledPhase

    sess, t = _kernel_timed(Device("cpu"), "sln", 64, 16, 3, str(tmp_path / "k"))
    phase = ProfiledPhase("CUDAExecutionProvider")
    phase.run("x", t, 1)
    phase.round("cfg", [("x", t)], 2)
    events = json.loads(Path(sess.end_profiling()).read_text())
    nodes = [e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    kernels = [{"cat": "Kernel", "name": "SimplifiedLayerNormKernel", "ts": e["ts"] + 1, "dur": 7,
                "args": {"op_name": e["args"]["op_name"], "stream": "13"}} for e in nodes]
    assert len(nodes) == 3 * 3  # three runs of three nodes
    values, source = phase.finish({"x": events + kernels})
    assert source == "onnxruntime profiler Kernel events (CUPTI)"
    assert values == {"cfg": {"x": [7.0 * 3]}}  # 3 kernels of 7 µs per run, the warm-up run left out
    # without them, a CUDA session's Node events (launch times) are no kernel time
    assert phase.finish({"x": events}) == ({"cfg": {"x": [None]}}, "not measured")
