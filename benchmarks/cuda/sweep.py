"""The CUDA sweep: LayerNorm vs RMSNorm kernels, folded models end to end (GPT-2-style and real trained
models, prepared as deployed on CUDA), and which `--fuse-residual` choice is fastest, on ONNX Runtime's
CUDA execution provider.

    python -m benchmarks.cuda                 # on a GPU host; results in benchmarks/results/cuda/
    python -m benchmarks.cuda --smoke         # the same code on the CPU EP, small sizes
    python -m benchmarks.cuda --trained DIR   # real models from DIR (default: models/trained/ if present)

What the figures can be trusted for, and the line that makes each failure impossible:

- placement (benchmarks/cuda/device.py): every session is created with `enable_fallback=0` and must
  report the provider asked for first; kernel graphs and the probe run with CPU fallback disabled
  (`session.disable_cpu_ep_fallback` = "1"); models, whose shape arithmetic onnxruntime keeps on the
  CPU on purpose, are checked node by node from their profile: a node off the device that touches a
  float tensor fails the sweep (`PlacementError`: one line, exit 2; nothing of that part is reported);
- one `calls` count per configuration for every variant (benchmarks/cuda/timing.py, calibrate_calls);
- kernel time beside the wall clock (benchmarks.cuda.timing.ProfiledPhase): CUPTI's kernel records, through
  onnxruntime's profiler where the build has them, else torch.profiler; on the CPU EP the profiler's
  node events. Kernel ratios are the ones that say what the kernels do; the wall clock of short kernel
  chains is launch overhead;
- the bandwidth figure says which level a node's tensors live in (the device's L2, asked of the
  device) and gives a share of the nominal DRAM bandwidth only for tensors several times the L2;
- equivalence of every variant with the original on every configuration and every output, with
  onnx_lnfold's own tolerances (`verify.check.output_types`, `rtol_for`); a mismatch fails the sweep (exit 3)
  after the results are written, marked FAILED (a placement failure, exit 2, likewise: the part it hit is
  not reported, the rest of the sweep runs, so one model cannot cost the others' figures);
- end-to-end models as deployed (benchmarks/cuda/models.py): optimizer (Attention fused), fp16, fold;
- every variant measured at least twice, in rotated positions, every figure with its spread; a time
  cap (`--max-seconds`) skips, by name, whatever would start after it.

Timing per configuration: (1) equivalence runs; (2) the profiled phase: warm-up, then
`profile_rounds` rounds in rotated order, each visit `profile_runs` synchronized runs in a kernel-time
window; onnxruntime's profile ends (placement checked, kernel time read); (3) the wall-clock phase:
`calls` calibrated once from the slowest variant, then rounds in rotated order until `min_rounds` and
the time budget are reached. Ratios are median(A) / median(B) with a paired bootstrap 95% interval
over rounds (> 1: B is faster).

Output in --out: results.json (everything, every sample), RESULTS.md (tables), cuda.png (plot;
skipped with a note when matplotlib is missing), with the machine, the GPU, its driver, L2 and
nominal bandwidth, onnxruntime and its provider options.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.common import ROOT, fmt_ratio, log, machine_info, ratio_of_medians
from benchmarks.cuda.device import Device, PlacementError, SweepRefused, check_assignment, memory_level
from benchmarks.cuda.models import (
    FUSE_CHOICES,
    ModelPrepError,
    Prepared,
    clean,
    find_trained,
    prepare_gpt2,
    prepare_trained,
)
from benchmarks.cuda.timing import ProfiledPhase, Timed, calibrate_calls, interleave, rotated
from benchmarks.gpt2_onnx import Gpt2Shape
from onnx_lnfold.bench.graphs import chain_model
from onnx_lnfold.bench.profile import load as load_profile

RESULTS_CUDA = ROOT / "benchmarks" / "results" / "cuda"
SMOKE_OUT = ROOT / "benchmarks" / "cache" / "cuda_smoke"

KERNEL_KINDS = ["ln", "sln", "add+ln", "add+sln", "skip_ln", "skip_sln", "copy"]
# tensors of the [rows, hidden] size each node reads, and reads + writes (gamma/beta are negligible)
KERNEL_READS = {"ln": 1, "sln": 1, "add+ln": 3, "add+sln": 3, "skip_ln": 2, "skip_sln": 2, "copy": 1}
KERNEL_TRAFFIC = {"ln": 2, "sln": 2, "add+ln": 5, "add+sln": 5, "skip_ln": 4, "skip_sln": 4, "copy": 2}
KERNEL_PAIRS = [("ln", "sln"), ("add+ln", "add+sln"), ("skip_ln", "skip_sln"), ("add+ln", "skip_sln")]


@dataclasses.dataclass
class SweepConfig:
    kernel_hidden: list[int]
    kernel_rows: list[int]
    kernel_dtypes: list[str]
    repeat: int                      # nodes per kernel graph
    gpt2_shapes: list[Gpt2Shape]
    batches: list[int]
    seqs: list[int]
    max_tokens: dict[int, int]       # hidden -> cap on batch*seq (memory/time); absent: no cap
    trained_batches: list[int]
    trained_seqs: list[int]          # sequence length of trained models whose inputs have one (decoders)
    warmup: int = 3
    min_rounds: int = 7
    max_rounds: int = 200
    kernel_budget_s: float = 0.4     # wall-clock seconds per kernel configuration after min_rounds
    e2e_budget_s: float = 1.5        # wall-clock seconds per end-to-end configuration after min_rounds
    sample_ms: float = 20.0
    profile_rounds: int = 2          # kernel-time rounds, order rotated: every variant in two positions
    profile_runs: int = 3            # synchronized runs per kernel-time visit
    max_seconds: float = 450.0       # time cap from the command's start: a part whose estimate ends later is skipped


FULL = SweepConfig(
    kernel_hidden=[768, 2048, 4096, 8192], kernel_rows=[512, 4096, 32768], kernel_dtypes=["float16", "float32"],
    repeat=10,
    # GPT-2 small and medium (d=1024, 24 layers, 16 heads): the medium one last, where a time cap cuts first
    gpt2_shapes=[Gpt2Shape(hidden=768, layers=12), Gpt2Shape(hidden=1024, layers=24)],
    batches=[1, 8], seqs=[128, 512, 2048], max_tokens={1024: 8192},
    trained_batches=[1, 8], trained_seqs=[64],
)
# --smoke: every code path of FULL, at sizes two shared CPU cores run in about a minute
SMOKE = SweepConfig(
    kernel_hidden=[64, 256], kernel_rows=[64], kernel_dtypes=["float16", "float32"], repeat=3,
    gpt2_shapes=[Gpt2Shape(hidden=64, layers=2, vocab=512, positions=256)],
    batches=[1, 2], seqs=[16, 64], max_tokens={64: 64}, trained_batches=[1], trained_seqs=[16],
    warmup=1, min_rounds=3, max_rounds=5, kernel_budget_s=0.0, e2e_budget_s=0.0, sample_ms=2.0,
    profile_rounds=2, profile_runs=2, max_seconds=1800.0,
)
# --smoke=min: the same paths again, fewer sizes (the test suite runs this one)
SMOKE_MIN = dataclasses.replace(SMOKE, kernel_hidden=[64], batches=[1], seqs=[16, 32], max_tokens={},
                                min_rounds=3, max_rounds=3, sample_ms=1.0)


class SweepFailed(Exception):
    """The sweep ran to its end, but a part failed (placement, equivalence, preparation, an error):
    the results are written, marked FAILED, and the command exits with `code`."""

    def __init__(self, line: str, code: int):
        super().__init__(line)
        self.code = code


class Deadline:
    """The sweep's time cap, counted from the command's start: a part whose estimated time would
    end after it does not start, and is listed as skipped, by name."""

    def __init__(self, max_seconds: float, t0: float | None = None):
        self.t0, self.max_seconds = (time.perf_counter() if t0 is None else t0), max_seconds

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def passed(self, what: str, skipped: list[str], reserve_s: float = 0.0) -> bool:
        if self.elapsed() + reserve_s <= self.max_seconds:
            return False
        skipped.append(f"{what} (time cap: {self.elapsed():.0f} s + about {reserve_s:.0f} s needed > "
                       f"{self.max_seconds:.0f} s)")
        return True


def kernel_reserve_s(cfg: SweepConfig) -> float:
    """What one (dtype, hidden) kernel group needs at most, roughly: per rows, the wall-clock
    rounds and budget plus the profiled rounds (a kineto window each)."""
    wall = cfg.min_rounds * len(KERNEL_KINDS) * cfg.sample_ms / 1e3 + cfg.kernel_budget_s
    return 2.0 + len(cfg.kernel_rows) * (wall + cfg.profile_rounds * 0.5 + 0.5)


def e2e_reserve_s(cfg: SweepConfig, params: float, configs: int) -> float:
    """One end-to-end model, roughly: its preparation on the host (about 15 s of one core per 100 M
    parameters: build, optimizer, fp16, re-save; the folds run beside it), five sessions, and per
    configuration the equivalence runs, the profiled rounds and the wall-clock rounds."""
    wall = cfg.min_rounds * len(FUSE_CHOICES + ["original", "resaved"]) * cfg.sample_ms / 1e3 + cfg.e2e_budget_s
    return 10.0 + 15.0 * params / 1e8 + configs * (wall + cfg.profile_rounds * 0.5 + 1.0)


def spread(values) -> list[float]:
    """[25th, 75th] percentile: the spread every median is given with."""
    v = np.asarray([x for x in values if x is not None], float)
    return [float(np.percentile(v, 25)), float(np.percentile(v, 75))] if v.size else [float("nan")] * 2


def _median(values) -> float | None:
    v = [x for x in values if x is not None]
    return float(np.median(v)) if v else None


def _ratio(a, b) -> dict | None:
    """ratio_of_medians over rounds where both sides were measured (kernel time may be missing)."""
    pairs = [(x, y) for x, y in zip(a, b) if x is not None and y is not None]
    if len(pairs) < 2:
        return None
    return ratio_of_medians([p[0] for p in pairs], [p[1] for p in pairs])


def _load_profile(sess) -> list[dict]:
    return load_profile(sess.end_profiling())


def end_profiles(device: Device, sessions: dict, phase: ProfiledPhase, label: str) -> tuple[dict, str, dict]:
    """End every session's profile: placement checked (PlacementError), kernel time per visit read."""
    profiles = {k: _load_profile(s) for k, s in sessions.items()}
    shape_nodes = {k: check_assignment(sessions[k], profiles[k], device.expected, f"{label} {k}") for k in sessions}
    values, source = phase.finish(profiles)
    return values, source, {k: sorted({n["op"] for n in v}) for k, v in shape_nodes.items() if v}


# --------------------------------------------------------------------------- #
# 1. Kernels
# --------------------------------------------------------------------------- #
def _kernel_model(kind: str, hidden: int, dtype: str, repeat: int) -> bytes:
    """A chain of `repeat` nodes of one kind (onnx_lnfold/bench/graphs.py, the calibration's chains);
    the residual forms carry the running sum from node to node and output it."""
    return chain_model(kind, hidden, dtype, repeat, residual_chain=True)


def bandwidth(kernel_us: dict[str, float | None], tensor_bytes: int, info: dict) -> dict:
    """Bytes each node moves, the memory level they live in, GB/s from kernel time (a wall-clock
    figure of a launch-bound chain is no bandwidth), as a share of the copy chain's GB/s, and as a
    share of the nominal DRAM bandwidth only where the level is DRAM (an L2-resident tensor would
    show shares above 1)."""
    moved = {k: KERNEL_TRAFFIC[k] * tensor_bytes for k in kernel_us}
    level = {k: memory_level(KERNEL_READS[k] * tensor_bytes, moved[k], info.get("l2_bytes")) for k in kernel_us}
    gbps = {k: (moved[k] / (us * 1e-6) / 1e9 if us else None) for k, us in kernel_us.items()}
    copy, nominal = gbps.get("copy"), info.get("nominal_gbps")
    return {"bytes_moved": moved, "level": level, "gbps": gbps,
            "share_of_copy": {k: (g / copy if g and copy else None) for k, g in gbps.items()},
            "share_of_dram": {k: (g / nominal if g and nominal and level[k] == "DRAM" else None)
                              for k, g in gbps.items()}}


def kernel_group(device: Device, cfg: SweepConfig, dtype: str, hidden: int, rows_list: list[int], info: dict,
                 profile_dir: Path) -> list[dict]:
    """The seven kernel graphs of one (dtype, hidden) at every rows: profiled phase, then wall clock."""
    label = f"kernels {dtype} d{hidden}"
    sessions = {k: device.session(_kernel_model(k, hidden, dtype, cfg.repeat), f"{label} {k}", optimize=False,
                                  strict=True, profile_prefix=str(profile_dir / f"{dtype}_{hidden}_{k}"))
                for k in KERNEL_KINDS}
    names = list(sessions)

    def feeds(rows: int) -> dict:
        rng = np.random.default_rng(rows + hidden)
        x = device.to_device(rng.standard_normal((1, rows, hidden), dtype=np.float32).astype(dtype))
        s = device.to_device(rng.standard_normal((1, rows, hidden), dtype=np.float32).astype(dtype))
        return {k: Timed(device, sess, {"x": x, "skip": s} if len(sess.get_inputs()) == 2 else {"x": x})
                for k, sess in sessions.items()}

    phase = ProfiledPhase(device.expected, kineto=device.kind == "cuda")
    for rows in rows_list:
        timed = feeds(rows)
        for k in names:
            phase.run(k, timed[k], max(1, cfg.warmup))
        for r in range(max(2, cfg.profile_rounds)):  # every variant in two positions at least
            phase.round(rows, [(k, timed[k]) for k in rotated(names, r)], cfg.profile_runs)
        del timed
    kernel, source, shape_nodes = end_profiles(device, sessions, phase, label)

    size = np.dtype(dtype).itemsize
    results = []
    for rows in rows_list:
        timed = feeds(rows)
        cal = calibrate_calls(timed, cfg.sample_ms, cfg.warmup)
        wall = interleave(timed, cal["calls"], cfg.min_rounds, cfg.max_rounds, cfg.kernel_budget_s)
        wall_node = {k: v / cfg.repeat for k, v in wall.items()}
        kern_node = {k: [None if v is None else v / cfg.repeat for v in kernel[rows][k]] for k in names}
        res = {"dtype": dtype, "hidden": hidden, "rows": rows, "repeat": cfg.repeat, "calls": cal["calls"],
               "calibration": cal, "rounds": int(len(wall["ln"])), "kernel_rounds": max(2, cfg.profile_rounds),
               "kernel_source": source,
               "wall_us": {k: float(np.median(v) * 1e6) for k, v in wall_node.items()},
               "wall_spread_us": {k: [x * 1e6 for x in spread(v)] for k, v in wall_node.items()},
               "wall_samples_us": {k: [round(float(t) * 1e6, 3) for t in v] for k, v in wall_node.items()},
               "kernel_us": {k: _median(v) for k, v in kern_node.items()},
               "kernel_spread_us": {k: spread(v) for k, v in kern_node.items()},
               "kernel_samples_us": {k: v for k, v in kern_node.items()},
               "ratios_kernel": {f"{a}/{b}": _ratio(kern_node[a], kern_node[b]) for a, b in KERNEL_PAIRS},
               "ratios_wall": {f"{a}/{b}": ratio_of_medians(wall_node[a], wall_node[b]) for a, b in KERNEL_PAIRS}}
        if shape_nodes:
            res["off_device_shape_nodes"] = shape_nodes
        res.update(bandwidth(res["kernel_us"], rows * hidden * size, info))
        results.append(res)
        kr, wr = res["ratios_kernel"]["ln/sln"], res["ratios_wall"]["ln/sln"]
        log(f"  kernel {dtype} d{hidden} x {rows} rows [{res['level']['ln']}]: ln/sln kernel "
            f"{'x%.3f' % kr['ratio'] if kr else 'not measured'}, wall x{wr['ratio']:.3f} "
            f"(calls {cal['calls']}, {res['rounds']} rounds)")
        del timed
    return results


def run_kernels(device: Device, cfg: SweepConfig, info: dict, deadline: Deadline, skipped: list[str],
                failures: list[dict], workdir: Path | None) -> list[dict]:
    results = []
    profile_dir = Path(tempfile.mkdtemp(prefix="lnfold-cuda-prof-", dir=workdir))
    try:
        for dtype in cfg.kernel_dtypes:
            for hidden in cfg.kernel_hidden:
                if deadline.passed(f"kernels {dtype} d{hidden}", skipped, kernel_reserve_s(cfg)):
                    continue
                try:
                    results += kernel_group(device, cfg, dtype, hidden, cfg.kernel_rows, info, profile_dir)
                except PlacementError as e:  # nothing of this group is reported; the sweep fails at its end
                    record_failure(failures, "placement", str(e), f"kernels {dtype} d{hidden}", skipped)
    finally:
        shutil.rmtree(profile_dir, ignore_errors=True)
    return results


# --------------------------------------------------------------------------- #
# 2. End to end
# --------------------------------------------------------------------------- #
def _equivalence(original: dict[str, np.ndarray], got: dict[str, np.ndarray], out_types: dict[str, int]) -> dict:
    """onnx_lnfold's own comparison and tolerances: every output, max|diff| / max|ref| <= rtol of the
    type the output is computed in."""
    from onnx_lnfold.verify.sessions import compare
    from onnx_lnfold.verify.verdict import rtol_for

    outputs = {}
    for d in compare(original, got):
        d.rtol = rtol_for(out_types.get(d.name))
        outputs[d.name] = {"max_abs_diff": d.max_abs_diff, "rel": d.rel_diff, "rtol": d.rtol,
                           "passed": bool(d.rel_diff <= d.rtol)}
    worst = max(outputs, key=lambda n: outputs[n]["rel"] / outputs[n]["rtol"]) if outputs else None
    return {"passed": all(o["passed"] for o in outputs.values()), "worst_output": worst, "outputs": outputs}


def e2e_configs(prep: Prepared, kind: str, cfg: SweepConfig, skipped: list[str]) -> list[tuple[int, int]]:
    if kind == "trained":
        configs, seen = [], set()
        for batch in cfg.trained_batches:
            for seq in cfg.trained_seqs:
                shapes = tuple((k, v.shape) for k, v in prep.feeds(batch, seq).items())
                if shapes not in seen:  # a model without a sequence axis runs once per batch
                    seen.add(shapes)
                    configs.append((batch, seq))
        return configs
    shape: Gpt2Shape = prep.info["shape"]
    configs = []
    cap = cfg.max_tokens.get(shape.hidden)
    for batch in cfg.batches:
        for seq in cfg.seqs:
            if seq > shape.positions or (cap and batch * seq > cap):
                skipped.append(f"{prep.name} b{batch} s{seq} (" + (
                    f"seq > {shape.positions} positions)" if seq > shape.positions
                    else f"batch*seq > {cap}: memory and time cap)"))
                continue
            configs.append((batch, seq))
    return configs


def measure_model(device: Device, prep: Prepared, configs: list[tuple[int, int]], cfg: SweepConfig,
                  profile_dir: Path) -> list[dict]:
    """Every variant of one model at every configuration: equivalence, kernel time, wall clock."""
    import onnx_ir as ir

    from onnx_lnfold.verify.check import output_types

    out_types = output_types(ir.load(prep.paths["original"]))
    sessions = {k: device.session(p, f"{prep.name} {k}", strict=False,
                                  profile_prefix=str(profile_dir / f"{prep.name}_{k}"))
                for k, p in prep.paths.items()}
    names = list(sessions)
    output_names = [o.name for o in sessions["original"].get_outputs()]

    def bind(batch: int, seq: int) -> tuple[dict, dict]:
        feeds = prep.feeds(batch, seq)
        dev = {k: device.to_device(v) for k, v in feeds.items()}
        return {k: Timed(device, s, dev) for k, s in sessions.items()}, {k: list(v.shape) for k, v in feeds.items()}

    phase = ProfiledPhase(device.expected, kineto=device.kind == "cuda")
    equivalence, shapes = {}, {}
    for batch, seq in configs:
        timed, shapes[(batch, seq)] = bind(batch, seq)
        outs = {}
        for k in names:
            phase.run(k, timed[k], 1)
            outs[k] = dict(zip(output_names, timed[k].outputs()))
        equivalence[(batch, seq)] = {k: _equivalence(outs["original"], outs[k], out_types) for k in names
                                     if k != "original"}
        del outs
        for k in names:
            phase.run(k, timed[k], max(1, cfg.warmup))
        for r in range(max(2, cfg.profile_rounds)):  # every variant in two positions at least
            phase.round((batch, seq), [(k, timed[k]) for k in rotated(names, r)], cfg.profile_runs)
        del timed
    kernel, source, shape_nodes = end_profiles(device, sessions, phase, prep.name)

    results = []
    for batch, seq in configs:
        timed, _ = bind(batch, seq)
        cal = calibrate_calls(timed, cfg.sample_ms, cfg.warmup)
        wall = interleave(timed, cal["calls"], cfg.min_rounds, cfg.max_rounds, cfg.e2e_budget_s)
        kern = {k: [None if v is None else v / 1e3 for v in kernel[(batch, seq)][k]] for k in names}  # ms
        eq = equivalence[(batch, seq)]
        res = {"model": prep.name, "source": prep.source, **{k: v for k, v in prep.info.items() if k != "shape"},
               "batch": batch, "seq": seq, "input_shapes": shapes[(batch, seq)],
               "rounds": int(len(wall["original"])), "kernel_rounds": max(2, cfg.profile_rounds), "calls": cal["calls"],
               "calibration": cal, "kernel_source": source,
               "wall_ms": {k: float(np.median(v) * 1e3) for k, v in wall.items()},
               "wall_spread_ms": {k: [x * 1e3 for x in spread(v)] for k, v in wall.items()},
               "wall_samples_ms": {k: [round(float(t) * 1e3, 5) for t in v] for k, v in wall.items()},
               "kernel_ms": {k: _median(v) for k, v in kern.items()},
               "kernel_spread_ms": {k: spread(v) for k, v in kern.items()},
               "kernel_samples_ms": kern,
               "ratios": {k: ratio_of_medians(wall["original"], wall[k]) for k in names if k != "original"},
               "kernel_ratios": {k: _ratio(kern["original"], kern[k]) for k in names if k != "original"},
               "vs_resaved": {f"folded_{c}": ratio_of_medians(wall["resaved"], wall[f"folded_{c}"])
                              for c in FUSE_CHOICES},
               "fuse_vs_auto": {c: ratio_of_medians(wall["folded_auto"], wall[f"folded_{c}"]) for c in FUSE_CHOICES},
               "fastest_fuse": min(FUSE_CHOICES, key=lambda c: float(np.median(wall[f"folded_{c}"]))),
               "equivalence": eq, "equivalent": all(e["passed"] for e in eq.values()),
               "folds": prep.folds, "graph_digest": prep.graph_digest, "optimizer": prep.optimizer}
        if shape_nodes:
            res["off_device_shape_nodes"] = shape_nodes
        results.append(res)
        f, kf = res["ratios"]["folded_auto"], res["kernel_ratios"]["folded_auto"]
        log(f"  {prep.name} b{batch} s{seq}: original {res['wall_ms']['original']:.3f} ms; folded(auto) wall "
            f"x{f['ratio']:.3f} [{f['lo']:.3f}, {f['hi']:.3f}], kernel "
            f"{'x%.3f' % kf['ratio'] if kf else 'not measured'}; re-saved x{res['ratios']['resaved']['ratio']:.3f}; "
            f"equivalent: {'yes' if res['equivalent'] else 'NO'} (calls {cal['calls']}, {res['rounds']} rounds)")
        del timed
    return results


def run_e2e(device: Device, cfg: SweepConfig, trained: list[Path], skip_gpt2: bool, deadline: Deadline,
            skipped: list[str], failures: list[dict], workdir: Path | None) -> tuple[list[dict], list[dict]]:
    """Real trained models first, then the GPT-2-style models (the largest last: a time cap cuts it first)."""
    results, models = [], []
    jobs = [("trained", p) for p in trained] + ([] if skip_gpt2 else [("gpt2", s) for s in cfg.gpt2_shapes])
    root = Path(tempfile.mkdtemp(prefix="lnfold-cuda-", dir=workdir))
    try:
        for kind, what in jobs:
            label = what.stem if kind == "trained" else what.label
            if kind == "trained":
                reserve = e2e_reserve_s(cfg, what.stat().st_size / 4, len(cfg.trained_batches) * len(cfg.trained_seqs))
            else:
                reserve = e2e_reserve_s(cfg, what.parameters(), len(cfg.batches) * len(cfg.seqs))
            if deadline.passed(f"{label} (end to end)", skipped, reserve):
                continue
            work = root / label
            work.mkdir(parents=True)
            try:
                try:
                    prep = prepare_trained(what, work) if kind == "trained" else prepare_gpt2(what, work)
                except ModelPrepError as e:
                    record_failure(failures, "preparation", str(e), label, skipped)
                    continue
                except Exception as e:  # noqa: BLE001 - the optimizer, the fp16 conversion or the fold broke
                    record_failure(failures, "preparation", f"{label}: {_one_line(e)}", label, skipped)
                    continue
                if kind == "gpt2":
                    prep.info["shape"] = what
                fold = prep.folds["auto"]
                log(f"  {prep.name}: prepared in {prep.prepare_s:.1f} s (optimizer fused "
                    f"{', '.join(f'{n} {op}' for op, n in prep.optimizer['fused'].items())}); "
                    f"folded {fold['folded']}/{fold['layer_norms']} LNs")
                models.append({"model": prep.name, "source": prep.source, "optimizer": prep.optimizer,
                               "folds": prep.folds, "prepare_s": prep.prepare_s, "graph_digest": prep.graph_digest,
                               **{k: v for k, v in prep.info.items() if k != "shape"}})
                configs = e2e_configs(prep, kind, cfg, skipped)
                try:
                    results += measure_model(device, prep, configs, cfg, work)
                except PlacementError as e:  # nothing of this model is reported; the sweep fails at its end
                    record_failure(failures, "placement", str(e), label, skipped)
                except Exception as e:  # noqa: BLE001 - one model's error must not lose the others' figures
                    record_failure(failures, "error", f"{label}: {_one_line(e)}", label, skipped)
            finally:
                clean(work)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return results, models


# exit codes by failure kind, in the order the first one of them is reported
EXIT_CODES = {"placement": 2, "equivalence": 3, "preparation": 4, "error": 5}


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:300]}" if text else type(e).__name__


def record_failure(failures: list[dict], kind: str, message: str, part: str, skipped: list[str]) -> None:
    log(f"FAILED ({kind}): {message}")
    failures.append({"kind": kind, "message": message})
    skipped.append(f"{part} (failed: {kind}, see `failures`)")


def first_failure(failures: list[dict]) -> dict | None:
    """The failure the sweep exits with: placement first, then equivalence, preparation, other errors."""
    if not failures:
        return None
    first = min(failures, key=lambda f: list(EXIT_CODES).index(f["kind"]))
    more = len(failures) - 1
    return {**first, "line": f"{first['kind']}: {first['message']}" + (f" (+{more} more failures)" if more else "")}


def equivalence_failure(e2e: list[dict]) -> str | None:
    """One line naming the first variant, configuration and output that differ (and how many more)."""
    bad = [(e, v, eq) for e in e2e for v, eq in e["equivalence"].items() if not eq["passed"]]
    if not bad:
        return None
    e, v, eq = bad[0]
    o = eq["outputs"][eq["worst_output"]]
    return (f"equivalence: {e['model']} b{e['batch']} s{e['seq']} {v}: output '{eq['worst_output']}' "
            f"max|diff|/max|ref| {o['rel']:.3g} > rtol {o['rtol']:g}" + (f" (+{len(bad) - 1} more)" if len(bad) > 1 else ""))


def fuse_summary(e2e: list[dict]) -> dict:
    """Per choice: wins, and the geometric mean of median(auto) / median(choice) over configurations."""
    if not e2e:
        return {}
    out = {}
    for c in FUSE_CHOICES:
        r = [x["fuse_vs_auto"][c]["ratio"] for x in e2e]
        sig_faster = sum(1 for x in e2e if x["fuse_vs_auto"][c]["lo"] > 1.0)
        sig_slower = sum(1 for x in e2e if x["fuse_vs_auto"][c]["hi"] < 1.0)
        out[c] = {"wins": sum(1 for x in e2e if x["fastest_fuse"] == c), "geomean_vs_auto": float(np.exp(np.mean(np.log(r)))),
                  "faster_than_auto_ci": sig_faster, "slower_than_auto_ci": sig_slower}
    best = max(FUSE_CHOICES, key=lambda c: out[c]["geomean_vs_auto"])
    out["recommended"] = best if out[best]["faster_than_auto_ci"] > out[best]["slower_than_auto_ci"] else "auto"
    return out


# --------------------------------------------------------------------------- #
# Report
# --------------------------------------------------------------------------- #
def write_report(res: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(res, indent=1))
    (out / "RESULTS.md").write_text(render_markdown(res))
    plot_note = plot(res, out / "cuda.png")
    if plot_note:
        log(plot_note)


def _fmt(x: float | None, spec: str = ".2f") -> str:
    return "n/m" if x is None else format(x, spec)


def _gb(x: int | None) -> str:
    return "?" if not x else f"{x / 2**20:.0f} MiB"


def render_markdown(res: dict) -> str:
    m, dev = res["machine"], res["device"]
    smoke = res["mode"] != "cuda"
    if smoke:
        title = "# onnx_lnfold on ONNX Runtime: CPU (SMOKE TEST: not CUDA figures; CUDA: not measured)"
    else:
        title = f"# onnx_lnfold on ONNX Runtime CUDA: measured on a GPU, {dev.get('gpu', '?')}"
    lines = [title, ""]
    if res.get("failed"):
        lines += [f"**FAILED: {res['failed']}**", ""]
        lines += [f"- {f['kind']}: {f['message']}" for f in res.get("failures", [])] + [""]
    lines.append(f"Command: `{res['command']}`  ")
    if not smoke:
        lines.append(f"GPU: {dev.get('gpu', '?')} ({dev.get('gpu_memory', '?')}, compute capability "
                     f"{dev.get('compute_capability', '?')}), driver {dev.get('driver', '?')}, L2 "
                     f"{_gb(dev.get('l2_bytes'))} ({dev.get('l2_source', '?')}), nominal DRAM "
                     f"{dev.get('nominal_gbps') or '?'} GB/s  ")
        lines.append(f"Provider options: `{json.dumps(dev.get('provider_options', {}), sort_keys=True)}`; CUDA "
                     f"libraries loaded by {dev.get('cuda_libraries_loaded_by', '?')}  ")
    lines.append(f"Execution provider {dev['execution_provider']}; onnxruntime {m['onnxruntime']}, onnx "
                 f"{m['onnx']}, onnx_lnfold {m['onnx_lnfold']} at git {m['git_commit']}, Python {m['python']}"
                 + (f", torch {dev['torch']} (CUDA {dev.get('torch_cuda')})" if dev.get("torch") else "") + "  ")
    lines.append(f"Host: {m['cpu']}, {m['logical_cores']} cores; run {m['date']}, {res['seconds']:.0f} s "
                 f"(cap {res['config']['max_seconds']:.0f} s)  ")
    lines.append(f"Kernel time: {res.get('kernel_source', 'n/a')}")
    lines += ["", "Ratios are median(A) / median(B) with a paired bootstrap 95% interval over rounds (> 1: B is "
              "faster); `kernel` ratios come from the kernels' own time, `wall` from bursts of runs on the host "
              "clock (launch overhead included). Spreads are [25th, 75th] percentiles. n/m: not measured. See "
              "benchmarks/README.md, section CUDA.", ""]
    if res["kernels"]:
        lines += ["## Kernels (one node type, chained; time per node)", "",
                  "| dtype | hidden | rows | level | ln us | sln us | ln/sln kernel | ln/sln wall | "
                  "add+ln/add+sln kernel | skip_ln/skip_sln kernel | add+ln/skip_sln kernel | sln GB/s | "
                  "sln / copy | sln / DRAM | calls | rounds |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for k in res["kernels"]:
            u, s, rk, rw = k["kernel_us"], k["kernel_spread_us"], k["ratios_kernel"], k["ratios_wall"]
            sln_us = (f"{_fmt(u['sln'])} [{_fmt(s['sln'][0])}-{_fmt(s['sln'][1])}]" if u["sln"] else "n/m")
            ln_us = (f"{_fmt(u['ln'])} [{_fmt(s['ln'][0])}-{_fmt(s['ln'][1])}]" if u["ln"] else "n/m")
            lines.append(f"| {k['dtype']} | {k['hidden']} | {k['rows']} | {k['level']['sln']} | {ln_us} | {sln_us} | "
                         f"{fmt_ratio(rk['ln/sln'])} | {fmt_ratio(rw['ln/sln'])} | {fmt_ratio(rk['add+ln/add+sln'])} | "
                         f"{fmt_ratio(rk['skip_ln/skip_sln'])} | {fmt_ratio(rk['add+ln/skip_sln'])} | "
                         f"{_fmt(k['gbps']['sln'], '.0f')} | {_fmt(k['share_of_copy']['sln'])} | "
                         f"{_fmt(k['share_of_dram']['sln']) if k['level']['sln'] == 'DRAM' else '- (' + k['level']['sln'] + ')'} | "
                         f"{k['calls']} | {k['rounds']}/{k['kernel_rounds']} |")
        lines += ["", "us: kernel time per node (median [25th-75th] over kernel-time rounds). GB/s counts the bytes a "
                  "node must move (x read, y written; the residual forms also read the skip and write the sum) over "
                  "its kernel time. level: where those tensors live between nodes: L2 when all of them fit in the "
                  "device's L2, DRAM when what a node reads is at least 4x the L2, L2+DRAM between; a share of the "
                  "nominal DRAM bandwidth is given only at DRAM. `sln / copy`: against a Neg chain over the same "
                  "tensor, at any level. rounds: wall-clock / kernel-time rounds.", ""]
    if res["e2e"]:
        lines += ["## End to end (optimizer -> fp16 -> fold; IO binding on the device)", "",
                  "| model | batch | seq | original wall ms | original kernel ms | folded auto (wall) | folded auto "
                  "(kernel) | re-saved control | auto vs re-saved | always vs auto | never vs auto | fastest | "
                  "equivalent (worst rel / rtol) | calls | rounds |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for e in res["e2e"]:
            w, sp = e["wall_ms"]["original"], e["wall_spread_ms"]["original"]
            eq = e["equivalence"].get("folded_auto", {})
            worst = eq.get("outputs", {}).get(eq.get("worst_output"), {})
            lines.append(f"| {e['model']} | {e['batch']} | {e['seq']} | {w:.3f} [{sp[0]:.3f}-{sp[1]:.3f}] | "
                         f"{_fmt(e['kernel_ms']['original'], '.3f')} | {fmt_ratio(e['ratios']['folded_auto'])} | "
                         f"{fmt_ratio(e['kernel_ratios']['folded_auto'])} | {fmt_ratio(e['ratios']['resaved'])} | "
                         f"{fmt_ratio(e['vs_resaved']['folded_auto'])} | {fmt_ratio(e['fuse_vs_auto']['always'])} | "
                         f"{fmt_ratio(e['fuse_vs_auto']['never'])} | {e['fastest_fuse']} | "
                         f"{'yes' if e['equivalent'] else '**NO**'} ({worst.get('rel', float('nan')):.1e} / "
                         f"{worst.get('rtol', float('nan')):g}) | {e['calls']} | {e['rounds']}/{e['kernel_rounds']} |")
        lines += ["", "Models as prepared (the optimizer's fusions, the fold):", ""]
        for mdl in res.get("models", []):
            fused = ", ".join(f"{n} {op}" for op, n in mdl["optimizer"]["fused"].items())
            lines.append(f"- `{mdl['model']}` ({mdl['source']}): optimize_model(model_type="
                         f"'{mdl['optimizer']['model_type']}', opt_level=0): {fused or 'nothing fused'}; fp16; "
                         f"folded {mdl['folds']['auto']['folded']}/{mdl['folds']['auto']['layer_norms']} LNs")
        s = res["fuse_residual"]
        lines += ["", "`--fuse-residual` over all configurations (geometric mean of median(auto) / median(choice), "
                  "wall clock; counts of configurations whose interval excludes 1):", ""]
        for c in FUSE_CHOICES:
            lines.append(f"- `{c}`: fastest in {s[c]['wins']}, x{s[c]['geomean_vs_auto']:.3f} vs auto, "
                         f"faster than auto in {s[c]['faster_than_auto_ci']}, slower in {s[c]['slower_than_auto_ci']}")
        lines += [f"- choice for this execution provider: **{s['recommended']}**", ""]
    if res.get("skipped"):
        lines += ["Skipped: " + "; ".join(res["skipped"]), ""]
    return "\n".join(lines) + "\n"


def plot(res: dict, path: Path) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib not installed: no plot (pip install matplotlib)"
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    ax = axes[0]
    for dtype, marker in (("float16", "o"), ("float32", "s")):
        for pair, color in (("ln/sln", "C0"), ("add+ln/add+sln", "C1"), ("skip_ln/skip_sln", "C2")):
            pts = sorted((k["rows"] * k["hidden"], k["ratios_kernel"][pair]) for k in res["kernels"]
                         if k["dtype"] == dtype and k["ratios_kernel"][pair])
            if pts:
                ax.errorbar([p[0] for p in pts], [p[1]["ratio"] for p in pts],
                            yerr=[[p[1]["ratio"] - p[1]["lo"] for p in pts], [p[1]["hi"] - p[1]["ratio"] for p in pts]],
                            marker=marker, color=color, ls="-" if dtype == "float16" else "--", label=f"{pair} {dtype}")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("rows x hidden (elements)")
    ax.set_ylabel("kernel time ratio LN form / RMS form (>1: RMS faster)")
    ax.set_title("kernels (kernel time)")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    ax = axes[1]
    keys = sorted({(e["model"], e["batch"]) for e in res["e2e"]})
    for i, key in enumerate(keys):
        pts = sorted((e["seq"], e["ratios"]["folded_auto"]) for e in res["e2e"] if (e["model"], e["batch"]) == key)
        ax.errorbar([p[0] for p in pts], [p[1]["ratio"] for p in pts],
                    yerr=[[p[1]["ratio"] - p[1]["lo"] for p in pts], [p[1]["hi"] - p[1]["ratio"] for p in pts]],
                    marker="o", color=f"C{i % 10}", label=f"{key[0]} b{key[1]}")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("sequence length")
    ax.set_ylabel("median(original) / median(folded, auto), wall")
    ax.set_title("end to end")
    if keys:
        ax.legend(fontsize=7)
    gpu = res["device"].get("gpu") or res["device"]["execution_provider"]
    fig.suptitle(f"onnx_lnfold, ONNX Runtime {res['machine']['onnxruntime']}, {gpu}"
                 + ("  [SMOKE: CPU, not CUDA]" if res["mode"] != "cuda" else ""))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


# --------------------------------------------------------------------------- #
def sweep(cfg: SweepConfig, device: Device, out: Path, command: str, *, skip_kernels=False, skip_e2e=False,
          skip_gpt2=False, trained: list[Path] | None = None, workdir: Path | None = None,
          t0: float | None = None) -> dict:
    deadline = Deadline(cfg.max_seconds, t0)
    dev_info = device.check(_kernel_model("ln", 64, "float32", 1))
    res: dict = {"mode": device.kind, "command": command, "machine": machine_info(), "device": dev_info,
                 "config": dataclasses.asdict(cfg), "kernels": [], "e2e": [], "models": [], "fuse_residual": {},
                 "skipped": [], "seconds": 0.0, "failures": [], "failed": None}
    if device.kind == "cuda":
        dev_info["kernel_time_probe"] = kernel_time_probe(device)
    sources = set()
    if skip_kernels:
        res["skipped"].append("kernels (--skip-kernels)")
    else:
        log(f"kernels on {dev_info['execution_provider']}")
        res["kernels"] = run_kernels(device, cfg, dev_info, deadline, res["skipped"], res["failures"], workdir)
        sources |= {k["kernel_source"] for k in res["kernels"]}
        res["kernel_source"] = "; ".join(sorted(sources))
        res["seconds"] = deadline.elapsed()
        write_report(res, out)  # a sweep cut short still leaves its kernel figures
    if skip_e2e:
        res["skipped"].append("end to end (--skip-e2e)")
    else:
        log("end to end")
        res["e2e"], res["models"] = run_e2e(device, cfg, trained or [], skip_gpt2, deadline, res["skipped"],
                                            res["failures"], workdir)
        res["fuse_residual"] = fuse_summary(res["e2e"])
        sources |= {e["kernel_source"] for e in res["e2e"]}
    res["kernel_source"] = "; ".join(sorted(sources)) or "n/a"
    mismatch = equivalence_failure(res["e2e"])
    if mismatch:
        res["failures"].append({"kind": "equivalence", "message": mismatch})
    first = first_failure(res["failures"])
    res["failed"] = first["line"] if first else None
    res["seconds"] = deadline.elapsed()
    write_report(res, out)
    if first:
        raise SweepFailed(first["line"], EXIT_CODES[first["kind"]])
    return res


def kernel_time_probe(device: Device) -> dict:
    """Whether torch.profiler sees onnxruntime's kernels here, told once before anything is timed."""
    from benchmarks.cuda.timing import kineto_round

    try:
        sess = device.session(_kernel_model("ln", 64, "float32", 4), "kernel-time probe", optimize=False)
        t = Timed(device, sess, {"x": device.to_device(np.ones((1, 256, 64), np.float32))})
        t.run_sync()
        with tempfile.TemporaryDirectory() as tmp:
            us = kineto_round([t.run_sync], 2, Path(tmp))[0]
    except Exception as e:  # noqa: BLE001 - recorded: the sweep still has its wall clock
        return {"kernel_us": None, "note": f"torch.profiler failed: {str(e).splitlines()[0][:200]}"}
    if us is None:
        log("kernel time: torch.profiler saw no kernel of onnxruntime's; kernel figures will be n/m")
    return {"kernel_us": us, "note": "4 LayerNormalization nodes, 256 x 64 fp32, per run"}


def _preload_cuda_libraries() -> str:
    """The GPU host's CUDA 13 libraries come with torch: importing it first loads them into the
    process, where onnxruntime's CUDA provider then finds them (and torch.profiler, CUPTI, is there
    for the kernel time). Without torch, onnxruntime's own `preload_dlls` looks in the `nvidia`
    packages of site-packages."""
    try:
        import torch  # noqa: F401

        return "torch"
    except ImportError:
        pass
    import onnxruntime as ort

    if hasattr(ort, "preload_dlls"):
        try:
            ort.preload_dlls()
            return "onnxruntime.preload_dlls"
        except Exception:  # noqa: BLE001
            pass
    return "none"


def main(argv=None) -> int:
    t0 = time.perf_counter()  # the time cap counts from here: the imports of torch and CUDA's start are in it
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", nargs="?", const="standard", choices=["standard", "min"],
                    help="run the same code on the CPU EP at small sizes (min: fewer sizes, for the test suite)")
    ap.add_argument("--out", help=f"results folder (default {RESULTS_CUDA.relative_to(ROOT)}; with --smoke "
                                  f"{SMOKE_OUT.relative_to(ROOT)})")
    ap.add_argument("--skip-kernels", action="store_true")
    ap.add_argument("--skip-e2e", action="store_true")
    ap.add_argument("--skip-gpt2", action="store_true", help="end to end: the real trained models only")
    ap.add_argument("--trained", nargs="+", metavar="PATH",
                    help="real trained models (.onnx files or folders; default: models/trained/ if present)")
    ap.add_argument("--no-trained", action="store_true", help="no real trained models")
    ap.add_argument("--budget-scale", type=float, default=1.0, help="multiply every wall-clock budget by this")
    ap.add_argument("--max-seconds", type=float, help="time cap: nothing starts later than this (default: "
                                                       f"{FULL.max_seconds:.0f} s, {SMOKE.max_seconds:.0f} s with --smoke)")
    ap.add_argument("--workdir", help="where the end-to-end models are built (default: the system temp folder)")
    args = ap.parse_args(argv)

    kind = "cpu" if args.smoke else "cuda"
    cfg = {None: FULL, "standard": SMOKE, "min": SMOKE_MIN}[args.smoke]
    cfg = dataclasses.replace(cfg, kernel_budget_s=cfg.kernel_budget_s * args.budget_scale,
                              e2e_budget_s=cfg.e2e_budget_s * args.budget_scale,
                              max_seconds=args.max_seconds or cfg.max_seconds)
    out = Path(args.out) if args.out else (SMOKE_OUT if args.smoke else RESULTS_CUDA)
    if kind != "cuda" and out.resolve() == RESULTS_CUDA.resolve():
        print(f"error: --smoke runs on the CPU EP; its figures are not written to {RESULTS_CUDA}", file=sys.stderr)
        return 2
    try:
        trained = [] if args.no_trained else find_trained(args.trained)
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    preload = _preload_cuda_libraries() if kind == "cuda" else "not needed (CPU)"
    command = "python -m benchmarks.cuda " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    try:
        device = Device(kind)
        res = sweep(cfg, device, out, command.strip(), skip_kernels=args.skip_kernels, skip_e2e=args.skip_e2e,
                    skip_gpt2=args.skip_gpt2, trained=trained, workdir=Path(args.workdir) if args.workdir else None,
                    t0=t0)
    except SweepRefused as e:
        print(f"error: not run on CUDA: {e}", file=sys.stderr)
        return 2
    except PlacementError as e:  # the probe's own session: nothing was measured
        print(f"error: placement: {e}", file=sys.stderr)
        return 2
    except SweepFailed as e:
        print(f"error: {e} (results written to {out}, marked FAILED)", file=sys.stderr)
        return e.code
    res["device"]["cuda_libraries_loaded_by"] = preload
    (out / "results.json").write_text(json.dumps(res, indent=1))
    (out / "RESULTS.md").write_text(render_markdown(res))
    log(f"done in {res['seconds']:.0f} s; {out / 'RESULTS.md'}")
    print((out / "RESULTS.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
