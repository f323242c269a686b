"""The model an ONNX Runtime CPU session writes back after its graph optimizations, for a weightless
copy (`ort_fusions.probe`) and for the profiled sessions of `bench`: its initializers go to the file
`data_name` beside it (a link to /dev/null, `discard_weights`: only the graph is read back), and,
for the copy, no weight is prepacked.

Writing the optimized model copies every initializer through fresh memory, so on a model of many GB
the session's time is mostly the kernel faulting in and zeroing that memory page by page, 4 KB at a
time. `probe` runs it in a child process of its own for large copies, with glibc's allocator told to
ask for transparent huge pages (`HUGE_PAGES_ENV`): the same graph, written in about half the time.
This module imports onnxruntime and the standard library alone, so that the child, which need not
find the package, runs it by its path.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path

# glibc (2.35 and later; older ones ignore it) madvises its large allocations for transparent huge pages.
HUGE_PAGES_ENV = ("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1")


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
