"""Judging a fold (docs/DESIGN.md section 6): the float64 figures of the original's twin, the
fold's twin as written and its exact twin, each against ONNX Runtime's runs, and the three
checks on them (`judge_float64`); or, without a float64 run, the original's own float32
sensitivity measured (`measure_sensitivity`) and the fold held to it (`judge_sensitivity`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import ml_dtypes
import numpy as np
import onnx

from onnx_lnfold.verify.reference import Float64Model, Float64Unavailable
from onnx_lnfold.verify.runner import ModelBytesOrPath, compare, first_line, run_session, session_for
from onnx_lnfold.verify.verdict import (
    EXACT_RTOL,
    FLOAT64,
    ORT_NOISE_FACTOR,
    SENSITIVITY,
    SENSITIVITY_FACTOR,
    OutputDiff,
    Verification,
)

# How long the float64 evaluation may take (FLOAT64_BUDGET_S, three twins on every input set) is
# estimated from ONNX Runtime's time for the original times FLOAT64_COST (onnx.reference in
# float64 over ONNX Runtime in float32, one run each, wall clock: 12 to 13 on Whisper tiny.en's
# encoder), then again from the first float64 run.
FLOAT64_COST = 15.0


def float64_estimate(original_seconds: float, twins: int = 3) -> float:
    """Seconds the float64 twins would take, from ONNX Runtime's time for the original."""
    return twins * FLOAT64_COST * original_seconds


# --------------------------------------------------------------------------- the check
@dataclass
class Compared:
    """One input set as ONNX Runtime ran it: the feeds the original accepted (as given, and as
    ONNX Runtime took them: widened for float32 shadows) and both models' outputs."""

    feeds: dict[str, np.ndarray]
    ort_feeds: dict[str, np.ndarray]
    original: dict[str, np.ndarray]
    fold: dict[str, np.ndarray]


def relative(reference: np.ndarray, candidate: np.ndarray) -> float:
    return compare({"": reference}, {"": candidate})[0].rel_diff


def float64_figures(
    original: ModelBytesOrPath,
    folded: ModelBytesOrPath,
    compared: list[Compared],
    worst: dict[str, OutputDiff],
    exact: Callable[[], dict[str, np.ndarray]] | None,
    budget: float,
) -> None:
    """Run the float64 twins on every input set ONNX Runtime ran, and add their figures to
    `worst`. Raises `Float64Unavailable` when they cannot run (nothing added then), or when the
    first run shows they would take more than `budget` seconds."""
    try:
        twins = [Float64Model(original), Float64Model(folded)]
        if exact is not None:
            twins.append(Float64Model(folded, exact()))
        figures: list[dict[str, OutputDiff]] = []
        for number, run in enumerate(compared):
            started = time.perf_counter()
            truth = twins[0].run(run.feeds)
            if number == 0:
                estimate = (time.perf_counter() - started) * len(twins) * len(compared)
                if estimate > budget:
                    raise Float64Unavailable(over_budget(estimate, budget))
            written, *exactly = (twin.run(run.feeds) for twin in twins[1:])
            per_output = {}
            for name, ref in truth.items():
                if name not in run.original or run.original[name].shape != ref.shape:
                    raise Float64Unavailable(
                        f"the float64 twin's output '{name}' has another shape than in onnxruntime"
                    )
                diff = OutputDiff(name, ref.shape, 0.0, 1.0)
                diff.written = relative(ref, written[name])
                diff.exact = relative(ref, exactly[0][name]) if exactly else None
                diff.original_error = relative(ref, run.original[name])
                diff.fold_error = relative(ref, run.fold[name])
                per_output[name] = diff
            figures.append(per_output)
    except Float64Unavailable:
        raise
    except Exception as e:  # noqa: BLE001 - e.g. an op the reference implements but not for these inputs
        raise Float64Unavailable(f"the float64 evaluation failed: {first_line(e)}") from None
    for per_output in figures:
        for name, diff in per_output.items():
            worst[name].merge(diff)


def over_budget(estimate: float, budget: float) -> str:
    return f"a float64 evaluation would take about {estimate:.0f} s, over the budget of {budget:g} s"


def judge_float64(outputs: list[OutputDiff], result) -> Verification:
    not_exact = [o for o in outputs if o.exact is not None and not o.exact <= EXACT_RTOL]
    if not_exact:
        o = max(not_exact, key=lambda o: o.exact)  # type: ignore[arg-type, return-value]
        reason = (
            f"the fold is not exact: in float64, output '{o.name}' differs from the original by {o.exact:.2g} "
            f"relative (tolerance {EXACT_RTOL:g})"
        )
        return result("failed", reason, outputs, judgment=FLOAT64)
    over = [o for o in outputs if not o.written <= o.rtol]  # type: ignore[operator]
    if over:
        o = max(over, key=lambda o: o.written / o.rtol)  # type: ignore[operator]
        reason = (
            f"output '{o.name}' differs: in float64, the fold as written (its weights rounded to their type) is "
            f"{o.written:.3g} relative from the original > rtol {o.rtol:g}"
        )
        return result("failed", reason, outputs, judgment=FLOAT64)
    def allowed(o: OutputDiff) -> float:
        return o.rtol + ORT_NOISE_FACTOR * o.original_error  # type: ignore[operator]

    noisy = [o for o in outputs if not o.fold_error <= allowed(o)]  # type: ignore[operator]
    if noisy:
        o = max(noisy, key=lambda o: o.fold_error / allowed(o))  # type: ignore[operator]
        reason = (
            f"output '{o.name}' differs: in onnxruntime, the fold is {o.fold_error:.3g} relative from the float64 "
            f"reference, the original {o.original_error:.3g} > rtol {o.rtol:g} + {ORT_NOISE_FACTOR:g} x the original's"
        )
        return result("failed", reason, outputs, judgment=FLOAT64)
    return result("passed", "", outputs, judgment=FLOAT64)


def perturbed(model: ModelBytesOrPath) -> bytes:
    """`model` with its float weights moved by up to one rounding step: w * (1 + u * eps), u
    uniform in [-1, 1], rounded back to w's type. Scalars stay (a mask's lowest value, a scale
    compared with another: they are the graph's logic, not its weights)."""
    proto = onnx.load_from_string(model) if isinstance(model, bytes) else onnx.load(str(model))
    rng = np.random.default_rng(0)
    floats = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE)

    def move(tensor: onnx.TensorProto) -> None:
        if tensor.data_type not in floats or int(np.prod(tensor.dims)) < 2:
            return
        values = onnx.numpy_helper.to_array(tensor)
        eps = float(ml_dtypes.finfo(values.dtype).eps)
        wide = values.astype(np.float64) * (1.0 + eps * rng.uniform(-1.0, 1.0, values.shape))
        tensor.CopyFrom(onnx.numpy_helper.from_array(wide.astype(values.dtype), tensor.name))

    def graph(g: onnx.GraphProto) -> None:
        for tensor in g.initializer:
            move(tensor)
        for node in g.node:
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.TENSOR and node.op_type == "Constant":
                    move(attr.t)
                elif attr.type == onnx.AttributeProto.GRAPH:
                    graph(attr.g)
                elif attr.type == onnx.AttributeProto.GRAPHS:
                    for sub in attr.graphs:
                        graph(sub)

    graph(proto.graph)
    return proto.SerializeToString()


def measure_sensitivity(original: ModelBytesOrPath, compared: list[Compared], worst: dict[str, OutputDiff]) -> None:
    """The original's own change, on each input set, when its weights move by one rounding step."""
    session = session_for(perturbed(original))
    for run in compared:
        moved = run_session(session, run.ort_feeds)
        for name, ref in run.original.items():
            diff = OutputDiff(name, ref.shape, 0.0, 1.0)
            diff.sensitivity = relative(ref, moved[name])
            worst[name].merge(diff)


def judge_sensitivity(outputs: list[OutputDiff], result, why: str) -> Verification:
    def allowed(o: OutputDiff) -> float:
        return o.rtol + SENSITIVITY_FACTOR * (o.sensitivity or 0.0)  # type: ignore[operator]

    over = [o for o in outputs if not o.rel_diff <= allowed(o)]
    if over:
        o = max(over, key=lambda o: o.rel_diff / allowed(o))
        sensitivity = (
            f" + {SENSITIVITY_FACTOR:g} x the original's sensitivity {o.sensitivity:.3g}" if o.sensitivity else ""
        )
        reason = (
            f"output '{o.name}' differs: max|diff| {o.max_abs_diff:.3g}, relative {o.rel_diff:.3g} > rtol {o.rtol:g}"
            f"{sensitivity} (no float64 reference: {why})"
        )
        return result("failed", reason, outputs, judgment=SENSITIVITY, judgment_reason=why)
    return result("passed", "", outputs, judgment=SENSITIVITY, judgment_reason=why)
