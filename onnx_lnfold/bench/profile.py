"""Kernel time from ONNX Runtime's profiler (`enable_profiling`, the JSON `end_profiling()` writes).

On the CPU EP the profile's `Node` events (`NODE_kernel_time`) are the kernels' own time. On CUDA
they are the host time of launching a node; the kernels' time is in `Kernel` events (CUPTI's
records, each with the `op_name` of the node that launched it), which only builds made with
`--enable_cuda_profiling` write: the onnxruntime-gpu wheels on PyPI are not such builds. A figure
that is not in the profile is None ("not measured"), never a launch time standing in for it.
Runs are attributed by counting: onnxruntime writes one `model_run` event per Run().
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import numpy as np

CPU = "CPUExecutionProvider"


def load(path: str | Path, remove: bool = True) -> list[dict]:
    path = Path(path)
    try:
        return json.loads(path.read_text())
    finally:
        if remove:
            path.unlink(missing_ok=True)


def kernel_events(events: list[dict], provider: str) -> tuple[set[str], str, str] | None:
    """(categories, name suffix, source) of the kernel events in onnxruntime's profile, or None."""
    if any(e.get("cat") == "Kernel" for e in events):
        return {"Kernel"}, "", "onnxruntime profiler Kernel events (CUPTI)"
    if provider == CPU:
        return {"Node"}, "_kernel_time", "onnxruntime profiler Node events (CPU EP kernels)"
    return None


def run_windows(events: list[dict]) -> list[tuple[float, float]]:
    """(start, end) of every Run() in the profile, in order."""
    return sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"]))
                  for e in events if e.get("cat") == "Session" and e.get("name") == "model_run")


def kernel_us_per_run(events: list[dict], windows: list[tuple[float, float]], categories: set[str],
                      runs: int, name_suffix: str = "") -> float | None:
    """Sum of the durations (us) of the events of `categories` that start inside one of `windows`,
    divided by `runs`; None when no such event exists (nothing measured, never zero)."""
    total, found = 0.0, False
    for e in events:
        if e.get("cat") not in categories or (name_suffix and not str(e.get("name", "")).endswith(name_suffix)):
            continue
        ts = float(e.get("ts", 0))
        if any(lo <= ts <= hi for lo, hi in windows):
            total += float(e.get("dur", 0))
            found = True
    return total / runs if found else None


def _kernel_time_by(events: list[dict], runs: int, provider: str, key) -> dict[str, float] | None:
    """Kernel time per `key(event, name suffix)`, microseconds per run (median over the last `runs`
    runs); None when the profile holds no kernel time."""
    kinds = kernel_events(events, provider)
    if kinds is None:
        return None
    categories, suffix, _ = kinds
    model_runs = run_windows(events)[-runs:]
    per_run = [defaultdict(float) for _ in model_runs]
    for e in events:
        if e.get("cat") not in categories or not str(e.get("name", "")).endswith(suffix):
            continue
        ts = float(e.get("ts", 0))
        for i, (lo, hi) in enumerate(model_runs):
            if lo <= ts <= hi:
                per_run[i][key(e, suffix)] += float(e["dur"])
                break
    keys = sorted({k for r in per_run for k in r})
    return {k: float(np.median([r.get(k, 0.0) for r in per_run])) for k in keys}


def op_profile(events: list[dict], runs: int, provider: str = CPU) -> dict[str, float] | None:
    """Kernel time per op type, microseconds per run (median over the last `runs` runs); None when
    the profile holds no kernel time (CUDA without CUPTI records)."""
    return _kernel_time_by(events, runs, provider, lambda e, _: e.get("args", {}).get("op_name", "?"))


def node_profile(events: list[dict], runs: int, provider: str = CPU) -> dict[str, float] | None:
    """Kernel time per node, by the name the session's graph gives it, microseconds per run (median
    over the last `runs` runs); None where the profile names no node's kernels (CPU EP only: CUPTI's
    records name the op, not the node)."""
    if provider != CPU:
        return None
    return _kernel_time_by(events, runs, provider, lambda e, suffix: str(e["name"]).removesuffix(suffix))
