"""`onnx-lnfold calibrate --provider NAME -o costs.json`: the kernel costs the never-slower rule
reads, measured on one execution provider, as a cost table (`decide.costs.CostTable`) that `--costs`
folds by.

What is measured: per node kind the rule prices (`decide.costs.KINDS`: LayerNormalization,
SimplifiedLayerNormalization, their Skip forms, the residual Add, beta's Add, an explicit centering;
and `decide.costs.LAYOUT_KINDS`: a centering and a decomposed LN over a non-last axis, a Transpose, on a
[1, width, tokens] stream), what one more such node costs a run, at every (tokens, width) of the shapes the rule decides on
(widths 64-1024, 16-8192 tokens). A node's cost is the marginal cost of a chain (`graphs`): the wall
time of a chain of `LONG` nodes less that of `SHORT` nodes, divided by the difference, so the run's
own fixed cost (session.run, feeds, fetches) cancels, as callgrind's (I(2N) - I(N)) / N does for the
built-in table; dispatch, allocation and, on a GPU, the launch are in it, as they are in a run.
Graph optimizations are off (ORT runs the chain's nodes as written) and, on a provider other than the
CPU, CPU fallback is disabled (`placement`): a node that would run elsewhere refuses the session.

Each of `processes` fresh processes creates the sessions in a rotated order and times every chain
of a shape in interleaved rounds (`sampling`: one `calls` count per shape, the rounds rotated); a
point's cost is the mean over processes, its spread their max - min (what the built-in table gives
its points too). The fit and the table are `tables`', the same for every table.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from onnx_lnfold.bench.graphs import CHANNELS_FIRST, chain_model
from onnx_lnfold.bench.placement import CPU, PlacementError, create_session, provider_name
from onnx_lnfold.bench.process import DEVICE_OF, rotated, run_child, session_options
from onnx_lnfold.bench.sampling import Timed, calibrate_calls, interleave
from onnx_lnfold.bench.tables import fit_error, make_table, write_table
from onnx_lnfold.core.errors import InvalidInput
from onnx_lnfold.core.ops import LAYER_NORM, RMS_NORM, SKIP_LAYER_NORM, SKIP_RMS_NORM
from onnx_lnfold.decide.costs import KINDS, LAYOUT_KINDS, CostTable, Point, builtin_table

CHAIN_OF = {  # the chain each cost kind is measured with (graphs.chain_model)
    LAYER_NORM.op_type: "ln",
    RMS_NORM.op_type: "sln",
    SKIP_LAYER_NORM.op_type: "skip_ln",
    SKIP_RMS_NORM.op_type: "skip_sln",
    "Add": "add",
    "BiasAdd": "bias_add",
    "Centering": "center",
    "StridedCentering": "strided_center",
    "StridedDecomposedLayerNorm": "strided_ln",
    "Transpose": "transpose",
}
MEASURED = (*KINDS, *LAYOUT_KINDS)  # every kind a table prices
SHORT, LONG = 4, 8  # chain lengths: a node's cost is (t(LONG) - t(SHORT)) / (LONG - SHORT)
WIDTHS = (64, 256, 384, 768, 1024)  # the built-in table's shapes
TOKENS = (16, 128, 1024, 8192)
QUICK_WIDTHS, QUICK_TOKENS, QUICK_ROUNDS = (64, 256), (16, 128), 3
SAMPLE_MS = 2.0  # a wall-clock sample is at least this long (runs back to back)


# --------------------------------------------------------------------------- #
# One process
# --------------------------------------------------------------------------- #
def measure_child(plan: dict) -> int:
    """`runner` mode "calibrate": every chain of each width, every token count, interleaved."""
    import onnxruntime as ort

    provider = plan["provider"]
    device = SimpleNamespace(ort=ort, ort_device=DEVICE_OF.get(provider, "cpu"))
    started = time.perf_counter()
    out: dict = {}
    for group in plan["groups"]:
        width, files = group["width"], group["files"]
        names = rotated(list(files), plan["rotation"])
        sessions = {}
        for name in names:  # created in the rotated order
            so = session_options(plan["threads"], optimize=False)  # the chain's nodes as written
            sessions[name] = create_session(ort, files[name], so, provider, plan.get("provider_options"),
                                            f"calibration {name} d{width}", strict=True)
        for tokens in group["tokens"]:
            if plan.get("max_seconds") and time.perf_counter() - started > plan["max_seconds"]:
                break
            rng = np.random.default_rng(tokens + width)
            x = rng.standard_normal((1, tokens, width), dtype=np.float32).astype(plan["dtype"])
            skip = rng.standard_normal((1, tokens, width), dtype=np.float32).astype(plan["dtype"])
            values = {"x": ort.OrtValue.ortvalue_from_numpy(x, device.ort_device, 0),
                      "skip": ort.OrtValue.ortvalue_from_numpy(skip, device.ort_device, 0),
                      "x channels first": ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(x.transpose(0, 2, 1)),
                                                                          device.ort_device, 0)}

            def feeds(name, session):
                first = name.rsplit("x", 1)[0] in CHANNELS_FIRST  # the chain's name: f"{chain}x{length}"
                return {i.name: values["x channels first" if first and i.name == "x" else i.name]
                        for i in session.get_inputs()}

            timed = {n: Timed(device, s, feeds(n, s)) for n, s in sessions.items()}
            timed = {n: timed[n] for n in rotated(names, plan["rotation"] + tokens)}
            cal = calibrate_calls(timed, plan["sample_ms"], plan["warmup"])
            wall = interleave(timed, cal["calls"], plan["rounds"], plan["rounds"], 0.0)
            out.setdefault(str(width), {})[str(tokens)] = {"calls": cal["calls"],
                                                           "samples_s": {n: [float(t) for t in v] for n, v in wall.items()}}
            del timed
        del sessions
    print(json.dumps({"times": out}))
    return 0


# --------------------------------------------------------------------------- #
# The table
# --------------------------------------------------------------------------- #
def node_cost_us(samples: dict[str, list[float]], kind: str) -> float:
    """One process's marginal cost of one node of `kind`, microseconds, from each chain's least
    disturbed sample (its minimum over the rounds: what the kernels cost, where a median also holds
    what other processes took from them; callgrind's counts, the built-in table's, hold neither)."""
    chain = CHAIN_OF[kind]
    long, short = np.min(samples[f"{chain}x{LONG}"]), np.min(samples[f"{chain}x{SHORT}"])
    return float(1e6 * (long - short) / (LONG - SHORT))


def points_from(processes: list[dict]) -> dict[str, list[Point]]:
    """Per kind, every shape all processes measured: the mean of their costs and its spread (max - min)."""
    shapes = set.intersection(*({(int(w), int(t)) for w, ts in p.items() for t in ts} for p in processes))
    out: dict[str, list[Point]] = {kind: [] for kind in MEASURED}
    for width, tokens in sorted(shapes):
        for kind in MEASURED:
            if f"{CHAIN_OF[kind]}x{LONG}" not in processes[0][str(width)][str(tokens)]["samples_s"]:
                continue  # samples kept before the layout kinds were measured
            costs = [node_cost_us(p[str(width)][str(tokens)]["samples_s"], kind) for p in processes]
            out[kind].append(Point(tokens, width, float(np.mean(costs)), float(max(costs) - min(costs))))
    return out


def calibrate(provider: str = CPU, *, widths=WIDTHS, tokens=TOKENS, processes: int = 2, rounds: int = 7,
              warmup: int = 2, threads: int | None = None, dtype: str = "float32", provider_options: dict | None = None,
              max_seconds: float | None = None, source: str = "", command: str = "", workdir: str | None = None,
              log=None) -> tuple[CostTable, dict]:
    """Measure the table (see the module's docstring); also the raw samples, by process."""
    import onnxruntime as ort

    from onnx_lnfold.bench.compare import usable_cores

    if processes < 2:
        raise InvalidInput("--processes must be at least 2: every chain is timed in two processes at least")
    if rounds < 2:
        raise InvalidInput("--rounds must be at least 2: every chain is timed in two positions at least")
    if len(set(tokens)) < 2 or len(set(widths)) < 2:
        raise InvalidInput("calibrate needs two token counts and two widths at least (the fit has three terms)")
    if provider not in ort.get_available_providers():
        raise PlacementError(f"onnxruntime {ort.__version__} has no {provider} (it has "
                             f"{', '.join(ort.get_available_providers())}): nothing is measured on another provider")
    threads = threads or (usable_cores() if provider == CPU else 1)
    raw = []
    with tempfile.TemporaryDirectory(prefix="lnfold-calibrate-", dir=workdir) as tmp:
        work = Path(tmp)
        groups = []
        for width in widths:
            files = {}
            for kind in MEASURED:
                for n in (SHORT, LONG):
                    path = work / f"{CHAIN_OF[kind]}x{n}.d{width}.onnx"
                    path.write_bytes(chain_model(CHAIN_OF[kind], width, dtype, n, residual_chain=False))
                    files[f"{CHAIN_OF[kind]}x{n}"] = str(path)
            groups.append({"width": width, "files": files, "tokens": list(tokens)})
        for k in range(processes):
            if log:
                log(f"calibrate: process {k + 1}/{processes}, {len(widths)} widths x {len(tokens)} token counts, "
                    f"{len(MEASURED)} kinds x 2 chains, {rounds} rounds")
            out = run_child({"mode": "calibrate", "groups": groups, "rotation": k, "rounds": rounds, "warmup": warmup,
                             "threads": threads, "provider": provider, "provider_options": provider_options,
                             "dtype": dtype, "sample_ms": SAMPLE_MS,
                             "max_seconds": max_seconds / processes if max_seconds else None}, work, f"calibrate.p{k}")
            raw.append(out["times"])
    return from_samples(raw, provider, processes=processes, rounds=rounds, threads=threads, dtype=dtype,
                        source=source, command=command, onnxruntime=ort.__version__), {"threads": threads, "processes": raw}


def from_samples(raw: list[dict], provider: str, *, processes: int, rounds: int, threads: int, dtype: str,
                 source: str, command: str, onnxruntime: str) -> CostTable:
    """The table from every process's samples (what `--samples` keeps: a table can be made again
    from them, `--from-samples`)."""
    points = points_from(raw)
    if any(len({p.tokens for p in points[k]}) < 2 or len({p.width for p in points[k]}) < 2 for k in KINDS):
        raise InvalidInput("calibrate ran out of time before two token counts and two widths were measured: "
                           "raise --max-seconds or measure fewer shapes")
    measured_by = (f"{command or 'onnx-lnfold calibrate'} ({dtype}, {threads} intra-op thread(s), "
                   f"{processes} processes x {rounds} rounds, chains of {SHORT} and {LONG} nodes, wall clock, "
                   "each chain's fastest round)")
    return make_table(points, provider=provider, unit="us", source=source, measured_by=measured_by,
                      onnxruntime=onnxruntime)


# --------------------------------------------------------------------------- #
# What the table decides, against another
# --------------------------------------------------------------------------- #
# The comparisons the rule makes, per width: (label, emitted, original), each a list of (kind, width
# factor) at one width.
def comparisons(d: int) -> list[tuple[str, list[tuple[str, int]], list[tuple[str, int]]]]:
    ln, sln = LAYER_NORM.op_type, RMS_NORM.op_type
    return [
        ("LN -> SLN (beta into a consumer)", [(sln, d)], [(ln, d)]),
        ("LN -> SLN + beta Add", [(sln, d), ("BiasAdd", d)], [(ln, d)]),
        ("SkipLN -> Add + SLN + beta Add", [("Add", d), (sln, d), ("BiasAdd", d)], [(SKIP_LAYER_NORM.op_type, d)]),
        ("Add + SLN -> SkipSLN (--fuse-residual auto)", [(SKIP_RMS_NORM.op_type, d)], [("Add", d), (sln, d)]),
        ("a centering vs one LN -> SLN saving", [("Centering", d), (sln, d)], [(ln, d)]),
        ("a centering over axis 1 vs one over the last", [("StridedCentering", d)], [("Centering", d)]),
        ("decomposed LN on axis 1 -> Transposes + SLN", [("Transpose", d), (sln, d), ("Transpose", d)],
         [("StridedDecomposedLayerNorm", d)]),
        *([("a bias created over d/4 vs beta's Add over d", [("BiasAdd", d // 4)], [("BiasAdd", d)])] if d >= 256 else []),
    ]


def judged(table: CostTable, emitted, original, tokens: int) -> tuple[float, str]:
    """(emitted / original, "less" / "more" / "cannot tell") by `table` at `tokens`. A side whose
    fitted cost is not above zero (a marginal cost below what wall clock resolves, fitted a little
    under it) has no ratio (NaN) and cannot be told apart."""
    e, o = table.total(emitted, tokens), table.total(original, tokens)
    if not (e > 0 and o > 0):
        return float("nan"), "cannot tell"
    spread = table.total_spread(emitted, tokens) + table.total_spread(original, tokens)
    word = "cannot tell" if abs(e - o) <= spread else "less" if e < o else "more"
    return e / o, word


def _verdict_words(ratio: float, word: str) -> str:
    """`x0.962 costs less`, `x0.981, cannot tell`; where the fit gives no ratio: `no ratio (a fit at or
    below 0)`."""
    if ratio != ratio:  # NaN
        return "no ratio (a fit at or below 0)"
    return f"x{ratio:.3f}, cannot tell" if word == "cannot tell" else f"x{ratio:.3f} costs {word}"


def decisions_text(table: CostTable, other: CostTable | None, tokens_list=(16, 8192), widths=(64, 384, 768, 1024)) -> str:
    """The rule's comparisons under `table` (and `other`, another table: units differ, so ratios are
    compared, and each table's verdict within its own spread)."""
    lines = []
    head = f"{'comparison':<44} {'d':>5} {'tokens':>6}  {_short(table):>28}"
    if other is not None:
        head += f"  {_short(other):>28}"
    lines.append(head)
    for d in widths:
        for tokens in tokens_list:
            for label, emitted, original in comparisons(d):
                r, word = judged(table, emitted, original, tokens)
                row = f"{label:<44} {d:>5} {tokens:>6}  {_verdict_words(r, word):>28}"
                if other is not None:
                    r2, word2 = judged(other, emitted, original, tokens)
                    row += f"  {_verdict_words(r2, word2):>28}" + ("  <- differs" if word != word2 else "")
                lines.append(row)
    return "\n".join(lines)


def _short(table: CostTable) -> str:
    return f"{table.provider.removesuffix('ExecutionProvider')} ({table.unit})"


def costs_text(table: CostTable) -> str:
    """Every measured point with its spread, and the fit."""
    lines = [f"{'kind':<34} {'d':>5} {'tokens':>6} {'cost':>12} {'spread':>10} {'fit':>12}"]
    for kind in (k for k in MEASURED if k in table.costs):
        cost = table.costs[kind]
        for p in table.points[kind]:
            lines.append(f"{kind:<34} {p.width:>5} {p.tokens:>6} {table.figure(p.value):>12} "
                         f"{table.figure(p.spread):>10} {table.figure(cost.at(p.tokens, p.width)):>12}")
        per_width = f" + {cost.per_width:.4g} x d" if kind in LAYOUT_KINDS else ""
        lines.append(f"  fit: {cost.fixed:.4g} + {cost.per_token:.4g} x tokens + {cost.per_element:.4g} x tokens x d"
                     f"{per_width} ({table.unit}; worst fit error {100 * fit_error(table, kind):.1f}%)")
    return "\n".join(lines)


def _children_peak_gb() -> float | None:
    """The largest resident memory a measuring process reached (they run one at a time), in GB;
    None where the platform does not say."""
    try:
        import resource
    except ImportError:  # Windows
        return None
    kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return kib * (1 if sys.platform == "darwin" else 1024) / 1e9 if kib else None


def calibrate_command(args) -> int:
    """The command line (bench.cli's parser)."""
    import onnxruntime as ort

    provider = provider_name(args.provider)
    widths = tuple(args.widths or (QUICK_WIDTHS if args.quick else WIDTHS))
    tokens = tuple(args.tokens or (QUICK_TOKENS if args.quick else TOKENS))
    rounds = QUICK_ROUNDS if args.quick and args.rounds == 7 else args.rounds
    out = Path(args.output)
    if not out.parent.is_dir():
        raise InvalidInput(f"{out.parent}: folder of -o does not exist")
    command = "onnx-lnfold calibrate " + " ".join(sys.argv[2:] if sys.argv[1:2] == ["calibrate"] else sys.argv[1:])

    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    started = time.perf_counter()
    if args.from_samples:  # the table again from kept samples: nothing is measured
        kept = json.loads(Path(args.from_samples).read_text())
        meta = kept.get("run", {})
        rounds = meta.get("rounds", rounds)
        table = from_samples(kept["processes"], meta.get("provider", provider),
                             processes=len(kept["processes"]), rounds=rounds,
                             threads=kept.get("threads", 1), dtype=meta.get("dtype", args.dtype), source=str(out),
                             command=meta.get("command", command.strip()) + f" (table from {args.from_samples})",
                             onnxruntime=meta.get("onnxruntime", ort.__version__))
    else:
        table, raw = calibrate(provider, widths=widths, tokens=tokens, processes=args.processes, rounds=rounds,
                               threads=args.threads, dtype=args.dtype, max_seconds=args.max_seconds, source=str(out),
                               command=command.strip(), log=log)
        if args.samples:
            raw["run"] = {"provider": provider, "rounds": rounds, "dtype": args.dtype, "command": command.strip(),
                          "onnxruntime": ort.__version__, "quick": bool(args.quick)}
            Path(args.samples).write_text(json.dumps(raw) + "\n")
    quick = args.quick if not args.from_samples else bool(kept.get("run", {}).get("quick"))
    rehearsal = (f"measured by --quick ({len(table.points[KINDS[0]])} shapes, {rounds} rounds): a rehearsal of the "
                 "run, too few shapes and rounds to fold by") if quick else None
    write_table(table, out, rehearsal)
    memory = f", peak memory {peak_gb:.1f} GB (a measuring process)" if (peak_gb := _children_peak_gb()) else ""
    print(f"onnx-lnfold calibrate: {table.provider} (onnxruntime {ort.__version__}), {table.unit} per node, "
          f"{time.perf_counter() - started:.0f} s{memory} -> {out}")
    if rehearsal:
        print(f"The table is marked as a rehearsal: {rehearsal}; --costs warns when it reads it.")
    print(costs_text(table))
    print()
    print("What the never-slower rule decides by this table and by the built-in CPU one (emitted / original, "
          "each table's own unit; 'cannot tell' where the difference is within the two sides' spreads):")
    print(decisions_text(table, builtin_table()))
    return 0
