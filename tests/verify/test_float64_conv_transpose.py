"""The float64 twin's ConvTranspose (`verify.oracle.float64_ops.ConvTranspose`) computes what ONNX
Runtime's computes, over strides, dilations, pads, output padding, output shapes, SAME pads, groups
and ranks 1 to 3; and it is the reference's own result where that one is right (one group)."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from onnx_lnfold.verify.oracle.float64_ops import FLOAT64_OPS

# (input spatial shape, kernel, attributes, channels in, out per group, group, bias)
CASES = [
    ((5, 6), (3, 3), {}, 4, 3, 1, True),
    ((5, 6), (2, 2), {"strides": [2, 2]}, 4, 3, 1, False),
    ((4, 7), (3, 2), {"strides": [2, 3], "pads": [1, 0, 0, 1]}, 3, 2, 1, True),
    ((4, 5), (3, 3), {"strides": [2, 2], "dilations": [2, 1], "output_padding": [1, 0]}, 2, 2, 1, True),
    ((4, 5), (3, 3), {"strides": [2, 2], "output_shape": [10, 9]}, 2, 3, 1, True),
    ((4, 5), (3, 3), {"strides": [2, 2], "auto_pad": "SAME_UPPER"}, 2, 2, 1, False),
    ((4, 5), (4, 4), {"strides": [2, 2], "auto_pad": "SAME_LOWER"}, 2, 2, 1, True),
    ((5, 5), (3, 3), {"strides": [2, 2], "group": 2}, 4, 3, 2, True),
    ((6, 4), (2, 3), {"strides": [1, 2], "group": 3, "pads": [0, 1, 1, 0]}, 6, 1, 3, False),
    ((9,), (4,), {"strides": [3], "pads": [1, 2]}, 3, 2, 1, True),
    ((3, 4, 2), (2, 2, 2), {"strides": [2, 1, 2]}, 2, 2, 1, True),
]


def _model(spatial, kernel, attrs, channels, per_group, group, bias):
    rng = np.random.default_rng(len(spatial) * 100 + sum(kernel))
    x = rng.normal(size=(2, channels, *spatial))
    w = rng.normal(size=(channels, per_group, *kernel))
    b = rng.normal(size=per_group * group)
    inputs = ["x", "w", "b"] if bias else ["x", "w"]
    node = helper.make_node("ConvTranspose", inputs, ["y"], **attrs)
    graph = helper.make_graph(
        [node],
        "ct",
        [helper.make_tensor_value_info(n, TensorProto.DOUBLE, None) for n in inputs],
        [helper.make_tensor_value_info("y", TensorProto.DOUBLE, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model, dict(zip(inputs, (x, w, b)))


def _as_float32(model: onnx.ModelProto) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for value in (*copy.graph.input, *copy.graph.output):
        value.type.tensor_type.elem_type = TensorProto.FLOAT
    return copy


@pytest.mark.parametrize("case", CASES, ids=[str(i) for i in range(len(CASES))])
def test_the_twins_conv_transpose_is_onnx_runtimes(case):
    model, feeds = _model(*case)
    (ours,) = ReferenceEvaluator(model, new_ops=FLOAT64_OPS).run(None, feeds)
    session = ort.InferenceSession(_as_float32(model).SerializeToString(), providers=["CPUExecutionProvider"])
    (theirs,) = session.run(None, {k: v.astype(np.float32) for k, v in feeds.items()})
    assert ours.dtype == np.float64 and ours.shape == theirs.shape
    assert np.abs(ours - theirs).max() / np.abs(theirs).max() < 1e-5
    group = case[5]
    if group == 1 and "output_shape" not in case[2]:  # where the reference's own result is right
        (reference,) = ReferenceEvaluator(model).run(None, feeds)
        assert np.abs(ours - reference).max() / np.abs(reference).max() < 1e-12
