"""The float64 evaluation verification judges a fold against (docs/DESIGN.md section 6).

A model's float64 twin (`verify.shadow.float64_twin`: every float tensor, type and dtype attribute widened
to double) runs in `onnx.reference`, which evaluates any standard op in the dtype of its inputs.
ONNX Runtime's CPU provider would be faster but has no double Conv or Erf. What `onnx.reference`
lacks or gets wrong for this purpose is implemented here as `OpRun`s:

- ONNX Runtime's own ops that the fold emits or that its transformers optimizer writes
  (`SimplifiedLayerNormalization`, `com.microsoft::SkipSimplifiedLayerNormalization`,
  `SkipLayerNormalization`, `FastGelu`, `BiasGelu`, `Gelu`, `QuickGelu`), with the semantics of
  its CPU kernels (onnxruntime/contrib_ops/cpu/skip_layer_norm.cc, bert/bias_gelu.cc,
  core/providers/cpu/nn/layer_norm_impl.cc) computed in float64;
- `Erf`, whose reference implementation rounds to float32, and `Gelu` (opset 20), which would
  expand to that Erf;
- `GatherElements`, whose reference implementation fails on tables of more than 32 rows, and
  `Loop`, which it runs zero times without a condition input and whose scan outputs it
  concatenates instead of stacking.

A twin of the fold can carry its centered weights and beta-folded biases unrounded (`exact_values`:
the float64 values `apply.centering` computed before rounding): then an exact fold differs from the
original by float64 rounding only. An op that no implementation covers (ONNX Runtime's `Attention`,
`EmbedLayerNormalization`, ...) is named by `Float64Unavailable`, and verification falls back.
"""

from __future__ import annotations

import math
import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun
from onnx.reference.ops.op_loop import Loop as _ReferenceLoop

from onnx_lnfold.core.ops import MS_DOMAIN
from onnx_lnfold.io.tensor_io import row_blocks
from onnx_lnfold.load.model import load_path
from onnx_lnfold.verify.blockwise import say
from onnx_lnfold.verify.shadow import float64_feeds, widen_to_float64


class Float64Unavailable(Exception):
    """The model cannot be evaluated in float64 here; the message says why (an op named)."""


# --------------------------------------------------------------------------- ops
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
    GatherElements,
    Loop,
]
# Domains the evaluator knows besides the main one (and model-local functions).
_KNOWN_DOMAINS = {"", "ai.onnx", "ai.onnx.ml", "ai.onnx.preview", "ai.onnx.preview.training", "experimental"}


class _Evaluator(ReferenceEvaluator):
    """A ReferenceEvaluator whose model-local functions get the ops above too (the base class
    builds their evaluators without `new_ops`; If/Loop/Scan bodies inherit them)."""

    def __init__(self, proto, *args, new_ops=None, **kwargs):
        super().__init__(proto, *args, new_ops=FLOAT64_OPS if new_ops is None else new_ops, **kwargs)


# --------------------------------------------------------------------------- the twins
def exact_tensors(model: ir.Model) -> dict[str, Any]:
    """Name -> tensor of every constant the fold computed (`apply.centering`'s tensors, which hand out
    their float64 values before rounding: `exact_float64()`), initializers and Constant nodes,
    bodies included. Taken before the model is written: writing it rebinds its tensors to the
    file, rounded."""
    found: dict[str, Any] = {}
    graphs = [model.graph]
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        for attr in node.attributes.values():
            if attr.type == ir.AttributeType.GRAPH:
                graphs.append(attr.as_graph())
            elif attr.type == ir.AttributeType.GRAPHS:
                graphs.extend(attr.as_graphs())
        if node.op_type == "Constant" and node.outputs[0].name:
            attr = node.attributes.get("value")
            tensor = attr.as_tensor() if attr is not None and attr.type == ir.AttributeType.TENSOR else None
            if hasattr(tensor, "exact_float64"):
                found[node.outputs[0].name] = tensor
    for graph in graphs:
        for name, value in graph.initializers.items():
            if hasattr(value.const_value, "exact_float64"):
                found[name] = value.const_value
    return found



_FLOAT_DTYPES = frozenset({ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16, ir.DataType.DOUBLE})
# A Constant node holding more than this is served like an initializer (read when its node runs)
# rather than written into the structure the evaluator loads.
_INLINE_CONSTANT_BYTES = 1 << 16
# The float64 evaluation may hold this share of the memory available when it starts.
MEMORY_SHARE = 0.5


def available_memory() -> int | None:
    """Bytes the system can give without swapping (Linux's MemAvailable), None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _substitute(graph: onnx.GraphProto, values: dict[str, np.ndarray], done: set[str]) -> None:
    for i, tensor in enumerate(graph.initializer):
        if tensor.name in values:
            graph.initializer[i].CopyFrom(onnx.numpy_helper.from_array(values[tensor.name], tensor.name))
            done.add(tensor.name)
    for node in graph.node:
        if node.op_type == "Constant" and node.output and node.output[0] in values:
            for attr in node.attribute:
                if attr.name == "value" and attr.type == onnx.AttributeProto.TENSOR:
                    attr.t.CopyFrom(onnx.numpy_helper.from_array(values[node.output[0]], attr.t.name))
                    done.add(node.output[0])
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                _substitute(attr.g, values, done)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    _substitute(g, values, done)


def _ops(proto: onnx.ModelProto) -> set[tuple[str, str]]:
    found: set[tuple[str, str]] = set()

    def walk(nodes) -> None:
        for node in nodes:
            found.add((node.domain, node.op_type))
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    walk(attr.g.node)
                elif attr.type == onnx.AttributeProto.GRAPHS:
                    for g in attr.graphs:
                        walk(g.node)

    walk(proto.graph.node)
    for function in proto.functions:
        walk(function.node)
    return found


def _widened(array: np.ndarray) -> np.ndarray:
    kind = array.dtype.kind
    return array.astype(np.float64) if kind == "f" or array.dtype.name == "bfloat16" else array


def _body_reads(node: onnx.NodeProto) -> set[str]:
    """The outer-scope names a node's subgraphs read (at any depth)."""
    reads: set[str] = set()
    for attr in node.attribute:
        graphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
        for g in graphs:
            defined = {i.name for i in g.input} | {t.name for t in g.initializer}
            for inner in g.node:
                reads.update(n for n in inner.input if n and n not in defined)
                reads.update(n for n in _body_reads(inner) if n not in defined)
                defined.update(inner.output)
    return reads


def _topological(nodes: list[onnx.NodeProto], known: set[str]) -> list[onnx.NodeProto]:
    """The nodes in an order that runs (ONNX Runtime sorts them; converters that append nodes, as
    the fp16 converter's input Casts, rely on that)."""
    known = set(known) | {""}
    ordered, waiting = [], list(nodes)
    while waiting:
        ready = [n for n in waiting if all(i in known for i in n.input) and _body_reads(n) <= known]
        if not ready:  # a cycle, or a name nothing defines: let the evaluator say which
            return ordered + waiting
        ids = {id(n) for n in ready}
        waiting = [n for n in waiting if id(n) not in ids]
        for n in ready:
            ordered.append(n)
            known.update(n.output)
    return ordered


class Float64Model:
    """A model's float64 twin, evaluated node by node in `onnx.reference`: every float tensor,
    type, Cast target and dtype attribute widened to double (`verify.shadow`), the weights read
    from the model as their node runs and dropped after it (a memory-mapped external tensor is
    not copied until then), each intermediate dropped after its last reader. Its memory is the
    live activations plus one node's weights in float64, not the model in float64, so a twin of
    a 10 GB model runs in a few GB; `memory_budget` bounds it (default: a share of the memory
    available), and a run that would exceed it raises `Float64Unavailable`.

    `exact` replaces constants by name with tensors that give their float64 values
    (`exact_float64()`: the fold's unrounded centered weights, `exact_tensors`). Raises
    `Float64Unavailable` when the evaluator cannot take the model (an op it does not know, named)."""

    def __init__(
        self,
        model: ir.Model | onnx.ModelProto | bytes | str | Path,
        exact: dict[str, Any] | None = None,
        memory_budget: int | None = None,
    ):
        if not isinstance(model, ir.Model):
            model = ir.from_proto(model) if isinstance(model, onnx.ModelProto) else _load_ir(model)
        self._exact = dict(exact or {})
        self._weights: dict[str, Any] = {}  # name -> tensor, read when its node runs
        proto = self._structure(model)
        widen_to_float64(proto)
        ops = _ops(proto)
        imported = {o.domain for o in proto.opset_import}
        if any(domain == MS_DOMAIN for domain, _ in ops) and MS_DOMAIN not in imported:
            proto.opset_import.append(onnx.helper.make_opsetid(MS_DOMAIN, 1))  # ONNX Runtime does not insist
        ours = {(cls.op_domain, cls.__name__) for cls in FLOAT64_OPS}
        functions = {(f.domain, f.name) for f in proto.functions}
        unknown = sorted(
            f"{domain}::{op}" for domain, op in ops if (domain, op) not in ours | functions and domain not in _KNOWN_DOMAINS
        )
        if unknown:
            raise Float64Unavailable(f"onnx.reference cannot evaluate {', '.join(unknown)}")
        try:
            self._evaluator = _Evaluator(proto)
        except NotImplementedError as e:  # a standard op the reference lacks
            found = re.search(r"Node type '([^']+)' from domain '([^']*)'", str(e))
            what = f"{found[2] + '::' if found and found[2] else ''}{found[1]}" if found else str(e).splitlines()[0]
            raise Float64Unavailable(f"onnx.reference cannot evaluate {what}") from None
        self.output_names = [o.name for o in proto.graph.output]
        self._reads = [list(node.input) + sorted(_body_reads(node)) for node in self._evaluator.nodes_]
        last: dict[str, int] = {}
        for index, names in enumerate(self._reads):
            for name in names:
                last[name] = index
        self._last_use = last
        available = available_memory()
        self.memory_budget = memory_budget if memory_budget is not None else (
            int(MEMORY_SHARE * available) if available is not None else None
        )
        self.peak_bytes = 0  # the most the last run held, activations and weights together
        self.label = "the model"  # what progress calls it

    def _structure(self, model: ir.Model) -> onnx.ModelProto:
        """The model without its weights: main-graph initializers and large Constant nodes become
        graph inputs served by `_weight`; everything else (bodies included) as serialized."""
        graph = model.graph
        inputs = [ir.serde.serialize_value(v) for v in graph.inputs]
        given = {v.name for v in graph.inputs}
        for name, value in graph.initializers.items():
            self._weights[name] = value.const_value
            if name not in given:
                inputs.append(ir.serde.serialize_value(value))
        nodes = []
        for node in graph:
            tensor = _large_constant(node)
            if tensor is not None:
                out = node.outputs[0]
                self._weights[out.name] = tensor
                inputs.append(onnx.helper.make_tensor_value_info(out.name, int(tensor.dtype), list(tensor.shape)))
                continue
            nodes.append(ir.serde.serialize_node(node))
        body_exact = {k: v for k, v in self._exact.items() if k not in self._weights}
        if body_exact:
            holder = onnx.helper.make_graph(nodes, "holder", [], [])
            _substitute(holder, {k: t.exact_float64() for k, t in body_exact.items()}, set())
            nodes = list(holder.node)
        known = {i.name for i in inputs}
        outputs = [ir.serde.serialize_value(v) for v in graph.outputs]
        g = onnx.helper.make_graph(_topological(nodes, known), graph.name or "graph", inputs, outputs)
        opsets = [onnx.helper.make_opsetid(domain, version) for domain, version in model.opset_imports.items()]
        proto = onnx.helper.make_model(g, opset_imports=opsets, ir_version=model.ir_version)
        proto.functions.extend(ir.serde.serialize_function(f) for f in model.functions.values())
        return proto

    def _weight(self, name: str) -> np.ndarray:
        exact = self._exact.get(name)
        if exact is not None:
            return exact.exact_float64()
        tensor = self._weights[name]
        if tensor.dtype not in _FLOAT_DTYPES or not tuple(tensor.shape):
            return _widened(np.asarray(tensor.numpy()))
        # Read by blocks of rows from the file, not mapped: a mapping's pages would stay in this
        # process's memory until the tensor is released, every weight of the model by the end.
        out = np.empty(tuple(tensor.shape), dtype=np.float64)
        for rows, block in row_blocks(tensor):
            out[rows] = block
        return out

    def _streamable(self, node: onnx.NodeProto, names: list[str]) -> str | None:
        """The weight of a MatMul by a 2-D float weight read once (and not an exact value): it can be
        streamed through the product by blocks of rows, never held whole in float64."""
        if node.op_type != "MatMul" or node.domain not in ("", "ai.onnx") or len(node.input) != 2:
            return None
        name = node.input[1]
        tensor = self._weights.get(name)
        if tensor is None or name in self._exact or names.count(name) != 1 or node.input[0] == name:
            return None
        if tensor.dtype not in _FLOAT_DTYPES or len(tuple(tensor.shape)) != 2:
            return None
        return name

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.run_many([feeds])[0]

    def run_many(
        self, feeds_list: list[dict[str, np.ndarray]], deadline: Deadline | None = None
    ) -> list[dict[str, np.ndarray]]:
        """The outputs on each input set, the sets evaluated together node by node: each weight is
        read once for all of them. `deadline`: its pace is checked as the nodes run; where all the
        sets would not fit, the first goes on alone (fewer outputs are returned), and where it would
        not either, `Float64Unavailable` is raised."""
        sets: list[dict[str, Any]] = [{"": None, **float64_feeds(feeds)} for feeds in feeds_list]
        weight_total = sum(getattr(t, "nbytes", 0) or 0 for t in self._weights.values())
        weight_done, told = 0, 0
        keep = set(self.output_names)
        self.peak_bytes = sum(map(_bytes, sets))
        for index, (node, names) in enumerate(zip(self._evaluator.rt_nodes_, self._reads)):
            streamed = self._streamable(node.onnx_node, names)
            weights = {n: self._weight(n) for n in names if n in self._weights and n not in sets[0] and n != streamed}
            stacked = _streamed_matmul(node.onnx_node, self._weights[streamed], sets) if streamed else None
            if streamed and stacked is None:  # activations it does not take: the weight is read whole
                weights[streamed] = self._weight(streamed)
            if stacked is None:
                stacked = _stacked_matmul(node.onnx_node, weights, sets)
            current = sum(a.nbytes for a in weights.values())
            weight_done += sum(getattr(self._weights[n], "nbytes", 0) or 0 for n in {*weights, *([streamed] if streamed else [])})
            for number, results in enumerate(sets):
                results.update(weights)
                if stacked is not None:
                    outputs = [stacked[number]]
                else:
                    inputs = [results[n] for n in node.input]
                    outputs = node.run(*inputs, context=results) if node.need_context() else node.run(*inputs)
                results.update((name, value) for name, value in zip(node.output, outputs) if name)
                current += _bytes(results) - sum(a.nbytes for a in weights.values())
            del stacked
            self.peak_bytes = max(self.peak_bytes, current)
            done = weight_done / weight_total if weight_total else (index + 1) / len(self._reads)
            if done * 10 >= told + 1:
                told = int(done * 10)
                say(f"Verifying in float64: {self.label}, {done:.0%} of the weights")
            if deadline is not None:
                if deadline.keeps(done, len(sets)) < len(sets):
                    del sets[1:]
            if self.memory_budget is not None and current > self.memory_budget:
                label = node.onnx_node.name or node.op_type
                raise Float64Unavailable(
                    f"the float64 evaluation would hold {current / 2**30:.1f} GiB at node '{label}', over its "
                    f"memory budget of {self.memory_budget / 2**30:.1f} GiB"
                )
            for name in names:
                if self._last_use.get(name) == index and name not in keep:
                    for results in sets:
                        results.pop(name, None)
            del weights
        outputs = []
        for results in sets:
            for name in self.output_names:  # an output that is a weight no node reads
                if name not in results:
                    results[name] = self._weight(name)
            outputs.append({name: np.asarray(results[name]) for name in self.output_names})
        return outputs


_STREAM_BYTES = 16 << 20


def _streamed_matmul(node: onnx.NodeProto, tensor, sets: list[dict[str, Any]]) -> list | None:
    """`_stacked_matmul` with the weight read from its file by blocks of rows, each widened to
    float64 and multiplied in as it comes (the product summed over the blocks): the weight is never
    held whole, in its type or in float64. None where the activations are not float64 rows of it."""
    depth, width = (int(d) for d in tensor.shape)
    lefts = [results.get(node.input[0]) for results in sets]
    if any(
        not isinstance(a, np.ndarray) or a.ndim < 2 or a.shape[-1] != depth or a.dtype != np.float64 for a in lefts
    ):
        return None
    rows = np.concatenate([a.reshape(-1, depth) for a in lefts]) if len(lefts) > 1 else lefts[0].reshape(-1, depth)
    # As (W^T X^T)^T: OpenBLAS streams a wide weight by few rows 2-3x faster that way round.
    total = np.zeros((width, rows.shape[0]))
    for part, block in row_blocks(tensor, _STREAM_BYTES):
        total += block.astype(np.float64).T @ rows[:, part].T
    product = np.ascontiguousarray(total.T)
    out, start = [], 0
    for a in lefts:
        count = math.prod(a.shape[:-1])
        out.append(product[start : start + count].reshape(*a.shape[:-1], width))
        start += count
    return out


def _stacked_matmul(node: onnx.NodeProto, weights: dict[str, np.ndarray], sets: list[dict[str, Any]]) -> list | None:
    """A MatMul of activations by a 2-D weight, on every input set as one product of the rows of
    all (the weight streamed through memory once, not once a set, and one 2-D product instead of a
    batch of them); None where the node is not that."""
    if node.op_type != "MatMul" or node.domain not in ("", "ai.onnx") or node.input[1] not in weights:
        return None
    weight = weights[node.input[1]]
    lefts = [results.get(node.input[0]) for results in sets]
    if weight.ndim != 2 or any(
        not isinstance(a, np.ndarray) or a.ndim < 2 or a.shape[-1] != weight.shape[0] or a.dtype != weight.dtype
        for a in lefts
    ):
        return None
    rows = np.concatenate([a.reshape(-1, weight.shape[0]) for a in lefts]) if len(lefts) > 1 else lefts[0].reshape(-1, weight.shape[0])
    # As (weight^T rows^T)^T: OpenBLAS streams a wide weight by few rows 2-3x faster that way round.
    product = np.ascontiguousarray((weight.T @ rows.T).T)
    out, start = [], 0
    for a in lefts:
        count = math.prod(a.shape[:-1])
        out.append(product[start : start + count].reshape(*a.shape[:-1], weight.shape[1]))
        start += count
    return out


class Deadline:
    """The pace of a float64 evaluation against its allowance: `twins` models to run on the same
    sets, this one first, within `allowance` seconds from `started`. The work done is measured in
    the share of the weights read (what the time follows in a large model)."""

    def __init__(self, started: float, allowance: float, twins: int):
        self.started, self.allowance, self.twins = started, allowance, twins
        self._dropped: tuple[float, float] | None = None  # (elapsed, done) when the sets were cut to one

    def projected(self, done: float) -> float:
        elapsed = time.perf_counter() - self.started
        if self._dropped is None:
            return self.twins * elapsed / max(done, 1e-9)
        at, was = self._dropped
        rate = (elapsed - at) / max(done - was, 1e-9)  # seconds for the whole model, one set
        return elapsed + rate * (1.0 - done) + (self.twins - 1) * rate

    def keeps(self, done: float, sets: int) -> int:
        """How many input sets go on, after `done` of the work on `sets`; raises where none fits."""
        if done < 0.05 and time.perf_counter() - self.started < 0.1 * self.allowance:
            return sets  # too early to tell
        projected = self.projected(done)
        if projected <= self.allowance:
            return sets
        if sets > 1:
            self._dropped = (time.perf_counter() - self.started, done)
            return 1
        if self._dropped is not None and done - self._dropped[1] < 0.05:
            return sets  # the pace of one set is not known yet
        raise Float64Unavailable(
            f"a float64 evaluation would take about {projected:.0f} s, over its allowance of {self.allowance:.0f} s "
            f"(stopped at {done:.0%} of the weights)"
        )


def _bytes(values: dict[str, Any]) -> int:
    return sum(getattr(v, "nbytes", 0) for v in values.values())


def _large_constant(node: ir.Node) -> ir.TensorProtocol | None:
    if node.op_type != "Constant" or node.domain not in ("", "ai.onnx") or len(node.outputs) != 1:
        return None
    attr = node.attributes.get("value")
    tensor = attr.as_tensor() if attr is not None and attr.type == ir.AttributeType.TENSOR else None
    if tensor is None or tensor.nbytes <= _INLINE_CONSTANT_BYTES or not node.outputs[0].name:
        return None
    return tensor


def _load_ir(model: bytes | str | Path) -> ir.Model:
    if isinstance(model, bytes):
        return ir.from_proto(onnx.load_from_string(model))
    return load_path(model)
