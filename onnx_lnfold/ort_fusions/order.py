"""Which order to run the fold and ONNX Runtime's transformers optimizer in, for this graph.

The optimizer (`onnxruntime.transformers.optimizer.optimize_model`) matches `LayerNormalization`
by op type, so on a graph it has not seen yet, folding first can cost its fusions. What it does
on this graph is decided by running it on weightless copies (`ort_fusions.fusion_cost.FusionCheck`); this module
only words the advice. Folding an optimized graph costs nothing more: the SkipLayerNormalizations
it wrote fold into SkipSimplifiedLayerNormalization. Where the fold folds more LNs of the
optimizer's output than of this graph (`FusionCheck.optimizer_first`), the advice says so with both
counts, and the JSON report gives the same facts (`optimizer_first_facts`). A quantized graph's
line says what folding the float model first would fold (`ort_fusions.float_first`). `advise`
gives a settled plan all of it.
"""

from __future__ import annotations

from typing import Any

import onnx_ir as ir

from onnx_lnfold.analysis.plan import CenteringPlan
from onnx_lnfold.analysis.planner import Planner
from onnx_lnfold.core.quantized import quantized_ops
from onnx_lnfold.forms import LnCandidate
from onnx_lnfold.ort_fusions.float_first import FloatFirst, float_first, float_first_facts
from onnx_lnfold.ort_fusions.fusion_cost import GEMM_RUN, OPTIMIZER, FusionCheck, OptimizerFirst

# What to do where the optimizer's output folds more LNs: the Order line's words and the JSON's.
_THEN = "then fold its output"
FIRST_ADVICE = f"run it first, {_THEN}"


def _optimizer_call(first: OptimizerFirst) -> str:
    """`model_type bert, opt_level 0, num_heads 4, hidden_size 64, onnxruntime 1.32.0`."""
    call = f"model_type {first.model_type}, opt_level {first.opt_level}"
    if first.num_heads:
        call += f", num_heads {first.num_heads}, hidden_size {first.hidden_size}"
    return f"{call}, onnxruntime {first.onnxruntime}"


def _first_words(first: OptimizerFirst) -> str:
    """The counts, as the Order line gives them."""
    bound = "at least " if first.at_least else ""
    unknown = (
        f" (taking the {len(first.unknown)} large tensors it computed from the copy's zeros for unknown inputs)"
        if first.at_least
        else ""
    )
    return (
        f"on a weightless copy ({_optimizer_call(first)}) {bound}{first.folded} of the {first.layer_norms} LayerNorms "
        f"of its output fold{unknown}, against {first.folded_here} of {first.layer_norms_here} here"
    )


def optimizer_first_facts(first: OptimizerFirst | None) -> dict[str, Any] | None:
    """The JSON report's `optimizer_first`: both counts, the optimizer's call and the advice."""
    if first is None:
        return None
    return {
        "folded": first.folded,
        "layer_norms": first.layer_norms,
        "folded_here": first.folded_here,
        "layer_norms_here": first.layer_norms_here,
        "at_least": first.at_least,
        "unknown_tensors": list(first.unknown),
        "optimizer": OPTIMIZER,
        "model_type": first.model_type,
        "opt_level": first.opt_level,
        "num_heads": first.num_heads,
        "hidden_size": first.hidden_size,
        "onnxruntime": first.onnxruntime,
        "advice": FIRST_ADVICE,
    }


def order_advice(
    fusions: FusionCheck,
    folded: set[ir.Node],
    kept_for_fusion: list[LnCandidate],
    anything_folded: bool,
    first: OptimizerFirst | None = None,
) -> list[str]:
    """One line saying which order to use, when the order matters for this graph (a fusion that
    folding first costs, or more LNs folded on the optimizer's output: `first`); or that ONNX
    Runtime's fusions were not checked; else nothing."""
    if fusions.enabled and not fusions.active and fusions.unchecked and (anything_folded or kept_for_fusion):
        return [
            f"Fusions: not checked ({fusions.unchecked}): folding may cost fusions that ONNX Runtime's "
            f"transformers optimizer ({OPTIMIZER}) or a session would make on the original; run the optimizer "
            "first, then fold the optimized model."
        ]
    lost = []
    gemm = fusions.gemm_order(folded) if anything_folded else None
    if gemm is not None:
        model_type, level = GEMM_RUN
        lost.append(
            f"on a weightless copy (model_type {model_type}, opt_level {level}, onnxruntime {fusions.version}) it "
            f"turns Reshape -> Gemm -> Reshape into MatMul + Add only behind a LayerNormalization, so folding "
            f"first leaves {gemm.gemms_left} more Gemm ({gemm.nodes_original} nodes from the original, "
            f"{gemm.nodes_folded} from the folded graph)"
        )
    if kept_for_fusion:
        names = ", ".join(f"'{cand.name}'" for cand in kept_for_fusion)
        lost.append(f"its EmbedLayerNormalization fusion is why {names} stayed a LayerNorm")
    if first is not None and not lost:
        return [
            f"Order: run ONNX Runtime's transformers optimizer ({OPTIMIZER}) first, {_THEN}: {_first_words(first)}."
        ]
    if first is not None:
        lost.append(_first_words(first))
    if not lost:
        return []
    return [
        f"Order: run ONNX Runtime's transformers optimizer ({OPTIMIZER}) first, then fold the optimized "
        f"model (no fusion is lost that way): {'; '.join(lost)}."
    ]


def advise(fusions: FusionCheck, planner: Planner, plan: CenteringPlan) -> None:
    """Set the advice of `plan`, the plan `fusions` settled for `planner`'s model: the Order line
    (`order_advice`) and the optimizer-first facts of the JSON report (`optimizer_first_facts`)."""
    folded = {cand.node for cand in planner.lns if plan.decision_for(cand.name).folded}
    first = fusions.optimizer_first(plan, planner)
    plan.optimizer_first = optimizer_first_facts(first)
    embed_kept = [cand for cand in planner.lns if cand.name in fusions.embed_kept]
    plan.advice = order_advice(fusions, folded, embed_kept, bool(plan.folded), first)
    quantized = float_first(planner, plan) if plan.decisions and quantized_ops(planner.model.graph) else None
    plan.float_first = float_first_facts(quantized)
    plan.advice += quantized_advice(planner.model.graph, plan, quantized)


def _float_first_words(first: FloatFirst | None) -> str:
    """What folding the float model first folds, as the Quantized line ends."""
    if first is None:
        return ""
    if first.unrecovered is not None:
        return f": the float model cannot be recovered from this file ({first.unrecovered})"
    return (
        f": folding the float model recovered from this file folds {first.folded} of its "
        f"{first.layer_norms} LNs (here {first.folded_here} of {first.layer_norms_here})"
    )


def quantized_advice(graph: ir.Graph, plan: CenteringPlan, first: FloatFirst | None = None) -> list[str]:
    """One line where the graph is quantized: its quantized ops, that the fold leaves their units
    whole (docs/DESIGN.md section 2.6) and how many LNs stay for that, and the order that folds them,
    with what folding the float model first folds (`first`, `ort_fusions.float_first`)."""
    ops = quantized_ops(graph)
    if not ops or not plan.decisions:
        return []
    counted = ", ".join(f"{n} {op}" for op, n in sorted(ops.items(), key=lambda item: (-item[1], item[0])))
    held = sum(d.code == "quantized" for d in plan.kept)
    stays = f"{held} LN{'s stay' if held != 1 else ' stays'} for that ('quantized')" if held else "no LN stays for that"
    return [
        f"Quantized: {counted}. The fold leaves every quantized unit whole (nothing is centered inside one, "
        f"no integer weight is centered): {stays}. Fold the float model before quantizing (docs/PIPELINES.md)"
        f"{_float_first_words(first)}."
    ]
