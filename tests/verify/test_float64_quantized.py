"""The float64 twin (`verify.oracle.reference.Float64Model`) of quantized models below opset 19, where
onnx.reference has no DequantizeLinear and its QuantizeLinear wraps around past int32
(`verify.oracle.float64_ops.EARLIER_OPSETS`): the committed QDQ and dynamic fixtures agree with ONNX
Runtime to float32's noise, and a generated model's integers and values are ONNX's, exactly."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnx_lnfold.verify.oracle.reference import Float64Model
from onnx_lnfold.verify.sessions import relative, run_model

from conftest import MODELS

# The quantized fixtures at opset 18 with DequantizeLinear (and QuantizeLinear, or
# DynamicQuantizeLinear and MatMulInteger) nodes.
QUANTIZED = [
    "bert_qdq_int8",
    "bert_qdq_int8_per_channel",
    "bert_dynamic_int8",
    "gpt2_qdq_int8",
    "gpt2_qdq_int8_per_channel",
    "gpt2_dynamic_int8",
]
# The twin's largest difference from ONNX Runtime (ORT_DISABLE_ALL) on these inputs is 3.7e-7 of an
# output's largest value (gpt2_dynamic_int8), 8.3e-8 on the QDQ fixtures: float32's rounding, no
# integer moved. Where float32's noise moves a quantized activation by one step (other inputs,
# another CPU's kernels) the outputs move by up to about 6e-5 (bert_dynamic_int8 at its realistic
# scale); a wrong scale, axis or rounding, or one step off at the last DequantizeLinear, by 1e-3
# or more.
TWIN_VS_ORT_RTOL = 1e-4


@pytest.mark.parametrize("name", QUANTIZED)
def test_the_twin_of_a_quantized_model_below_opset_19_agrees_with_onnx_runtime(name):
    path = MODELS / f"{name}.onnx"
    assert min(o.version for o in onnx.load(str(path), load_external_data=False).opset_import if o.domain == "") < 19
    feeds = dict(np.load(MODELS / f"{name}.inputs.npz"))
    ort = run_model(str(path), feeds)
    twin = Float64Model(path).run(feeds)
    for output, value in ort.items():
        assert twin[output].dtype == np.float64 and twin[output].shape == value.shape, output
        assert relative(twin[output], value) < TWIN_VS_ORT_RTOL, output


# --------------------------------------------------------------------------- exact semantics
X = np.array(
    [
        [[1.25, 1.75, -1.25, -1.75], [0.0, 63.0, -70.0, 1e12]],
        [[-1e12, 0.24, 0.26, 2.5], [-0.25, 0.25, 0.75, 100.0]],
    ],
    dtype=np.float32,
)  # halves of the 0.5 step, both signs; past int8's range; past int32's range, both signs
SCALE, ZERO = np.float32(0.5), np.int8(3)
AXIS_SCALES = np.array([0.5, 0.25], dtype=np.float32)  # per slice of axis 1
AXIS_ZEROS = np.array([3, -1], dtype=np.int8)
UINT8_SCALES = np.array([1.0, 0.5, 2.0, 0.25], dtype=np.float32)  # per slice of axis 2
UINT8_ZEROS = np.array([128, 0, 255, 10], dtype=np.uint8)
BIAS = np.array([-(2**20) - 3, 17, 2**23], dtype=np.int32)
BIAS_SCALE, BIAS_ZERO = np.float32(2.0**-10), np.int32(5)


def _qdq_model(opset: int) -> onnx.ModelProto:
    """int8 per tensor, uint8 per axis 2 (QuantizeLinear); the int8 one back per axis 1, and an
    int32 initializer per tensor (DequantizeLinear)."""
    init = onnx.numpy_helper.from_array
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "scale", "zero"], ["q"]),
        helper.make_node("QuantizeLinear", ["x", "u_scales", "u_zeros"], ["u"], axis=2),
        helper.make_node("DequantizeLinear", ["q", "axis_scales", "axis_zeros"], ["y"], axis=1),
        helper.make_node("DequantizeLinear", ["bias", "bias_scale", "bias_zero"], ["b"]),
    ]
    arrays = {
        "scale": SCALE, "zero": ZERO, "u_scales": UINT8_SCALES, "u_zeros": UINT8_ZEROS,
        "axis_scales": AXIS_SCALES, "axis_zeros": AXIS_ZEROS,
        "bias": BIAS, "bias_scale": BIAS_SCALE, "bias_zero": BIAS_ZERO,
    }  # fmt: skip
    graph = helper.make_graph(
        nodes,
        "qdq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(X.shape))],
        [
            helper.make_tensor_value_info("q", TensorProto.INT8, list(X.shape)),
            helper.make_tensor_value_info("u", TensorProto.UINT8, list(X.shape)),
            helper.make_tensor_value_info("y", TensorProto.FLOAT, list(X.shape)),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, list(BIAS.shape)),
        ],
        [init(np.asarray(value), name) for name, value in arrays.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _quantized(x, scale, zero, low, high):
    """ONNX's QuantizeLinear in numpy: round half to even, then saturate (in float64, no wrapping)."""
    return np.clip(np.rint(x.astype(np.float64) / scale) + zero.astype(np.float64), low, high)


@pytest.mark.parametrize("opset", [13, 18])
def test_quantize_and_dequantize_linear_below_opset_19_compute_onnx_s_integers_and_values(opset):
    model = _qdq_model(opset)
    q = _quantized(X, np.float64(SCALE), ZERO, -128, 127).astype(np.int8)
    u = _quantized(X, UINT8_SCALES.astype(np.float64), UINT8_ZEROS, 0, 255).astype(np.uint8)
    y = (q.astype(np.float64) - AXIS_ZEROS[:, None]) * AXIS_SCALES[:, None].astype(np.float64)
    b = (BIAS.astype(np.float64) - BIAS_ZERO) * np.float64(BIAS_SCALE)
    assert q[0, 0].tolist() == [5, 7, 1, -1] and q[0, 1, 3] == 127 and q[1, 0, 0] == -128  # half to even, saturated

    twin = Float64Model(model).run({"x": X})
    assert twin["q"].dtype == np.int8 and twin["u"].dtype == np.uint8
    np.testing.assert_array_equal(twin["q"], q)
    np.testing.assert_array_equal(twin["u"], u)
    assert twin["y"].dtype == np.float64 and twin["b"].dtype == np.float64  # the widened scale's type
    np.testing.assert_array_equal(twin["y"], y)
    np.testing.assert_array_equal(twin["b"], b)

    ort = run_model(model.SerializeToString(), {"x": X})  # every value above is exact in float32
    for name in ("q", "u", "y", "b"):
        np.testing.assert_array_equal(ort[name], twin[name].astype(ort[name].dtype), err_msg=name)


def test_from_opset_19_the_reference_s_own_classes_run_blocked_dequantization_too():
    """Opset 21's blocked DequantizeLinear (`block_size`), which the opset 10-18 classes do not take."""
    x = np.arange(-8, 8, dtype=np.int8).reshape(2, 8)
    scales = np.array([[0.5, 2.0], [0.25, 4.0]], dtype=np.float32)  # one per block of 4 along axis 1
    node = helper.make_node("DequantizeLinear", ["x", "s"], ["y"], axis=1, block_size=4)
    graph = helper.make_graph(
        [node],
        "blocked",
        [],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(x.shape))],
        [onnx.numpy_helper.from_array(x, "x"), onnx.numpy_helper.from_array(scales, "s")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    y = Float64Model(model).run({})["y"]
    assert y.dtype == np.float64
    np.testing.assert_array_equal(y, x * np.repeat(scales.astype(np.float64), 4, axis=1))
