"""The check at the level users run (docs/DESIGN.md section 6, "At the level users run").

The judges compare the fold with the original with ONNX Runtime's optimizations off, where its
fusions can neither hide nor cause a difference. But deployments run ORT_ENABLE_ALL, and there a
quantized graph runs other kernels: QDQ units become QLinear ops and QGemm, a dynamic int8
`MatMulInteger -> Cast -> Mul` becomes MatMulIntegerToFloat, and the rounding of those kernels is
not the float one. So for a model with quantized ops (`core.quantized`), and wherever the caller
asks (`CheckSettings.deployed`), both models also run at ORT_ENABLE_ALL on the same input sets, and
the fold's difference there is judged against the original's own sensitivity at that level (its
float weights moved by up to one rounding step, as `verify.judges.sensitivity` measures it with
optimizations off): each output within its rtol plus `SENSITIVITY_FACTOR` times that sensitivity.
A fold that moves what users run beyond that is refused.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from onnx_lnfold.verify.case import Case
from onnx_lnfold.verify.oracle import blockwise
from onnx_lnfold.verify.sessions import ModelBytesOrPath, first_line, relative, run_sets, session_options
from onnx_lnfold.verify.verdict import SENSITIVITY_FACTOR

LEVEL = "ORT_ENABLE_ALL"
# Above this relative sensitivity at the deployed level, the report says so in one line: the model's
# outputs move that much under any rounding, so a figure of that size says nothing of the fold.
LARGE_SENSITIVITY = 1e-3


def deployed_options():
    """`session_options` at the level ONNX Runtime runs by default."""
    import onnxruntime as ort

    options = session_options()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return options


@dataclass(frozen=True)
class DeployedCheck:
    """Both models at `level` on the check's input sets: the fold's worst difference from the
    original there (`output`: which output), the original's own sensitivity there on that output,
    what that output was allowed, and whether every output stayed within its allowance."""

    level: str
    rel_diff: float
    sensitivity: float
    allowed: float
    output: str
    passed: bool

    def to_dict(self) -> dict:
        return asdict(self)

    def line(self) -> str:
        """The report's line."""
        text = (
            f"at {self.level} (as deployed): fold vs original {self.rel_diff:.2g} relative on '{self.output}', "
            f"the original's own sensitivity there {self.sensitivity:.2g}"
        )
        if self.sensitivity > LARGE_SENSITIVITY:
            text += " (large: one rounding step of its weights moves this model's outputs that much)"
        return text


def check_deployed(case: Case, original: ModelBytesOrPath, folded: ModelBytesOrPath) -> DeployedCheck | str:
    """Run `original` (with and without its weights perturbed) and `folded` at `LEVEL` on `case`'s
    input sets (the feeds the original ran on) and judge each output; the reason it could not run
    otherwise. `case.worst` gives each output's rtol."""
    feeds = [run.ort_feeds for run in case.compared]
    if not feeds:
        return "no input set ran"
    try:
        reference = _run(original, feeds, perturbed=False)
        moved = _run(original, feeds, perturbed=True)
        fold = _run(folded, feeds, perturbed=False)
    except Exception as e:  # noqa: BLE001 - a model that runs with optimizations off and not at this level
        return first_line(e)
    worst: tuple[float, float, float, str] | None = None  # (excess, diff, sensitivity, output)
    passed = True
    allowed_at_worst = 0.0
    for ref, perturbed, got in zip(reference, moved, fold):
        for name, expected in ref.items():
            if (
                name not in got
                or np.shape(got[name]) != np.shape(expected)
                or np.shape(perturbed.get(name)) != np.shape(expected)
            ):
                return f"output '{name}' comes out in another shape at {LEVEL}"
            diff = relative(expected, got[name])
            sensitivity = relative(expected, perturbed[name])
            rtol = case.worst[name].rtol if name in case.worst and case.worst[name].rtol is not None else 0.0
            allowed = rtol + SENSITIVITY_FACTOR * sensitivity
            excess = diff - allowed
            if diff > allowed:
                passed = False
            if worst is None or excess > worst[0]:
                worst, allowed_at_worst = (excess, diff, sensitivity, name), allowed
    assert worst is not None
    _, diff, sensitivity, name = worst
    return DeployedCheck(LEVEL, diff, sensitivity, allowed_at_worst, name, passed)


def _run(model: ModelBytesOrPath, feeds: list[dict], perturbed: bool) -> list[dict[str, np.ndarray]]:
    """Each input set's outputs at `LEVEL`: one session, or for the perturbed original a session of it
    with its weights moved in memory (`verify.oracle.blockwise`, which runs a model of the size the
    check reads in memory as one block: the graph ONNX Runtime optimizes is the model's)."""
    import onnxruntime as ort

    if perturbed:
        proto, folder = blockwise.load_structure(model)
        session = blockwise.BlockwiseSession(proto, folder, deployed_options, perturbed=True, label="the original")
    else:
        source = model if isinstance(model, bytes) else str(model)
        session = ort.InferenceSession(source, deployed_options(), providers=["CPUExecutionProvider"])
    results = run_sets(session, feeds)
    for result in results:
        if isinstance(result, Exception):
            raise result
    return results  # type: ignore[return-value]
