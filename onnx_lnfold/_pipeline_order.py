"""Which order to run the fold and ONNX Runtime's transformers optimizer in, for this graph.

The optimizer (`onnxruntime.transformers.optimizer.optimize_model`) matches `LayerNormalization`
by op type, so on a graph it has not seen yet, folding first can cost its fusions (`_fusions`).
Folding an optimized graph costs none: the SkipLayerNormalizations it wrote fold into
SkipSimplifiedLayerNormalization, and it fuses `Add + SimplifiedLayerNormalization` itself.
"""

from __future__ import annotations

import onnx_ir as ir

from onnx_lnfold._fusions import gemm_after_layer_norm, optimizer_has_run
from onnx_lnfold._recognize import LnCandidate

OPTIMIZER = "onnxruntime.transformers.optimizer.optimize_model"


def order_advice(graph: ir.Graph, folded: list[LnCandidate], kept_for_fusion: list[LnCandidate]) -> list[str]:
    """One line saying which order to use, when the order matters for this graph; else nothing."""
    if optimizer_has_run(graph) or not (folded or kept_for_fusion):
        return []
    lost = []
    gemms = gemm_after_layer_norm(graph, {cand.node for cand in folded})
    if gemms:
        lost.append(
            f"it turns {len(gemms)} Reshape -> Gemm -> Reshape into MatMul + Add (model_type gpt2) only behind a "
            "LayerNormalization, not behind the folded one"
        )
    if kept_for_fusion:
        names = ", ".join(f"'{cand.name}'" for cand in kept_for_fusion)
        lost.append(f"its EmbedLayerNormalization fusion is why {names} stayed a LayerNorm")
    if not lost:
        return []
    return [
        f"Order: ONNX Runtime's transformers optimizer ({OPTIMIZER}) has not run on this graph; run it first, "
        f"then fold the optimized model (no fusion is lost that way): {'; '.join(lost)}."
    ]
