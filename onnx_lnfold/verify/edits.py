"""Each weight edit checked on its own, in float64, tensor by tensor (docs/DESIGN.md section 6).

Where no float64 run of the whole model fits, the end-to-end comparison in ONNX Runtime is judged
by the original's sensitivity, which one rounding step of every weight moves by far more than one
slightly wrong centering would. So each centered tensor is read as written (from the folded
model's file) beside the original it came from (from the original's), in blocks, and must be that
original less its mean along the axis, to within the rounding of its own type: its mean along the
axis within one unit of rounding of the row's largest entry, and its difference from the original
the same along the axis, to the same. What the proof of the fold rests on (the LN input is then
zero-mean) is structural; this check shows the edits that proof asked for are the ones written.

Plain centerings are checked (axis whole, no per-channel weights, no blocks, not derived at load,
not a bias that also takes a folded LN's beta); the others are counted as not checked.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir

from onnx_lnfold.analysis.plan import CenteringPlan
from onnx_lnfold.core.ir import constant_of
from onnx_lnfold.emit.targets import bias_slot
from onnx_lnfold.io.external_data import release_tensor
from onnx_lnfold.load.model import load_path
from onnx_lnfold.verify.runner import ModelBytesOrPath

_BLOCK = 1 << 20  # float64 elements per block read
_ROUNDING_UNITS = 2.0  # the tolerance, in units of rounding (eps) of the row's largest entry
_FLOATS = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64), np.dtype(ml_dtypes.bfloat16))


@dataclass(frozen=True)
class EditCheck:
    """One edit to check: `written` in the folded model is `tensor` of the original, centered along
    `axis` (None: made exactly zero)."""

    tensor: str
    written: str
    axis: int | None


@dataclass
class EditsChecked:
    checked: int
    unchecked: int  # edits of a kind this check does not read (blocks, weights, derived at load)
    problem: str = ""  # the first edit that is not a centering, and by how much


def _biases(nodes: list[ir.Node]) -> set[str]:
    """The names of the bias tensors of these linear layers (Gemm's C, the Add after a MatMul)."""
    names = set()
    for node in nodes:
        slot = (node, 2) if node.op_type == "Gemm" else bias_slot(node)
        if slot is not None and len(slot[0].inputs) > slot[1] and slot[0].inputs[slot[1]] is not None:
            names.add(slot[0].inputs[slot[1]].name)
    return names


def edit_checks(plan: CenteringPlan) -> tuple[list[EditCheck], int]:
    """The plain centerings of `plan` to check, and how many others it holds (a bias that also
    takes a folded LN's beta among them: it is written centered plus `beta @ W`)."""
    checks, others = [], 0
    with_beta = _biases(plan.beta_consumers())
    for e in plan.edits:
        if e.block is not None or e.weights is not None or e.means_name or e.tensor in with_beta:
            others += 1
            continue
        checks.append(EditCheck(e.tensor, e.new_name if e.untie and e.new_name else e.tensor, e.axis))
    return checks, others


def _model(source: ModelBytesOrPath) -> ir.Model:
    return ir.from_proto(onnx.load_from_string(source)) if isinstance(source, bytes) else load_path(source)


def _constants(model: ir.Model) -> dict[str, ir.TensorProtocol]:
    """Every constant tensor of `model`'s graphs (initializers, Constant outputs), by name."""
    found: dict[str, ir.TensorProtocol] = {}
    for graph in model.graphs():
        values = [*graph.initializers.values(), *(node.outputs[0] for node in graph if node.op_type == "Constant")]
        for value in values:
            tensor = constant_of(value)
            if tensor is not None and value.name:
                found[value.name] = tensor
    return found


def _eps(dtype: np.dtype) -> float:
    return float(ml_dtypes.finfo(dtype).eps)


def _off_by(original: np.ndarray, written: np.ndarray, axis: int | None) -> float:
    """How far `written` is from `original` centered along `axis`, in units of rounding of each
    row's largest entry (the worst row)."""
    eps = _eps(written.dtype)
    if axis is None:
        return 0.0 if not np.any(written) else float("inf")
    if original.ndim == 0:
        return 0.0
    a, w = np.moveaxis(original, axis, -1), np.moveaxis(written, axis, -1)
    n = a.shape[-1]
    rows = max(1, a.size // max(n, 1))
    if a.ndim != 2:  # a bias (1-D) or a convolution's kernel: copied whole, they are small
        a, w = a.reshape(rows, n), w.reshape(rows, n)
    step = max(1, _BLOCK // max(n, 1))
    worst = 0.0
    for start in range(0, rows, step):
        o, c = a[start : start + step].astype(np.float64), w[start : start + step].astype(np.float64)
        scale = np.maximum(np.abs(o).max(axis=1), np.abs(c).max(axis=1)) * eps
        scale = np.where(scale > 0, scale, np.finfo(np.float64).tiny)
        mean = np.abs(c.mean(axis=1)) / scale
        shift = c - o
        spread = np.abs(shift - shift.mean(axis=1, keepdims=True)).max(axis=1) / scale
        worst = max(worst, float(mean.max()), float(spread.max()))
    return worst


def check_edits(original: ModelBytesOrPath, folded: ModelBytesOrPath, checks: list[EditCheck], others: int) -> EditsChecked:
    """Read each edit's tensors from both models (external data memory-mapped, one tensor and one
    block at a time) and find the first that is not the original centered along its axis."""
    result = EditsChecked(0, others)
    if not checks:
        return result
    before, after = _constants(_model(original)), _constants(_model(folded))
    for check in checks:
        source, written = before.get(check.tensor), after.get(check.written)
        if source is None or written is None:
            result.unchecked += 1
            continue
        a, w = np.asarray(source.numpy()), np.asarray(written.numpy())
        if a.shape != w.shape or w.dtype not in _FLOATS:
            result.unchecked += 1
            continue
        off = _off_by(a, w, check.axis)
        del a, w
        release_tensor(source)  # unmapped once read: kept maps hold their pages
        release_tensor(written)
        result.checked += 1
        if off > _ROUNDING_UNITS:
            along = "made zero" if check.axis is None else f"centered along axis {check.axis}"
            result.problem = (
                f"the written '{check.written}' is not '{check.tensor}' {along}: off by {off:.3g} units of its "
                f"type's rounding (at most {_ROUNDING_UNITS:g})"
            )
            return result
    return result
