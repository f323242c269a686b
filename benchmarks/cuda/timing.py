"""Timing for the CUDA sweep: the wall clock of bursts of runs, and the kernels' own time.

Wall clock (onnx_lnfold/bench/sampling.py, the code `onnx-lnfold calibrate` times with). A sample is `calls` runs issued back to back without synchronizing the device between
them (run option `disable_synchronize_execution_providers`), then one synchronized run; sample time /
(calls + 1). `calls` is one number for every variant of a configuration (`calibrate_calls`: the
median of several synchronized runs of each variant, the slowest one sets it), so every variant is
timed over the same number of runs: a per-variant count rounds differently near the sample length
(0 calls for one variant, 1 for another) and biases one side of a ratio by several percent.

Kernel time. For short kernel chains the wall clock measures launch overhead: every node costs a
launch whatever its kernel does, so LayerNorm vs RMSNorm would come out ~1. The kernels are timed
themselves in a profiled phase before the wall-clock phase, over rounds in rotated order, each
visit `runs` synchronized runs of one session:

- onnxruntime's own profile (`enable_profiling`, `end_profiling()` JSON): on the CUDA EP its
  `Kernel` events are CUPTI's kernel records, each with the `op_name` of the node that launched it
  (CUPTIManager::ProcessActivityBuffers, GPUProfilerBase::MergeEvents), but only in builds made with
  `--enable_cuda_profiling`: the onnxruntime-gpu wheels on PyPI are not (the 1.31.1 wheel's
  libonnxruntime_providers_cuda.so links no libcupti and contains no CUPTI symbol), and their `Node`
  events on CUDA are the host time of launching a node, not its kernel time. On the CPU EP the `Node`
  events (`NODE_kernel_time`) are the kernels' time: the `--smoke` path reads them;
- CUPTI through torch.profiler (kineto) around each visit: the `kernel` events of the trace are
  every kernel the device ran in that window, whoever launched it (the GPU host has torch with
  CUDA 13, which ships CUPTI). Used on CUDA when onnxruntime's profile has no `Kernel` events.

Both read the same way (`kernel_us_per_run`, onnx_lnfold/bench/profile.py, which `onnx-lnfold bench`
reads its profiles with): the events of a category inside each visit's window,
summed, divided by the visit's runs. Runs are attributed to visits by counting: onnxruntime writes
one `model_run` event per Run() (the counter `Timed.runs` counts them the same way).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from onnx_lnfold.bench.process import rotated  # noqa: F401 - the sweep's round order is the bench's
from onnx_lnfold.bench.profile import kernel_events as ort_kernel_events
from onnx_lnfold.bench.profile import kernel_us_per_run, run_windows
from onnx_lnfold.bench.sampling import Timed, calibrate_calls, interleave  # noqa: F401 - the calibration's


# --------------------------------------------------------------------------- #
# Kernel time
# --------------------------------------------------------------------------- #
class ProfiledPhase:
    """The profiled phase of one set of sessions created with `enable_profiling`.

    Every Run() of those sessions before their profiles end goes through `run()`, so the n-th
    `model_run` of a profile is known to be the n-th run made; a run with a `tag` is a kernel-time
    visit (inside a kineto window when `kineto`). `finish()` takes every session's profile (the
    caller also checks placement with them) and returns the kernel time of each visit, µs per run,
    by tag and session, with where it came from."""

    def __init__(self, expected_provider: str, kineto: bool = False):
        self.expected = expected_provider
        self.kineto = kineto
        self.count: dict[str, int] = {}                          # session -> Run() calls made
        self.visits: list[tuple[object, str, int, int]] = []     # (tag, session, first run index, runs)
        self.kineto_us: dict[int, float | None] = {}             # visit index -> kineto's figure
        self._tmp = Path(tempfile.mkdtemp(prefix="lnfold-kineto-")) if kineto else None

    def run(self, name: str, t: Timed, runs: int) -> None:
        """Runs that are no visit (equivalence, warm-up), counted."""
        for _ in range(runs):
            t.run_sync()
        self.count[name] = self.count.get(name, 0) + runs

    def round(self, tag: object, visits: list[tuple[str, Timed]], runs: int) -> None:
        """One kernel-time round: every session in `visits`, in that order, `runs` runs each (with
        kineto, one profiler window for the round, split between visits by markers)."""
        first = len(self.visits)
        for name, _ in visits:
            self.visits.append((tag, name, self.count.get(name, 0), runs))
            self.count[name] = self.count.get(name, 0) + runs
        if self.kineto:
            values = kineto_round([t.run_sync for _, t in visits], runs, self._tmp)
            self.kineto_us.update({first + i: v for i, v in enumerate(values)})
        else:
            for _, t in visits:
                for _ in range(runs):
                    t.run_sync()

    def finish(self, profiles: dict[str, list[dict]]) -> tuple[dict, str]:
        kinds = {name: ort_kernel_events(events, self.expected) for name, events in profiles.items()}
        use_ort = bool(profiles) and all(k is not None for k in kinds.values())
        windows = {}
        if use_ort:
            for name, events in profiles.items():
                windows[name] = run_windows(events)
                if len(windows[name]) != self.count.get(name, 0):
                    raise RuntimeError(f"the profile of {name} has {len(windows[name])} model_run events for "
                                       f"{self.count.get(name, 0)} runs: its kernel events cannot be attributed")
        source = (next(iter(kinds.values()))[2] if use_ort else
                  "torch.profiler (kineto, CUPTI) kernel events" if self.kineto else "not measured")
        out: dict = {}
        for i, (tag, name, start, runs) in enumerate(self.visits):
            if use_ort:
                categories, suffix, _ = kinds[name]
                value = kernel_us_per_run(profiles[name], windows[name][start:start + runs], categories, runs, suffix)
            else:
                value = self.kineto_us.get(i)
            out.setdefault(tag, {}).setdefault(name, []).append(value)
        return out, source


def kineto_round(visits: list, runs: int, tmpdir: Path, activity: str = "CUDA", category: str = "kernel",
                 marker=None, marker_name: str = "spin_kernel") -> list[float | None]:
    """The kernel time of each visit (µs per run; None when it has no event, never 0), in one
    torch.profiler window: each visit is `runs` calls of its function, then a marker (on the GPU
    host a torch spin kernel, launched once the visit's last run has synchronized, and waited for,
    so every kernel of a visit lies between two markers on the device's clock). The tests rehearse
    the same code with the CPU activity: torch ops as visits and markers, `cpu_op` events."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    if marker is None:
        def marker():
            torch.cuda._sleep(1000)
            torch.cuda.synchronize()

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if activity == "CUDA" else [])
    with profile(activities=activities) as prof:
        marker()
        for run in visits:
            for _ in range(runs):
                run()
            marker()
    path = Path(tempfile.mkstemp(suffix=".json", dir=tmpdir)[1])
    try:
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text()).get("traceEvents", [])
    finally:
        path.unlink(missing_ok=True)
    events = sorted((e for e in events if e.get("cat") == category), key=lambda e: float(e.get("ts", 0)))
    marks = [float(e["ts"]) for e in events if marker_name in str(e.get("name", ""))]
    if len(marks) != len(visits) + 1:
        return [None] * len(visits)  # markers not seen: nothing can be attributed
    return [kernel_us_per_run([e for e in events if marker_name not in str(e.get("name", ""))],
                              [(marks[i], marks[i + 1])], {category}, runs) for i in range(len(visits))]
