"""Which order to run the fold and ONNX Runtime's transformers optimizer in, for this graph.

The optimizer (`onnxruntime.transformers.optimizer.optimize_model`) matches `LayerNormalization`
by op type, so on a graph it has not seen yet, folding first can cost its fusions. What it does
on this graph is decided by running it on weightless copies (`ort_fusions.check.FusionCheck`); this module
only words the advice. Folding an optimized graph costs nothing more: the SkipLayerNormalizations
it wrote fold into SkipSimplifiedLayerNormalization.
"""

from __future__ import annotations

import onnx_ir as ir

from onnx_lnfold.forms import LnCandidate
from onnx_lnfold.ort_fusions.check import GEMM_RUN, OPTIMIZER, FusionCheck


def order_advice(
    fusions: FusionCheck, folded: set[ir.Node], kept_for_fusion: list[LnCandidate], anything_folded: bool
) -> list[str]:
    """One line saying which order to use, when the order matters for this graph; or that ONNX
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
    if not lost:
        return []
    return [
        f"Order: run ONNX Runtime's transformers optimizer ({OPTIMIZER}) first, then fold the optimized "
        f"model (no fusion is lost that way): {'; '.join(lost)}."
    ]
