"""Fold cost: wall time and peak RSS of `python -m onnx_lnfold` vs a plain onnx.load + onnx.save.

Two uses, one meter:

- on the benchmark models (`python -m benchmarks.fold_cost NAME ...`, and `benchmarks.run`): the
  three commands below on the cached export, interleaved, `reps` times each, medians. Targets:
  fold wall <= 1.5x baseline wall; fold peak RSS <= 1.2x the model file size.

      baseline     python -c "onnx.save(onnx.load(IN), OUT)"
      fold         python -m onnx_lnfold IN -o OUT --no-verify --json REPORT
      fold+verify  python -m onnx_lnfold IN -o OUT --json REPORT      (verification = difference)

- at scale (`python -m benchmarks.fold_cost --sizes 0.5,2.5,6,10 --dir DIR`): for each size a
  GPT-2-style pre-LN model with that many GB of float32 weights in external data, built once
  into DIR by `models/make/make_large_model.py`, then interleaved (the order rotated each rep):
  `onnx.load` + `onnx.save(..., save_as_external_data=True)`, the default fold (verification on)
  and `--no-verify`. Targets (issue 23): the default run peaks at <= 1.5x the weights + 0.5 GB
  and takes <= 3x the baseline. Writes FOLD_COST.md and fold_cost.json into `--out`
  (default benchmarks/results/fold_cost/), rewritten after every run.

Every measurement is one fresh subprocess started by a small launcher, which times it and
reports its own `ru_maxrss` from `os.wait4` (so a figure includes interpreter start-up and
imports, for the fold and for the baseline alike) and the peak of its whole process tree
(the fold runs ONNX Runtime's transformers optimizer in a child process on large models):
the sum of VmRSS over the tree, sampled every 20 ms, with an upper bound (the command's
ru_maxrss plus every other process's VmHWM, as if all peaked at once). Each sample also sums
the tree's RssAnon (memory the processes allocated) and RssFile (pages of mapped files: the
libraries, and weights memory-mapped to be read, which the kernel may drop but VmRSS counts);
their peaks are reported too, each its own (they need not fall on the same sample).

Also writes the folded model (NAME.lnfold.onnx, used by the latency benchmark) and the
re-saved control NAME.resaved.onnx (`onnx_ir.save(onnx_ir.load(IN))`) into the cache.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.common import (
    CACHE,
    MAKE_LARGE,
    ROOT,
    CpuMonitor,
    load_script,
    log,
    machine_info,
    results_header,
    wait_for_quiet,
)

ROUNDTRIP = "import sys, onnx; onnx.save(onnx.load(sys.argv[1]), sys.argv[2])"
IR_RESAVE = "import sys, onnx_ir as ir; ir.save(ir.load(sys.argv[1]), sys.argv[2])"

WALL_TARGET = 1.5
RSS_TARGET = 1.2


# A small launcher runs each command and reports the command's own rusage. Linux carries a process's
# peak RSS across fork/vfork + exec (the parent's high-water mark at exec time counts), so a command
# spawned straight from this (large) benchmark process would inherit our RSS; from the launcher it
# inherits only the launcher's ~10 MB, below any command's real peak. While the command runs, the
# launcher samples its process tree: VmRSS summed over the command and its descendants every 20 ms
# (the tree found anew from /proc every 0.2 s), and each descendant's VmHWM (its own peak, which
# an exec starts afresh). Each sample also sums RssAnon and RssFile over the tree, whose peaks are
# reported beside VmRSS's.
_LAUNCHER = r"""
import json, os, sys, time
out, stdout_path, stderr_path, argv = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
fa = [(os.POSIX_SPAWN_OPEN, 1, stdout_path or os.devnull, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)]
if stderr_path:
    fa.append((os.POSIX_SPAWN_OPEN, 2, stderr_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644))

def descendants(root):
    children = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open("/proc/" + name + "/stat", "rb") as f:
                    stat = f.read()
            except OSError:
                continue
            children.setdefault(int(stat[stat.rindex(b")") + 2:].split()[1]), []).append(int(name))
    found, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found

def memory(pid):
    rss = hwm = anon = mapped = 0
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
            elif line.startswith("VmHWM:"):
                hwm = int(line.split()[1]) * 1024
            elif line.startswith("RssAnon:"):
                anon = int(line.split()[1]) * 1024
            elif line.startswith("RssFile:"):
                mapped = int(line.split()[1]) * 1024
    return rss, hwm, anon, mapped

t0 = time.perf_counter()
pid = os.posix_spawn(argv[0], argv, dict(os.environ), file_actions=fa)
members, seen, hwm, tree_peak, scanned = {pid}, {pid}, {}, 0, 0.0
anon_peak = file_peak = 0
while True:
    done, status, ru = os.wait4(pid, os.WNOHANG)
    if done:
        break
    now = time.perf_counter()
    if now - scanned >= 0.2:
        members = {pid} | descendants(pid)
        seen |= members
        scanned = now
    total = anon_total = file_total = 0
    for p in list(members):
        try:
            rss, high, anon, mapped = memory(p)
        except OSError:
            members.discard(p)
            continue
        total += rss
        anon_total += anon
        file_total += mapped
        hwm[p] = max(hwm.get(p, 0), high)
    tree_peak = max(tree_peak, total)
    anon_peak = max(anon_peak, anon_total)
    file_peak = max(file_peak, file_total)
    time.sleep(0.02)
wall = time.perf_counter() - t0
os.sync()  # what the command wrote, on disk: a copy returns with much of it still in the page cache
durable = time.perf_counter() - t0
own = ru.ru_maxrss * 1024
others = [v for p, v in hwm.items() if p != pid]
with open(out, "w") as f:
    json.dump({"wall_s": wall, "durable_s": durable, "peak_rss_bytes": own, "rc": os.waitstatus_to_exitcode(status),
               "cpu_s": ru.ru_utime + ru.ru_stime,
               "tree_peak_rss_bytes": max([tree_peak, own] + others),
               "tree_peak_bound_bytes": max(tree_peak, own + sum(others)), "processes": len(seen),
               "tree_peak_rss_anon_bytes": anon_peak, "tree_peak_rss_file_bytes": file_peak}, f)
"""


def measure(cmd: list[str], stdout: Path | None = None, stderr: Path | None = None) -> dict:
    """Run `cmd` (argv[0] an absolute path); wall seconds around the command, its peak RSS (bytes,
    its own and its process tree's: `tree_peak_rss_bytes` sampled, `tree_peak_bound_bytes` an
    upper bound; the tree's sampled RssAnon and RssFile peaks, `tree_peak_rss_anon_bytes` and
    `tree_peak_rss_file_bytes`), how many processes the tree had, its CPU seconds and exit code. Its stdout goes to
    `stdout` (default: nowhere), its stderr to `stderr` (default: kept, and returned on failure)."""
    with tempfile.TemporaryDirectory(prefix="lnfold-cost-") as tmp:
        res_path = os.path.join(tmp, "r.json")
        p = subprocess.run([sys.executable, "-I", "-S", "-c", _LAUNCHER, res_path, str(stdout or ""), str(stderr or ""),
                            *cmd], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        if not os.path.exists(res_path):
            raise RuntimeError(f"launcher failed: {p.stderr.decode(errors='replace')[-2000:]}")
        res = json.loads(Path(res_path).read_text())
    if res["rc"] != 0:
        text = stderr.read_text(errors="replace") if stderr is not None and stderr.exists() else p.stderr.decode(errors="replace")
        res["stderr"] = text[-2000:]
    return res


def _clean(path: Path) -> None:
    for p in (path, Path(str(path) + ".data")):
        if p.exists():
            p.unlink()


def prepare_variants(meta: dict, cache: Path = CACHE) -> dict:
    """Folded model (CLI, no verify) and the onnx_ir re-saved control; returns paths + fold report."""
    src = Path(meta["path"])
    name = meta["name"]
    folded, report, resaved = cache / f"{name}.lnfold.onnx", cache / f"{name}.fold.json", cache / f"{name}.resaved.onnx"
    if not folded.exists() or folded.stat().st_mtime < src.stat().st_mtime or not report.exists():
        _clean(folded)
        r = measure([sys.executable, "-m", "onnx_lnfold", str(src), "-o", str(folded), "--no-verify", "-q",
                     "--json", str(report)])
        if r["rc"] != 0:
            raise RuntimeError(f"fold of {name} failed: {r.get('stderr')}")
    if not resaved.exists() or resaved.stat().st_mtime < src.stat().st_mtime:
        _clean(resaved)
        r = measure([sys.executable, "-c", IR_RESAVE, str(src), str(resaved)])
        if r["rc"] != 0:
            raise RuntimeError(f"re-save of {name} failed: {r.get('stderr')}")
    return {"original": str(src), "folded": str(folded), "resaved": str(resaved),
            "fold_report": json.loads(report.read_text())}


def fold_cost(meta: dict, reps: int = 3, cache: Path = CACHE, max_retries: int = 2,
              quiet_wait_s: float = 120.0) -> dict:
    src = Path(meta["path"])
    name = meta["name"]
    size = src.stat().st_size + (Path(str(src) + ".data").stat().st_size if Path(str(src) + ".data").exists() else 0)
    out_rt, out_f, out_fv = cache / f"{name}.cost_roundtrip.onnx", cache / f"{name}.lnfold.onnx", cache / f"{name}.cost_verify.onnx"
    rep_f, rep_fv = cache / f"{name}.fold.json", cache / f"{name}.cost_verify.json"
    cmds = {
        "roundtrip": [sys.executable, "-c", ROUNDTRIP, str(src), str(out_rt)],
        "fold": [sys.executable, "-m", "onnx_lnfold", str(src), "-o", str(out_f), "--no-verify", "-q",
                 "--json", str(rep_f)],
        "fold_verify": [sys.executable, "-m", "onnx_lnfold", str(src), "-o", str(out_fv), "-q", "--json", str(rep_fv)],
    }
    runs: dict[str, list[dict]] = {k: [] for k in cmds}
    mon = CpuMonitor()
    for i in range(reps):
        for attempt in range(1 + max_retries):  # a rep disturbed by other processes is measured again
            rep_mon = CpuMonitor()
            rep = {}
            for k, cmd in cmds.items():
                _clean({"roundtrip": out_rt, "fold": out_f, "fold_verify": out_fv}[k])  # a fresh file every time
                r = measure(cmd)
                if r["rc"] != 0:
                    raise RuntimeError(f"{k} on {name} failed (rc {r['rc']}): {r.get('stderr')}")
                rep[k] = r
            f = rep_mon.foreign()
            if f is None or f <= 0.10 or attempt == max_retries:
                break
            log(f"  fold cost {name} rep {i + 1}: other processes used {f * 100:.0f}% of the CPU; again")
            wait_for_quiet(quiet_wait_s)
        for k, r in rep.items():
            runs[k].append(r)
        log(f"  fold cost {name} rep {i + 1}/{reps}: " + ", ".join(f"{k} {v[-1]['wall_s']:.2f}s" for k, v in runs.items()))
    verify_report = json.loads(rep_fv.read_text())
    _clean(out_rt)
    _clean(out_fv)
    rep_fv.unlink(missing_ok=True)

    med = {k: float(np.median([r["wall_s"] for r in v])) for k, v in runs.items()}
    rss = {k: int(np.median([r["peak_rss_bytes"] for r in v])) for k, v in runs.items()}
    wall_ratio = med["fold"] / med["roundtrip"]
    rss_ratio = rss["fold"] / size
    return {
        "model": name,
        "file_size_bytes": size,
        "reps": reps,
        "foreign_cpu": mon.foreign(),
        "wall_s": med,
        "wall_s_all": {k: [r["wall_s"] for r in v] for k, v in runs.items()},
        "peak_rss_bytes": rss,
        "fold_vs_roundtrip_wall": wall_ratio,
        "verify_s": med["fold_verify"] - med["fold"],
        "verification": verify_report.get("verification", {}),
        "fold_rss_vs_file": rss_ratio,
        "roundtrip_rss_vs_file": rss["roundtrip"] / size,
        "wall_target_met": bool(wall_ratio <= WALL_TARGET),
        "rss_target_met": bool(rss_ratio <= RSS_TARGET),
    }


def startup_costs() -> dict:
    """Context for small models: interpreter start + imports alone (one run each)."""
    res = {}
    for k, code in (("import_onnx", "import onnx"), ("import_onnx_lnfold_cli", "import onnx_lnfold._cli")):
        r = measure([sys.executable, "-c", code])
        res[k] = {"wall_s": r["wall_s"], "peak_rss_bytes": r["peak_rss_bytes"]}
    return res


# --------------------------------------------------------------------------- #
# At scale: multi-GB external-data models (issue 23)
# --------------------------------------------------------------------------- #
GB = 1e9
ROUNDTRIP_EXTERNAL = (
    "import sys, os, onnx; onnx.save(onnx.load(sys.argv[1]), sys.argv[2], save_as_external_data=True, "
    "location=os.path.basename(sys.argv[2]) + '.data')"
)
# Past half the machine's memory `onnx.load` cannot hold the weights: the baseline is then a copy of
# the model's files, the least any tool that writes a folded model does (issue 31's yardstick).
COPY_FILES = (
    "import shutil, sys; shutil.copyfile(sys.argv[1], sys.argv[2]); "
    "shutil.copyfile(sys.argv[1] + '.data', sys.argv[2] + '.data')"
)
ROUNDTRIP_MEMORY_SHARE = 0.5
SCALE_WALL_TARGET = 3.0  # default run (verification on) <= 3x the baseline
SCALE_RSS_FACTOR, SCALE_RSS_EXTRA = 1.5, 0.5 * GB  # default run's peak <= 1.5x the weights + 0.5 GB
VARIANTS = ("baseline", "default", "no_verify")
VARIANT_TITLES = {"baseline": "onnx.load + onnx.save", "default": "fold (default, verified)",
                  "no_verify": "fold --no-verify", "copy": "copy the model's files"}

# the hidden size by the weights asked for (GB): GPT-2-like widths that grow with the model
HIDDEN_BY_SIZE = ((1.0, 768), (4.0, 1536), (8.0, 2048), (float("inf"), 2560))
MEMORY_WAIT_FROM = 5 * GB  # models with at least this many bytes of weights wait for --min-available


def config_for(size_gb: float, vocab: int = 50257, positions: int = 1024) -> dict:
    """The (hidden, layers) whose float32 weights come nearest `size_gb` GB (10^9 bytes)."""
    hidden = next(h for bound, h in HIDDEN_BY_SIZE if size_gb < bound)
    wb = load_script(MAKE_LARGE).weight_bytes
    base = wb(hidden, 0, vocab, positions)
    per_layer = wb(hidden, 1, vocab, positions) - base
    layers = max(1, round((size_gb * GB - base) / per_layer))
    return {"label": f"{size_gb:g} GB", "hidden": hidden, "layers": layers, "vocab": vocab, "positions": positions}


def model_files(path: Path) -> list[Path]:
    return [path, Path(str(path) + ".data")]


def build_model(cfg: dict, folder: Path) -> Path:
    """The model of `cfg`, built once into `folder` (in a subprocess: make_large_model streams its
    weights, a few hundred MB of memory at any size); a marker file says the build finished."""
    tag = f"h{cfg['hidden']}_l{cfg['layers']}_v{cfg['vocab']}_p{cfg['positions']}" + ("_tied" if cfg.get("tie_head") else "")
    path = folder / f"large_{tag}.onnx"
    marker = folder / f"large_{tag}.built.json"
    files = model_files(path)
    if marker.exists() and all(f.exists() for f in files):
        sizes = json.loads(marker.read_text()).get("file_bytes")
        if sizes == [f.stat().st_size for f in files]:
            return path
    folder.mkdir(parents=True, exist_ok=True)
    marker.unlink(missing_ok=True)
    log(f"building {path.name} (hidden {cfg['hidden']}, {cfg['layers']} layers, vocab {cfg['vocab']}) ...")
    started = time.perf_counter()
    cmd = [sys.executable, str(MAKE_LARGE), str(path), "--hidden", str(cfg["hidden"]), "--layers", str(cfg["layers"]),
           "--vocab", str(cfg["vocab"]), "--positions", str(cfg["positions"])] + (["--tie-head"] if cfg.get("tie_head") else [])
    subprocess.run(cmd, check=True, stdout=sys.stderr)
    log(f"  built in {time.perf_counter() - started:.0f} s")
    marker.write_text(json.dumps({"config": cfg, "file_bytes": [f.stat().st_size for f in files]}) + "\n")
    return path


def weight_bytes_of(path: Path) -> int:
    """Bytes of every initializer, read off the graph (no weight is loaded)."""
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    total = 0
    for t in proto.graph.initializer:
        count = int(np.prod(t.dims)) if len(t.dims) else 1
        total += count * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    return total


def _title(entry: dict, variant: str) -> str:
    return VARIANT_TITLES["copy" if variant == "baseline" and entry.get("baseline") == "copy" else variant]


def _meminfo(field: str) -> int:
    """Bytes of one /proc/meminfo field (0 where there is none)."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def mem_total() -> int:
    return _meminfo("MemTotal")


def mem_available() -> int:
    return _meminfo("MemAvailable")


def wait_for_memory(needed: int, max_wait_s: float) -> tuple[int, float]:
    """Wait (up to max_wait_s) until MemAvailable >= needed; (MemAvailable then, seconds waited)."""
    t0 = time.time()
    avail = mem_available()
    if avail < needed:
        log(f"  MemAvailable {avail / GB:.1f} GB < {needed / GB:.1f} GB: waiting up to {max_wait_s:.0f} s")
    while avail < needed and time.time() - t0 < max_wait_s:
        time.sleep(10)
        avail = mem_available()
    waited = time.time() - t0
    if waited > 1:
        log(f"  ... waited {waited:.0f} s: MemAvailable {avail / GB:.1f} GB")
    return avail, waited


def warm_files(path: Path) -> float:
    """Read the model's files once (unmeasured), so every run starts from the same page cache."""
    started = time.perf_counter()
    for f in model_files(path):
        with open(f, "rb", buffering=0) as fh:
            while fh.read(16 << 20):
                pass
    return time.perf_counter() - started


def _verdict(report_path: Path, stdout_path: Path) -> dict:
    """What the fold's --json report and its first line say about the verification."""
    out: dict = {}
    lines = stdout_path.read_text(errors="replace").splitlines() if stdout_path.exists() else []
    out["summary"] = next((line for line in lines if line.startswith("onnx_lnfold:")), "")
    if report_path.exists():
        rep = json.loads(report_path.read_text())
        v = rep.get("verification") or {}
        out.update({k: v.get(k) for k in ("status", "judgment", "judgment_reason", "max_rel_diff", "reason", "notes")})
        outputs = v.get("outputs") or []
        exact = [o["float64_exact"] for o in outputs if o.get("float64_exact") is not None]
        out["float64_exact"] = max(exact) if exact else None
        out["folded"], out["layer_norms"] = rep.get("folded"), rep.get("layer_norms")
        out["fold_elapsed_s"] = rep.get("elapsed_s")
    return out


def _loadavg() -> list[float]:
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return []


def scale_run(cfg: dict, folder: Path, reps: int, quiet_wait_s: float, min_available: float,
              memory_wait_s: float, entry: dict | None = None, on_run=None) -> dict:
    """One size: build (cached), then `reps` interleaved runs of each variant, into `entry`
    (filled as the runs come; `on_run()` after each)."""
    model = build_model(cfg, folder)
    weights = weight_bytes_of(model)
    files = sum(f.stat().st_size for f in model_files(model))
    entry = {} if entry is None else entry
    entry.update({"config": cfg, "model": model.name, "weight_bytes": weights, "file_bytes": files, "runs": []})
    free = shutil.disk_usage(folder).free
    if free < 1.2 * files:
        entry["error"] = f"{folder}: {free / GB:.1f} GB free, the output needs about {1.2 * files / GB:.1f} GB"
        log("  " + entry["error"])
        return entry
    out = folder / "cost_out.onnx"
    report, stdout, stderr = folder / "cost_report.json", folder / "cost_stdout.txt", folder / "cost_stderr.txt"
    fold = [sys.executable, "-m", "onnx_lnfold", str(model), "-o", str(out), "--json", str(report)]
    entry["baseline"] = "copy" if weights > ROUNDTRIP_MEMORY_SHARE * mem_total() else "roundtrip"
    baseline = COPY_FILES if entry["baseline"] == "copy" else ROUNDTRIP_EXTERNAL
    cmds = {"baseline": [sys.executable, "-c", baseline, str(model), str(out)],
            "default": fold, "no_verify": [*fold, "--no-verify"]}
    entry["warm_read_s"] = warm_files(model)
    for rep in range(reps):
        order = VARIANTS[rep % 3:] + VARIANTS[:rep % 3]
        for variant in order:
            for f in (*model_files(out), report, stdout, stderr):
                f.unlink(missing_ok=True)
            avail, waited = (mem_available(), 0.0)
            if weights >= MEMORY_WAIT_FROM and min_available > 0:
                avail, waited = wait_for_memory(int(min_available), memory_wait_s)
            quiet = wait_for_quiet(quiet_wait_s) if quiet_wait_s > 0 else None
            os.sync()
            load_before = _loadavg()
            mon = CpuMonitor()
            r = measure(cmds[variant], stdout=stdout, stderr=stderr)
            r.update({"variant": variant, "rep": rep + 1, "foreign_cpu": mon.foreign(), "loadavg_before": load_before,
                      "loadavg_after": _loadavg(), "mem_available_before": avail, "memory_wait_s": waited,
                      "other_cpu_before": quiet, "output_written": out.exists()})
            if variant != "baseline":
                r["verdict"] = _verdict(report, stdout)
            if r["rc"] != 0 and "stderr" not in r:
                r["stderr"] = stderr.read_text(errors="replace")[-2000:] if stderr.exists() else ""
            entry["runs"].append(r)
            entry["summary"] = summarize(entry)
            log(f"  {cfg['label']} rep {rep + 1}/{reps} {variant:9s} rc {r['rc']} {r['wall_s']:7.1f} s "
                f"(on disk {r['durable_s']:.1f} s) "
                f"{r['tree_peak_rss_bytes'] / GB:6.2f} GB (anon {r['tree_peak_rss_anon_bytes'] / GB:.2f}, file "
                f"{r['tree_peak_rss_file_bytes'] / GB:.2f}; {r['processes']} proc), other CPU "
                f"{100 * (r['foreign_cpu'] or 0):.0f}%" + (f"  {r['verdict'].get('summary', '')}" if "verdict" in r else ""))
            for f in (*model_files(out), report, stdout, stderr):
                f.unlink(missing_ok=True)
            if on_run is not None:
                on_run()
    entry["summary"] = summarize(entry)
    return entry


def _spread(values: list[float]) -> dict | None:
    if not values:
        return None
    return {"median": float(np.median(values)), "min": float(min(values)), "max": float(max(values)), "n": len(values)}


def summarize(entry: dict) -> dict:
    """Per variant: median and range of wall time and peak RSS (runs that exited 0), every exit
    code; the ratios to the baseline and against the targets."""
    weights = entry["weight_bytes"]
    per: dict = {}
    for variant in VARIANTS:
        runs = [r for r in entry["runs"] if r["variant"] == variant]
        ok = [r for r in runs if r["rc"] == 0]
        per[variant] = {
            "runs": len(runs), "rc": [r["rc"] for r in runs],
            "wall_s": _spread([r["wall_s"] for r in ok]),
            "durable_s": _spread([r["durable_s"] for r in ok if "durable_s" in r]),
            "peak_rss_bytes": _spread([r["tree_peak_rss_bytes"] for r in ok]),
            "peak_rss_bound_bytes": _spread([r["tree_peak_bound_bytes"] for r in ok]),
            "peak_rss_all_bytes": [r["tree_peak_rss_bytes"] for r in runs],
            "peak_rss_anon_bytes": _spread([r["tree_peak_rss_anon_bytes"] for r in ok if "tree_peak_rss_anon_bytes" in r]),
            "peak_rss_file_bytes": _spread([r["tree_peak_rss_file_bytes"] for r in ok if "tree_peak_rss_file_bytes" in r]),
            "processes": sorted({r["processes"] for r in runs}),
            "foreign_cpu": _spread([r["foreign_cpu"] for r in runs if r.get("foreign_cpu") is not None]),
        }
    out: dict = {"variants": per}
    for variant in ("default", "no_verify"):
        for clock in ("wall", "durable"):  # the command's own time; until what it wrote is on disk
            w, base = per[variant][f"{clock}_s"], per["baseline"][f"{clock}_s"]
            out[f"{variant}_vs_baseline_{clock}"] = w["median"] / base["median"] if w and base else None
            if w and base:
                # the spread of the ratio: slowest fold over fastest baseline, and the reverse
                out[f"{variant}_vs_baseline_{clock}_range"] = [w["min"] / base["max"], w["max"] / base["min"]]
        rss = per[variant]["peak_rss_bytes"]
        out[f"{variant}_peak_vs_weights"] = rss["median"] / weights if rss else None
    limit = SCALE_RSS_FACTOR * weights + SCALE_RSS_EXTRA
    d = per["default"]
    failed = any(rc != 0 for rc in d["rc"])
    out["rss_limit_bytes"] = limit
    out["rss_target_met"] = None if not d["peak_rss_bytes"] else bool(not failed and d["peak_rss_bytes"]["max"] <= limit)
    for clock in ("wall", "durable"):
        r = out[f"default_vs_baseline_{clock}"]
        out[f"{clock}_target_met"] = None if r is None else bool(not failed and r <= SCALE_WALL_TARGET)
    verdicts = [run.get("verdict", {}) for run in entry["runs"] if run["variant"] == "default"]
    out["verdicts"] = sorted({(v.get("status") or "-", v.get("judgment") or "-", v.get("judgment_reason") or "")
                              for v in verdicts})
    out["summaries"] = [v.get("summary", "") for v in verdicts]
    return out


def _gb(n: float | None) -> str:
    return "-" if n is None else f"{n / GB:.2f}"


def _fmt_spread(s: dict | None, fmt) -> str:
    if not s:
        return "-"
    if s["n"] == 1:
        return fmt(s["median"])
    return f"{fmt(s['median'])} [{fmt(s['min'])}-{fmt(s['max'])}]"


def _met(flag: bool | None) -> str:
    return "-" if flag is None else ("met" if flag else "**NOT met**")


def format_md(results: dict) -> list[str]:
    m = results["machine"]
    others = [r["foreign_cpu"] for size in results["sizes"] for r in size["runs"] if r.get("foreign_cpu") is not None]
    load = f"other processes used {100 * max(others):.0f}% of its CPU at most during a run" if others else "its load unknown"
    note = (f"This machine: {m['logical_cores']} cores, {m['memory']}; {load} "
            f"(column `other CPU`: the share of the machine's CPU other processes used during each run). "
            f"GB = 10^9 bytes; weights = the bytes of all initializers. Each run is a fresh process, its page "
            f"cache warm (the model read once before its size's runs; `sync` before each run; outputs deleted "
            f"after each).")
    L = results_header("Fold cost at scale", results["command"], m, note)
    L += [f"Targets (issue 23): the default run (verification on) peaks at <= {SCALE_RSS_FACTOR:g}x the weights + "
          f"{SCALE_RSS_EXTRA / GB:g} GB and takes <= {SCALE_WALL_TARGET:g}x `onnx.load` + `onnx.save` of the same model "
          f"(`save_as_external_data=True`); where the weights exceed {ROUNDTRIP_MEMORY_SHARE:g}x the machine's memory, "
          f"which `onnx.load` cannot hold, <= {SCALE_WALL_TARGET:g}x copying the model's files (issue 31).", ""]
    L += ["Median [min-max] over the runs that exited 0; `peak RSS` is the process tree's (VmRSS of the command and "
          "its children summed, sampled every 20 ms); `RssAnon` (memory allocated) and `RssFile` (pages of mapped "
          "files: libraries, memory-mapped weights) are the peaks of the same sums, each its own.", ""]
    L += ["`wall s`: the command's own time; `on disk s`: until what it wrote is on disk (a `sync` after it, "
          "timed: a copy returns while much of what it wrote is still in the page cache, the fold writes first "
          "and checks after).", ""]
    L += ["| size | model | weights GB | variant | runs | exit codes | wall s | x baseline | on disk s | x baseline | "
          "peak RSS GB | peak / weights | peak RssAnon GB | peak RssFile GB | processes | other CPU |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for e in results["sizes"]:
        if "summary" not in e:
            L.append(f"| {e['config']['label']} | {e.get('model', '-')} | {_gb(e.get('weight_bytes'))} | "
                     f"{e.get('error', 'not run')} |  |  |  |  |  |  |  |  |  |  |")
            continue
        s, w = e["summary"], e["weight_bytes"]
        cfg = e["config"]
        for variant in VARIANTS:
            v = s["variants"][variant]
            ratio = "" if variant == "baseline" else _fmt_ratio(s, variant)
            durable = "" if variant == "baseline" else _fmt_ratio(s, variant, "durable")
            rss = v["peak_rss_bytes"]
            per_w = _fmt_spread({k: (x / w if k != "n" else x) for k, x in rss.items()}, lambda x: f"{x:.2f}x") if rss else "-"
            L.append(f"| {cfg['label']} | h{cfg['hidden']} x {cfg['layers']} | {w / GB:.2f} | {_title(e, variant)} | "
                     f"{v['runs']} | {', '.join(map(str, v['rc']))} | {_fmt_spread(v['wall_s'], lambda x: f'{x:.1f}')} | "
                     f"{ratio} | {_fmt_spread(v.get('durable_s'), lambda x: f'{x:.1f}')} | {durable} | "
                     f"{_fmt_spread(rss, lambda x: f'{x / GB:.2f}')} | {per_w} | "
                     f"{_fmt_spread(v.get('peak_rss_anon_bytes'), lambda x: f'{x / GB:.2f}')} | "
                     f"{_fmt_spread(v.get('peak_rss_file_bytes'), lambda x: f'{x / GB:.2f}')} | "
                     f"{', '.join(map(str, v['processes']))} | {_fmt_spread(v['foreign_cpu'], lambda x: f'{100 * x:.0f}%')} |")
    L += ["", "## Against the targets (default run)", "",
          "| size | weights GB | wall / baseline | <= 3x | on disk / baseline | <= 3x | peak RSS GB (max) | limit GB | "
          "peak limit | --no-verify / baseline |",
          "|---|---|---|---|---|---|---|---|---|---|"]
    for e in results["sizes"]:
        if "summary" not in e:
            continue
        s = e["summary"]
        rss = s["variants"]["default"]["peak_rss_bytes"]
        L.append(f"| {e['config']['label']} | {e['weight_bytes'] / GB:.2f} | {_fmt_ratio(s, 'default')} | "
                 f"{_met(s['wall_target_met'])} | {_fmt_ratio(s, 'default', 'durable')} | {_met(s.get('durable_target_met'))} | "
                 f"{_gb(rss['max'] if rss else None)} | {_gb(s['rss_limit_bytes'])} | "
                 f"{_met(s['rss_target_met'])} | {_fmt_ratio(s, 'no_verify')} |")
    L += ["", "## What each default run's verification rests on", ""]
    for e in results["sizes"]:
        if "summary" not in e:
            continue
        L.append(f"- {e['config']['label']}:")
        for run in (r for r in e["runs"] if r["variant"] == "default"):
            v = run.get("verdict", {})
            rest = v.get("judgment") or "-"
            why = f" ({v['judgment_reason']})" if v.get("judgment_reason") else ""
            exact = f", float64 exact {v['float64_exact']:.2g}" if v.get("float64_exact") is not None else ""
            line = v.get("summary") or (run.get("stderr", "").strip().splitlines() or ["(no output)"])[-1]
            L.append(f"  - rep {run['rep']}, exit {run['rc']}: {v.get('status') or '-'}, judged on: {rest}{why}{exact}  ")
            L.append(f"    `{line}`")
    bounds = []
    for e in results["sizes"]:
        for variant, v in e.get("summary", {}).get("variants", {}).items():
            lo, hi = v["peak_rss_bytes"], v["peak_rss_bound_bytes"]
            if lo and hi and hi["max"] > 1.01 * lo["max"]:
                bounds.append(f"{e['config']['label']} {_title(e, variant)}: {_gb(hi['max'])} GB")
    L += ["", "Peak RSS of the tree, upper bound (the command's own ru_maxrss plus every child's VmHWM, as if all "
          "peaked at once), where it exceeds the sampled figure by more than 1%: "
          + ("; ".join(bounds) if bounds else "nowhere") + ".", ""]
    return L


def _fmt_ratio(s: dict, variant: str, clock: str = "wall") -> str:
    r = s.get(f"{variant}_vs_baseline_{clock}")
    if r is None:
        return "-"
    lo, hi = s.get(f"{variant}_vs_baseline_{clock}_range", [r, r])
    return f"{r:.2f}x" if lo == hi else f"{r:.2f}x [{lo:.2f}-{hi:.2f}]"


def sweep(configs: list[dict], folder: Path, out: Path, reps: list[int], command: str, quiet_wait_s: float = 60.0,
          min_available: float = 19 * GB, memory_wait_s: float = 1800.0) -> dict:
    """Every size in `configs`, one after the other; FOLD_COST.md and fold_cost.json in `out`,
    rewritten after every run (a sweep cut short keeps what it measured)."""
    out.mkdir(parents=True, exist_ok=True)
    results: dict = {"command": command, "machine": machine_info(), "sizes": [],
                     "targets": {"wall": SCALE_WALL_TARGET, "rss_factor": SCALE_RSS_FACTOR, "rss_extra_bytes": SCALE_RSS_EXTRA},
                     "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "loadavg_start": _loadavg()}
    mon = CpuMonitor()

    def write() -> None:
        results["foreign_cpu"] = mon.foreign()
        results["loadavg_end"] = _loadavg()
        (out / "fold_cost.json").write_text(json.dumps(results, indent=1) + "\n")
        (out / "FOLD_COST.md").write_text("\n".join(format_md(results)) + "\n")

    for cfg, n in zip(configs, reps):
        log(f"fold cost at scale: {cfg['label']}")
        entry: dict = {"config": cfg, "runs": []}
        results["sizes"].append(entry)
        scale_run(cfg, folder, n, quiet_wait_s, min_available, memory_wait_s, entry, on_run=write)
        write()
    results["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    write()
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("models", nargs="*", help="benchmark models (benchmarks.common.SPECS) to measure, as benchmarks.run does")
    p.add_argument("--sizes", help="comma-separated GB of weights: the sweep at scale (e.g. 0.5,2.5,6,10)")
    p.add_argument("--hidden", type=int, help="one model of this hidden size (with --layers) instead of --sizes")
    p.add_argument("--layers", type=int)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--positions", type=int, default=1024)
    p.add_argument("--tie-head", action="store_true", help="(with --hidden) the LM head reads the embedding table")
    p.add_argument("--dir", type=Path, default=CACHE / "large", help="where the models are built and kept, and the outputs written")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "fold_cost", help="FOLD_COST.md, fold_cost.json")
    p.add_argument("--reps", default="2", help="runs of each variant: one number, or one per size (3,3,2,2)")
    p.add_argument("--wait-quiet", type=float, default=60.0, help="wait up to S s for other processes to use < 10%% of the CPU before each run")
    p.add_argument("--min-available", type=float, default=19.0,
                   help=f"GB of MemAvailable to wait for before each run of a model of >= {MEMORY_WAIT_FROM / GB:g} GB (0: none)")
    p.add_argument("--memory-wait", type=float, default=1800.0, help="longest wait for --min-available, s")
    args = p.parse_args(argv)

    if args.sizes is None and args.hidden is None:
        if not args.models:
            p.error("name benchmark models, or give --sizes or --hidden/--layers")
        from benchmarks.common import ensure_exported

        out = {n: fold_cost(ensure_exported(n)) for n in args.models}
        out["startup"] = startup_costs()
        print(json.dumps(out, indent=2))
        return 0
    if args.hidden is not None:
        if args.layers is None:
            p.error("--hidden needs --layers")
        configs = [{"label": f"h{args.hidden} x {args.layers}", "hidden": args.hidden, "layers": args.layers,
                    "vocab": args.vocab, "positions": args.positions, "tie_head": args.tie_head}]
    else:
        configs = [config_for(float(x), args.vocab, args.positions) for x in args.sizes.split(",")]
    reps = [int(x) for x in args.reps.split(",")]
    reps = reps * len(configs) if len(reps) == 1 else reps
    if len(reps) != len(configs) or min(reps) < 1:
        p.error("--reps: one number, or one per size")
    command = "python -m benchmarks.fold_cost " + " ".join(argv if argv is not None else sys.argv[1:])
    sweep(configs, args.dir, args.out, reps, command, args.wait_quiet, args.min_available * GB, args.memory_wait)
    log(f"wrote {args.out / 'FOLD_COST.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
