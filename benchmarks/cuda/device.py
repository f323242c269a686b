"""Where the CUDA sweep's sessions run, and the proof that every node of every timed session ran there.

The four ways a session asked for CUDA can end up on the CPU, and the line that closes each, are
onnx_lnfold/bench/placement.py's (the code `onnx-lnfold bench` and `onnx-lnfold calibrate` run too):
sessions are created with `enable_fallback=0` and must report the provider asked for first; kernel
graphs and the probe run with CPU fallback disabled (`session.disable_cpu_ep_fallback` = "1");
models, whose shape arithmetic onnxruntime keeps on the CPU on purpose, are checked node by node
from their profile (`check_assignment`). This module adds the sweep's device: its session options,
IO binding, the probe, the GPU's figures.

On the CPU (`--smoke`) the CPU EP is the provider asked for; the same checks run and pass, and
tests/benchmarks/test_bench_cuda_smoke.py rehearses their failures by asking for CUDA on a CPU-only onnxruntime.
"""

from __future__ import annotations

import ctypes
import subprocess
import sys
from pathlib import Path

import numpy as np

from onnx_lnfold.bench.placement import (  # noqa: F401 - the sweep's placement checks are the package's
    DISABLE_CPU_FALLBACK,
    SHAPE_TYPES,
    PlacementError,
    check_assignment,
    check_providers,
    create_session,
    off_device_nodes,
)
from onnx_lnfold.bench.sampling import bind

EXPECTED_PROVIDER = {"cuda": "CUDAExecutionProvider", "cpu": "CPUExecutionProvider"}

# Nominal DRAM bandwidth (GB/s) by GPU name fragment (vendor data sheets), for the share-of-DRAM column.
NOMINAL_GBPS = {"H200": 4800, "H100 SXM": 3350, "H100 PCIe": 2000, "H100": 3350, "A100-SXM4-80GB": 2039,
                "A100 80GB": 1935, "A100": 1555, "L40S": 864, "L4": 300, "A10": 600, "RTX 4090": 1008,
                "B200": 8000}
# L2 size (bytes) by GPU name fragment, used only when the device cannot be asked (torch's
# `L2_cache_size`, else cudaDevAttrL2CacheSize). GH100 has 60 MB of L2 on the die; H100 SXM5, H100 PCIe
# and H200 enable 50 MB of it.
L2_BYTES = {"H200": 50 * 2**20, "H100": 50 * 2**20, "A100": 40 * 2**20, "L40S": 96 * 2**20, "L4": 48 * 2**20,
            "A10": 6 * 2**20, "RTX 4090": 72 * 2**20, "B200": 126 * 2**20}


class SweepRefused(Exception):
    """The sweep cannot run as asked (no CUDA, or CPU figures headed for the CUDA results)."""


def _first_line(e: BaseException, limit: int = 300) -> str:
    text = str(e).strip().splitlines()
    return (text[-1] if text else type(e).__name__)[:limit]


class Device:
    """The execution provider a sweep runs on: CUDA, or the CPU EP for `--smoke`. `provider` may name
    another provider than the kind's own: the tests ask for CUDA on a CPU-only onnxruntime."""

    def __init__(self, kind: str, provider: str | None = None, provider_options: dict | None = None):
        import onnxruntime as ort

        self.kind, self.ort = kind, ort
        self.expected = provider or EXPECTED_PROVIDER[kind]
        # kSameAsRequested: seven kernel sessions of up to 1 GiB tensors each hold their own arena; the
        # default (next power of two) could double that. Allocation happens in warm-up, never timed.
        cuda_defaults = {"device_id": 0, "arena_extend_strategy": "kSameAsRequested"}
        options = dict(provider_options or (cuda_defaults if self.expected == "CUDAExecutionProvider" else {}))
        self.providers = [(self.expected, options)] if options else [self.expected]
        self.ort_device = "cuda" if kind == "cuda" else "cpu"

    # ---- sessions ---------------------------------------------------------------------------------
    def session_options(self, optimize: bool = True, strict: bool = True, profile_prefix: str | None = None):
        ort = self.ort
        so = ort.SessionOptions()
        so.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize
                                       else ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
        so.log_severity_level = 2  # warnings shown: "Some nodes were not assigned to the preferred execution providers"
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        # the CPU EP cannot be "fallen back" from: asking for it with the config set is an error in itself
        if strict and self.expected != "CPUExecutionProvider":
            so.add_session_config_entry(DISABLE_CPU_FALLBACK, "1")
        if profile_prefix:
            so.enable_profiling = True
            so.profile_file_prefix = profile_prefix
        if self.kind == "cpu":
            so.intra_op_num_threads = 1  # smoke: two shared cores, several sessions interleaved
            so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        return so

    def session(self, model, label: str, *, optimize: bool = True, strict: bool = True,
                profile_prefix: str | None = None):
        """A session on this device, or PlacementError. `strict`: CPU fallback disabled (graphs
        without shape arithmetic); else the placement is checked after profiling (`check_assignment`)."""
        so = self.session_options(optimize, strict, profile_prefix)  # the CPU fallback refused there when strict
        options = self.providers[0][1] if isinstance(self.providers[0], tuple) else None
        return create_session(self.ort, model, so, self.expected, options, label)

    # ---- device memory ----------------------------------------------------------------------------
    def to_device(self, arr: np.ndarray):
        return self.ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(arr), self.ort_device, 0)

    def binding(self, sess, device_feeds: dict):
        return bind(sess, device_feeds, self.ort_device)

    def run_once(self, sess, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        io = self.binding(sess, {k: self.to_device(v) for k, v in feeds.items()})
        sess.run_with_iobinding(io)
        return io.copy_outputs_to_cpu()

    # ---- the probe --------------------------------------------------------------------------------
    def check(self, probe_model: bytes) -> dict:
        """Raise SweepRefused unless a strict session really runs on this device; return what it found."""
        ort = self.ort
        info: dict = {"execution_provider": self.expected}
        if self.kind != "cuda":
            return info
        if self.expected not in ort.get_available_providers():
            raise SweepRefused(f"onnxruntime {ort.__version__} at {Path(ort.__file__).parent} has no "
                               f"{self.expected} (providers: {', '.join(ort.get_available_providers())}); "
                               "install onnxruntime-gpu (see benchmarks/cuda/gpu_host/)")
        try:
            sess = self.session(probe_model, "probe", optimize=False)
            y = self.run_once(sess, {"x": np.ones((1, 4, 64), np.float32)})
        except PlacementError as e:
            raise SweepRefused(str(e)) from None
        except Exception as e:  # noqa: BLE001 - the reason is the message
            raise SweepRefused(f"a CUDA session could not run: {_first_line(e)} "
                               "(CUDA libraries not found? see benchmarks/cuda/gpu_host/run_on_host.sh)") from None
        if not np.isfinite(y[0]).all():
            raise SweepRefused("the probe session on CUDA returned non-finite values")
        # e.g. use_tf32 (on by default: fp32 MatMuls then round like TF32 on both sides of a ratio)
        info["provider_options"] = sess.get_provider_options().get(self.expected, {})
        info.update(gpu_info())
        return info


# --------------------------------------------------------------------------- #
# The GPU
# --------------------------------------------------------------------------- #
def gpu_info() -> dict:
    info: dict = {}
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version,clocks.max.memory",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
        if out.returncode == 0 and out.stdout.strip():
            name, mem, driver, mclk = (s.strip() for s in out.stdout.strip().splitlines()[0].split(","))
            info.update(gpu=name, gpu_memory=mem, driver=driver, max_memory_clock=mclk)
    except (OSError, subprocess.TimeoutExpired, ValueError):
        pass
    torch = sys.modules.get("torch")  # imported first on the GPU host for its CUDA libraries
    if torch is not None:
        info["torch"] = torch.__version__
        info["torch_cuda"] = getattr(torch.version, "cuda", None)
        try:
            if torch.cuda.is_available():
                info.setdefault("gpu", torch.cuda.get_device_name(0))
                props = torch.cuda.get_device_properties(0)
                info["compute_capability"] = f"{props.major}.{props.minor}"
                if getattr(props, "L2_cache_size", None):
                    info["l2_bytes"], info["l2_source"] = int(props.L2_cache_size), "torch.cuda.get_device_properties"
        except Exception:  # noqa: BLE001
            pass
    if "l2_bytes" not in info:
        l2 = _cudart_l2_bytes()
        if l2:
            info["l2_bytes"], info["l2_source"] = l2, "cudaDeviceGetAttribute(cudaDevAttrL2CacheSize)"
    if "l2_bytes" not in info:
        l2 = by_name(L2_BYTES, info.get("gpu", ""))
        if l2:
            info["l2_bytes"], info["l2_source"] = int(l2), "table by GPU name (benchmarks/cuda_device.py)"
    info["nominal_gbps"] = by_name(NOMINAL_GBPS, info.get("gpu", ""))
    return info


def _cudart_l2_bytes() -> int | None:
    for lib in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
        try:
            cudart = ctypes.CDLL(lib)
        except OSError:
            continue
        value = ctypes.c_int(0)
        if cudart.cudaDeviceGetAttribute(ctypes.byref(value), 89, 0) == 0 and value.value > 0:  # cudaDevAttrL2CacheSize
            return int(value.value)
    return None


def by_name(table: dict, gpu_name: str) -> float | None:
    for key in sorted(table, key=len, reverse=True):
        if key.lower() in gpu_name.lower():
            return float(table[key])
    return None


def memory_level(bytes_read: int, bytes_moved: int, l2_bytes: int | None) -> str:
    """Where a node's tensors live between nodes of a chain: "L2" when everything it moves fits in
    the L2 (its producer's output may still be there), "DRAM" when what it reads is at least 4x the
    L2 (at most a quarter of it can still be cached), "L2+DRAM" between, "?" when the L2 is unknown.
    Only "DRAM" tensors get a share of the nominal DRAM bandwidth."""
    if not l2_bytes:
        return "?"
    if bytes_moved <= l2_bytes:
        return "L2"
    return "DRAM" if bytes_read >= 4 * l2_bytes else "L2+DRAM"
