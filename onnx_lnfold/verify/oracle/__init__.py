"""The oracle the check holds a fold to, and the means to compute it at any size.

The truth is the float64 value of the original: each model widened to a float64 twin (`shadow`,
which also widens bfloat16 models to float32 shadows for ONNX Runtime) and evaluated node by node in
`onnx.reference` (`reference`), with the ops it lacks or rounds added (`float64_ops`), a node's
weight read in part where it needs only part (`part_reads`). A model larger than the memory at hand
is cut where few tensors are live (`cut`) and run block by block (`blockwise`), which is also how
the original's own sensitivity to one rounding step of its weights is measured. The passes over a
large model advance together (`paced`), so each file is read from disk about once; each says where
it is to the progress line it is given.
"""
