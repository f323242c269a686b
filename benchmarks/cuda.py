"""The CUDA sweep: LayerNorm vs RMSNorm kernels, folded GPT-2-style models end to end, and which
`--fuse-residual` choice is fastest, on ONNX Runtime's CUDA execution provider.

    python -m benchmarks.cuda                 # on a GPU host; results in benchmarks/results/cuda/
    python -m benchmarks.cuda --smoke         # the same code on the CPU EP, small sizes (< 2 min)

Nothing is reported as CUDA unless a probe session really runs on CUDAExecutionProvider with CPU
fallback disabled; otherwise the command says why in one line and exits 2, writing nothing.
`--smoke` runs on the CPU EP and refuses to write into benchmarks/results/cuda/.

1. Kernels: one-node-type graphs, a chain of `--repeat` nodes fed by the previous node (as a
   model's residual stream is), graph optimizations off so nothing is fused or split:

       ln        LayerNormalization                   sln       SimplifiedLayerNormalization
       add+ln    Add -> LayerNormalization            add+sln   Add -> SimplifiedLayerNormalization
       skip_ln   com.microsoft SkipLayerNormalization skip_sln  com.microsoft SkipSimplifiedLayerNormalization
       copy      Neg (reads and writes the tensor once: the device's achievable streaming bandwidth)

   fp32 and fp16, hidden x rows as configured. Time per node = time per run / repeat. GB/s =
   bytes each node must move (x read, y written; + skip read and sum written for the residual
   forms) / time, beside the copy's GB/s and the GPU's nominal bandwidth where known.
2. End to end: GPT-2-style models built on the fly (`benchmarks.gpt2_onnx`, random perturbed
   weights), fp16 and fp32; variants original, re-saved original (onnx_ir load + save: the fold's
   I/O path alone), folded with `--fuse-residual auto|always|never`; all sessions at graph
   optimization level ALL, timed interleaved (order rotated every round), inputs and outputs
   bound on the device (IO binding), so host copies are not timed. Each folded variant's logits
   are compared with the original's on the device at the first configuration.
3. The fastest `--fuse-residual` choice per configuration, and over all.

Timing: a sample is `calls` runs issued back to back without synchronizing the device between
them (run option `disable_synchronize_execution_providers`), then one synchronized run; sample
time / (calls + 1). `calls` is chosen in warm-up so a sample lasts about `--sample-ms`. Ratios are
median(original) / median(X) with a paired bootstrap 95% interval over rounds (> 1: X is faster).

Output in --out: results.json (everything, every sample), RESULTS.md (tables), cuda.png (plot;
skipped with a note when matplotlib is missing), with the machine, the GPU, and the versions.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.common import ROOT, fmt_ratio, log, machine_info, ratio_of_medians
from benchmarks.gpt2_onnx import Gpt2Shape, build_gpt2, make_inputs

RESULTS_CUDA = ROOT / "benchmarks" / "results" / "cuda"
SMOKE_OUT = ROOT / "benchmarks" / "cache" / "cuda_smoke"

KERNEL_KINDS = ["ln", "sln", "add+ln", "add+sln", "skip_ln", "skip_sln", "copy"]
# tensors of the [rows, hidden] size each node reads + writes (gamma/beta are negligible)
KERNEL_TRAFFIC = {"ln": 2, "sln": 2, "add+ln": 5, "add+sln": 5, "skip_ln": 4, "skip_sln": 4, "copy": 2}
KERNEL_PAIRS = [("ln", "sln"), ("add+ln", "add+sln"), ("skip_ln", "skip_sln"), ("add+ln", "skip_sln")]
FUSE_CHOICES = ["auto", "always", "never"]
E2E_VARIANTS = ["original", "resaved"] + [f"folded_{c}" for c in FUSE_CHOICES]

# Nominal DRAM bandwidth (GB/s) by GPU name fragment, for the "share of the device" column.
NOMINAL_GBPS = {"H200": 4800, "H100 SXM": 3350, "H100 PCIe": 2000, "H100": 3350, "A100-SXM4-80GB": 2039,
                "A100 80GB": 1935, "A100": 1555, "L40S": 864, "L4": 300, "A10": 600, "RTX 4090": 1008,
                "B200": 8000}


@dataclasses.dataclass
class SweepConfig:
    kernel_hidden: list[int]
    kernel_rows: list[int]
    dtypes: list[str]
    repeat: int                      # nodes per kernel graph
    e2e_shapes: list[Gpt2Shape]
    batches: list[int]
    seqs: list[int]
    max_tokens: dict[int, int]       # hidden -> cap on batch*seq (memory/time); absent: no cap
    warmup: int = 3
    min_rounds: int = 7
    max_rounds: int = 200
    kernel_budget_s: float = 0.6     # timing seconds per kernel (shape, dtype) after min_rounds
    e2e_budget_s: float = 2.0        # timing seconds per end-to-end configuration
    sample_ms: float = 20.0


FULL = SweepConfig(
    kernel_hidden=[768, 2048, 4096, 8192], kernel_rows=[512, 4096, 16384], dtypes=["float16", "float32"],
    repeat=10,
    e2e_shapes=[Gpt2Shape(hidden=768, layers=12), Gpt2Shape(hidden=2048, layers=12)],
    batches=[1, 8], seqs=[128, 512, 2048], max_tokens={2048: 8192},
)
# --smoke: every code path of FULL, at sizes two shared CPU cores run in well under two minutes
SMOKE = SweepConfig(
    kernel_hidden=[64, 256], kernel_rows=[64], dtypes=["float16", "float32"], repeat=3,
    e2e_shapes=[Gpt2Shape(hidden=64, layers=2, vocab=512, positions=256)],
    batches=[1, 2], seqs=[16, 64], max_tokens={64: 64},
    warmup=1, min_rounds=3, max_rounds=5, kernel_budget_s=0.0, e2e_budget_s=0.0, sample_ms=2.0,
)
# --smoke=min: the same paths again, fewer sizes (the test suite runs this one)
SMOKE_MIN = dataclasses.replace(SMOKE, kernel_hidden=[64], dtypes=["float16", "float32"], batches=[1],
                                seqs=[16, 32], max_tokens={}, min_rounds=3, max_rounds=3, sample_ms=1.0)


class SweepRefused(Exception):
    """The sweep cannot run as asked (no CUDA, or CPU figures headed for the CUDA results)."""


# --------------------------------------------------------------------------- #
# Device
# --------------------------------------------------------------------------- #
class Device:
    """The execution provider a sweep runs on: CUDA (proven by a probe session) or CPU (smoke)."""

    def __init__(self, kind: str):
        import onnxruntime as ort

        self.kind = kind
        self.ort = ort
        if kind == "cuda":
            self.providers = [("CUDAExecutionProvider", {"device_id": 0})]
            self.ort_device = "cuda"
        else:
            self.providers = ["CPUExecutionProvider"]
            self.ort_device = "cpu"

    def check(self) -> dict:
        """Raise SweepRefused unless a session really runs on this device; return what it found."""
        ort = self.ort
        info: dict = {"execution_provider": self.providers[0] if isinstance(self.providers[0], str)
                      else self.providers[0][0]}
        if self.kind != "cuda":
            return info
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            raise SweepRefused(f"onnxruntime {ort.__version__} at {Path(ort.__file__).parent} has no "
                               f"CUDAExecutionProvider (providers: {', '.join(ort.get_available_providers())}); "
                               "install onnxruntime-gpu (see benchmarks/gpu_host/)")
        so = self.session_options(optimize=False)
        so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
        try:
            sess = ort.InferenceSession(_kernel_model("ln", 64, "float32", 1), so, providers=self.providers)
            x = np.ones((1, 4, 64), np.float32)
            y = self.run_once(sess, {"x": x})
        except Exception as e:  # noqa: BLE001 - the reason is the message
            raise SweepRefused(f"a CUDA session could not run: {str(e).splitlines()[0][:300]} "
                               "(CUDA libraries not found? see benchmarks/gpu_host/run_on_host.sh)") from None
        if sess.get_providers()[0] != "CUDAExecutionProvider":
            raise SweepRefused(f"the probe session ran on {sess.get_providers()}, not CUDAExecutionProvider")
        if not np.isfinite(y[0]).all():
            raise SweepRefused("the probe session on CUDA returned non-finite values")
        # e.g. use_tf32 (on by default: fp32 MatMuls then round like TF32 on both sides of a ratio)
        info["provider_options"] = sess.get_provider_options().get("CUDAExecutionProvider", {})
        info.update(gpu_info())
        return info

    def session_options(self, optimize: bool = True):
        ort = self.ort
        so = ort.SessionOptions()
        so.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize
                                       else ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
        so.log_severity_level = 3
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        if self.kind == "cpu":
            so.intra_op_num_threads = 1  # smoke: two shared cores, several sessions interleaved
            so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        return so

    def session(self, model, optimize: bool = True):
        return self.ort.InferenceSession(model if isinstance(model, (bytes, str)) else str(model),
                                         self.session_options(optimize), providers=self.providers)

    def to_device(self, arr: np.ndarray):
        return self.ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(arr), self.ort_device, 0)

    def binding(self, sess, device_feeds: dict):
        io = sess.io_binding()
        for name, value in device_feeds.items():
            io.bind_ortvalue_input(name, value)
        for out in sess.get_outputs():
            io.bind_output(out.name, self.ort_device, 0)
        return io

    def run_once(self, sess, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        io = self.binding(sess, {k: self.to_device(v) for k, v in feeds.items()})
        sess.run_with_iobinding(io)
        return io.copy_outputs_to_cpu()


def gpu_info() -> dict:
    info: dict = {}
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version,clocks.max.memory",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
        if out.returncode == 0 and out.stdout.strip():
            name, mem, driver, mclk = (s.strip() for s in out.stdout.strip().splitlines()[0].split(","))
            info.update(gpu=name, gpu_memory=mem, driver=driver, max_memory_clock=mclk)
    except (OSError, subprocess.TimeoutExpired, ValueError):
        pass
    torch = sys.modules.get("torch")  # imported first on the GPU host for its CUDA libraries
    if torch is not None:
        info["torch"] = torch.__version__
        info["torch_cuda"] = getattr(torch.version, "cuda", None)
        try:
            if torch.cuda.is_available():
                info.setdefault("gpu", torch.cuda.get_device_name(0))
                props = torch.cuda.get_device_properties(0)
                info["compute_capability"] = f"{props.major}.{props.minor}"
        except Exception:  # noqa: BLE001
            pass
    info["nominal_gbps"] = nominal_bandwidth(info.get("gpu", ""))
    return info


def nominal_bandwidth(gpu_name: str) -> float | None:
    for key in sorted(NOMINAL_GBPS, key=len, reverse=True):
        if key.lower() in gpu_name.lower():
            return float(NOMINAL_GBPS[key])
    return None


# --------------------------------------------------------------------------- #
# Timing
# --------------------------------------------------------------------------- #
class Timed:
    """One session with its inputs bound on the device; `sample()` times `calls` + 1 runs."""

    def __init__(self, device: Device, sess, device_feeds: dict):
        self.sess, self.io = sess, device.binding(sess, device_feeds)
        self.async_opts = device.ort.RunOptions()
        self.async_opts.add_run_config_entry("disable_synchronize_execution_providers", "1")
        self.calls = 1

    def run_sync(self) -> None:
        self.sess.run_with_iobinding(self.io)

    def calibrate(self, sample_ms: float, warmup: int) -> None:
        for _ in range(max(1, warmup)):
            self.run_sync()
        t0 = time.perf_counter()
        self.run_sync()
        one = time.perf_counter() - t0
        self.calls = int(min(200, max(0, round(sample_ms / 1e3 / max(one, 1e-6)) - 1)))

    def sample(self) -> float:
        t0 = time.perf_counter()
        for _ in range(self.calls):
            self.sess.run_with_iobinding(self.io, self.async_opts)
        self.sess.run_with_iobinding(self.io)  # synchronizes the device: every queued run has finished
        return (time.perf_counter() - t0) / (self.calls + 1)


def interleave(timed: dict[str, Timed], cfg: SweepConfig, budget_s: float) -> dict[str, np.ndarray]:
    for t in timed.values():
        t.calibrate(cfg.sample_ms, cfg.warmup)
    names = list(timed)
    samples: dict[str, list[float]] = {k: [] for k in names}
    t_start, r = time.perf_counter(), 0
    while r < cfg.max_rounds and (r < cfg.min_rounds or time.perf_counter() - t_start < budget_s):
        for k in names[r % len(names):] + names[:r % len(names)]:
            samples[k].append(timed[k].sample())
        r += 1
    return {k: np.array(v) for k, v in samples.items()}


# --------------------------------------------------------------------------- #
# 1. Kernels
# --------------------------------------------------------------------------- #
def _kernel_model(kind: str, hidden: int, dtype: str, repeat: int) -> bytes:
    """A chain of `repeat` nodes of one kind; each reads the previous node's output (and, for the
    residual forms, the running sum), so nothing is dead and no node reads a graph input twice."""
    from onnx import TensorProto, helper, numpy_helper

    np_dtype = np.dtype(dtype)
    elem = TensorProto.FLOAT16 if np_dtype == np.float16 else TensorProto.FLOAT
    rng = np.random.default_rng(hidden)
    inits = [numpy_helper.from_array((1 + 0.1 * rng.standard_normal(hidden)).astype(np_dtype), "gamma"),
             numpy_helper.from_array((0.1 * rng.standard_normal(hidden)).astype(np_dtype), "beta")]
    residual = kind in ("add+ln", "add+sln", "skip_ln", "skip_sln")
    inputs = [helper.make_tensor_value_info("x", elem, [1, "rows", hidden])]
    if residual:
        inputs.append(helper.make_tensor_value_info("skip", elem, [1, "rows", hidden]))
    nodes, x, r, eps = [], "x", "skip", 1e-5
    for i in range(repeat):
        y = f"y{i}"
        if kind == "copy":
            nodes.append(helper.make_node("Neg", [x], [y]))
        elif kind == "ln":
            nodes.append(helper.make_node("LayerNormalization", [x, "gamma", "beta"], [y], axis=-1, epsilon=eps))
        elif kind == "sln":
            nodes.append(helper.make_node("SimplifiedLayerNormalization", [x, "gamma"], [y], axis=-1, epsilon=eps))
        elif kind in ("add+ln", "add+sln"):
            nodes.append(helper.make_node("Add", [x, r], [f"r{i}"]))
            norm = (helper.make_node("LayerNormalization", [f"r{i}", "gamma", "beta"], [y], axis=-1, epsilon=eps)
                    if kind == "add+ln" else
                    helper.make_node("SimplifiedLayerNormalization", [f"r{i}", "gamma"], [y], axis=-1, epsilon=eps))
            nodes.append(norm)
        elif kind == "skip_ln":
            nodes.append(helper.make_node("SkipLayerNormalization", [x, r, "gamma", "beta"], [y, "", "", f"r{i}"],
                                          domain="com.microsoft", epsilon=eps))
        elif kind == "skip_sln":
            nodes.append(helper.make_node("SkipSimplifiedLayerNormalization", [x, r, "gamma"], [y, "", "", f"r{i}"],
                                          domain="com.microsoft", epsilon=eps))
        else:
            raise ValueError(kind)
        x, r = y, (f"r{i}" if residual else r)
    outputs = [helper.make_tensor_value_info(x, elem, [1, "rows", hidden])]
    if residual:
        outputs.append(helper.make_tensor_value_info(r, elem, [1, "rows", hidden]))
    used = {i for n in nodes for i in n.input}
    graph = helper.make_graph(nodes, f"{kind}_x{repeat}", inputs, outputs, [t for t in inits if t.name in used])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 9
    return m.SerializeToString()


def run_kernels(device: Device, cfg: SweepConfig, gbps_nominal: float | None) -> list[dict]:
    results = []
    for dtype in cfg.dtypes:
        size = np.dtype(dtype).itemsize
        for hidden in cfg.kernel_hidden:
            sessions = {k: device.session(_kernel_model(k, hidden, dtype, cfg.repeat), optimize=False)
                        for k in KERNEL_KINDS}
            for rows in cfg.kernel_rows:
                rng = np.random.default_rng(rows + hidden)
                x = device.to_device(rng.standard_normal((1, rows, hidden), dtype=np.float32).astype(dtype))
                s = device.to_device(rng.standard_normal((1, rows, hidden), dtype=np.float32).astype(dtype))
                timed = {k: Timed(device, sess, {"x": x, "skip": s} if len(sess.get_inputs()) == 2 else {"x": x})
                         for k, sess in sessions.items()}
                samples = interleave(timed, cfg, cfg.kernel_budget_s)
                per_node = {k: v / cfg.repeat for k, v in samples.items()}
                res = {"dtype": dtype, "hidden": hidden, "rows": rows, "repeat": cfg.repeat,
                       "rounds": int(len(per_node["ln"])), "calls": {k: t.calls + 1 for k, t in timed.items()},
                       "median_us": {k: float(np.median(v) * 1e6) for k, v in per_node.items()},
                       "samples_us": {k: [round(float(t) * 1e6, 3) for t in v] for k, v in per_node.items()}}
                res["gbps"] = {k: KERNEL_TRAFFIC[k] * rows * hidden * size / (res["median_us"][k] * 1e-6) / 1e9
                               for k in KERNEL_KINDS}
                if gbps_nominal:
                    res["share_of_nominal"] = {k: g / gbps_nominal for k, g in res["gbps"].items()}
                res["ratios"] = {f"{a}/{b}": ratio_of_medians(per_node[a], per_node[b]) for a, b in KERNEL_PAIRS}
                results.append(res)
                ln_sln = res["ratios"]["ln/sln"]
                log(f"  kernel {dtype} d{hidden} x {rows} rows: ln {res['median_us']['ln']:.1f} us, "
                    f"sln {res['median_us']['sln']:.1f} us (x{ln_sln['ratio']:.3f}), "
                    f"skip_ln {res['median_us']['skip_ln']:.1f} us, skip_sln {res['median_us']['skip_sln']:.1f} us, "
                    f"copy {res['gbps']['copy']:.0f} GB/s")
                del timed, x, s
            del sessions
    return results


# --------------------------------------------------------------------------- #
# 2. End to end
# --------------------------------------------------------------------------- #
def _start_fold(src: Path, dst: Path, fuse: str) -> tuple[subprocess.Popen, Path]:
    # --fold-costly: every LN folds in every variant (the final one, whose beta stays an Add, is
    # kept by default: the CPU cost rule), so the variants differ by their residual fusion alone.
    proc = subprocess.Popen([sys.executable, "-m", "onnx_lnfold", str(src), "-o", str(dst), "--no-verify", "-q",
                             "--fuse-residual", fuse, "--fold-costly", "--json", str(dst.with_suffix(".json"))],
                            cwd=ROOT, stderr=subprocess.PIPE, text=True)
    return proc, dst


def _finish_fold(proc: subprocess.Popen, dst: Path) -> dict:
    _, err = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"onnx_lnfold failed on {dst.name} (exit {proc.returncode}): {err.strip()[-500:]}")
    rep = json.loads(dst.with_suffix(".json").read_text())
    return {"layer_norms": rep["layer_norms"], "folded": rep["folded"], "ops_after": rep.get("ops_after"),
            "untied_bytes": rep.get("untied_bytes")}


def _graph_digest(path: Path) -> str:
    """Digest of the graph file alone (external data excluded): two variants whose graphs match
    run the same nodes."""
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def prepare_models(shape: Gpt2Shape, dtype: str, workdir: Path) -> dict:
    import onnx_ir as ir

    t0 = time.perf_counter()
    orig = build_gpt2(shape, dtype, workdir / "original.onnx")
    t_build = time.perf_counter() - t0
    paths = {"original": orig}
    # the three folds run in subprocesses while this process re-saves the original
    pending = {fuse: _start_fold(orig, workdir / f"folded_{fuse}.onnx", fuse) for fuse in FUSE_CHOICES}
    resaved = workdir / "resaved.onnx"
    ir.save(ir.load(orig), resaved, external_data=resaved.name + ".data", size_threshold_bytes=1024)
    paths["resaved"] = resaved
    folds = {}
    for fuse, (proc, dst) in pending.items():
        folds[fuse] = _finish_fold(proc, dst)
        paths[f"folded_{fuse}"] = dst
    return {"paths": paths, "folds": folds, "build_s": t_build, "prepare_s": time.perf_counter() - t0,
            "graph_digest": {k: _graph_digest(p) for k, p in paths.items()}}


def _equivalence(device: Device, timed: dict[str, Timed]) -> dict:
    timed["original"].run_sync()
    ref = timed["original"].io.copy_outputs_to_cpu()[0].astype(np.float64)
    out = {}
    for k, t in timed.items():
        if k == "original":
            continue
        t.run_sync()
        got = t.io.copy_outputs_to_cpu()[0].astype(np.float64)
        diff = float(np.max(np.abs(got - ref)))
        out[k] = {"max_abs_diff": diff, "rel": diff / max(float(np.max(np.abs(ref))), 1e-30),
                  "finite": bool(np.isfinite(got).all())}
    return out


def run_e2e(device: Device, cfg: SweepConfig, workroot: Path, skipped: list[str]) -> list[dict]:
    results = []
    for shape in cfg.e2e_shapes:
        for dtype in cfg.dtypes:
            workdir = workroot / f"{shape.label}_{dtype}"
            shutil.rmtree(workdir, ignore_errors=True)
            workdir.mkdir(parents=True)
            try:
                prep = prepare_models(shape, dtype, workdir)
                log(f"  {shape.label} {dtype}: built in {prep['build_s']:.1f} s, re-saved and folded 3 ways in "
                    f"{prep['prepare_s']:.1f} s; folded {prep['folds']['auto']['folded']}/"
                    f"{prep['folds']['auto']['layer_norms']} LNs")
                sessions = {k: device.session(p) for k, p in prep["paths"].items()}
                checked = None
                cap = cfg.max_tokens.get(shape.hidden)
                for batch in cfg.batches:
                    for seq in cfg.seqs:
                        if seq > shape.positions or (cap and batch * seq > cap):
                            note = f"{shape.label} {dtype} b{batch} s{seq} (" + (
                                f"seq > {shape.positions} positions)" if seq > shape.positions
                                else f"batch*seq > {cap}: memory and time cap)")
                            skipped.append(note)
                            continue
                        feeds = make_inputs(shape, batch, seq, seed=batch * 7 + seq)
                        dev_feeds = {k: device.to_device(v) for k, v in feeds.items()}
                        timed = {k: Timed(device, s, dev_feeds) for k, s in sessions.items()}
                        if checked is None:
                            checked = _equivalence(device, timed)
                        samples = interleave(timed, cfg, cfg.e2e_budget_s)
                        res = _e2e_result(shape, dtype, batch, seq, samples, timed)
                        res.update(folds=prep["folds"], graph_digest=prep["graph_digest"], equivalence=checked)
                        results.append(res)
                        f = res["ratios"]["folded_auto"]
                        log(f"  {shape.label} {dtype} b{batch} s{seq}: original {res['median_ms']['original']:.3f} ms; "
                            f"folded(auto) x{f['ratio']:.3f} [{f['lo']:.3f}, {f['hi']:.3f}], re-saved "
                            f"x{res['ratios']['resaved']['ratio']:.3f}; fastest fold: {res['fastest_fuse']}")
                        del timed, dev_feeds
                del sessions
            finally:
                shutil.rmtree(workdir, ignore_errors=True)
    return results


def _e2e_result(shape, dtype, batch, seq, samples, timed) -> dict:
    med = {k: float(np.median(v)) for k, v in samples.items()}
    fastest = min(FUSE_CHOICES, key=lambda c: med[f"folded_{c}"])
    return {
        "model": shape.label, "hidden": shape.hidden, "layers": shape.layers, "vocab": shape.vocab,
        "params": shape.parameters(), "dtype": dtype, "batch": batch, "seq": seq,
        "rounds": int(len(samples["original"])), "calls": {k: t.calls + 1 for k, t in timed.items()},
        "median_ms": {k: v * 1e3 for k, v in med.items()},
        "ratios": {k: ratio_of_medians(samples["original"], samples[k]) for k in E2E_VARIANTS if k != "original"},
        "vs_resaved": {f"folded_{c}": ratio_of_medians(samples["resaved"], samples[f"folded_{c}"])
                       for c in FUSE_CHOICES},
        "fuse_vs_auto": {c: ratio_of_medians(samples["folded_auto"], samples[f"folded_{c}"]) for c in FUSE_CHOICES},
        "fastest_fuse": fastest,
        "samples_ms": {k: [round(float(t) * 1e3, 5) for t in v] for k, v in samples.items()},
    }


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


def render_markdown(res: dict) -> str:
    m, dev = res["machine"], res["device"]
    smoke = res["mode"] != "cuda"
    lines = [f"# onnx_lnfold on ONNX Runtime {'CPU (SMOKE TEST: not CUDA figures)' if smoke else 'CUDA'}", ""]
    lines.append(f"Command: `{res['command']}`  ")
    gpu = (f"GPU: {dev.get('gpu', '?')} ({dev.get('gpu_memory', '?')}, driver {dev.get('driver', '?')}, "
           f"nominal {dev.get('nominal_gbps') or '?'} GB/s); " if not smoke else "")
    lines.append(f"{gpu}execution provider {dev['execution_provider']}; onnxruntime {m['onnxruntime']}, onnx "
                 f"{m['onnx']}, onnx_lnfold {m['onnx_lnfold']} at git {m['git_commit']}, Python {m['python']}"
                 + (f", torch {dev['torch']} (CUDA {dev.get('torch_cuda')})" if dev.get("torch") else "") + "  ")
    lines.append(f"Host: {m['cpu']}, {m['logical_cores']} cores; run {m['date']}, {res['seconds']:.0f} s")
    lines += ["", "Ratios are median(A) / median(B) with a paired bootstrap 95% interval (> 1: B is faster). "
              "See benchmarks/README.md, section CUDA.", ""]
    if res["kernels"]:
        lines += ["## Kernels (one node type, chained; time per node, device tensors)", "",
                  "| dtype | hidden | rows | ln us | sln us | ln/sln | add+ln us | add+sln us | add+ln/add+sln | "
                  "skip_ln us | skip_sln us | skip_ln/skip_sln | add+ln/skip_sln | sln GB/s | copy GB/s |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for k in res["kernels"]:
            u, r, g = k["median_us"], k["ratios"], k["gbps"]
            lines.append(f"| {k['dtype']} | {k['hidden']} | {k['rows']} | {u['ln']:.2f} | {u['sln']:.2f} | "
                         f"{fmt_ratio(r['ln/sln'])} | {u['add+ln']:.2f} | {u['add+sln']:.2f} | "
                         f"{fmt_ratio(r['add+ln/add+sln'])} | {u['skip_ln']:.2f} | {u['skip_sln']:.2f} | "
                         f"{fmt_ratio(r['skip_ln/skip_sln'])} | {fmt_ratio(r['add+ln/skip_sln'])} | "
                         f"{g['sln']:.0f} | {g['copy']:.0f} |")
        lines += ["", "GB/s counts the bytes a node must move (x read, y written; the residual forms also read "
                  "the skip and write the sum); `copy` is a Neg chain over the same tensor: what this device "
                  "streams in practice.", ""]
    if res["e2e"]:
        lines += ["## End to end (GPT-2-style, built on the fly; IO binding on the device)", "",
                  "| model | dtype | batch | seq | original ms | folded auto | re-saved control | folded auto vs "
                  "re-saved | always vs auto | never vs auto | fastest | max rel diff (auto) | rounds |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for e in res["e2e"]:
            eq = e["equivalence"].get("folded_auto", {})
            lines.append(f"| {e['model']} | {e['dtype']} | {e['batch']} | {e['seq']} | {e['median_ms']['original']:.3f} | "
                         f"{fmt_ratio(e['ratios']['folded_auto'])} | {fmt_ratio(e['ratios']['resaved'])} | "
                         f"{fmt_ratio(e['vs_resaved']['folded_auto'])} | {fmt_ratio(e['fuse_vs_auto']['always'])} | "
                         f"{fmt_ratio(e['fuse_vs_auto']['never'])} | {e['fastest_fuse']} | "
                         f"{eq.get('rel', float('nan')):.2e} | {e['rounds']} |")
        s = res["fuse_residual"]
        lines += ["", "`--fuse-residual` over all configurations (geometric mean of median(auto) / median(choice); "
                  "counts of configurations whose interval excludes 1):", ""]
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
            pts = sorted((k["rows"] * k["hidden"], k["ratios"][pair]) for k in res["kernels"] if k["dtype"] == dtype)
            if pts:
                ax.errorbar([p[0] for p in pts], [p[1]["ratio"] for p in pts],
                            yerr=[[p[1]["ratio"] - p[1]["lo"] for p in pts], [p[1]["hi"] - p[1]["ratio"] for p in pts]],
                            marker=marker, color=color, ls="-" if dtype == "float16" else "--", label=f"{pair} {dtype}")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("rows x hidden (elements)")
    ax.set_ylabel("time ratio LN form / RMS form (>1: RMS faster)")
    ax.set_title("kernels")
    if res["kernels"]:
        ax.legend(fontsize=7)
    ax = axes[1]
    keys = sorted({(e["model"], e["dtype"], e["batch"]) for e in res["e2e"]})
    for i, key in enumerate(keys):
        pts = sorted((e["seq"], e["ratios"]["folded_auto"]) for e in res["e2e"] if (e["model"], e["dtype"], e["batch"]) == key)
        ax.errorbar([p[0] for p in pts], [p[1]["ratio"] for p in pts],
                    yerr=[[p[1]["ratio"] - p[1]["lo"] for p in pts], [p[1]["hi"] - p[1]["ratio"] for p in pts]],
                    marker="o", color=f"C{i % 10}", label=f"{key[0]} {key[1]} b{key[2]}")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("sequence length")
    ax.set_ylabel("median(original) / median(folded, auto)")
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
def sweep(cfg: SweepConfig, device: Device, out: Path, command: str, skip_kernels=False, skip_e2e=False,
          workdir: Path | None = None) -> dict:
    t0 = time.perf_counter()
    dev_info = device.check()
    res: dict = {"mode": device.kind, "command": command, "machine": machine_info(), "device": dev_info,
                 "config": dataclasses.asdict(cfg), "kernels": [], "e2e": [], "fuse_residual": {}, "skipped": [],
                 "seconds": 0.0}
    if skip_kernels:
        res["skipped"].append("kernels (--skip-kernels)")
    else:
        log(f"kernels on {dev_info['execution_provider']}")
        res["kernels"] = run_kernels(device, cfg, dev_info.get("nominal_gbps"))
        res["seconds"] = time.perf_counter() - t0
        write_report(res, out)  # a sweep cut short still leaves its kernel figures
    if skip_e2e:
        res["skipped"].append("end to end (--skip-e2e)")
    else:
        log("end to end")
        tmp = Path(tempfile.mkdtemp(prefix="lnfold-cuda-", dir=workdir))
        try:
            res["e2e"] = run_e2e(device, cfg, tmp, res["skipped"])
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        res["fuse_residual"] = fuse_summary(res["e2e"])
    res["seconds"] = time.perf_counter() - t0
    write_report(res, out)
    return res


def _preload_cuda_libraries() -> str:
    """The GPU host's CUDA 13 libraries come with torch: importing it first loads them into the
    process, where onnxruntime's CUDA provider then finds them. Without torch, onnxruntime's own
    `preload_dlls` looks in the `nvidia` packages of site-packages."""
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
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", nargs="?", const="standard", choices=["standard", "min"],
                    help="run the same code on the CPU EP at small sizes (min: fewer sizes, for the test suite)")
    ap.add_argument("--out", help=f"results folder (default {RESULTS_CUDA.relative_to(ROOT)}; with --smoke "
                                  f"{SMOKE_OUT.relative_to(ROOT)})")
    ap.add_argument("--skip-kernels", action="store_true")
    ap.add_argument("--skip-e2e", action="store_true")
    ap.add_argument("--budget-scale", type=float, default=1.0, help="multiply every timing budget by this")
    ap.add_argument("--workdir", help="where the end-to-end models are built (default: the system temp folder)")
    args = ap.parse_args(argv)

    kind = "cpu" if args.smoke else "cuda"
    cfg = {None: FULL, "standard": SMOKE, "min": SMOKE_MIN}[args.smoke]
    cfg = dataclasses.replace(cfg, kernel_budget_s=cfg.kernel_budget_s * args.budget_scale,
                              e2e_budget_s=cfg.e2e_budget_s * args.budget_scale)
    out = Path(args.out) if args.out else (SMOKE_OUT if args.smoke else RESULTS_CUDA)
    if kind != "cuda" and out.resolve() == RESULTS_CUDA.resolve():
        print(f"error: --smoke runs on the CPU EP; its figures are not written to {RESULTS_CUDA}", file=sys.stderr)
        return 2
    preload = _preload_cuda_libraries() if kind == "cuda" else "not needed (CPU)"
    try:
        device = Device(kind)
        command = "python -m benchmarks.cuda " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
        res = sweep(cfg, device, out, command.strip(), args.skip_kernels, args.skip_e2e,
                    Path(args.workdir) if args.workdir else None)
    except SweepRefused as e:
        print(f"error: not run on CUDA: {e}", file=sys.stderr)
        return 2
    res["device"]["cuda_libraries_loaded_by"] = preload
    (out / "results.json").write_text(json.dumps(res, indent=1))
    log(f"done in {res['seconds']:.0f} s; {out / 'RESULTS.md'}")
    print((out / "RESULTS.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
