"""Verify (step 5): is the folded model the original's function? (docs/DESIGN.md section 6)

Takes the original and the folded model (paths or in memory) and one `VerifyRequest` (`request`);
gives a `Verification` (`verdict`): passed, failed, skipped or unverified, with the figures it rests
on. `check` runs it: both models in ONNX Runtime on the input sets of `feeds.sets` (`ort_runs`), the
fold read back against its plan (`readback`), then the ladder of judges (`judges`: float64, the
original's sensitivity, rtol alone) against the float64 oracle (`oracle`). The passes over both
models are asked for alike (`passes`): each runs alone, or, for models run block by block, those
that read the weights run side by side first (`side_by_side`).
"""
