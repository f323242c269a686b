"""GPT-2-style pre-LN decoders built directly with onnx-ir: no torch, any size, fp32 or fp16.

    path = build_gpt2(Gpt2Shape(hidden=768, layers=12), "float16", "/tmp/gpt2.onnx")

The graph is what the dynamo exporter writes for GPT2LMHeadModel, in standard ops at opset 18:
token + position `Gather`s, per block `LayerNormalization -> MatMul+Add (qkv) -> Split -> heads ->
MatMul -> scale -> causal mask (Where on a sliced constant) -> Softmax -> MatMul -> MatMul+Add
(proj) -> residual Add -> LayerNormalization -> MatMul+Add -> Gelu (Erf form) -> MatMul+Add ->
residual Add`, a final LayerNormalization and an LM head tied to the token embedding
(`Transpose(wte) -> MatMul`). Batch and sequence are dynamic. Weights are random, every one
perturbed off its init (no gamma == 1, no zero bias), so the fold does real centering work.

`style="torchscript"` writes the same model as the TorchScript exporter wrote GPT2LMHeadModel (no
past), the graph ONNX Runtime's transformers optimizer was written for: each Conv1D as
`Reshape -> Gemm -> Reshape`, the scores divided by sqrt(head size), the causal mask sliced from a
bool buffer by the scores' own shape (`bias[:, :, ns-nd:ns, :ns]`), GELU in its tanh form (gelu_new).
`optimize_model(model_type="gpt2", opt_level=0)` fuses it into one com.microsoft `Attention` per block
(FusionGptAttentionNoPast), `FastGelu`, and `SkipLayerNormalization`; on the dynamo-style graph it
fuses no attention at all, so only this style describes a GPT-2 as users deploy it on CUDA.

Weights larger than 1 KiB go to one external data file beside the model, so a d=2048 model is
written without a > 2 GB protobuf.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np
import onnx_ir as ir
from onnx_ir import tape as ir_tape

OPSET = 18


@dataclasses.dataclass(frozen=True)
class Gpt2Shape:
    hidden: int = 768
    layers: int = 12
    heads: int | None = None  # default: hidden // 64
    vocab: int = 50257
    positions: int = 2048
    ffn: int | None = None  # default: 4 * hidden

    @property
    def n_heads(self) -> int:
        return self.heads or max(1, self.hidden // 64)

    @property
    def n_ffn(self) -> int:
        return self.ffn or 4 * self.hidden

    @property
    def head_size(self) -> int:
        return self.hidden // self.n_heads

    @property
    def label(self) -> str:
        return f"gpt2_d{self.hidden}_L{self.layers}"

    def parameters(self) -> int:
        d, f = self.hidden, self.n_ffn
        per_block = 4 * d + (d * 3 * d + 3 * d) + (d * d + d) + (d * f + f) + (f * d + d)
        return self.vocab * d + self.positions * d + self.layers * per_block + 2 * d


class _Parts(NamedTuple):
    """What the two styles write differently inside a block (`_blocks` writes the rest)."""

    linear: Callable[[ir.Value, str, int, int], ir.Value]  # (input, name, n_in, n_out) -> output
    probs: Callable[[ir.Value, ir.Value], ir.Value]  # (q, k^T) -> attention probabilities
    gelu: Callable[[ir.Value], ir.Value]
    split_axis: int  # of the q/k/v Split
    heads_shape: ir.Value  # Reshape target [0, 0, heads, head size]
    merge_shape: ir.Value  # Reshape target [0, 0, hidden]


class _Weights:
    """Random weights, perturbed off their init: N(0, 0.02) matrices, gamma = 1 + N(0, 0.1),
    beta and biases N(0, 0.02) (an exporter merges identical initializers and drops zero biases,
    and a real checkpoint never looks like its init)."""

    def __init__(self, tape: ir_tape.Tape, dtype: np.dtype, seed: int):
        self.tape, self.dtype = tape, dtype
        self.rng = np.random.default_rng(seed)

    def _value(self, name: str, array: np.ndarray) -> ir.Value:
        return self.tape.initializer(ir.tensor(np.ascontiguousarray(array.astype(self.dtype)), name=name), name=name)

    def matrix(self, name: str, shape: tuple[int, ...], std: float = 0.02) -> ir.Value:
        # float32 draws: float64 normals would double the peak memory of a d=2048 build
        return self._value(name, self.rng.standard_normal(shape, dtype=np.float32) * np.float32(std))

    def gamma(self, name: str, d: int) -> ir.Value:
        return self._value(name, 1.0 + 0.1 * self.rng.standard_normal(d, dtype=np.float32))

    def scalar(self, name: str, value: float, dtype=None) -> ir.Value:
        arr = np.array(value, dtype=dtype or self.dtype)
        return self.tape.initializer(ir.tensor(arr, name=name), name=name)

    def ints(self, name: str, values: list[int]) -> ir.Value:
        return self.tape.initializer(ir.tensor(np.array(values, dtype=np.int64), name=name), name=name)


def build_gpt2(shape: Gpt2Shape, dtype: str, path: str | Path, seed: int = 0, eps: float = 1e-5,
               style: str = "dynamo") -> Path:
    """Write the model to `path` (+ `path.data`); returns the path. `style`: "dynamo" or "torchscript"."""
    if style not in ("dynamo", "torchscript"):
        raise ValueError(f"style {style!r}: dynamo or torchscript")
    np_dtype = np.dtype(dtype)
    ir_dtype = ir.DataType.FLOAT16 if np_dtype == np.float16 else ir.DataType.FLOAT
    d, h = shape.hidden, shape.n_heads
    dh = d // h
    if dh * h != d:
        raise ValueError(f"hidden {d} is not a multiple of {h} heads")
    tape = ir_tape.Tape()
    w = _Weights(tape, np_dtype, seed)
    op = tape.op

    ids = ir.Value(name="input_ids", type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape(["batch", "seq"]))
    wte = w.matrix("wte", (shape.vocab, d))
    wpe = w.matrix("wpe", (shape.positions, d), std=0.01)
    one = w.ints("c_one", [1])
    seq = op("Gather", [op("Shape", [ids]), one], {"axis": 0})  # [1]
    positions = op("Range", [w.scalar("c_pos0", 0, np.int64), op("Squeeze", [seq]), w.scalar("c_pos1", 1, np.int64)])
    x = op("Add", [op("Gather", [wte, ids], {"axis": 0}), op("Gather", [wpe, positions], {"axis": 0})])

    def layer_norm(inp: ir.Value, name: str) -> ir.Value:
        return op("LayerNormalization", [inp, w.gamma(f"{name}.weight", d), w.matrix(f"{name}.bias", (d,))],
                  {"axis": -1, "epsilon": eps})

    parts = _torchscript_parts if style == "torchscript" else _dynamo_parts
    x = _blocks(tape, w, shape, x, layer_norm, parts(tape, w, shape, seq))
    logits = op("MatMul", [layer_norm(x, "ln_f"), op("Transpose", [wte], {"perm": [1, 0]})])
    logits.name = "logits"
    logits.type = ir.TensorType(ir_dtype)
    logits.shape = ir.Shape(["batch", "seq", shape.vocab])

    graph = ir.Graph([ids], [logits], nodes=tape.nodes, initializers=tape.initializers,
                     opset_imports={"": OPSET}, name=shape.label)
    # the transformers optimizer warns unless the producer is the one its fusions expect
    model = ir.Model(graph, ir_version=9, producer_name="pytorch" if style == "torchscript" else "benchmarks.gpt2_onnx")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    ir.save(model, path, external_data=path.name + ".data", size_threshold_bytes=1024)
    return path


def _blocks(tape: ir_tape.Tape, w: _Weights, shape: Gpt2Shape, x: ir.Value, layer_norm, parts: _Parts) -> ir.Value:
    """The transformer blocks (pre-LN attention and MLP, each added to the stream), the same in both
    styles but for `parts`; returns the stream."""
    op = tape.op
    d = shape.hidden
    for i in range(shape.layers):
        p = f"h.{i}"
        qkv = parts.linear(layer_norm(x, f"{p}.ln_1"), f"{p}.attn.c_attn", d, 3 * d)
        q, k, v = tape.op_multi_out("Split", [qkv, w.ints(f"{p}.split", [d, d, d])], {"axis": parts.split_axis},
                                    num_outputs=3)
        q = op("Transpose", [op("Reshape", [q, parts.heads_shape])], {"perm": [0, 2, 1, 3]})
        k = op("Transpose", [op("Reshape", [k, parts.heads_shape])], {"perm": [0, 2, 3, 1]})
        v = op("Transpose", [op("Reshape", [v, parts.heads_shape])], {"perm": [0, 2, 1, 3]})
        ctx = op("Transpose", [op("MatMul", [parts.probs(q, k), v])], {"perm": [0, 2, 1, 3]})
        x = op("Add", [x, parts.linear(op("Reshape", [ctx, parts.merge_shape]), f"{p}.attn.c_proj", d, d)])
        up = parts.linear(layer_norm(x, f"{p}.ln_2"), f"{p}.mlp.c_fc", d, shape.n_ffn)
        x = op("Add", [x, parts.linear(parts.gelu(up), f"{p}.mlp.c_proj", shape.n_ffn, d)])
    return x


def _dynamo_parts(tape: ir_tape.Tape, w: _Weights, shape: Gpt2Shape, seq: ir.Value) -> _Parts:
    """The blocks' parts as the dynamo exporter writes GPT-2 (sdpa); makes their constants."""
    op, d, h, dh = tape.op, shape.hidden, shape.n_heads, shape.head_size
    causal = tape.initializer(ir.tensor(np.tril(np.ones((shape.positions, shape.positions), dtype=bool)),
                                        name="causal_mask"), name="causal_mask")
    zero = w.ints("c_zero", [0])
    neg_inf = w.scalar("c_neg_big", -1e4 if w.dtype == np.float16 else -1e9)
    scale = w.scalar("c_attn_scale", 1.0 / math.sqrt(dh))
    half, one_f = w.scalar("c_half", 0.5), w.scalar("c_one_f", 1.0)
    inv_sqrt2 = w.scalar("c_inv_sqrt2", 1.0 / math.sqrt(2.0))
    heads_shape = w.ints("c_heads_shape", [0, 0, h, dh])
    merge_shape = w.ints("c_merge_shape", [0, 0, d])
    # causal[:seq, :seq] as [1, 1, seq, seq]
    mask = op("Slice", [causal, op("Concat", [zero, zero], {"axis": 0}), op("Concat", [seq, seq], {"axis": 0}),
                        w.ints("c_axes01", [0, 1])])
    mask = op("Unsqueeze", [mask, w.ints("c_axes_mask", [0, 1])])

    def linear(inp: ir.Value, name: str, n_in: int, n_out: int) -> ir.Value:
        return op("Add", [op("MatMul", [inp, w.matrix(f"{name}.weight", (n_in, n_out))]),
                          w.matrix(f"{name}.bias", (n_out,))])

    def probs(q: ir.Value, k: ir.Value) -> ir.Value:
        scores = op("Mul", [op("MatMul", [q, k]), scale])
        return op("Softmax", [op("Where", [mask, scores, neg_inf])], {"axis": -1})

    def gelu(up: ir.Value) -> ir.Value:
        return op("Mul", [op("Mul", [up, half]), op("Add", [op("Erf", [op("Mul", [up, inv_sqrt2])]), one_f])])

    return _Parts(linear, probs, gelu, -1, heads_shape, merge_shape)


def _torchscript_parts(tape: ir_tape.Tape, w: _Weights, shape: Gpt2Shape, seq: ir.Value) -> _Parts:
    """The blocks' parts as the TorchScript exporter wrote GPT-2 (no past); makes their constants."""
    op, d, h, dh = tape.op, shape.hidden, shape.n_heads, shape.head_size
    # GPT-2's `bias` buffer (bool, [1, 1, positions, positions]) and `masked_bias`
    bias = tape.initializer(ir.tensor(np.tril(np.ones((shape.positions, shape.positions), dtype=bool))[None, None],
                                      name="attn_bias"), name="attn_bias")
    masked_bias = w.scalar("c_masked_bias", -1e4)
    sqrt_dh = w.scalar("c_sqrt_head", math.sqrt(dh))
    half, one_f = w.scalar("c_gelu_half", 0.5), w.scalar("c_gelu_one", 1.0)
    three, k0447, k7978 = (w.scalar("c_gelu_three", 3.0), w.scalar("c_gelu_0044715", 0.044715),
                           w.scalar("c_gelu_sqrt_2_pi", math.sqrt(2.0 / math.pi)))
    axis0, last2, last1, first2 = (w.ints("c_axis0", [0]), w.ints("c_m2", [-2]), w.ints("c_m1", [-1]),
                                   w.ints("c_first2", [2]))
    big, axis2, axis3 = w.ints("c_big", [2**62]), w.ints("c_axis2", [2]), w.ints("c_axis3", [3])
    heads_shape = w.ints("c_ts_heads_shape", [0, 0, h, dh])
    merge_shape = w.ints("c_ts_merge_shape", [0, 0, d])
    zero1 = w.ints("c_zero1", [0])

    def conv1d(inp: ir.Value, name: str, n_in: int, n_out: int) -> ir.Value:
        # Conv1D = addmm over the rows flattened, reshaped back to [batch, seq, n_out]
        flat = op("Reshape", [inp, w.ints(f"{name}.flat", [-1, n_in])])
        y = op("Gemm", [flat, w.matrix(f"{name}.weight", (n_in, n_out)), w.matrix(f"{name}.bias", (n_out,))])
        lead = op("Slice", [op("Shape", [inp]), zero1, first2, axis0])
        return op("Reshape", [y, op("Concat", [lead, w.ints(f"{name}.n_out", [n_out])], {"axis": 0})])

    def probs(q: ir.Value, k: ir.Value) -> ir.Value:
        scores = op("Div", [op("MatMul", [q, k]), sqrt_dh])
        dims = op("Shape", [scores])
        nd = op("Squeeze", [op("Slice", [dims, last2, last1, axis0]), axis0])
        ns = op("Squeeze", [op("Slice", [dims, last1, big, axis0]), axis0])
        rows = op("Slice", [bias, op("Unsqueeze", [op("Sub", [ns, nd]), axis0]), op("Unsqueeze", [ns, axis0]), axis2])
        mask = op("Slice", [rows, zero1, op("Unsqueeze", [ns, axis0]), axis3])
        return op("Softmax", [op("Where", [mask, scores, masked_bias])], {"axis": -1})

    def gelu(up: ir.Value) -> ir.Value:
        inner = op("Mul", [op("Add", [up, op("Mul", [op("Pow", [up, three]), k0447])]), k7978])
        return op("Mul", [op("Mul", [up, half]), op("Add", [op("Tanh", [inner]), one_f])])

    return _Parts(conv1d, probs, gelu, 2, heads_shape, merge_shape)


def make_inputs(shape: Gpt2Shape, batch: int, seq: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"input_ids": rng.integers(0, shape.vocab, size=(batch, seq), dtype=np.int64)}
