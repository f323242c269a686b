"""The model an ONNX Runtime CPU session writes back after its graph optimizations, for a weightless
copy (`ort_fusions.probe`) and for the profiled sessions of `bench`: its initializers go to the file
`data_name` beside it (a link to /dev/null, `discard_weights`: only the graph is read back), and,
for the copy, no weight is prepacked.

Writing the optimized model reads every initializer into a fresh buffer, so on a model of many GB
the session's time was mostly the kernel handing out and zeroing new pages, tensor after tensor.
`probe` runs it in a child process of its own for large copies, with glibc's allocator told to
keep what it frees (`ALLOCATOR_TUNABLES`): each initializer's buffer reuses the pages of the one
before (`python -m benchmarks.weightless_session` measures it).
This module imports onnxruntime and the standard library alone, so that the child, which need not
find the package, runs it by its path.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path

# glibc's allocator in the child (2.26 and later; older ones ignore it): no allocation of its own
# mapping (`mmap_max=0`: a freed one would go back to the kernel) and the heap never trimmed, so
# the next initializer's buffer reuses the pages of the last instead of faulting in zeroed ones.
ALLOCATOR_TUNABLES = ("glibc.malloc.mmap_max=0", f"glibc.malloc.trim_threshold={1 << 46}")


def child_env(environ: dict[str, str]) -> dict[str, str]:
    """`environ` with `ALLOCATOR_TUNABLES` added to the tunables it already sets (theirs win)."""
    given = [t for t in environ.get("GLIBC_TUNABLES", "").split(":") if t]
    names = {t.split("=", 1)[0] for t in given}
    ours = [t for t in ALLOCATOR_TUNABLES if t.split("=", 1)[0] not in names]
    return {**environ, "GLIBC_TUNABLES": ":".join(ours + given)}


def discard_weights(optimized: Path) -> str:
    """The name of the file a session writing back `optimized` puts its initializers in
    (`write_back`), made a link to /dev/null where links are possible: only the graph is read."""
    data_name = f"{optimized.name}.data"
    sink = optimized.with_name(data_name)
    if os.path.exists(os.devnull) and not sink.exists():
        with contextlib.suppress(OSError):
            sink.symlink_to(os.devnull)
    return data_name


def write_back(options, optimized: str, data_name: str) -> None:
    """Have the session of `options` write its optimized model to `optimized`, every initializer
    over 1 KB in the file `data_name` beside it (a graph over 2 GB cannot be one protobuf)."""
    options.optimized_model_filepath = optimized
    options.add_session_config_entry("session.optimized_model_external_initializers_file_name", data_name)
    options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")


def child_command(job: list) -> list[str]:
    """The command that runs `write_optimized(*job)` in a child process (this file, by its path)."""
    return [sys.executable, os.path.abspath(__file__), json.dumps(job)]


def write_optimized(path: str, optimized: str, data_name: str, level: str, disabled: list[str]) -> None:
    """Optimize `path` in a CPU session at `level` (a GraphOptimizationLevel name), `disabled`
    optimizers off, and write the result to `optimized`, its initializers to `data_name`."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    options.log_severity_level = 3
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    write_back(options, optimized, data_name)
    options.add_session_config_entry("session.disable_prepacking", "1")
    kwargs = {"disabled_optimizers": list(disabled)} if disabled else {}
    ort.InferenceSession(path, options, providers=["CPUExecutionProvider"], **kwargs)


if __name__ == "__main__":
    try:
        write_optimized(*json.loads(sys.argv[1]))
    except Exception as error:  # noqa: BLE001 - the parent raises it again, named
        print(f"{type(error).__name__}: {error}", file=sys.stderr)
        sys.exit(1)
