"""The check (step 5): decide whether the folded model computes what the original computes, before
anything is written (docs/DESIGN.md section 6).

Both models run in ONNX Runtime (graph optimizations off, so that its fusions can neither hide nor
cause a difference) on every input set (`feeds.sets`, `verify.ort_runs`): the fold must load and run
there, and the figures users see come from there. The folded model is then read back against its
plan (`verify.readback`), whatever the judgment. But a float32 run is one rounding of the truth, and
a deep model's own float32 error can exceed the tolerance while the fold is exact (or the fold can be
wrong by less than that error). So the decision is taken by the strongest judge that can take it
(`verify.judges`): in float64 against the original's float64 twin (`verify.oracle`); where no
float64 run fits (an op `onnx.reference` cannot evaluate, an estimated time over the budget), against
the original's own float32 sensitivity on the same inputs; where that cannot be measured, by rtol
alone. The report says which judgment was used and why.

A fold is written only when this check *passed*. When it cannot run (no onnxruntime, the original
does not run on the inputs, no inputs can be made), the status is "unverified" and the fold is
refused like a failed one, with the way out named (`refusal`).

bfloat16 models run in ONNX Runtime through float32 shadows (`verify.oracle.shadow`). Both models are
handed to ONNX Runtime as bytes or, when large, as files (`OrtSource`).
"""

from __future__ import annotations

import dataclasses

import onnx_ir as ir

from onnx_lnfold.core.ir import weight_bytes
from onnx_lnfold.core.quantized import quantized_ops
from onnx_lnfold.feeds.sets import verification_input_sets
from onnx_lnfold.feeds.synthesize import InputsUnavailable
from onnx_lnfold.verify.case import Case
from onnx_lnfold.verify.deployed import LEVEL, check_deployed
from onnx_lnfold.verify.judges import judge
from onnx_lnfold.verify.oracle import blockwise
from onnx_lnfold.verify.oracle.reference import exact_tensors
from onnx_lnfold.verify.oracle.shadow import bfloat16_rounding, has_bfloat16
from onnx_lnfold.verify.ort_runs import run_both
from onnx_lnfold.verify.passes import EachAlone
from onnx_lnfold.verify.readback import ReadBack
from onnx_lnfold.verify.request import VerifyRequest
from onnx_lnfold.verify.seeded import unseeded_random_ops
from onnx_lnfold.verify.sessions import ModelBytesOrPath
from onnx_lnfold.verify.verdict import FLOAT64, LOW_PRECISION, SENSITIVITY_FACTOR, Verification


# --------------------------------------------------------------------------- what the model holds
def output_types(model: ir.Model) -> dict[str, int]:
    """The element type each graph output is computed in: its tolerance follows it. An fp32 output
    is held to the fp32 tolerance even when some weights are fp16; but an output that is only a
    widening Cast of an fp16/bf16 tensor (an fp16 model converted with `keep_io_types`) carries
    fp16 rounding, and gets the fp16 tolerance."""
    types = {}
    for v in model.graph.outputs:
        if not v.name or v.dtype is None:
            continue
        computed, dtype = v, v.dtype
        while computed.producer() is not None and computed.producer().op_type in ("Cast", "Identity"):
            source = computed.producer().inputs[0]
            if source is None:
                break
            computed, dtype = source, _elem_type(source)
        types[v.name] = int(dtype if dtype in LOW_PRECISION else v.dtype)
    return types


def _elem_type(value: ir.Value, depth: int = 0) -> int | None:
    """`value`'s element type, declared or, where intermediate types were not written, read off
    its producer: a Cast's `to`, else the type of the producer's first typed input."""
    if value.dtype is not None:
        return int(value.dtype)
    node = value.producer()
    if node is None or depth > 16:
        return None
    if node.op_type == "Cast" and "to" in node.attributes:
        return node.attributes.get_int("to")
    for inp in node.inputs:
        if inp is not None and (found := _elem_type(inp, depth + 1)) is not None:
            return found
    return None


def check_equivalence(
    original: ModelBytesOrPath, folded: ModelBytesOrPath, model: ir.Model, request: VerifyRequest
) -> Verification:
    """Run both models on the verification inputs and judge the fold; never raises for a check that
    cannot run (the status is then "unverified", with the reason and the way out); raises
    `InvalidInput` for an original ONNX Runtime refuses as invalid (`verify.ort_runs`). `model` is the
    folded model in memory: its inputs are synthesized from it, and, where `request.computed` is
    None, the constants the fold computed are those it still holds (`verify.oracle.reference.exact_tensors`)."""
    if request.computed is None:
        request = dataclasses.replace(request, computed=exact_tensors(model))
    try:
        input_sets = verification_input_sets(model, request.input_shapes, request.inputs, request.folder)
    except InputsUnavailable as e:
        return Verification("unverified", f"cannot synthesize verification inputs: {e}", request.rtol, way_out="inputs")
    # The fold leaves random ops as they are: the folded model says whether the original has any.
    random_ops = bool(unseeded_random_ops(model))
    case = Case(request, original, folded, input_sets, output_types(model), has_bfloat16(model), random_ops=random_ops)
    verification = run_both(case, weight_bytes(model))
    if verification is not None:
        return verification
    read = case.passes.read_back()  # type: ignore[union-attr]  # chosen by run_both
    if read is not None and read.problem:
        return case.verdict("failed", f"the folded model is not what the plan wrote: {read.problem}")
    verification = _read_back(judge(case), read)
    if case.shadow and request.plan is not None and verification.status == "passed":
        verification.notes.extend(bfloat16_rounding(model, request.plan))
    if verification.status == "passed" and _deployed_wanted(request, model):
        _at_deployed_level(case, verification, model)
    return verification


def _deployed_wanted(request: VerifyRequest, model: ir.Model) -> bool:
    """Whether the check also runs at ORT_ENABLE_ALL: as asked, or ("auto") for a quantized model."""
    if request.deployed_check != "auto":
        return request.deployed_check == "always"
    return bool(quantized_ops(model.graph))


def _at_deployed_level(case: Case, verification: Verification, model: ir.Model) -> None:
    """Judge both models at ORT_ENABLE_ALL too (`verify.deployed`): a fold beyond its allowance there
    fails; where that check cannot run (a model run block by block or through float32 shadows, whose
    optimized graph is not the deployed one), the report says so. Whether the model runs block by
    block is read from the folded model's weights in memory (`model`), not from its file again."""
    above = blockwise.blockwise_above()
    if case.shadow or not isinstance(case.passes, EachAlone) or (above is not None and weight_bytes(model) > above):
        verification.notes.append(f"not checked at {LEVEL}: the model is run block by block or through float32 shadows")
        return
    found = check_deployed(case, case.ort_original or case.original, case.ort_folded or case.folded)
    if isinstance(found, str):
        verification.notes.append(f"not checked at {LEVEL}: {found}")
        return
    verification.deployed = found
    if not found.passed:
        verification.status = "failed"
        verification.reason = (
            f"at {LEVEL}, the level ONNX Runtime runs by default, the fold moves output '{found.output}' by "
            f"{found.rel_diff:.2g} relative, more than its allowance there ({found.allowed:.2g}: its rtol plus "
            f"{SENSITIVITY_FACTOR:g} x the original's own sensitivity at that level, {found.sensitivity:.2g})"
        )


def _read_back(verification: Verification, read: ReadBack | None) -> Verification:
    """The verdict with what reading the fold back showed (`verify.readback`): a count, and without
    float64, where it is part of what the verdict rests on, a note."""
    if read is not None:
        verification.edits_checked = read.checked
        if verification.judgment != FLOAT64:
            verification.notes.append(
                f"the fold read back against its plan, in float64, tensor by tensor: {read.checked} planned changes as "
                f"planned (centered weights, biases with beta, rewritten and inserted nodes), {read.unchanged} other "
                "tensors and every other node as they were"
            )
    return verification
