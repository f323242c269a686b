"""What a timing shares with the fresh process that runs it (`runner`): the session options, where
a provider keeps its tensors, the order of a round, and `run_child`, which starts that process on
one plan. `compare` (the bench) and `calibrate` (cost tables) time through it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from onnx_lnfold.bench.placement import PlacementError

# Where a provider keeps its tensors, for IO binding (onnxruntime's OrtValue device names).
DEVICE_OF = {"CUDAExecutionProvider": "cuda"}


def session_options(threads: int, profile: str | None = None, optimize: bool = True):
    """Level ALL (`optimize`; else none), `threads` intra-op threads, one inter-op thread, spinning
    off (several sessions share the cores in one process), onnxruntime's own log quiet."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize
                                   else ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.log_severity_level = 3
    if profile:
        so.enable_profiling = True
        so.profile_file_prefix = profile
    return so


def rotated(names: list[str], r: int) -> list[str]:
    i = r % len(names)
    return names[i:] + names[:i]


class ChildFailed(RuntimeError):
    """A timing process ended with an error: its last lines say which."""


def run_child(plan: dict, work: Path, tag: str) -> dict:
    """Run one plan in a fresh Python process (this package's, whatever the caller's path is)."""
    path = work / f"plan.{tag}.json"
    path.write_text(json.dumps(plan))
    package_parent = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package_parent, os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-m", "onnx_lnfold.bench.runner", str(path)], capture_output=True,
                          text=True, env=env)
    last = proc.stdout.strip().splitlines()[-1:]
    if proc.returncode == 3 and last and last[0].startswith('{"placement_error"'):
        raise PlacementError(json.loads(last[0])["placement_error"])
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
        raise ChildFailed(f"{tag}: {lines[-1] if lines else f'exit {proc.returncode}'}")
    return json.loads(proc.stdout.strip().splitlines()[-1])
