"""ONNX Runtime's fusions (docs/DESIGN.md section 10): which LNs to keep because folding them
would cost a fusion ONNX Runtime makes on the original, decided by ONNX Runtime's own optimizers
run on weightless copies of the graph (`weightless`, `probe`), before and after the plan is
applied to a clone (`fusion_cost.FusionCheck`, the fused nodes lost: `session_fusions`), where
the graph's structure leaves them something to find (`prefilter`); and the advice on the order of
the fold and the transformers optimizer (`order`), with the count of the fold of the optimizer's
output where it folds more (`optimizer_first`, on that output read back whole: `light`).

Takes the analysis's `Planner` of the model and the apply step to carry a plan out on a clone;
gives the plan that costs no fusion (`FusionCheck.settle`), its LNs kept for one each with its
`Blocked`, and the advice lines (`order.advise`). ONNX Runtime never reads a weight's values:
the copies hold zeros.
"""
