"""ONNX Runtime's fusions (docs/DESIGN.md section 10): which LNs to keep because folding them
would cost a fusion ONNX Runtime makes on the original, decided by ONNX Runtime's own optimizers
run on weightless copies of the graph (`weightless`, `probe`), before and after the plan is
applied to a clone (`fusion_cost.FusionCheck`), and the advice on the order of the fold and the
transformers optimizer (`order`), with the count of the fold of the optimizer's output where it
folds more (`optimizer_first`, on that output read back whole: `light`).

Takes the model, a way to plan a clone and the apply step to carry that plan out; gives the LNs
to keep, each with its `Blocked`, and the advice lines. ONNX Runtime never reads a weight's
values: the copies hold zeros.
"""
