"""The CUDA sweep (`python -m benchmarks.cuda`): LayerNorm vs RMSNorm kernels, folded models end to
end, and which `--fuse-residual` choice pays, on ONNX Runtime's CUDA provider. `sweep` runs it and
writes the report, `device` holds the sessions and the proof that every node ran on the GPU,
`timing` the wall clock and kernel time, `models` the end-to-end models as deployed on CUDA;
`gpu_host/` prepares and runs it on an offline GPU host."""
