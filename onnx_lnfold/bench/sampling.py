"""Wall-clock samples of sessions bound to a device, interleaved (the calibration's and the CUDA
sweep's timing).

A sample is `calls` runs issued back to back without synchronizing the device between them (run
option `disable_synchronize_execution_providers`), then one synchronized run; sample time /
(calls + 1). `calls` is one number for every variant of a configuration (`calibrate_calls`: the
median of several synchronized runs of each variant, the slowest one sets it), so every variant is
timed over the same number of runs: a per-variant count rounds differently near the sample length
(0 calls for one variant, 1 for another) and biases one side of a ratio by several percent.
Rounds run every variant once, the order rotated every round.
"""

from __future__ import annotations

import time

import numpy as np

from onnx_lnfold.bench.process import rotated

CALIBRATION_RUNS = 5   # synchronized runs per variant that set `calls`
MAX_CALLS = 200


def bind(sess, device_feeds: dict, device: str):
    """An IO binding of `sess`: its inputs the OrtValues given, its outputs on `device`."""
    io = sess.io_binding()
    for name, value in device_feeds.items():
        io.bind_ortvalue_input(name, value)
    for out in sess.get_outputs():
        io.bind_output(out.name, device, 0)
    return io


class Timed:
    """One session with its inputs and outputs bound on the device (`device.ort` is onnxruntime,
    `device.ort_device` where tensors live: "cpu", "cuda")."""

    def __init__(self, device, sess, device_feeds: dict):
        self.sess, self.io = sess, bind(sess, device_feeds, device.ort_device)
        self.async_opts = device.ort.RunOptions()
        self.async_opts.add_run_config_entry("disable_synchronize_execution_providers", "1")
        self.runs = 0  # Run() calls so far: the index of the next `model_run` event in the profile

    def run_sync(self) -> None:
        self.sess.run_with_iobinding(self.io)
        self.runs += 1

    def sample(self, calls: int) -> float:
        t0 = time.perf_counter()
        for _ in range(calls):
            self.sess.run_with_iobinding(self.io, self.async_opts)
        self.sess.run_with_iobinding(self.io)  # synchronizes the device: every queued run has finished
        self.runs += calls + 1
        return (time.perf_counter() - t0) / (calls + 1)

    def outputs(self) -> list[np.ndarray]:
        return self.io.copy_outputs_to_cpu()


def calibrate_calls(timed: dict[str, Timed], sample_ms: float, warmup: int, runs: int = CALIBRATION_RUNS) -> dict:
    """The one `calls` count of a configuration: warm-up, then `runs` synchronized runs of every
    variant in rotated order; the slowest variant's median sets how many runs fill `sample_ms`."""
    for t in timed.values():
        for _ in range(max(1, warmup)):
            t.run_sync()
    names = list(timed)
    per: dict[str, list[float]] = {k: [] for k in names}
    for r in range(max(1, runs)):
        for k in rotated(names, r):
            t0 = time.perf_counter()
            timed[k].run_sync()
            per[k].append(time.perf_counter() - t0)
    run_s = {k: float(np.median(v)) for k, v in per.items()}
    slowest = max(run_s, key=run_s.get)
    calls = int(min(MAX_CALLS, max(0, round(sample_ms / 1e3 / max(run_s[slowest], 1e-9)) - 1)))
    return {"calls": calls, "slowest": slowest, "calibration_runs": runs,
            "run_ms": {k: v * 1e3 for k, v in run_s.items()}}


def interleave(timed: dict[str, Timed], calls: int, min_rounds: int, max_rounds: int,
               budget_s: float) -> dict[str, np.ndarray]:
    """Wall-clock samples, every variant once per round, the order rotated each round, every
    variant with the same `calls`; at least two rounds, so each variant is timed in two positions."""
    names = list(timed)
    samples: dict[str, list[float]] = {k: [] for k in names}
    t_start, r = time.perf_counter(), 0
    min_rounds = max(2, min_rounds)
    while r < max(max_rounds, min_rounds) and (r < min_rounds or time.perf_counter() - t_start < budget_s):
        for k in rotated(names, r):
            samples[k].append(timed[k].sample(calls))
        r += 1
    return {k: np.array(v) for k, v in samples.items()}
