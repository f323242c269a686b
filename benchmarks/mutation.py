"""Mutation campaign of the check: does any fault that matters pass as "verified"?

For each committed model (models/*.onnx) that folds, the real pipeline runs (analyze -> apply),
then ONE fault is injected into the folded model (`run_pipeline(after_apply=...)`) before the
tool's own verification sees it, through each judgment path (`JUDGMENTS`): the default (float64
where it fits), `float64_budget=0` (the path every model past the float64 budget takes: the
read-back and the original's sensitivity), and the default block by block (the path of a model
larger than memory: both models in ONNX Runtime, their float64 twins and the read-back side by
side, `verify.side_by_side`). Each mutant is also judged independently in float64
(`verify.oracle.reference.Float64Model`, first verification input set): the fault *matters* when it moves
some output by more than MATTERS relative against the same fold without the fault, as written.

Faults (`FAULTS`): one centered constant offset by 1e-2 / 1e-4 / 1e-6 of its largest entry (a
producer left uncentered); one element of it moved by 1e-3 / 1e-5 of that entry; one RMS node's
epsilon x10; one element of one RMS node's gamma x(1+1e-3) / x(1+1e-5); a dropped explicit centering
(its readers read the stream again); a beta left out (a consumer's bias without its share, else the
Add of beta removed); a wrong axis (an RMS node's axis -2, else a centering's mean over another
axis). A fault a model has no site for is counted "not injectable", not caught. Controls (no fault)
must pass.

    python -m benchmarks.mutation [--models gpt2,bert] [--faults gamma-1e-5,epsilon-x10] [--out DIR]

writes MUTATION.md and mutation.json into `--out` (default benchmarks/results/mutation/).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from collections.abc import Callable
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import onnx_ir as ir

from onnx_lnfold import _pipeline
from onnx_lnfold.analysis.plan import CenteringPlan
from onnx_lnfold.apply.centering import BiasPlusBeta
from onnx_lnfold.core.fold_request import FoldRequest
from onnx_lnfold.core.ir import constant_of, set_constant_value
from onnx_lnfold.core.ops import RMS_OPS
from onnx_lnfold.core.options import FLOAT64_BUDGET_S, CheckSettings
from onnx_lnfold.feeds.sets import verification_input_sets
from onnx_lnfold.load.model import load_model
from onnx_lnfold.verify.oracle import blockwise
from onnx_lnfold.verify.oracle.reference import Float64Model

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "models"
OUT = ROOT / "benchmarks" / "results" / "mutation"
MATTERS = 1e-7  # float64 effect on the outputs, relative, above which a fault matters
# Each judgment path: its float64 budget, and whether the models run block by block (as a model
# larger than memory does: both models' passes and the read-back side by side, verify.side_by_side).
JUDGMENTS = {
    "default": (FLOAT64_BUDGET_S, False),
    "float64_budget=0": (0.0, False),
    "default, block by block": (FLOAT64_BUDGET_S, True),
}
BLOCK_BYTES = 50_000  # small blocks: a committed model's few hundred kB of weights in several

Injector = Callable[[ir.Model, CenteringPlan], str | None]  # what it changed, or None: no site


# --------------------------------------------------------------------------- where faults go
def _qualified(node: ir.Node) -> str:
    return f"{node.domain}::{node.op_type}" if node.domain not in ("", "ai.onnx") else node.op_type


def _rms_nodes(model: ir.Model) -> list[ir.Node]:
    return [node for graph in model.graphs() for node in graph if _qualified(node) in RMS_OPS]


def _value(model: ir.Model, name: str) -> ir.Value | None:
    for graph in model.graphs():
        if name in graph.initializers:
            return graph.initializers[name]
        for node in graph:
            if node.op_type == "Constant" and node.outputs[0].name == name:
                return node.outputs[0]
    return None


def _set_tensor(value: ir.Value, array: np.ndarray) -> None:
    tensor = ir.Tensor(array, dtype=constant_of(value).dtype, name=value.name)  # type: ignore[union-attr]
    set_constant_value(value, tensor)


def _change(model: ir.Model, name: str, how: Callable[[np.ndarray], np.ndarray]) -> bool:
    """The stored tensor `name` replaced by `how` of its values (computed in float64, rounded back)."""
    value = _value(model, name)
    tensor = constant_of(value) if value is not None else None
    if tensor is None:
        return False
    values = np.array(tensor.numpy())
    _set_tensor(value, how(values.astype(np.float64)).astype(values.dtype))  # type: ignore[arg-type]
    return True


def _centered_constant(plan: CenteringPlan) -> str | None:
    """The written name of the first constant the plan centers along an axis (not a table derived at load)."""
    for e in plan.edits:
        if e.axis is not None and not e.means_name:
            return e.new_name if e.untie and e.new_name else e.tensor
    return None


def offset(relative: float) -> Injector:
    def inject(model: ir.Model, plan: CenteringPlan) -> str | None:
        name = _centered_constant(plan)
        if name is None or not _change(model, name, lambda a: a + relative * np.abs(a).max()):
            return None
        return f"'{name}' + {relative:g} x its largest entry"

    return inject


def element(relative: float) -> Injector:
    def inject(model: ir.Model, plan: CenteringPlan) -> str | None:
        name = _centered_constant(plan)

        def move(a: np.ndarray) -> np.ndarray:
            flat = a.reshape(-1)
            at = int(np.abs(flat).argmax())
            flat[at] += relative * abs(flat[at])
            return a

        if name is None or not _change(model, name, move):
            return None
        return f"the largest entry of '{name}' moved by {relative:g} of itself"

    return inject


def epsilon_times_10(model: ir.Model, plan: CenteringPlan) -> str | None:
    for node in _rms_nodes(model):
        epsilon = node.attributes.get_float("epsilon", 1e-5)
        node.attributes["epsilon"] = ir.AttrFloat32("epsilon", epsilon * 10)
        return f"the epsilon of '{node.name}' {epsilon:g} -> {epsilon * 10:g}"
    return None


def gamma(relative: float) -> Injector:
    def inject(model: ir.Model, plan: CenteringPlan) -> str | None:
        for node in _rms_nodes(model):
            at = 2 if node.op_type.startswith("Skip") else 1
            scale = node.inputs[at] if len(node.inputs) > at else None
            if scale is None or constant_of(scale) is None or not scale.name:

                continue

            def move(a: np.ndarray) -> np.ndarray:
                flat = a.reshape(-1)
                flat[int(np.abs(flat).argmax())] *= 1 + relative
                return a

            _change(model, scale.name, move)
            return f"one entry of '{scale.name}' (gamma of '{node.name}') x(1 + {relative:g})"
        return None

    return inject


def drop_centering(model: ir.Model, plan: CenteringPlan) -> str | None:
    for centering in plan.centerings:
        for graph in model.graphs():
            sub = next((n for n in graph if n.outputs and n.outputs[0].name == centering.new_name), None)
            if sub is None:
                continue
            x, mean = sub.inputs[0], sub.inputs[1].producer()  # type: ignore[union-attr]
            sub.outputs[0].replace_all_uses_with(x, replace_graph_outputs=True)  # type: ignore[arg-type]
            graph.remove([sub, mean], safe=True)
            return f"the explicit centering '{centering.new_name}' removed, its readers read '{x.name}'"  # type: ignore[union-attr]
    return None


def leave_out_beta(model: ir.Model, plan: CenteringPlan) -> str | None:
    for graph in model.graphs():
        for value in graph.initializers.values():
            tensor = value.const_value
            if isinstance(tensor, BiasPlusBeta) and tensor._bias is not None:
                _set_tensor(value, np.array(tensor._bias.numpy()))
                return f"the bias '{value.name}' without its share of beta"
    for decision in plan.folded:
        if decision.beta != "add":
            continue
        # The rewrite names beta's Add after the LN (`apply.rewrite.rewrite_layer_norm`).
        beta = f"{decision.node}/beta"
        adds = (n for g in model.graphs() for n in g if n.op_type == "Add" and (n.name or "").startswith(beta))
        add = next(adds, None)
        if add is None:
            continue
        y, final = add.inputs[0], add.outputs[0]
        name = final.name
        final.replace_all_uses_with(y, replace_graph_outputs=True)  # type: ignore[arg-type]
        add.graph.remove(add, safe=True)  # type: ignore[union-attr]
        y.name = name  # type: ignore[union-attr]
        return f"the Add of beta after '{decision.node}' removed"
    return None


def wrong_axis(model: ir.Model, plan: CenteringPlan) -> str | None:
    for node in _rms_nodes(model):
        if "axis" in node.attributes:
            node.attributes["axis"] = ir.AttrInt64("axis", -2)
            return f"the axis of '{node.name}' -1 -> -2"
    for centering in plan.centerings:
        for graph in model.graphs():
            mean = next((n for n in graph if n.op_type == "ReduceMean" and n.outputs[0].uses() and any(
                u.node.outputs[0].name == centering.new_name for u in n.outputs[0].uses())), None)
            if mean is None:
                continue
            wrong = centering.axis - 1 if centering.axis > 0 else centering.axis + 1
            if "axes" in mean.attributes:
                mean.attributes["axes"] = ir.AttrInt64s("axes", [wrong])
            else:
                axes = ir.Value(name=f"{centering.new_name}.wrong_axes", const_value=ir.Tensor(np.array([wrong], np.int64)))
                graph.register_initializer(axes)
                mean.replace_input_with(1, axes)
            return f"the mean of the centering '{centering.new_name}' over axis {wrong}, not {centering.axis}"
    return None


FAULTS: dict[str, Injector | None] = {
    "control": None,
    "offset-1e-2": offset(1e-2),
    "offset-1e-4": offset(1e-4),
    "offset-1e-6": offset(1e-6),
    "element-1e-3": element(1e-3),
    "element-1e-5": element(1e-5),
    "epsilon-x10": epsilon_times_10,
    "gamma-1e-3": gamma(1e-3),
    "gamma-1e-5": gamma(1e-5),
    "centering-dropped": drop_centering,
    "beta-left-out": leave_out_beta,
    "wrong-axis": wrong_axis,
}


# --------------------------------------------------------------------------- one mutant
@dataclass
class Mutant:
    model: str
    fault: str
    judgment: str
    injected: str | None  # what was changed; None: not injectable
    status: str = ""  # the tool's verdict: passed, failed, unverified, skipped
    judged_by: str = ""  # the judgment the tool took
    reason: str = ""
    effect: float | None = None  # float64, relative, against the fold without the fault
    seconds: float = 0.0

    @property
    def matters(self) -> bool:
        return self.effect is None or self.effect > MATTERS  # a mutant float64 cannot run differs

    @property
    def verified(self) -> bool:
        return self.status in ("passed", "skipped")


@contextmanager
def _block_by_block():
    """Within it every model the check runs is run block by block, in small blocks."""
    above, size = blockwise.blockwise_above, blockwise.block_bytes
    blockwise.blockwise_above, blockwise.block_bytes = (lambda: 0), (lambda: BLOCK_BYTES)
    try:
        yield
    finally:
        blockwise.blockwise_above, blockwise.block_bytes = above, size


def _fold(
    path: Path, budget: float | None, inject: Injector | None, by_blocks: bool = False
) -> tuple[_pipeline.FoldRun, str | None]:
    """The pipeline on `path` with one fault injected after the apply step."""
    injected: list[str | None] = [None]

    def after_apply(model: ir.Model, plan: CenteringPlan) -> None:
        injected[0] = inject(model, plan) if inject is not None else "none"

    model, _ = load_model(path)
    with _block_by_block() if by_blocks else nullcontext():
        request = FoldRequest(check=CheckSettings(float64_budget=budget))
        run = _pipeline.run_pipeline(model, path, request, after_apply=after_apply)
    return run, injected[0]


def _relative(reference: dict[str, np.ndarray], candidate: dict[str, np.ndarray]) -> float:
    worst = 0.0
    for name, ref in reference.items():
        ref, out = np.asarray(ref, np.float64), np.asarray(candidate[name], np.float64)
        if ref.shape != out.shape:
            return float("inf")
        scale = max(float(np.abs(ref).max(initial=0.0)), np.finfo(np.float64).tiny)
        worst = max(worst, float(np.abs(out - ref).max(initial=0.0)) / scale)
    return worst


def _float64_outputs(model: ir.Model, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray] | None:
    try:
        return Float64Model(model).run_many([feeds])[0]
    except Exception:  # noqa: BLE001 - a mutant float64 cannot run: counted as mattering
        return None


def _figure(effect: float | None) -> str:
    return "float64 failed" if effect is None else f"{effect:.2g}"


def campaign_for(path: Path, faults: list[str], log=print) -> list[Mutant]:
    """Every fault of `faults` on one model, through every judgment path (`JUDGMENTS`)."""
    results: list[Mutant] = []
    control, _ = _fold(path, 0.0, None)
    if not control.report.plan.folded:
        return results
    feeds = verification_input_sets(load_model(path)[0])[0].feeds
    truth = _float64_outputs(control.model, feeds)  # the fold without the fault, as written
    for fault in faults:
        inject = FAULTS[fault]
        effect: float | None = 0.0
        for judgment, (budget, by_blocks) in JUDGMENTS.items():
            started = time.perf_counter()
            run, injected = _fold(path, budget, inject, by_blocks)
            mutant = Mutant(path.stem, fault, judgment, injected)
            if injected is not None:
                v = run.report.verification
                mutant.status, mutant.judged_by, mutant.reason = v.status, v.judgment, v.reason
                if judgment == "default" and inject is not None:  # one float64 judgment per mutant
                    out = _float64_outputs(run.model, feeds) if truth is not None else None
                    effect = _relative(truth, out) if truth is not None and out is not None else None
                mutant.effect = effect
            mutant.seconds = time.perf_counter() - started
            results.append(mutant)
            log(
                f"{path.stem:32s} {fault:18s} {judgment:23s} "
                + ("not injectable" if injected is None else f"{mutant.status:8s} effect {_figure(mutant.effect)} {mutant.reason[:90]}")
            )
    return results


# --------------------------------------------------------------------------- the tables
def tally(mutants: list[Mutant]) -> dict[str, dict[str, int]]:
    """Per judgment: faults that matter, caught, passed as verified (those that matter), not
    injectable, faults that do not matter, controls passed / run."""
    table: dict[str, dict[str, int]] = {}
    for judgment in JUDGMENTS:
        rows = [m for m in mutants if m.judgment == judgment]
        faults = [m for m in rows if m.fault != "control" and m.injected is not None]
        matter = [m for m in faults if m.matters]
        table[judgment] = {
            "matter": len(matter),
            "caught": sum(not m.verified for m in matter),
            "passed": sum(m.verified for m in matter),
            "not_injectable": sum(m.fault != "control" and m.injected is None for m in rows),
            "do_not_matter": len(faults) - len(matter),
            "do_not_matter_refused": sum(not m.verified for m in faults if not m.matters),
            "controls_passed": sum(m.verified for m in rows if m.fault == "control"),
            "controls": sum(m.fault == "control" for m in rows),
        }
    return table


def write(mutants: list[Mutant], out: Path, command: str, seconds: float) -> None:
    from benchmarks.common import machine_info, results_header

    out.mkdir(parents=True, exist_ok=True)
    table = tally(mutants)
    (out / "mutation.json").write_text(
        json.dumps({"table": table, "matters_above": MATTERS, "seconds": seconds, "mutants": [asdict(m) for m in mutants]}, indent=1)
    )
    lines = results_header(
        "Mutation campaign of the check", command, machine_info(),
        f"{len({m.model for m in mutants})} committed models that fold, {len(FAULTS) - 1} fault kinds, {seconds:.0f} s.",
    )
    lines += [
        f"A fault *matters* when its float64 effect on some output exceeds {MATTERS:g} relative (against the same fold",
        "without it, as written); it is *caught* when the tool refuses the fold. The default judgment is float64",
        "where it fits; `float64_budget=0` is the path every model past the float64 budget takes; block by block, the",
        "path of a model larger than memory (its passes side by side).",
        "",
        "| judgment | faults that matter | caught | passed as verified | not injectable | faults that do not matter (refused) | controls passed |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for judgment, row in table.items():
        lines.append(
            f"| {judgment} | {row['matter']} | {row['caught']} | **{row['passed']}** | {row['not_injectable']} | "
            f"{row['do_not_matter']} ({row['do_not_matter_refused']}) | {row['controls_passed']}/{row['controls']} |"
        )
    caught_by = " | ".join(f"caught ({judgment})" for judgment in JUDGMENTS)
    lines += ["", "## Per fault kind", "", f"| fault | injected | matter | {caught_by} | smallest effect that matters |",
              "| --- | --- | --- | " + "--- | " * len(JUDGMENTS) + "--- |"]
    for fault in FAULTS:
        if fault == "control":
            continue
        per_path = {j: [m for m in mutants if m.fault == fault and m.judgment == j and m.injected is not None] for j in JUDGMENTS}
        first = next(iter(per_path.values()))
        matter = [m for m in first if m.matters]
        effects = [m.effect for m in matter if m.effect is not None]
        caught = " | ".join(str(sum(not m.verified for m in rows if m.matters)) for rows in per_path.values())
        lines.append(f"| {fault} | {len(first)} | {len(matter)} | {caught} | {min(effects):.2g} |" if effects else
                     f"| {fault} | {len(first)} | {len(matter)} | {caught} | - |")
    unjudged = [m for m in mutants if m.fault != "control" and m.injected is not None and m.effect is None]
    models = sorted({m.model for m in unjudged})
    lines += ["", f"{len(unjudged) // len(JUDGMENTS)} mutants could not be run in float64 (on {', '.join(models) or 'no model'}): "
              f"counted as mattering; {sum(not m.verified for m in unjudged)} of their {len(unjudged)} verdicts refused."]
    passed = [m for m in mutants if m.fault != "control" and m.injected is not None and m.matters and m.verified]
    lines += ["", "## Faults that matter and passed", ""]
    lines += [f"- {m.model} {m.fault} ({m.judgment}): effect {m.effect:.2g}, {m.injected}" for m in passed] or ["None."]
    (out / "MUTATION.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", help="comma-separated stems of models/*.onnx (default: all)")
    parser.add_argument("--faults", help=f"comma-separated, of {', '.join(FAULTS)} (default: all)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    paths = [MODELS / f"{stem}.onnx" for stem in args.models.split(",")] if args.models else sorted(MODELS.glob("*.onnx"))
    faults = args.faults.split(",") if args.faults else list(FAULTS)
    if "control" not in faults:
        faults.insert(0, "control")
    started = time.perf_counter()
    mutants: list[Mutant] = []
    for path in paths:
        mutants += campaign_for(path, faults, log=lambda line: print(line, flush=True))
        write(mutants, args.out, "python -m benchmarks.mutation " + " ".join(argv if argv is not None else sys.argv[1:]), time.perf_counter() - started)
    table = tally(mutants)
    for judgment, row in table.items():
        print(f"{judgment}: {row}")
    return 1 if any(row["passed"] or row["controls_passed"] < row["controls"] for row in table.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
