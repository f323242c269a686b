"""Verify (step 5): is the folded model the original's function? Both run in ONNX Runtime on
input sets given or synthesized from the graph (`inputs`), and their float64 twins
(`shadow`, evaluated by `reference`) decide (`check`, docs/DESIGN.md section 6).

Takes the original and the folded model (paths or in memory) and the plan; gives a
`Verification`: passed, failed, skipped or unverified, with the figures it rests on.
"""
