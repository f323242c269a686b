"""Every target's fold in the runtimes users run ONNX models on: does it load, is it exact there,
which normalization kernel runs, and is it ever slower than the original there.

    python -m benchmarks.runtimes [--models gpt2 vit ...] [--runtimes ...] [--processes 2]
                                  [--seconds 12] [--threads 1] [--out benchmarks/results/runtimes]
    LNFOLD_TRAINED_DIR=/path/to/trained  python -m benchmarks.runtimes     # the real trained models too
    LNFOLD_ORT_OPENVINO_PYTHON=/venv/bin/python python -m benchmarks.runtimes   # ONNX Runtime's OpenVINO EP

The runtimes (`RUNTIMES`): ONNX Runtime's CPU EP (ORT_ENABLE_ALL, spinning off); OpenVINO's CPU
plugin with `INFERENCE_PRECISION_HINT f32` and at its default precision (bf16 on CPUs with bf16
units); ONNX Runtime's OpenVINO execution provider (CPU, FP32), from the `onnxruntime-openvino`
wheel, which replaces the `onnxruntime` package it installs into: it runs from its own virtual
environment (`--ort-openvino-python`, or LNFOLD_ORT_OPENVINO_PYTHON), and is left out without one.

The variants of each model: the original and its fold for each target (`python -m onnx_lnfold
--target T --inputs FEEDS`: verified in ONNX Runtime and float64 before it is written). The
committed models run on their own `models/NAME.inputs.npz`; the trained ones (benchmarks/trained.py's
`MODELS`, from LNFOLD_TRAINED_DIR) at the shapes they run.

Per runtime and model, each of `--processes` fresh processes loads every variant (in an order
rotated from process to process), reads the kernels the runtime chose (OpenVINO's runtime model:
its `RMS` and `MVN` layers; ONNX Runtime's optimized graph: its normalization ops; the OpenVINO
EP: which nodes it left to ONNX Runtime's CPU EP), runs each once for its outputs, warms up, then
times interleaved rounds (every variant once per round, the order rotated each round) for about
`--seconds`. A ratio original / folded > 1: the fold is faster. Each process gives the ratio of
its medians with a paired bootstrap 95% interval over its rounds; a figure is the median over
processes with the range over them. A cell is "slower" when every process's interval lies below
1, "faster" when every one lies above, else the difference is not resolved. Processes are run
model by model and runtime by runtime, the k-th process of every cell before the (k+1)-th, so one
burst of load on the machine touches every cell's k-th process rather than one cell. Other
processes' CPU use during each is recorded (column `other CPU`).

Exactness: each fold's outputs against the original's in the same runtime and precision
(max |diff| / max |original|, worst output); at a reduced precision (OpenVINO's default) beside
the original's own distance from ONNX Runtime's fp32 run, the precision's noise.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "runtimes"
WORK = ROOT / "benchmarks" / "cache" / "runtimes"
TARGETS = ("ort", "onnx", "primitive")
COMMITTED = ("gpt2", "vit", "whisper_encoder")
TRAINED = ("whisper_encoder_dynamo", "whisper_decoder_prompt", "dinov2_vits14", "ppocrv5_rec")

# name: (kind, settings, what it is)
RUNTIMES: dict[str, tuple[str, dict, str]] = {
    "onnxruntime-cpu": ("ort", {}, "ONNX Runtime, CPU EP, ORT_ENABLE_ALL"),
    "openvino-cpu-f32": ("openvino", {"INFERENCE_PRECISION_HINT": "f32"}, "OpenVINO CPU plugin, f32 inference precision"),
    "openvino-cpu-default": ("openvino", {}, "OpenVINO CPU plugin, its default inference precision"),
    "onnxruntime-openvino-ep": ("ort-openvino", {"device_type": "CPU", "precision": "FP32"},
                                "ONNX Runtime's OpenVINO EP, CPU, FP32 (onnxruntime-openvino, own venv)"),
    # Another OpenVINO release from its own venv (--other-openvino-python): the one
    # onnxruntime-openvino bundles, say, to tell what that EP does from what OpenVINO does.
    "other-openvino-cpu-f32": ("openvino", {"INFERENCE_PRECISION_HINT": "f32"},
                               "OpenVINO CPU plugin of --other-openvino-python, f32 inference precision"),
}
# The runtimes that run in a venv of their own, by the option naming its python.
OWN_PYTHON = {"onnxruntime-openvino-ep": "ort_openvino_python", "other-openvino-cpu-f32": "other_openvino_python"}
ORT_NORM_OPS = ("LayerNormalization", "SkipLayerNormalization", "SimplifiedLayerNormalization",
                "SkipSimplifiedLayerNormalization", "RMSNormalization")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- #
# Child: one fresh process, one runtime, every variant of one model
# --------------------------------------------------------------------------- #
def _ort_options(threads: int):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.add_session_config_entry("session.inter_op.allow_spinning", "0")
    so.log_severity_level = 3
    return so


def _ort_kernels(path: str, threads: int, work: str) -> dict[str, int]:
    """The normalization ops of ONNX Runtime's optimized graph (a separate session)."""
    import onnx
    import onnxruntime as ort

    so = _ort_options(threads)
    optimized = os.path.join(work, f"optimized.{os.getpid()}.onnx")
    so.optimized_model_filepath = optimized
    ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    ops = [n.op_type for n in onnx.load(optimized, load_external_data=False).graph.node]
    for leftover in Path(work).glob(f"optimized.{os.getpid()}.onnx*"):
        leftover.unlink()
    return {op: ops.count(op) for op in ORT_NORM_OPS if ops.count(op)}


def _ep_placement(path: str, settings: dict, threads: int, feeds: dict, work: str) -> dict[str, int]:
    """The nodes the OpenVINO EP left to ONNX Runtime's CPU EP, by op type (from a profiled run)."""
    import onnxruntime as ort

    so = _ort_options(threads)
    so.enable_profiling = True
    so.profile_file_prefix = os.path.join(work, f"placement.{os.getpid()}")
    sess = ort.InferenceSession(path, so, providers=[("OpenVINOExecutionProvider", settings)])
    sess.run(None, feeds)
    profile = sess.end_profiling()
    events = json.loads(Path(profile).read_text())
    os.remove(profile)
    on_cpu: dict[str, int] = {}
    for e in events:
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time"):
            args = e.get("args", {})
            if args.get("provider") == "CPUExecutionProvider":
                on_cpu[args.get("op_name", "?")] = on_cpu.get(args.get("op_name", "?"), 0) + 1
    return on_cpu


def _load(kind: str, settings: dict, path: str, threads: int):
    """A callable that runs the model on feeds and returns its outputs, and a kernel census thunk."""
    if kind == "openvino":
        import openvino as ov

        config = {"INFERENCE_NUM_THREADS": threads, "NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY", **settings}
        compiled = ov.Core().compile_model(path, "CPU", config)
        request = compiled.create_infer_request()

        def run(feeds):
            request.infer(feeds)
            return [np.array(request.get_output_tensor(i).data) for i in range(len(compiled.outputs))]

        def census(feeds, work):
            types = [op.get_rt_info()["layerType"].astype(str) for op in compiled.get_runtime_model().get_ops()]
            return {t: types.count(t) for t in ("RMS", "MVN") if types.count(t)}

        return run, census
    import onnxruntime as ort

    if kind == "ort":
        sess = ort.InferenceSession(path, _ort_options(threads), providers=["CPUExecutionProvider"])
        return (lambda feeds: sess.run(None, feeds)), (lambda feeds, work: _ort_kernels(path, threads, work))
    ep = {**settings, "num_of_threads": str(threads)}
    sess = ort.InferenceSession(path, _ort_options(threads), providers=[("OpenVINOExecutionProvider", ep)])
    if "OpenVINOExecutionProvider" not in sess.get_providers():
        raise RuntimeError("the OpenVINO EP is not available in this onnxruntime")
    return (lambda feeds: sess.run(None, feeds)), (lambda feeds, work: {"on ORT's CPU EP": _ep_placement(path, ep, threads, feeds, work)})


def _reason(error: Exception) -> str:
    """The line of a runtime's refusal that says what failed (OpenVINO's first lines are file
    locations of the exception's way up)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    telling = [line for line in lines if not line.startswith(("Exception from", "Check 'false' failed"))]
    return f"{type(error).__name__}: {(telling or lines or [''])[-1]}"[:300]


def child(plan_path: str) -> int:
    plan = json.loads(Path(plan_path).read_text())
    with np.load(plan["feeds"]) as z:
        feeds = {k: z[k] for k in z.files}
    kind, settings = plan["kind"], plan["settings"]
    order = plan["order"]
    report: dict = {"variants": {}}
    runners = {}
    for variant in order:
        entry: dict = {}
        started = time.perf_counter()
        try:
            run, census = _load(kind, settings, plan["files"][variant], plan["threads"])
            outputs = run(feeds)
        except Exception as e:  # noqa: BLE001 - a runtime's refusal is a result
            entry.update(loads=False, error=_reason(e))
            report["variants"][variant] = entry
            continue
        entry.update(loads=True, load_s=time.perf_counter() - started)
        if plan["census"]:
            entry["kernels"] = census(feeds, plan["work"])
            np.savez(Path(plan["outputs"]) / f"{variant}.npz", *[np.asarray(o) for o in outputs])
        runners[variant] = run
        report["variants"][variant] = entry
    loaded = [v for v in order if v in runners]
    for _ in range(plan["warmup"]):
        for v in loaded:
            runners[v](feeds)
    times: dict[str, list[float]] = {v: [] for v in loaded}
    deadline = time.perf_counter() + plan["seconds"]
    rounds = 0
    while loaded and (rounds < plan["min_rounds"] or (time.perf_counter() < deadline and rounds < plan["max_rounds"])):
        for v in loaded[rounds % len(loaded):] + loaded[: rounds % len(loaded)]:
            t0 = time.perf_counter()
            runners[v](feeds)
            times[v].append(time.perf_counter() - t0)
        rounds += 1
    report["times"] = times
    print(json.dumps(report))
    return 0


def instruction_child(plan_path: str) -> int:
    """Under callgrind (`--instr-atstart=no`): load and warm every variant uninstrumented, switch
    instrumentation on, then per variant a segment of N runs and one of 2N, each between
    `os.getpgrp()` (counters zeroed) and `os.getsid(0)` (counters dumped), as benchmarks/instructions.py."""
    import gc

    plan = json.loads(Path(plan_path).read_text())
    with np.load(plan["feeds"]) as z:
        feeds = {k: z[k] for k in z.files}
    runners = []
    for variant in plan["order"]:
        run, _ = _load(plan["kind"], plan["settings"], plan["files"][variant], 1)
        run(feeds)
        run(feeds)
        runners.append(run)
    gc.collect()
    gc.disable()
    ctl = subprocess.run(["callgrind_control", "-i", "on", str(os.getpid())], capture_output=True, text=True)
    if ctl.returncode != 0:
        print(f"callgrind_control failed: {ctl.stderr.strip()}", file=sys.stderr)
        return 3
    runs = plan["runs"]
    for run in runners:
        for count in (runs, 2 * runs):
            os.getpgrp()
            for _ in range(count):
                run(feeds)
            os.getsid(0)
    return 0


def count_instructions(model: dict, runtime: str, order: list[str], runs: int, tag: str) -> dict[str, float]:
    """Instructions per run of each variant in one valgrind process: (I(2N) - I(N)) / N."""
    kind, settings, _ = RUNTIMES[runtime]
    prefix = WORK / f"cg.{tag}"
    for old in WORK.glob(f"cg.{tag}.*"):
        old.unlink()
    plan = WORK / f"plan.{tag}.json"
    plan.write_text(json.dumps({"kind": kind, "settings": settings, "files": model["files"], "feeds": model["feeds"],
                                "order": order, "runs": runs}))
    env = dict(os.environ, PYTHONHASHSEED="0", OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--separate-threads=yes", "--zero-before=getpgrp",
           "--dump-before=getsid", f"--callgrind-out-file={prefix}", sys.executable, "-m", "benchmarks.runtimes",
           "--instruction-child", str(plan)]
    if shutil.which("setarch"):
        cmd = ["setarch", os.uname().machine, "-R"] + cmd
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    plan.unlink()
    if proc.returncode != 0:
        raise RuntimeError(f"valgrind child failed for {tag}: {proc.stderr.strip()[-600:]}")
    from benchmarks.common import callgrind_dump_totals

    totals = callgrind_dump_totals(prefix)
    for old in WORK.glob(f"cg.{tag}.*"):
        old.unlink()
    if len(totals) != 2 * len(order):
        raise RuntimeError(f"{tag}: expected {2 * len(order)} callgrind dumps, found {len(totals)}")
    return {v: (totals[2 * i + 1] - totals[2 * i]) / runs for i, v in enumerate(order)}


def instructions(models: list[dict], runtimes: list[str], args) -> dict:
    """Per model and runtime (those valgrind can run: ONNX Runtime's CPU EP and OpenVINO at f32),
    instructions per run of each variant in `args.processes` valgrind processes (the variants'
    order rotated), and the ratio original / folded per process."""
    out: dict = {}
    for model in models:
        for runtime in runtimes:
            if runtime not in ("onnxruntime-cpu", "openvino-cpu-f32"):
                continue
            variants = list(model["files"])
            counts: dict[str, list[float]] = {v: [] for v in variants}
            for k in range(args.processes):
                order = variants[k % len(variants):] + variants[: k % len(variants)]
                log(f"instructions: {model['name']} on {runtime}, process {k + 1}/{args.processes}")
                got = count_instructions(model, runtime, order, args.instruction_runs, f"{model['name']}.{runtime}.{k}")
                for v, n in got.items():
                    counts[v].append(n)
            ratios = {v: [o / f for o, f in zip(counts["original"], counts[v])] for v in variants if v != "original"}
            out.setdefault(model["name"], {})[runtime] = {"per_run": counts, "original/folded": ratios}
    return out


# --------------------------------------------------------------------------- #
# Parent
# --------------------------------------------------------------------------- #
def _trained_dir() -> Path:
    return Path(os.environ.get("LNFOLD_TRAINED_DIR") or ROOT / "models" / "trained")


def model_source(name: str) -> tuple[Path, str, dict[str, np.ndarray]]:
    """(file, what it is, feeds)."""
    if name in COMMITTED:
        path = ROOT / "models" / f"{name}.onnx"
        with np.load(ROOT / "models" / f"{name}.inputs.npz") as z:
            feeds = {k: z[k] for k in z.files}
        return path, f"models/{name}.onnx (committed, {'x'.join(map(str, next(iter(feeds.values())).shape))} input)", feeds
    from benchmarks.trained import MODELS

    file, what, make_feeds = MODELS[name]
    return _trained_dir() / file, what, make_feeds()


def prepare(name: str, targets: list[str], work: Path) -> dict:
    """The original, each target's fold of it (verified), the feeds; what each fold did."""
    src, what, feeds = model_source(name)
    folder = work / name
    folder.mkdir(parents=True, exist_ok=True)
    feeds_path = folder / "feeds.npz"
    np.savez(feeds_path, **feeds)
    files, folds = {"original": str(src)}, {}
    for target in targets:
        out, report = folder / f"{name}.{target}.onnx", folder / f"{name}.{target}.json"
        if not (out.exists() and report.exists()):
            log(f"fold {name} --target {target}")
            proc = subprocess.run([sys.executable, "-m", "onnx_lnfold", str(src), "-o", str(out), "--target", target,
                                   "--inputs", str(feeds_path), "-q", "--json", str(report)],
                                  cwd=ROOT, capture_output=True, text=True)
            if proc.returncode != 0:
                folds[target] = {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "failed"}
                continue
        data = json.loads(report.read_text())
        folds[target] = {"folded": data["folded"], "layer_norms": data["layer_norms"],
                         "verification": data["verification"]["status"]}
        files[target] = str(out)
    return {"name": name, "what": what, "files": files, "folds": folds, "feeds": str(feeds_path), "folder": str(folder)}


def _run_child(python: str, plan: dict, tag: str) -> dict:
    from benchmarks.common import CpuMonitor

    path = Path(plan["work"]) / f"plan.{tag}.json"
    path.write_text(json.dumps(plan))
    monitor = CpuMonitor()
    proc = subprocess.run([python, "-m", "benchmarks.runtimes", "--child", str(path)], cwd=ROOT,
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    other = monitor.foreign()
    path.unlink()
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["failed"])[-1][:300]}
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["other_cpu"] = other
    return out


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    scale = float(np.abs(b).max()) if b.size else 0.0
    return float(np.abs(a - b).max() / scale) if scale else float(np.abs(a - b).max() if a.size else 0.0)


def _outputs(folder: Path, variant: str) -> list[np.ndarray] | None:
    path = folder / f"{variant}.npz"
    if not path.exists():
        return None
    with np.load(path) as z:
        return [z[f"arr_{i}"] for i in range(len(z.files))]


def _worst(outputs, reference) -> float | None:
    if outputs is None or reference is None:
        return None
    return max((_rel(o, r) for o, r in zip(outputs, reference)), default=0.0)


def summarize(cell_runs: list[dict], variants: list[str]) -> dict:
    """Per target: the ratio original / folded of every process, its interval, their median and range."""
    from benchmarks.common import ratio_of_medians

    out = {}
    for target in variants:
        if target == "original":
            continue
        per = []
        for run in cell_runs:
            times = run.get("times", {})
            if "original" in times and target in times and times[target]:
                r = ratio_of_medians(np.array(times["original"]), np.array(times[target]))
                per.append({**r, "other_cpu": run.get("other_cpu")})
        if not per:
            continue
        ratios = [p["ratio"] for p in per]
        verdict = "slower" if all(p["hi"] < 1 for p in per) else "faster" if all(p["lo"] > 1 for p in per) else "not resolved"
        out[target] = {"ratio": float(np.median(ratios)), "min": min(ratios), "max": max(ratios), "per_process": per,
                       "verdict": verdict}
    return out


def measure(models: list[dict], runtimes: list[str], args) -> list[dict]:
    from benchmarks.common import wait_for_quiet

    cells = []
    for model in models:
        for runtime in runtimes:
            outputs = Path(model["folder"]) / f"outputs.{runtime}"
            outputs.mkdir(exist_ok=True)
            cells.append({"model": model, "runtime": runtime, "runs": [], "outputs": str(outputs)})
    variants_of = {id(c): list(c["model"]["files"]) for c in cells}
    for k in range(args.processes):
        for cell in cells:
            kind, settings, _ = RUNTIMES[cell["runtime"]]
            python = getattr(args, OWN_PYTHON[cell["runtime"]]) if cell["runtime"] in OWN_PYTHON else sys.executable
            variants = variants_of[id(cell)]
            order = variants[k % len(variants):] + variants[: k % len(variants)]
            if args.wait_quiet:
                wait_for_quiet(args.wait_quiet)
            log(f"{cell['model']['name']} on {cell['runtime']}: process {k + 1}/{args.processes}")
            plan = {"kind": kind, "settings": settings, "files": cell["model"]["files"], "feeds": cell["model"]["feeds"],
                    "order": order, "threads": args.threads, "warmup": args.warmup, "seconds": args.seconds,
                    "min_rounds": args.min_rounds, "max_rounds": args.max_rounds, "census": k == 0,
                    "outputs": cell["outputs"], "work": str(WORK)}
            cell["runs"].append(_run_child(python, plan, f"{cell['model']['name']}.{cell['runtime']}.{k}"))
    return cells


def results_of(cells: list[dict]) -> list[dict]:
    reference: dict[str, list[np.ndarray] | None] = {}
    for cell in cells:
        if cell["runtime"] == "onnxruntime-cpu":
            reference[cell["model"]["name"]] = _outputs(Path(cell["outputs"]), "original")
    rows = []
    for cell in cells:
        model, first = cell["model"], (cell["runs"][0] if cell["runs"] else {})
        folder = Path(cell["outputs"])
        original = _outputs(folder, "original")
        variants = list(model["files"])
        timing = summarize(cell["runs"], variants)
        per_variant = {}
        for variant in variants:
            entry = dict(first.get("variants", {}).get(variant, {"loads": False, "error": first.get("error", "not run")}))
            entry["max_rel_vs_original"] = None if variant == "original" else _worst(_outputs(folder, variant), original)
            entry["max_rel_vs_ort_fp32"] = _worst(_outputs(folder, variant), reference.get(model["name"]))
            times = [np.median(r["times"][variant]) for r in cell["runs"] if variant in r.get("times", {})]
            entry["median_ms"] = 1e3 * float(np.median(times)) if times else None
            if variant in timing:
                entry["timing"] = timing[variant]
            per_variant[variant] = entry
        rows.append({"model": model["name"], "what": model["what"], "runtime": cell["runtime"],
                     "folds": model["folds"], "variants": per_variant,
                     "rounds": [len(next(iter(r["times"].values()), [])) for r in cell["runs"] if r.get("times")],
                     "other_cpu": [r.get("other_cpu") for r in cell["runs"]]})
    return rows


def _kernels(entry: dict) -> str:
    kernels = entry.get("kernels")
    if kernels is None:
        return "-"
    if "on ORT's CPU EP" in kernels:
        left = kernels["on ORT's CPU EP"]
        return "all in OpenVINO" if not left else "on ORT CPU: " + ", ".join(f"{k} {v}" for k, v in sorted(left.items()))
    return ", ".join(f"{k} {v}" for k, v in sorted(kernels.items())) or "none"


def _instructions(counted: dict, variant: str) -> str:
    """`12.35M per run` for the original; `x1.0042 (1.0041-1.0043)` for a fold, over processes."""
    if not counted:
        return "-"
    if variant == "original":
        return f"{np.median(counted['per_run']['original']) / 1e6:.2f}M per run"
    ratios = counted["original/folded"].get(variant)
    if not ratios:
        return "-"
    return f"x{np.median(ratios):.4f} ({min(ratios):.4f}-{max(ratios):.4f})"


def _fmt_rel(x: float | None) -> str:
    return "-" if x is None else f"{x:.1e}"


def render(rows: list[dict], command: str, machine: dict, args, instruction_commands: list[str] = ()) -> str:
    counted = "".join(f"Instructions: `{c}`  \n" for c in instruction_commands)
    lines = [
        "# The fold in each runtime: loads, exact, original / folded time",
        "",
        f"Command: `{command}`  ",
        *([counted.rstrip("\n")] if counted else []),
        f"onnx_lnfold at git {machine.get('git_commit')}, {machine.get('cpu')}, {machine.get('cores_usable')} cores usable; "
        f"{', '.join(f'{k} {v}' for k, v in machine.get('runtimes', {}).items())}  ",
        f"Run {machine.get('date')}. {args.threads} inference thread(s) everywhere; {args.processes} fresh processes per "
        f"cell, each timing every variant interleaved for about {args.seconds:g} s. A ratio > 1: the fold is faster. "
        "Ratio: median over processes (the range over processes) [each process's paired bootstrap 95% interval]; "
        "verdict: slower / faster when every process's interval says so. max rel: max |fold - original| / "
        "max |original| in that runtime, worst output; noise: the original's own distance from ONNX Runtime's fp32 run. "
        "Instructions (callgrind, one thread; OpenVINO then runs its AVX2 f32 kernels, valgrind's CPU having no "
        "AVX-512): original / folded per run, the median over valgrind processes (their range).",
        "",
    ]
    runtimes = list(dict.fromkeys(r["runtime"] for r in rows))
    for runtime in runtimes:
        lines += [f"## {runtime}: {RUNTIMES[runtime][2]}", "",
                  "| model | variant | loads | normalization kernels | max rel | original / folded | verdict | original (ms) "
                  "| other CPU | instructions: original / folded |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for row in (r for r in rows if r["runtime"] == runtime):
            other = [o for o in row["other_cpu"] if o is not None]
            other_text = f"{100 * max(other):.0f}%" if other else "-"
            counted = row.get("instructions") or {}
            for variant, entry in row["variants"].items():
                if not entry.get("loads"):
                    loads = f"no: {entry.get('error', '?')[:120]}"
                else:
                    loads = "yes"
                if variant == "original":
                    rel = f"noise {_fmt_rel(entry.get('max_rel_vs_ort_fp32'))}" if row["runtime"] != "onnxruntime-cpu" else "-"
                    ratio = verdict = "-"
                    ms = f"{entry['median_ms']:.2f}" if entry.get("median_ms") else "-"
                    label = "original"
                else:
                    fold = row["folds"].get(variant, {})
                    label = f"--target {variant} ({fold.get('folded', '?')}/{fold.get('layer_norms', '?')} folded)"
                    rel = _fmt_rel(entry.get("max_rel_vs_original"))
                    t = entry.get("timing")
                    if t:
                        spans = "; ".join(f"{p['lo']:.3f}-{p['hi']:.3f}" for p in t["per_process"])
                        ratio = f"x{t['ratio']:.3f} ({t['min']:.3f}-{t['max']:.3f}) [{spans}]"
                        verdict = t["verdict"]
                    else:
                        ratio = verdict = "-"
                    ms = ""
                lines.append(f"| {row['model'] if variant == 'original' else ''} | {label} | {loads} | {_kernels(entry)} | "
                             f"{rel} | {ratio} | {verdict} | {ms} | {other_text if variant == 'original' else ''} | "
                             f"{_instructions(counted, variant)} |")
        lines.append("")
    lines += ["## Models", ""] + [f"- {name}: {what}" for name, what in
                                  dict.fromkeys((r["model"], r["what"]) for r in rows)] + [""]
    return "\n".join(lines)


def _versions(ort_openvino_python: str | None, other_openvino_python: str | None = None) -> dict[str, str]:
    versions = {}
    for module in ("onnxruntime", "openvino"):
        try:
            versions[module] = __import__(module).__version__.split("-")[0]
        except ImportError:
            pass
    if ort_openvino_python:
        code = "import onnxruntime, pathlib; p = pathlib.Path(onnxruntime.__file__).parent / 'capi'; " \
               "print(onnxruntime.__version__, ' '.join(sorted(f.name for f in p.glob('libopenvino.so.20*'))))"
        got = subprocess.run([ort_openvino_python, "-c", code], capture_output=True, text=True).stdout.split()
        if got:
            bundled = got[1].replace("libopenvino.so.", "") if len(got) > 1 else "?"
            versions["onnxruntime-openvino"] = f"{got[0]} (OpenVINO {bundled})"
    if other_openvino_python:
        code = "import openvino; print(openvino.__version__.split('-')[0])"
        got = subprocess.run([other_openvino_python, "-c", code], capture_output=True, text=True).stdout.strip()
        versions["other openvino"] = got or "?"
    return versions


def main(argv=None) -> int:
    global WORK
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=None, choices=[*COMMITTED, *TRAINED],
                    help="default: the committed three, and the trained ones found in LNFOLD_TRAINED_DIR")
    ap.add_argument("--runtimes", nargs="+", default=None, choices=list(RUNTIMES))
    ap.add_argument("--targets", nargs="+", default=list(TARGETS), choices=list(TARGETS))
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=12.0, help="timing seconds per process (default 12)")
    ap.add_argument("--min-rounds", type=int, default=10)
    ap.add_argument("--max-rounds", type=int, default=400)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--wait-quiet", type=float, default=0, metavar="S",
                    help="wait up to S seconds before each process for other processes to use < 10%% of the CPU")
    ap.add_argument("--ort-openvino-python", default=os.environ.get("LNFOLD_ORT_OPENVINO_PYTHON"),
                    help="the python of a venv with onnxruntime-openvino (default: $LNFOLD_ORT_OPENVINO_PYTHON)")
    ap.add_argument("--other-openvino-python", default=os.environ.get("LNFOLD_OTHER_OPENVINO_PYTHON"),
                    help="the python of a venv with another openvino release (default: $LNFOLD_OTHER_OPENVINO_PYTHON)")
    ap.add_argument("--instructions-only", action="store_true",
                    help="count instructions (--instruction-runs) for --models and --runtimes and add them to the "
                    "results already in --out, keeping their timings")
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--work", default=str(WORK), help="where the folds, feeds and outputs go (default: %(default)s)")
    ap.add_argument("--report-only", action="store_true", help="rewrite the markdown from the JSON")
    ap.add_argument("--instruction-runs", type=int, default=0, metavar="N",
                    help="also count instructions per run under callgrind (ONNX Runtime CPU and OpenVINO f32; N and 2N "
                    "runs per variant, --processes valgrind processes); 0: no (default)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--instruction-child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args.child)
    if args.instruction_child:
        return instruction_child(args.instruction_child)
    out = Path(args.out)
    if args.report_only:
        data = json.loads((out / "runtimes.json").read_text())
        (out / "RUNTIMES.md").write_text(render(data["rows"], data["command"], data["machine"],
                                                argparse.Namespace(**data["args"]), data.get("instruction_commands", [])))
        return 0
    if args.processes < 2:
        print("error: --processes must be at least 2: every ratio is measured in two processes", file=sys.stderr)
        return 2
    from benchmarks.common import machine_info

    models = args.models or [*COMMITTED, *(m for m in TRAINED if _trained_file_exists(m))]
    runtimes = args.runtimes or [r for r in RUNTIMES if r not in OWN_PYTHON or getattr(args, OWN_PYTHON[r])]
    try:
        import openvino  # noqa: F401
    except ImportError:
        runtimes = [r for r in runtimes if RUNTIMES[r][0] != "openvino"]
        log("openvino is not installed here: its runtimes are left out (pip install openvino)")
    WORK = Path(args.work)
    WORK.mkdir(parents=True, exist_ok=True)
    if args.instructions_only:
        return add_instructions(out, [prepare(m, args.targets, WORK) for m in models], runtimes, args)
    env = [f"{k}={os.environ[k]}" for k in ENV_VARS if os.environ.get(k)]
    command = " ".join([*env, "python -m benchmarks.runtimes", *(argv if argv is not None else sys.argv[1:])])
    prepared = [prepare(m, args.targets, WORK) for m in models]
    cells = measure(prepared, runtimes, args)
    rows = results_of(cells)
    counted = instructions(prepared, runtimes, args) if args.instruction_runs else {}
    for row in rows:
        row["instructions"] = counted.get(row["model"], {}).get(row["runtime"])
    machine = machine_info()
    machine["runtimes"] = _versions(args.ort_openvino_python if "onnxruntime-openvino-ep" in runtimes else None,
                                    args.other_openvino_python if "other-openvino-cpu-f32" in runtimes else None)
    out.mkdir(parents=True, exist_ok=True)
    saved_args = {k: v for k, v in vars(args).items() if k not in ("child",)}
    (out / "runtimes.json").write_text(json.dumps({"command": command, "machine": machine, "args": saved_args,
                                                   "rows": rows}, indent=1, default=str) + "\n")
    (out / "RUNTIMES.md").write_text(render(rows, command, machine, args))
    log(f"wrote {out / 'RUNTIMES.md'} and runtimes.json")
    return 0


ENV_VARS = ("LNFOLD_TRAINED_DIR", "LNFOLD_ORT_OPENVINO_PYTHON", "LNFOLD_OTHER_OPENVINO_PYTHON")


def add_instructions(out: Path, models: list[dict], runtimes: list[str], args) -> int:
    """Instruction counts for `models` x `runtimes`, into the rows of an earlier run's runtimes.json."""
    path = out / "runtimes.json"
    data = json.loads(path.read_text())
    counted = instructions(models, runtimes, args)
    env = [f"{k}={os.environ[k]}" for k in ENV_VARS if os.environ.get(k)]
    command = " ".join([*env, "python -m benchmarks.runtimes", *sys.argv[1:]])
    for row in data["rows"]:
        got = counted.get(row["model"], {}).get(row["runtime"])
        if got is not None:
            row["instructions"] = got
    data.setdefault("instruction_commands", []).append(command)
    path.write_text(json.dumps(data, indent=1, default=str) + "\n")
    (out / "RUNTIMES.md").write_text(render(data["rows"], data["command"], data["machine"], argparse.Namespace(**data["args"]),
                                            data.get("instruction_commands", [])))
    return 0


def _trained_file_exists(name: str) -> bool:
    from benchmarks.trained import MODELS

    return (_trained_dir() / MODELS[name][0]).exists()


if __name__ == "__main__":
    sys.exit(main())
