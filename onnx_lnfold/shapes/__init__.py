"""Shapes: the rank, dims and dtype of every value, as ONNX's and ONNX Runtime's shape inference
find them and as the graph says (`ShapeTable`, built on `infer`); which axis a Reshape moves where
(`reshape`); and parts of an axis, cut into blocks for per-head LNs (`parts`, docs/DESIGN.md
section 2.4). Read by every step that reasons about axes.
"""
