"""`onnx-lnfold bench ORIGINAL FOLDED`: does the fold pay on this model, on this machine?

The original, its re-saved copy (onnx_ir load + save, the path the fold writes through: re-saving
alone can move ONNX Runtime's time, by node order and memory planning) and the fold are timed side
by side: each of `processes` fresh processes creates the three sessions in a rotated order (the
creation slot alone has moved a session by up to 5%), warms each up, then runs them in `rounds`
interleaved rounds, the order rotated every round. A process gives the ratio of its medians; a
ratio is the median over processes with a bootstrap 95% interval (processes resampled, and the
paired rounds within each: `stats.nested_ratio`) and the range over processes. Verdict: "faster" where both original/folded and re-saved/folded lie above 1
(their whole intervals), "slower" where both lie below, else "no change it can resolve", with the
smallest change these intervals resolve. A separate process per variant profiles the kernels (ONNX
Runtime's profiler): the normalizations' kernel time per op type, which is what the fold changes.

Every session runs on the provider asked for and no other (`placement`): a provider the session did
not get is an error, never a silent CPU figure. `benchmarks/trained.py` calls this same code.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from onnx_lnfold.bench import session_graph, stats
from onnx_lnfold.bench.placement import CPU, PlacementError, check_profile
from onnx_lnfold.bench.process import run_child
from onnx_lnfold.bench.profile import load, node_profile, op_profile
from onnx_lnfold.core.errors import InvalidInput
from onnx_lnfold.core.ops import NORM_OPS

VARIANTS = ("original", "resaved", "folded")
NORM_TYPES = tuple(dict.fromkeys(op.op_type for op in NORM_OPS))  # the normalizations a profile names


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


# --------------------------------------------------------------------------- #
# Timing: fresh processes, rotated creation, interleaved rounds
# --------------------------------------------------------------------------- #
@dataclass(frozen=True)
class Sessions:
    """What every fresh process of one comparison shares: the model files by variant, the inputs
    (.npz), the folder it works in, the rounds, warm-up runs, intra-op threads and the provider (the
    plan `runner` reads, but its mode and the order the sessions are created in)."""

    files: dict[str, str]
    feeds: str
    work: Path
    rounds: int
    warmup: int
    threads: int
    provider: str = CPU
    provider_options: dict | None = None

    def child_plan(self, mode: str, order: list[str], **extra) -> dict:
        return {"mode": mode, "files": self.files, "feeds": self.feeds, "order": order, "rounds": self.rounds,
                "warmup": self.warmup, "threads": self.threads, "provider": self.provider,
                "provider_options": self.provider_options, **extra}


def time_variants(sessions: Sessions, tag: str, processes: int) -> dict:
    """Every variant of `sessions.files` in `processes` fresh processes (the creation order rotated
    from one process to the next), its rounds interleaved in each; ratios of the per-process medians."""
    files = sessions.files
    names = [v for v in VARIANTS if v in files] + [v for v in files if v not in VARIANTS]
    times: dict[str, list[list[float]]] = {v: [] for v in names}
    for k in range(processes):
        order = names[k % len(names):] + names[: k % len(names)]
        out = run_child(sessions.child_plan("time", order), sessions.work, f"{tag}.p{k}")
        for v, t in out["times"].items():
            times[v].append(t)
    ratio = {f"{a}/{b}": stats.nested_ratio(times[a], times[b])
             for a, b in (("original", "folded"), ("resaved", "folded"), ("original", "resaved"))}
    per_process = [{v: float(np.median(times[v][k])) for v in names} for k in range(processes)]
    median_ms = {v: 1e3 * float(np.median([p[v] for p in per_process])) for v in names}
    return {"median_ms": median_ms, "ratios": ratio, "per_process_median_s": per_process,
            "times_s": {v: [[round(x, 7) for x in t] for t in ts] for v, ts in times.items()}}


@dataclass(frozen=True)
class Profiled:
    """What the profiled processes give: kernel time per op type of each variant (None where its
    profile holds no kernel time), and the run split into what the fold changed and the nodes both
    run (`split_kernel_time`; None where the profile names no node)."""

    ops: dict[str, dict[str, float] | None] | None
    split: dict | None


def profile_variants(sessions: Sessions, tag: str, variants: tuple[str, ...] = ("original", "folded")) -> Profiled:
    """One profiled process per variant; on the CPU EP, whose profile names each node, each also
    writes the graph its session runs, its weights discarded (an EP that compiles nodes may not
    write one). Placement is
    checked from the same profile."""
    ops, per_node, graphs = {}, {}, {}
    for variant in variants:
        prefix = str(sessions.work / f"prof.{tag}.{variant}")
        optimized = sessions.work / f"prof.{tag}.{variant}.optimized.onnx" if sessions.provider == CPU else None
        res = run_child(sessions.child_plan("profile", [variant], profile=prefix, optimized=optimized and str(optimized)),
                        sessions.work, f"{tag}.prof.{variant}")
        events = load(res["profile"])
        check_profile(events, sessions.provider, variant)
        ops[variant] = op_profile(events, sessions.rounds, sessions.provider)
        per_node[variant] = node_profile(events, sessions.rounds, sessions.provider)
        if optimized is not None:
            graphs[variant] = session_graph.read(optimized)
    both = set(graphs) >= {"original", "folded"}
    return Profiled(ops, split_kernel_time(graphs, per_node) if both else None)


def split_kernel_time(graphs: dict[str, onnx.GraphProto], per_node: dict[str, dict[str, float] | None]) -> dict | None:
    """The kernel time of the original's and the fold's runs split into what the fold changed (the
    normalization group, and every node outside it that only one graph runs) and the nodes both run
    (`session_graph.split_nodes`), us per run; None where a profile names no node."""
    if per_node["original"] is None or per_node["folded"] is None:
        return None
    variants = ("original", "folded")
    nodes = {v: {n.name: n.op_type for n in graphs[v].node} for v in variants}
    shared, alone = session_graph.split_nodes(nodes, {v: session_graph.norm_roles(graphs[v]) for v in variants})
    both = {v: sum(t for name, t in per_node[v].items() if name in shared) for v in variants}
    return {"shared_nodes": len(shared), "only_original": alone["original"], "only_folded": alone["folded"],
            "changed_us": [sum(per_node[v].values()) - both[v] for v in variants],
            "shared_us": [both[v] for v in variants]}


# --------------------------------------------------------------------------- #
# The verdict
# --------------------------------------------------------------------------- #
FASTER, SLOWER, UNRESOLVED = "faster", "slower", "no change it can resolve"
# The fewest processes and rounds whose bootstrap interval a verdict rests on: with fewer, the
# percentile interval of a resampled median is the sample's own range, and says nothing.
VERDICT_PROCESSES, VERDICT_ROUNDS = 3, 10


def verdict(ratios: dict, processes: int = VERDICT_PROCESSES, rounds: int = VERDICT_ROUNDS) -> tuple[str, str]:
    """(verdict, why in words) from original/folded and re-saved/folded (> 1: the fold is faster)."""
    a, b = ratios["original/folded"], ratios["resaved/folded"]
    resolves = 100 * max(stats.half_width(a), stats.half_width(b))
    if processes < VERDICT_PROCESSES or rounds < VERDICT_ROUNDS:
        return UNRESOLVED, (f"{processes} processes x {rounds} rounds are too few for a verdict (it takes "
                            f"{VERDICT_PROCESSES} x {VERDICT_ROUNDS} at least); the intervals above are shown, not read")
    if a["lo"] > 1 and b["lo"] > 1:
        return FASTER, "the folded model is faster than the original and than its re-saved copy (both intervals above 1)"
    if a["hi"] < 1 and b["hi"] < 1:
        return SLOWER, "the folded model is slower than the original and than its re-saved copy (both intervals below 1)"
    if a["lo"] > 1 or a["hi"] < 1:
        side = "faster" if a["lo"] > 1 else "slower"
        why = (f"the folded model is {side} than the original, but not resolvably so against its re-saved copy: "
               "what differs is the re-save, not the fold")
    elif b["lo"] > 1 or b["hi"] < 1:
        side = "faster" if b["lo"] > 1 else "slower"
        why = f"the folded model is {side} than its re-saved copy, but not resolvably so against the original"
    else:
        why = "both intervals contain 1"
    return UNRESOLVED, f"{why}; these runs resolve changes beyond about +-{resolves:.1f}%"


# --------------------------------------------------------------------------- #
# The command
# --------------------------------------------------------------------------- #
@dataclass
class BenchResult:
    original: str
    folded: str
    provider: str
    threads: int
    inputs: dict[str, list[int]]
    inputs_from: str
    processes: int
    rounds: int
    timing: dict
    profile: dict | None = None
    split: dict | None = None  # `split_kernel_time`
    verdict: str = ""
    why: str = ""
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return dict(self.__dict__)

    def format_text(self) -> str:
        t = self.timing
        ms = t["median_ms"]
        r = t["ratios"]
        lines = [
            f"onnx-lnfold bench: {self.original} vs {self.folded} on {self.provider}, {self.threads} intra-op thread(s)",
            f"  inputs: {', '.join(f'{k}{tuple(v)}' for k, v in self.inputs.items())} ({self.inputs_from})",
            f"  {self.processes} fresh processes x {self.rounds} interleaved rounds (sessions created in rotated order); "
            f"median run: original {ms['original']:.3f} ms, re-saved {ms['resaved']:.3f} ms, folded {ms['folded']:.3f} ms",
            f"  original / folded    {stats.fmt_across(r['original/folded'])}",
            f"  re-saved / folded    {stats.fmt_across(r['resaved/folded'])}",
            f"  original / re-saved  {stats.fmt_across(r['original/resaved'])}  (the control: re-saving alone)",
            "  (> 1: the folded model is faster; median over processes [bootstrap 95% interval over processes and "
            "rounds] (range over processes))",
            f"verdict: {self.verdict}: {self.why}",
        ]
        lines += [f"  note: {n}" for n in self.notes]
        lines += self._profile_lines()
        return "\n".join(lines)

    def _profile_lines(self) -> list[str]:
        if self.profile is None:
            return []
        before, after = self.profile.get("original"), self.profile.get("folded")
        if before is None or after is None:
            return [f"kernel time per op: not measured: {self.provider}'s profile in this onnxruntime build records "
                    "no kernel events (its Node events are launch times)"]
        lines = ["kernel time per op type (ONNX Runtime's profiler, one process per variant; us per run, median over "
                 f"{self.rounds} runs; original -> folded):"]
        norms = [op for op in NORM_TYPES if before.get(op) or after.get(op)]
        width = max([len(op) for op in norms] + [24])
        for op in norms:
            lines.append(f"  {op:<{width}} {before.get(op, 0.0):10.1f} -> {after.get(op, 0.0):10.1f}")
        nb, na = sum(before.get(op, 0.0) for op in norms), sum(after.get(op, 0.0) for op in norms)
        lines.append(f"  {'normalizations':<{width}} {nb:10.1f} -> {na:10.1f}" + (f"  (x{nb / na:.2f})" if na else ""))
        total_b, total_a = sum(before.values()), sum(after.values())
        moved = sorted((op for op in set(before) | set(after) if op not in NORM_TYPES
                        and abs(after.get(op, 0.0) - before.get(op, 0.0)) > 0.005 * total_b),
                       key=lambda op: after.get(op, 0.0) - before.get(op, 0.0))
        for op in moved:
            lines.append(f"  {op:<{width}} {before.get(op, 0.0):10.1f} -> {after.get(op, 0.0):10.1f}")
        lines.append(f"  {'all kernels':<{width}} {total_b:10.1f} -> {total_a:10.1f}  (single-process figures: "
                     "several percent of noise per op type)")
        return lines + self._split_lines()

    def _split_lines(self) -> list[str]:
        if self.split is None:
            return []
        sp = self.split

        def ops(counts: dict[str, int]) -> str:
            return ", ".join(f"{n} {op}" for op, n in counts.items()) or "none"

        return [
            f"the graphs ONNX Runtime runs: {sp['shared_nodes']} nodes in both; outside the normalizations, only the "
            f"original runs {ops(sp['only_original'])}; only the fold, {ops(sp['only_folded'])}",
            f"  what the fold changed   {sp['changed_us'][0]:10.1f} -> {sp['changed_us'][1]:10.1f} us",
            f"  the nodes both run      {sp['shared_us'][0]:10.1f} -> {sp['shared_us'][1]:10.1f} us  (the same kernels "
            "on the same shapes: what moves them is the machine)",
        ]


def _feeds(model_path: str, inputs: dict[str, np.ndarray] | None, shapes: dict[str, tuple[int, ...]] | None):
    """The inputs to time with, and where they came from."""
    from onnx_lnfold.feeds.given import check_inputs
    from onnx_lnfold.feeds.sets import REALISTIC_SIZES
    from onnx_lnfold.feeds.synthesize import synthesize_inputs
    from onnx_lnfold.load.model import load_path

    model = load_path(Path(model_path))
    if inputs is not None:
        check_inputs(model, inputs)
        return inputs, "given"
    batch, seq = REALISTIC_SIZES[0]
    feeds = synthesize_inputs(model, shapes, batch_size=batch, sequence_length=seq, seed=2, realistic=True)
    given = f", {', '.join(shapes)} as given by --input-shape" if shapes else ""
    return feeds, (f"synthesized at batch {batch}, sequence {seq}{given}: give --inputs FILE.npz or --input-shape "
                   "for the shapes you run")


def resave(src: str, dest: Path) -> None:
    """The original re-saved as the fold writes its output (its external data beside it)."""
    from onnx_lnfold.load.model import load_path
    from onnx_lnfold.save.staged import StagedModel

    StagedModel(load_path(Path(src)), dest, rebind=True).commit()


def _same_inputs(original: str, folded: str) -> None:
    import onnx

    names = [[i.name for i in onnx.load(p, load_external_data=False).graph.input] for p in (original, folded)]
    inits = [{t.name for t in onnx.load(p, load_external_data=False).graph.initializer} for p in (original, folded)]
    a, b = ([n for n in ns if n not in init] for ns, init in zip(names, inits))
    if a != b:
        raise InvalidInput(f"{folded}: its inputs ({', '.join(b)}) are not {original}'s ({', '.join(a)}): "
                           "not a fold of that model")


def bench(original: str, folded: str, *, provider: str = CPU, provider_options: dict | None = None,
          inputs: dict[str, np.ndarray] | None = None, input_shapes: dict[str, tuple[int, ...]] | None = None,
          processes: int = 5, rounds: int = 20, warmup: int = 3, threads: int | None = None,
          profile: bool = True, workdir: str | None = None) -> BenchResult:
    """Time `original`, its re-saved copy and `folded` (see the module's docstring)."""
    for path in (original, folded):
        if not Path(path).is_file():
            raise InvalidInput(f"{path}: no such file")
    if processes < 2:
        raise InvalidInput("--processes must be at least 2: every variant is timed in two processes at least")
    if rounds < 2:
        raise InvalidInput("--rounds must be at least 2: every variant is timed in two positions at least")
    import onnxruntime as ort

    if provider not in ort.get_available_providers():
        raise PlacementError(f"onnxruntime {ort.__version__} has no {provider} (it has "
                             f"{', '.join(ort.get_available_providers())}): nothing is timed on another provider")
    _same_inputs(original, folded)
    threads = threads or usable_cores()
    feeds, inputs_from = _feeds(original, inputs, input_shapes)
    with tempfile.TemporaryDirectory(prefix="lnfold-bench-", dir=workdir) as tmp:
        work = Path(tmp)
        feeds_path = work / "feeds.npz"
        np.savez(feeds_path, **feeds)
        resaved = work / "resaved" / Path(original).name
        resaved.parent.mkdir()
        resave(original, resaved)
        files = {"original": str(Path(original).resolve()), "resaved": str(resaved), "folded": str(Path(folded).resolve())}
        sessions = Sessions(files, str(feeds_path), work, rounds, warmup, threads, provider, provider_options)
        timing = time_variants(sessions, "bench", processes)
        profiled = profile_variants(sessions, "bench") if profile else Profiled(None, None)
    result = BenchResult(original, folded, provider, threads, {k: list(v.shape) for k, v in feeds.items()},
                         inputs_from, processes, rounds, timing, profiled.ops, profiled.split)
    result.verdict, result.why = verdict(timing["ratios"], processes, rounds)
    control = timing["ratios"]["original/resaved"]
    if control["lo"] > 1 or control["hi"] < 1:
        result.notes.append(f"re-saving alone moved the time (original / re-saved x{control['ratio']:.3f}, interval "
                            f"excludes 1): re-saved / folded is what the fold itself does")
    return result


def write_json(result: BenchResult, path: str) -> None:
    Path(path).write_text(json.dumps(result.to_dict(), indent=1) + "\n")
