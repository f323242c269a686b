"""Benchmarks for onnx_lnfold: latency (original vs folded in onnxruntime), the bound, fold cost.

Entry point: ``python -m benchmarks.run --quick`` (see benchmarks/README.md).
"""
