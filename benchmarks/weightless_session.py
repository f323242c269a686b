"""A weightless copy's ONNX Runtime session in its child process, by the allocator settings it runs with.

    python -m benchmarks.weightless_session [--size HIDDEN:LAYERS ...] [--rounds 2] [--out benchmarks/results/weightless_session]

The fusion check runs ONNX Runtime sessions on weightless copies of the model (`ort_fusions.probe`);
each writes back its optimized model, reading every initializer (zeros) into a fresh buffer. Past
`probe.SESSION_CHILD_ABOVE_BYTES` of zeros that session runs in a child process
(`ort_fusions.session_save`). Here the child runs on a weightless copy of a GPT-2-style model of
`models/make/make_large_model.py` (its weights never drawn: the copy holds references into one
sparse file of zeros, so no size needs disk or memory), ORT_ENABLE_ALL as `probe.session_graph`
runs it, with glibc's allocator set three ways, interleaved round by round:

    shipped       `session_save.ALLOCATOR_TUNABLES`: nothing mapped on its own, the heap never trimmed
    huge pages    glibc.malloc.hugetlb=1 (what the child ran with before)
    glibc         glibc's defaults

and reports per size the child's wall time, CPU seconds and peak RSS (median [min-max] over the
rounds) and each variant's ratio to `shipped` (paired bootstrap 95% interval); `in process` is the
same session run by this process (where copies up to `SESSION_CHILD_ABOVE_BYTES` run), for the
threshold. Every variant must write the same optimized graph.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx

from benchmarks.common import MAKE_LARGE, load_script, log, machine_info, results_header
from onnx_lnfold.bench.stats import fmt_ratio, ratio_of_medians
from onnx_lnfold.ort_fusions import probe, session_save
from onnx_lnfold.ort_fusions.weightless import WeightlessFolder, weightless_clone

VARIANTS = {
    "shipped": ":".join(session_save.ALLOCATOR_TUNABLES),
    "huge pages": "glibc.malloc.hugetlb=1",
    "glibc": "",
}
DEFAULT_SIZES = ("1024:8", "2560:24", "4096:52")  # about 1, 7 and 30 GB of float32 zeros


def _graph(job: list) -> tuple[bytes, ...]:
    """The optimized graph's nodes (its initializers name each run's own data file)."""
    return tuple(n.SerializeToString() for n in onnx.load(job[1], load_external_data=False).graph.node)


def _in_child(job: list, tunables: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    if tunables:
        env["GLIBC_TUNABLES"] = tunables
    start = time.perf_counter()
    child = subprocess.Popen(session_save.child_command(job), env=env, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    if status:
        raise SystemExit(f"the session's child failed: {child.stderr.read().decode(errors='replace')[-400:]}")
    return {"wall": wall, "cpu": usage.ru_utime + usage.ru_stime, "peak_gb": usage.ru_maxrss * 1024 / 1e9}


def _in_process(job: list) -> dict:
    start, cpu = time.perf_counter(), time.process_time()
    session_save.write_optimized(*job)
    return {"wall": time.perf_counter() - start, "cpu": time.process_time() - cpu, "peak_gb": float("nan")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", action="append", help="HIDDEN:LAYERS of the GPT-2-style model (repeatable)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--in-process-up-to", type=float, default=8.0, help="also run in this process up to this many GB")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/weightless_session"))
    args = p.parse_args(argv)
    make = load_script(MAKE_LARGE)
    results = []
    for size in args.size or DEFAULT_SIZES:
        hidden, layers = (int(x) for x in size.split(":"))
        with WeightlessFolder() as folder:
            path = folder.write(weightless_clone(make.build(hidden, layers, 50257), folder), "copy.onnx")
            zeros_gb = folder.stripped_bytes / 1e9
            variants = dict(VARIANTS)
            if zeros_gb <= args.in_process_up_to:
                variants["in process"] = None
            times: dict[str, dict[str, list[float]]] = {v: {"wall": [], "cpu": [], "peak_gb": []} for v in variants}
            graphs = set()
            for r in range(args.rounds):
                for i, variant in enumerate(variants):
                    job = probe.session_job(path, folder, "ORT_ENABLE_ALL", f"r{r}v{i}")
                    got = _in_process(job) if variants[variant] is None else _in_child(job, variants[variant])
                    graphs.add(_graph(job))
                    for key, value in got.items():
                        times[variant][key].append(value)
                log(f"{zeros_gb:.1f} GB, round {r + 1}: " + ", ".join(f"{v} {times[v]['wall'][-1]:.1f} s" for v in variants))
            if len(graphs) != 1:
                raise SystemExit(f"{size}: the variants wrote different optimized graphs")
        results.append({"hidden": hidden, "layers": layers, "zeros_gb": zeros_gb, "times": times})

    def spread(values: list[float], digits: int = 1) -> str:
        if all(np.isnan(values)):
            return "-"
        return f"{np.median(values):.{digits}f} [{min(values):.{digits}f}-{max(values):.{digits}f}]"

    machine = machine_info()
    command = "python -m benchmarks.weightless_session " + " ".join(argv if argv is not None else sys.argv[1:])
    lines = results_header("weightless session", command.strip(), machine, f"{args.rounds} interleaved rounds")
    lines += [
        "| zeros | variant | wall s | CPU s | peak RSS GB | wall vs shipped | CPU vs shipped |",
        "|---|---|---|---|---|---|---|",
    ]
    for result in results:
        times = result["times"]
        base = times["shipped"]
        for variant, t in times.items():
            lines.append(
                f"| {result['zeros_gb']:.2f} GB ({result['hidden']}x{result['layers']}) | {variant} | {spread(t['wall'])} "
                f"| {spread(t['cpu'])} | {spread(t['peak_gb'], 2)} | {fmt_ratio(ratio_of_medians(t['wall'], base['wall']), 2)} "
                f"| {fmt_ratio(ratio_of_medians(t['cpu'], base['cpu']), 2)} |"
            )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "WEIGHTLESS_SESSION.md").write_text("\n".join(lines) + "\n")
    (args.out / "weightless_session.json").write_text(
        json.dumps({"machine": machine, "variants": VARIANTS, "results": results}, indent=1) + "\n"
    )
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
