"""The ops the float64 evaluation (`verify.oracle.reference`) adds to `onnx.reference`, as `OpRun`s
computed in the dtype of their inputs (float64 in a twin):

- ONNX Runtime's own ops that the fold emits or that its transformers optimizer writes
  (`SimplifiedLayerNormalization`, `com.microsoft::SkipSimplifiedLayerNormalization`,
  `SkipLayerNormalization`, `FastGelu`, `BiasGelu`, `Gelu`, `QuickGelu`, `GroupQueryAttention`,
  `MatMulNBits`), with the semantics of its CPU kernels (onnxruntime/contrib_ops/cpu/skip_layer_norm.cc,
  bert/bias_gelu.cc, core/providers/cpu/nn/layer_norm_impl.cc);
- `Erf`, whose reference implementation rounds to float32, and `Gelu` (opset 20), which would
  expand to that Erf;
- `GatherElements`, whose reference implementation fails on tables of more than 32 rows;
  `Loop`, which it runs zero times without a condition input and whose scan outputs it
  concatenates instead of stacking; `Pad`, which it refuses with negative pads (a crop); and
  `ConvTranspose`, which it scatters element by element in Python;
- `DequantizeLinear` and `QuantizeLinear` at opsets 10 to 18 (`EARLIER_OPSETS`): the reference
  implements the first only from opset 19 on, and its second wraps around past int32.

`Evaluator` is `onnx.reference`'s evaluator with these ops, in model-local functions too.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import onnx
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun
from onnx.reference.ops.op_dequantize_linear import DequantizeLinear_19
from onnx.reference.ops.op_loop import Loop as _ReferenceLoop
from onnx.reference.ops.op_quantize_linear import QuantizeLinear_10

from onnx_lnfold.core.ops import MS_DOMAIN


def _erf(x: np.ndarray) -> np.ndarray:
    # The C library's double erf (within an ulp or so), one Python call an element: numpy has none.
    flat = np.fromiter(map(math.erf, x.ravel().tolist()), dtype=np.float64, count=x.size)
    return flat.reshape(x.shape).astype(x.dtype, copy=False)


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


def _normalize(x: np.ndarray, scale, bias, axis: int, epsilon: float, simplified: bool):
    """(y, mean, inv_std_dev) over the axes from `axis` on: LayerNorm, or RMSNorm when
    `simplified` (its mean output is zeros, as the kernel leaves nothing else there)."""
    axes = tuple(range(axis % x.ndim, x.ndim))
    if simplified:
        mean = np.zeros(x.shape[: axis % x.ndim] + (1,) * len(axes), dtype=x.dtype)
        centered = x
    else:
        mean = x.mean(axis=axes, keepdims=True)
        centered = x - mean
    inv_std_dev = 1.0 / np.sqrt(np.mean(centered * centered, axis=axes, keepdims=True) + epsilon)
    y = centered * inv_std_dev * scale
    if bias is not None:
        y = y + bias
    return y.astype(x.dtype, copy=False), mean, inv_std_dev.astype(x.dtype, copy=False)


class SimplifiedLayerNormalization(OpRun):
    """ONNX Runtime's RMSNorm (domain ''): X / sqrt(mean(X^2) + epsilon) * scale over the axes from
    `axis` on; outputs Y and inv_std_var."""

    op_domain = ""

    def _run(self, X, scale, axis=None, epsilon=None, stash_type=None):  # noqa: ARG002
        axis = -1 if axis is None else axis
        epsilon = 1e-5 if epsilon is None else epsilon
        y, _, inv_std_dev = _normalize(X, scale, None, axis, epsilon, simplified=True)
        return y, inv_std_dev


# SkipLayerNormalization's schema default; the kernel requires the attribute to be present.
_SKIP_EPSILON = 1e-12


class SkipLayerNormalization(OpRun):
    """com.microsoft: sum = input + skip (+ bias), LayerNorm of the sum over the last axis; outputs
    (output, mean, inv_std_var, input_skip_bias_sum); skip broadcasts over the leading axes."""

    op_domain = MS_DOMAIN

    def _run(self, input, skip, gamma, beta=None, bias=None, epsilon=None):  # noqa: A002
        total = input + skip if bias is None else input + skip + bias
        epsilon = _SKIP_EPSILON if epsilon is None else epsilon
        y, mean, inv_std_dev = _normalize(total, gamma, beta, -1, epsilon, simplified=False)
        return y, mean, inv_std_dev, total


class SkipSimplifiedLayerNormalization(OpRun):
    """com.microsoft: the RMSNorm counterpart of SkipLayerNormalization (inputs input, skip,
    gamma, bias)."""

    op_domain = MS_DOMAIN

    def _run(self, input, skip, gamma, bias=None, epsilon=None):  # noqa: A002
        total = input + skip if bias is None else input + skip + bias
        epsilon = _SKIP_EPSILON if epsilon is None else epsilon
        y, mean, inv_std_dev = _normalize(total, gamma, None, -1, epsilon, simplified=True)
        return y, mean, inv_std_dev, total


class FastGelu(OpRun):
    """com.microsoft: the tanh approximation of GELU, of X (+ bias)."""

    op_domain = MS_DOMAIN

    def _run(self, X, bias=None):
        return (_gelu_tanh(X if bias is None else X + bias),)


class BiasGelu(OpRun):
    """com.microsoft: GELU (erf) of A + B."""

    op_domain = MS_DOMAIN

    def _run(self, A, B):
        return (_gelu(A + B),)


class Gelu(OpRun):
    """GELU (erf) as com.microsoft::Gelu has it."""

    op_domain = MS_DOMAIN

    def _run(self, X, approximate=None):  # noqa: ARG002 - the evaluator adds ONNX's Gelu attribute
        return (_gelu(X),)


class QuickGelu(OpRun):
    """com.microsoft: X * sigmoid(alpha * X)."""

    op_domain = MS_DOMAIN

    def _run(self, X, alpha=None):
        alpha = 1.702 if alpha is None else alpha
        return ((X / (1.0 + np.exp(-alpha * X))).astype(X.dtype, copy=False),)


class Erf(OpRun):
    """The reference's Erf computes in float32 whatever its input; this one in the input's dtype."""

    op_domain = ""

    def _run(self, x):
        return (_erf(x),)


class _OnnxGelu(OpRun):
    """Gelu (opset 20): its function body would run the reference's float32 Erf."""

    op_domain = ""

    def _run(self, X, approximate=None):
        approximate = approximate.decode() if isinstance(approximate, bytes) else approximate
        return ((_gelu_tanh(X) if approximate == "tanh" else _gelu(X)).astype(X.dtype, copy=False),)


_OnnxGelu.__name__ = "Gelu"  # the evaluator keys new ops by (op_domain, class name)


class BatchNormalization(OpRun):
    """The reference's opset 9-13 kernel normalizes by the batch's own statistics whenever the node
    has a `momentum` (exporters write one); at those opsets a node with one output is in inference
    mode and uses the running mean and variance, as ONNX Runtime does (a PP-OCRv5 export at opset 11:
    25% relative from ONNX Runtime at its first BatchNormalization)."""

    op_domain = ""

    def _run(self, x, scale, bias, mean, var, epsilon=None, momentum=None, training_mode=None, is_test=None, spatial=None):  # noqa: ARG002
        if training_mode or len(self.onnx_node.output) > 1:
            raise NotImplementedError("BatchNormalization in training mode")
        eps = 1e-5 if epsilon is None else epsilon
        shape = (-1,) + (1,) * (x.ndim - 2)
        y = scale.reshape(shape) * (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps) + bias.reshape(shape)
        return (y.astype(x.dtype, copy=False),)


class GatherElements(OpRun):
    """The reference's GatherElements gives wrong shapes past 32 rows (np.choose's limit)."""

    op_domain = ""

    def _run(self, data, indices, axis=None):
        axis = 0 if axis is None else axis
        indices = np.where(indices < 0, indices + data.shape[axis], indices)
        return (np.take_along_axis(data, indices, axis=axis),)


def _rotary(x: np.ndarray, positions: np.ndarray, cos: np.ndarray, sin: np.ndarray, interleaved: bool) -> np.ndarray:
    """Rotary embedding of x [B, N, S, D] over its first 2 * cos.shape[1] dims at `positions` [B, S]."""
    half = cos.shape[1]
    c, s = cos[positions][:, None], sin[positions][:, None]  # [B, 1, S, half]
    out = x.copy()
    if interleaved:
        x1, x2 = x[..., 0 : 2 * half : 2], x[..., 1 : 2 * half : 2]
        out[..., 0 : 2 * half : 2], out[..., 1 : 2 * half : 2] = x1 * c - x2 * s, x2 * c + x1 * s
    else:
        x1, x2 = x[..., :half], x[..., half : 2 * half]
        out[..., :half], out[..., half : 2 * half] = x1 * c - x2 * s, x2 * c + x1 * s
    return out


class GroupQueryAttention(OpRun):
    """com.microsoft: attention of num_heads query heads over kv_num_heads key/value heads, each
    shared by num_heads / kv_num_heads of them, causal, with a KV cache (past and present in
    [B, kv_num_heads, S, head_size]) and rotary embedding of q and k inside, as ONNX Runtime's CPU
    kernel computes it (contrib_ops/cpu/bert/group_query_attention.cc, gqa_attention_base.h):
    `seqlens_k` is each batch row's total length minus one, the new tokens its last positions."""

    op_domain = MS_DOMAIN

    def _run(  # noqa: PLR0913
        self, query, key=None, value=None, past_key=None, past_value=None, seqlens_k=None, total_sequence_length=None,
        cos_cache=None, sin_cache=None, position_ids=None, attention_bias=None, head_sink=None, *, num_heads=None,
        kv_num_heads=None, scale=None, softcap=None, local_window_size=None, do_rotary=None, rotary_interleaved=None,
        smooth_softmax=None, qk_output=None,
    ):  # fmt: skip
        heads, kv_heads = int(num_heads), int(kv_num_heads)
        batch, new = query.shape[:2]
        if key is None:  # packed: [B, S, (heads + 2 kv_heads) * D]
            size = query.shape[2] // (heads + 2 * kv_heads)
            packed = query.reshape(batch, new, heads + 2 * kv_heads, size)
            q, k, v = np.split(packed, [heads, heads + kv_heads], axis=2)
        else:
            size = query.shape[2] // heads
            q = query.reshape(batch, new, heads, size)
            k = key.reshape(batch, new, kv_heads, size)
            v = value.reshape(batch, new, kv_heads, size)
        q, k, v = (t.transpose(0, 2, 1, 3) for t in (q, k, v))  # [B, N, S, D]
        lengths = seqlens_k.astype(np.int64).reshape(-1) + 1  # each row's total length
        positions = lengths[:, None] - new + np.arange(new)[None, :]  # the new tokens' positions
        if position_ids is not None:
            positions = position_ids.astype(np.int64)
        if do_rotary:
            q = _rotary(q, np.maximum(positions, 0), cos_cache, sin_cache, bool(rotary_interleaved))
            k = _rotary(k, np.maximum(positions, 0), cos_cache, sin_cache, bool(rotary_interleaved))
        past_length = 0 if past_key is None else past_key.shape[2]
        present_k = np.zeros((batch, kv_heads, max(past_length, int(lengths.max())), size), dtype=query.dtype)
        present_v = np.zeros_like(present_k)
        for b in range(batch):
            start = int(lengths[b]) - new  # where the new tokens go: after the row's own past
            if past_key is not None and start > 0:
                present_k[b, :, :start] = past_key[b, :, :start]
                present_v[b, :, :start] = past_value[b, :, :start]
            present_k[b, :, start : start + new] = k[b]
            present_v[b, :, start : start + new] = v[b]
        group = heads // kv_heads
        keys = np.repeat(present_k, group, axis=1)  # [B, heads, T, D]
        values = np.repeat(present_v, group, axis=1)
        factor = float(scale) if scale else 1.0 / math.sqrt(size)
        scores = np.einsum("bhsd,bhtd->bhst", q, keys) * factor
        if softcap:
            scores = float(softcap) * np.tanh(scores / float(softcap))
        if attention_bias is not None:
            scores = scores + attention_bias
        t = np.arange(keys.shape[2])[None, None, None, :]
        allowed = t <= positions[:, None, :, None]  # causal, and within the row's length
        if local_window_size is not None and int(local_window_size) > 0:
            allowed &= t > positions[:, None, :, None] - int(local_window_size)
        scores = np.where(allowed, scores, -np.inf)
        top = scores.max(axis=-1, keepdims=True)
        weights = np.exp(scores - top)
        denominator = weights.sum(axis=-1, keepdims=True) + (np.exp(-top) if smooth_softmax else 0.0)
        out = np.einsum("bhst,bhtd->bhsd", weights / denominator, values)
        return out.transpose(0, 2, 1, 3).reshape(batch, new, heads * size), present_k, present_v


class MatMulNBits(OpRun):
    """com.microsoft: A @ W^T with W [N, K] stored in `bits`-bit blocks of `block_size` along K,
    each with its scale (and zero point, default 2^(bits-1)), dequantized in float64; whatever the
    kernel does with A (`accuracy_level` 4 rounds it to int8), the float64 reference is exact."""

    op_domain = MS_DOMAIN

    def _run(self, A, B, scales, zero_points=None, g_idx=None, bias=None, *, K=None, N=None, bits=None, block_size=None,
             accuracy_level=None):  # noqa: ARG002
        k, n, bits, size = int(K), int(N), int(bits or 4), int(block_size)
        blocks = -(-k // size)
        raw = np.asarray(B, dtype=np.uint8).reshape(n, blocks, -1)
        if bits == 4:
            q = np.stack([raw & 0x0F, raw >> 4], axis=-1).reshape(n, blocks, -1)[:, :, :size]
        elif bits == 8:
            q = raw[:, :, :size]
        else:
            raise NotImplementedError(f"MatMulNBits with bits={bits}")
        scale = np.asarray(scales, dtype=np.float64).reshape(n, blocks)
        if zero_points is None:
            zero = np.full((n, blocks), 2 ** (bits - 1), dtype=np.float64)
        elif zero_points.dtype == np.uint8:
            packed = zero_points.reshape(n, -1)
            zero = (np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(n, -1) if bits == 4 else packed)[:, :blocks]
        else:
            zero = np.asarray(zero_points, dtype=np.float64).reshape(n, blocks)
        weight = ((q.astype(np.float64) - zero[:, :, None]) * scale[:, :, None]).reshape(n, -1)[:, :k]
        out = A @ weight.T
        if bias is not None:
            out = out + bias
        return (out.astype(A.dtype, copy=False),)


class Loop(_ReferenceLoop):
    """The reference's Loop runs no iteration when the condition input is omitted (it means true),
    joins scan outputs with np.vstack ([M * d0, ...] where ONNX stacks them: [M, d0, ...]), and
    fails when no iteration ran."""

    op_domain = ""

    def _run(self, M, cond, *args, context=None, body=None, attributes=None, bindings=None):  # noqa: ARG002
        body = self.body
        names = body.input_names
        inputs: dict[str, Any] = dict.fromkeys(names)
        for name, value in zip(names[2:], args):
            inputs[name] = value
        inputs.update(context or {})
        scans: list[list[np.ndarray]] = [[] for _ in range(self.K)]
        states = [inputs[name] for name in names[2:]]
        cond = np.array(True) if cond is None else cond
        iteration = 0
        while cond and (M is None or iteration < M):
            if names and names[0]:
                inputs[names[0]] = np.array(iteration, dtype=None if M is None else M.dtype)
            if len(names) > 1 and names[1]:
                inputs[names[1]] = cond
            outputs = self._run_body(inputs, attributes=attributes, bindings=bindings)
            cond = outputs[self.output_index[body.output_names[0]]]
            states = list(outputs[1 : 1 + self.N])
            for k in range(self.K):
                scans[k].append(outputs[1 + self.N + k])
            for name, value in zip(names[2:], states):
                inputs[name] = value
            iteration += 1
        results = states + [np.stack(scan) if scan else np.empty((0,)) for scan in scans]
        return self._check_and_fix_outputs(tuple(results))


class Pad(OpRun):
    """The reference pads with np.pad, which refuses negative pads; ONNX crops there (RWKV's time
    shift pads one step in and crops one out). Crop first, then pad what is left. One class for
    every version: pads and value as attributes (opset 2), pads, constant_value and axes as inputs
    (11, 18)."""

    op_domain = ""

    def _run(self, data, pads=None, constant_value=None, axes=None, mode=None, value=None):
        rank = data.ndim
        axes = list(range(rank)) if axes is None else [int(a) % rank for a in np.asarray(axes).ravel()]
        pads = [int(p) for p in np.asarray(pads).ravel()]
        begins, ends = pads[: len(axes)], pads[len(axes) :]
        crop = [slice(None)] * rank
        widths = [(0, 0)] * rank
        for axis, begin, end in zip(axes, begins, ends):
            crop[axis] = slice(max(-begin, 0), data.shape[axis] - max(-end, 0))
            widths[axis] = (max(begin, 0), max(end, 0))
        cropped = data[tuple(crop)]
        mode = (mode.decode() if isinstance(mode, bytes) else mode) or "constant"
        if mode != "constant":
            return (np.pad(cropped, widths, mode=mode).astype(data.dtype, copy=False),)
        fill = constant_value if constant_value is not None else (value if value is not None else 0)
        fill = np.asarray(fill).ravel()[0] if np.size(fill) else 0
        return (np.pad(cropped, widths, mode="constant", constant_values=fill).astype(data.dtype, copy=False),)


# The first opset whose DequantizeLinear and QuantizeLinear onnx.reference's own classes serve.
_REFERENCE_QDQ_OPSET = 19
# Past this quotient x / scale, QuantizeLinear saturates whatever the zero point (far beyond int8's
# and uint8's range, the types of opsets 10 to 18, and within int32's, where the reference converts
# the rounded quotient).
_SATURATED_QUOTIENT = float(2**24)


class DequantizeLinear10(DequantizeLinear_19):
    """DequantizeLinear at opsets 10 to 18: (x - zero_point) * scale, per tensor, or from opset 13
    per slice along `axis` (a 1-D scale), on int8, uint8 and int32. Opset 19 only adds types and
    keeps the formula, so the reference's opset 19 class computes it, under opset 18's schema
    (no later attribute). The result has the scale's type: float64 in a twin, exact products of
    the integers and the scale, where the integers fit float32 (the reference converts them to
    float32 first, as ONNX Runtime does: an int32 past 2^24 is rounded by both)."""

    op_domain = ""
    op_schema = onnx.defs.get_schema("DequantizeLinear", _REFERENCE_QDQ_OPSET - 1)


class QuantizeLinear10(QuantizeLinear_10):
    """QuantizeLinear at opsets 10 to 18: saturate(round(x / scale) + zero_point) to the zero point's
    type (uint8 without one), rounding half to even, per tensor or from opset 13 per `axis`. The
    reference's class, with its quotient held within `_SATURATED_QUOTIENT` first: it converts the
    rounded quotient to int32, so a quotient past int32's range wrapped around (a large positive x
    gave the type's minimum), where ONNX Runtime saturates.

    In a twin x and the scale are float64 and so is the quotient. ONNX defines the quotient as the
    real x / scale; float64 is within 2^-53 of it, ONNX Runtime's float32 within 2^-24, so on the
    same float32 x and scale both round to the same integer unless the real quotient lies within
    float32's error of a half, where float64 gives ONNX's integer. The twin's x, computed in
    float64, differs from ONNX Runtime's float32 one by float32's noise, which moves an integer by
    one step where x lies that near a boundary: the noise the judge measures, not an error of the
    twin."""

    op_domain = ""
    op_schema = onnx.defs.get_schema("QuantizeLinear", _REFERENCE_QDQ_OPSET - 1)

    def _run(self, x, y_scale, zero_point=None, axis=None):
        axis = 1 if axis is None else axis
        scale = np.abs(y_scale)
        if scale.ndim == 1 and scale.size > 1:
            scale = scale.reshape([-1 if d == axis % x.ndim else 1 for d in range(x.ndim)])
        bound = _SATURATED_QUOTIENT * scale
        return super()._run(np.clip(x, -bound, bound).astype(x.dtype, copy=False), y_scale, zero_point, axis=axis)


# Op type -> the class for a model below `_REFERENCE_QDQ_OPSET` (`Evaluator._load_impl`).
class ConvTranspose(OpRun):
    """The reference scatters each output channel through a Python loop over every input position
    (`col2im_naive_implementation`): a minute for an image model's three upsampling layers. Here
    one product over the input channels per kernel position, added into the strided output; pads
    and output shape as ONNX defines them (an `output_shape` or `auto_pad` SAME sets the pads)."""

    op_domain = ""

    def _run(
        self,
        X,
        W,
        B=None,
        auto_pad=None,
        dilations=None,
        group=None,
        kernel_shape=None,
        output_padding=None,
        output_shape=None,
        pads=None,
        strides=None,
    ):
        spatial, kernel = X.shape[2:], W.shape[2:]
        rank = len(spatial)
        strides = list(strides or [1] * rank)
        dilations = list(dilations or [1] * rank)
        extra = list(output_padding or [0] * rank)
        group = group or 1
        # The extent a full scatter covers, before the pads crop it.
        full = [s * (n - 1) + e + (k - 1) * d + 1 for n, k, s, d, e in zip(spatial, kernel, strides, dilations, extra)]
        if output_shape is not None or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            shape = list(output_shape)[-rank:] if output_shape is not None else [n * s for n, s in zip(spatial, strides)]
            total = [f - o for f, o in zip(full, shape)]
            begins = [t // 2 if auto_pad == "SAME_UPPER" else t - t // 2 for t in total]
        else:
            pads = list(pads or [0] * (2 * rank))
            begins = pads[:rank]
            shape = [f - b - e for f, b, e in zip(full, begins, pads[rank:])]
        size = [max(f, b + o) for f, b, o in zip(full, begins, shape)]
        batch, channels, per_group = X.shape[0], X.shape[1], W.shape[1]
        y = np.zeros((batch, group * per_group, *size), dtype=np.result_type(X, W))
        # (batch, group, positions, channels in the group) @ (group, channels, out per group): BLAS.
        rows = np.moveaxis(X.reshape(batch, group, channels // group, -1), 2, -1)
        w_groups = W.reshape(group, channels // group, per_group, *kernel)
        for position in np.ndindex(*kernel):
            part = np.moveaxis(np.matmul(rows, w_groups[(..., *position)]), -1, 2)
            at = tuple(slice(p * d, p * d + s * (n - 1) + 1, s) for p, d, s, n in zip(position, dilations, strides, spatial))
            y[(slice(None), slice(None), *at)] += part.reshape(batch, group * per_group, *spatial)
        y = y[(slice(None), slice(None), *(slice(b, b + o) for b, o in zip(begins, shape)))]
        if B is not None:
            y = y + B.reshape(1, -1, *[1] * rank)
        return (y.astype(X.dtype, copy=False),)


EARLIER_OPSETS: dict[str, type[OpRun]] = {"DequantizeLinear": DequantizeLinear10, "QuantizeLinear": QuantizeLinear10}

FLOAT64_OPS: list[type[OpRun]] = [
    GroupQueryAttention,
    MatMulNBits,
    SimplifiedLayerNormalization,
    SkipLayerNormalization,
    SkipSimplifiedLayerNormalization,
    FastGelu,
    BiasGelu,
    Gelu,
    QuickGelu,
    Erf,
    _OnnxGelu,
    BatchNormalization,
    ConvTranspose,
    GatherElements,
    Loop,
    Pad,
]
# Domains the evaluator knows besides the main one (and model-local functions).
KNOWN_DOMAINS = {"", "ai.onnx", "ai.onnx.ml", "ai.onnx.preview", "ai.onnx.preview.training", "experimental"}


class Evaluator(ReferenceEvaluator):
    """A ReferenceEvaluator whose model-local functions get the ops above too (the base class
    builds their evaluators without `new_ops`; If/Loop/Scan bodies inherit them)."""

    def __init__(self, proto, *args, new_ops=None, **kwargs):
        # The class each (domain, op) loads, looked up once: the base class imports and searches
        # its op list for every node, seconds for a graph of 200,000.
        self._classes: dict[tuple[str, str], type] = {}
        super().__init__(proto, *args, new_ops=FLOAT64_OPS if new_ops is None else new_ops, **kwargs)

    def _load_impl(self, node, input_types=None):
        """`EARLIER_OPSETS`' classes where the main opset is below the reference's own; bodies and
        functions are evaluated by this class too."""
        key = (node.domain, node.op_type)
        found = self._classes.get(key) if input_types is None else None
        if found is not None:
            return found
        earlier = EARLIER_OPSETS.get(node.op_type) if node.domain in ("", "ai.onnx") else None
        if earlier is not None and self.opsets.get(node.domain, _REFERENCE_QDQ_OPSET) < _REFERENCE_QDQ_OPSET:
            return earlier
        found = super()._load_impl(node, input_types)
        if input_types is None and isinstance(found, type):  # not a function's evaluator, made per node
            self._classes[key] = found
        return found
