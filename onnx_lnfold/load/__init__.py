"""Load (step 1): a path, an `onnx.ModelProto` or an `onnx_ir.Model` as an `onnx_ir.Model` of
the caller's own, its large weights left where they are (`load_model`); the caller's copy is
never touched, checked by ONNX's checker (`validate`). Bad input is one `InvalidInput` with one line.
"""
