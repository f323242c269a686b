"""One fresh process of a timing: `python -m onnx_lnfold.bench.runner PLAN.json`, as
`process.run_child` starts it.

A plan (JSON) names the model files by variant, the inputs (.npz), the order the sessions are
created in, the rounds, warm-up runs, intra-op threads and the execution provider. Mode "time":
every session created in that order, warmed up, then run in interleaved rounds, the order rotated
every round; it prints the wall time of every run. Mode "profile": one variant with ONNX Runtime's
profiler on; it prints the profile's path, and writes the graph the session runs where the plan
names a file for it ("optimized"). Sessions run on the provider asked for and no other
(`placement`); on a provider with its own memory the inputs and outputs are bound there (IO
binding), so a run times the model, not copies to and from the host.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

from onnx_lnfold.bench.calibrate import measure_child
from onnx_lnfold.bench.placement import CPU, PlacementError, create_session
from onnx_lnfold.bench.process import DEVICE_OF, rotated, session_options
from onnx_lnfold.ort_fusions import session_save


class Runner:
    """One session and its inputs: `run()` is one synchronized Run()."""

    def __init__(self, ort, path: str, feeds: dict[str, np.ndarray], plan: dict, label: str, profile: str | None = None,
                 optimized: str | None = None):
        provider = plan.get("provider", CPU)
        options = session_options(plan["threads"], profile)
        if optimized:
            session_save.write_back(options, optimized, session_save.discard_weights(Path(optimized)))
        self.sess = create_session(ort, path, options, provider, plan.get("provider_options"), label)
        device = DEVICE_OF.get(provider)
        if device is None:
            self.feeds = feeds
            self.run = lambda: self.sess.run(None, self.feeds)
        else:
            io = self.sess.io_binding()
            for name, array in feeds.items():
                io.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array), device, 0))
            for out in self.sess.get_outputs():
                io.bind_output(out.name, device, 0)
            self.run = lambda: self.sess.run_with_iobinding(io)


def child(plan_path: str) -> int:
    try:
        return _child(plan_path)
    except PlacementError as e:  # one line the parent raises again: nothing is timed elsewhere
        print(json.dumps({"placement_error": str(e)}))
        return 3


def _preload(ort, provider: str) -> None:
    """A GPU provider's libraries (CUDA, cuDNN) from the `nvidia` packages, where onnxruntime can load
    them (`preload_dlls`, onnxruntime >= 1.21); LD_LIBRARY_PATH or the system otherwise."""
    if provider in DEVICE_OF and hasattr(ort, "preload_dlls"):
        try:
            ort.preload_dlls()
        except Exception:  # noqa: BLE001 - the session says what is missing, if anything is
            pass


def _child(plan_path: str) -> int:
    import onnxruntime as ort

    plan = json.loads(Path(plan_path).read_text())
    _preload(ort, plan.get("provider", CPU))
    if plan["mode"] == "calibrate":
        return measure_child(plan)
    with np.load(plan["feeds"]) as z:
        feeds = {k: z[k] for k in z.files}
    order = plan["order"]
    if plan["mode"] == "profile":  # one variant, profiled
        runner = Runner(ort, plan["files"][order[0]], feeds, plan, order[0], profile=plan["profile"],
                        optimized=plan.get("optimized"))
        for _ in range(plan["warmup"] + plan["rounds"]):
            runner.run()
        print(json.dumps({"profile": runner.sess.end_profiling(), "providers": runner.sess.get_providers()}))
        return 0
    runners = {v: Runner(ort, plan["files"][v], feeds, plan, v) for v in order}  # created in the rotated order
    for _ in range(plan["warmup"]):
        for v in order:
            runners[v].run()
    times: dict[str, list[float]] = {v: [] for v in order}
    for r in range(plan["rounds"]):
        for v in rotated(order, r):
            t0 = time.perf_counter()
            runners[v].run()
            times[v].append(time.perf_counter() - t0)
    print(json.dumps({"times": times}))
    return 0


if __name__ == "__main__":
    raise SystemExit(child(sys.argv[1]))
