"""Shared helpers: paths, the benchmark models, the machine description, ORT session options, stats."""

from __future__ import annotations

import datetime
import importlib.util
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from onnx_lnfold.bench.stats import fmt_ratio, ratio_of_medians  # noqa: F401 - the statistics, the package's

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / "benchmarks" / "cache"
EXPORTER = ROOT / "models" / "make" / "export_bench_models.py"
MAKE_LARGE = ROOT / "models" / "make" / "make_large_model.py"


def load_script(path: Path):
    """A script of models/make (not a package) as a module, registered under its file's name."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = mod
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


exporter = load_script(EXPORTER)  # light: torch / transformers are imported only when exporting
SPECS = exporter.SPECS
SMALL_MODELS = exporter.SMALL_MODELS
BASE_MODELS = exporter.BASE_MODELS


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def ensure_exported(name: str, cache: Path = CACHE) -> dict:
    """The exported model (NAME.onnx in the cache) and its metadata; exports in a subprocess if missing."""
    path, meta_path = cache / f"{name}.onnx", cache / f"{name}.json"
    if not (path.exists() and meta_path.exists()
            and json.loads(meta_path.read_text()).get("file_size_bytes") == path.stat().st_size):
        log(f"exporting {name} (torch dynamo) -> {path}")
        subprocess.run([sys.executable, str(EXPORTER), "--only", name, "--out-dir", str(cache)], check=True,
                       stdout=sys.stderr)
    meta = json.loads(meta_path.read_text())
    meta["path"] = str(path)
    return meta


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10).stdout.strip()
    except Exception:  # noqa: BLE001
        return ""


def machine_info() -> dict:
    import onnx
    import onnxruntime as ort

    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        cpu = platform.processor()
    mem = ""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem = f"{int(line.split()[1]) / 2**20:.1f} GiB"
    except OSError:
        pass
    try:
        import onnx_lnfold

        lnfold_version = onnx_lnfold.__version__
    except Exception:  # noqa: BLE001
        lnfold_version = "?"
    dirty = _git("status", "--porcelain", "--", "onnx_lnfold")
    return {
        "cpu": cpu,
        "logical_cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "memory": mem,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "onnxruntime": ort.__version__,
        "onnxruntime_providers": ort.get_available_providers(),
        "onnx": onnx.__version__,
        "numpy": np.__version__,
        "onnx_lnfold": lnfold_version,
        "git_commit": _git("rev-parse", "--short", "HEAD"),
        "onnx_lnfold_uncommitted_changes": bool(dirty),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
    }


def results_header(title: str, command: str, machine: dict, run_note: str, hardware: str | None = None) -> list[str]:
    """The opening lines of a results file: its title, the command that wrote it, the versions and the
    machine (`hardware`, default the CPU's name) and when it ran, followed by `run_note`."""
    return [f"# {title}", "",
            f"Command: `{command}`  ",
            f"onnxruntime {machine['onnxruntime']}, onnx_lnfold at git {machine['git_commit']}, "
            f"{machine['cpu'] if hardware is None else hardware}  ",
            f"Run {machine['date']}. {run_note}", ""]


def cuda_available() -> tuple[bool, str]:
    """(usable, reason): CUDA EP present in this onnxruntime build and a GPU visible."""
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return False, "not run: no GPU (onnxruntime has no CUDAExecutionProvider; onnxruntime-gpu not installed)"
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
        if out.returncode != 0 or "GPU" not in out.stdout:
            return False, "not run: no GPU (nvidia-smi sees none)"
    except (OSError, subprocess.TimeoutExpired):
        return False, "not run: no GPU (no nvidia-smi)"
    return True, ""


def session_options(threads: int | None = None, profile_prefix: str | None = None,
                    optimized_path: str | None = None):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = threads or os.cpu_count() or 1
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    # several sessions are timed in one process, interleaved: spinning threads would steal cores
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.add_session_config_entry("session.inter_op.allow_spinning", "0")
    so.log_severity_level = 3
    if profile_prefix:
        so.enable_profiling = True
        so.profile_file_prefix = profile_prefix
    if optimized_path:
        so.optimized_model_filepath = optimized_path
    return so


def providers_for(device: str):
    if device == "cuda":
        return [("CUDAExecutionProvider", {}), "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


# --------------------------------------------------------------------------- #
# Other processes' CPU use (the machine must be quiet for the ratios to mean anything)
# --------------------------------------------------------------------------- #
_HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class CpuMonitor:
    """Share of the machine's CPU capacity used by *other* processes since `start()`
    (/proc/stat busy time minus this process's and its children's CPU time)."""

    def __init__(self):
        self.start()

    @staticmethod
    def _read():
        try:
            with open("/proc/stat") as f:
                vals = [int(x) for x in f.readline().split()[1:9]]
        except OSError:
            return None
        t = os.times()
        return sum(vals) / _HZ, (vals[3] + vals[4]) / _HZ, t.user + t.system + t.children_user + t.children_system

    def start(self) -> None:
        self._s = self._read()

    def foreign(self) -> float | None:
        now = self._read()
        if now is None or self._s is None:
            return None
        total, idle, own = (a - b for a, b in zip(now, self._s))
        if total <= 0:
            return 0.0
        return max(0.0, min(1.0, (total - idle - own) / total))


def wait_for_quiet(max_wait_s: float, threshold: float = 0.10, window_s: float = 3.0) -> float | None:
    """Wait (up to max_wait_s) until other processes use < threshold of the CPU over window_s."""
    t0 = last = time.time()
    first = True
    while True:
        m = CpuMonitor()
        time.sleep(window_s)
        f = m.foreign()
        if f is None or f < threshold or time.time() - t0 >= max_wait_s:
            if not first:
                log(f"  ... waited {time.time() - t0:.0f} s (other processes now {100 * (f or 0):.0f}%)")
            return f
        if first or time.time() - last > 30:
            log(f"machine busy: other processes use {f * 100:.0f}% of the CPU; waiting up to {max_wait_s:.0f} s")
            first, last = False, time.time()


def callgrind_dump_totals(prefix: Path) -> list[int]:
    """Instructions per callgrind dump of `prefix`.* (every thread's, summed), in dump order."""
    by_dump: dict[int, int] = {}
    for p in prefix.parent.glob(prefix.name + ".*-*"):
        k = int(p.name[len(prefix.name) + 1:].split("-")[0])
        for line in p.read_text().splitlines():
            if line.startswith(("summary:", "totals:")):
                by_dump[k] = by_dump.get(k, 0) + int(line.split()[1])
                break
    return [by_dump[k] for k in sorted(by_dump)]
