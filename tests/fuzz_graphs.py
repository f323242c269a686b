"""Random models over the whole vocabulary of docs/DESIGN.md, for the property test in test_fuzz.py.

Every structural choice is a hypothesis draw (failures shrink toward smaller graphs: the first
option of every `pick` and the "off" side of every `chance` is the simple one); constant values
come from one numpy generator seeded by a drawn integer.

The stream is kept in a canonical layout `[B, S, w]` (normalized axis last) between ops; layout
changes (Transpose, Reshape, Flatten, Unsqueeze, Split, Concat, Slice, Gather, ReduceMean) are
drawn as excursions that come back to it, so any op can follow any other. Views that change the
shape for good (pooling, slicing the axis, splitting it) are only used in front of a terminal LN.
B is 2 (static) or the symbol 'b'; S is the symbol 's', or 's'+1 after a class token.

Vocabulary (docs/DESIGN.md sections 2, 3 and 5):
- producers: MatMul with a constant weight (2-D, batched 3-D, tied, behind Identity/Cast/Unsqueeze/
  Expand, or a Transpose of another weight) + optional bias Add; Reshape -> Gemm (transB 0/1,
  bias [w], [1, w], scalar, none; alpha/beta) -> Reshape back; Conv 1-D and 2-D (group 1, 2 and
  depthwise) -> Transpose to channels-last; embedding Gather from int64 ids; position tables
  (Gather, or Slice to the dynamic length); constants added in (full, size-1 broadcast, scalar, as
  Constant nodes, behind Identity/Neg/Cast/Reshape/Unsqueeze/Expand); class token Concat.
- carry ops: Add/Sub/Sum of streams, Neg, Identity, Dropout, Cast float->float (also through
  double/fp16/bf16), Mul/Div by scalars, by constants varying along other axes and by
  data-dependent factors; Reshape/Flatten/Unsqueeze/Squeeze/Transpose excursions, Split/Concat along
  other axes, Slice of the batch and of the whole axis (also reversed), ReduceMean/ReduceSum and
  Gather over other axes, Expand.
- blockers: Relu/Tanh/Sigmoid/Softmax/com.microsoft Gelu, LN outputs on the stream (post-LN),
  graph inputs added in, Mul by a vector along the axis (also with a zero entry), Mul of two
  streams, a per-row mean added back, casts through int, Reshape splitting the axis, Concat along
  it, Shape of the stream, the stream feeding a MatMul/Relu/SimplifiedLayerNormalization, stream
  tensors as graph outputs, weights listed as graph inputs.
- LNs: pre-LN (also fused as com.microsoft::SkipLayerNormalization), post-LN, parallel and 2-D
  (consumed by Gemm/MatMul: beta into their biases) residual blocks, 0-3 of them; decomposed LNs;
  LNs over several axes, with Mean/InvStdDev outputs present or used, in transposed/flattened/pooled
  views, with or without beta; tied gammas/betas/heads (an LM head on the embedding table).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import onnx
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from graphs import Graph

F, I64 = TensorProto.FLOAT, TensorProto.INT64
BIG = 2**62


@dataclass
class Built:
    model: onnx.ModelProto
    index_bounds: dict[str, int]  # int64 input -> exclusive upper bound of its values
    n_ln: int
    forms: Counter = field(default_factory=Counter)  # LN forms, keyed like LnDecision.op_type
    ln_inputs: list[str] = field(default_factory=list)  # what each LN normalizes


class _Gen:
    def __init__(self, draw):
        self.draw = draw
        self.g = Graph(seed=draw(st.integers(0, 2**16)))
        self.rng = self.g.rng
        self.n = 0
        self.B = draw(st.sampled_from([2, "b"]))
        self.d = draw(st.sampled_from([4, 8, 12]))
        self.k = draw(st.sampled_from([4, 3, 6]))
        self.opset = draw(st.sampled_from([18, 17]))  # 17: ReduceMean axes attribute, no Split num_outputs
        self.blockers = draw(st.sampled_from([0, 12, 25]))  # % of terms, carry ops and blocks that block
        self.seq = "s"  # "s+1" after a class token: inputs with an 's' dim no longer fit
        self.src_cls: str | None = None  # a non-stream [B, s+1, k] tensor, once there is a class token
        self.inputs: set[str] = set()
        self.bounds: dict[str, int] = {}
        self.pool: dict[tuple, list[str]] = {}  # shape -> float constants, for tying
        self.tables: list[tuple[str, int, int]] = []  # (name, V, w) embedding tables
        self.stream: list[str] = []  # canonical stream tensors
        self.outputs: list[str] = []
        self.ms = False
        self.n_ln = 0
        self.forms: Counter = Counter()
        self.ln_inputs: list[str] = []
        self.residual: tuple[str, str, str] | None = None  # (sum, a, b) of the last residual Add
        self.in_body = False  # building an If/Loop body: its constants are not the main graph's
        self.decoys: set[str] = set()  # body names chosen to collide with what the fold may add

    # ---- draws -------------------------------------------------------------------------------
    def chance(self, pct: int) -> bool:
        return self.draw(st.integers(0, 99)) >= 100 - pct

    def pick(self, options):
        return self.draw(st.sampled_from(options))

    def fresh(self, stem: str) -> str:
        self.n += 1
        return f"{stem}_{self.n}"

    # ---- graph pieces --------------------------------------------------------------------------
    def node(self, op: str, ins, n_out: int = 1, domain: str = "", **attrs):
        return self.g.node(op, list(ins), n_out=n_out, name=self.fresh(op.lower() + "_"), domain=domain, **attrs)

    def const(self, shape, stem: str = "c", *, nonzero: bool = False, tie: bool = False) -> str:
        shape = tuple(shape)
        if tie and self.pool.get(shape) and self.chance(25):
            return self.pick(self.pool[shape])  # in a body too: a main-graph constant, read from the outer scope
        arr = self.rng.normal(0.3, 1.0, size=shape)
        if nonzero:
            arr = np.where(arr >= 0, 1.0, -1.0) * (0.5 + np.abs(arr))
        arr = np.asarray(arr, dtype=np.float32)
        name = self.fresh(stem)
        if self.chance(15):  # a Constant node instead of an initializer
            if arr.ndim == 0 and self.chance(50):
                attrs = {"value_float": float(arr)}
            elif arr.ndim == 1 and self.chance(50):
                attrs = {"value_floats": [float(v) for v in arr]}
            else:
                attrs = {"value": numpy_helper.from_array(arr, name)}
            self.g.nodes.append(helper.make_node("Constant", [], [name], name=self.fresh("const_"), **attrs))
        else:
            self.g.inits.append(numpy_helper.from_array(arr, name))
        if not self.in_body:  # a body's constants are not visible outside it
            self.pool.setdefault(shape, []).append(name)
        return name

    def double(self, shape, stem: str = "dc") -> str:
        """A float64 constant, cast to float32 where it is used."""
        name = self.fresh(stem)
        self.g.inits.append(numpy_helper.from_array(self.rng.normal(0.3, 1.0, size=shape).astype(np.float64), name))
        return self.node("Cast", [name], to=F)

    def half(self, shape, stem: str = "hc") -> str:
        """An fp16 constant, cast to float32 where it is used (weights stored in fp16, computed in fp32)."""
        name = self.fresh(stem)
        self.g.inits.append(numpy_helper.from_array(self.rng.normal(0.3, 1.0, size=shape).astype(np.float16), name))
        return self.node("Cast", [name], to=F)

    def addend(self, w: int, stem: str = "add") -> str:
        """A constant added into the stream, possibly behind carry ops (each one a different leaf)."""
        shape = self.broadcast_shape(w)
        wrap = self.pick(["identity", "neg", "cast", "reshape", "unsqueeze", "expand", "half"]) if self.chance(30) else None
        if wrap == "cast":
            return self.double(shape, stem)
        if wrap == "half":
            return self.half(shape, stem)
        c = self.const(shape, stem, tie=True)
        full = [1] * (3 - len(shape)) + list(shape)
        if wrap == "identity":
            return self.node("Identity", [c])
        if wrap == "neg":
            return self.node("Neg", [c])
        if wrap == "reshape":
            return self.node("Reshape", [c, self.ints(full)])
        if wrap == "unsqueeze" and len(shape) < 3:
            return self.node("Unsqueeze", [c, self.ints([0])])
        if wrap == "expand":
            return self.node("Expand", [c, self.ints([1] * len(full))])
        return c

    def reduce(self, op: str, x: str, axes, keepdims: int) -> str:
        if op == "ReduceMean" and self.opset < 18:
            return self.node(op, [x], axes=list(axes), keepdims=keepdims)
        return self.node(op, [x, self.ints(list(axes))], keepdims=keepdims)

    def split2(self, x: str, axis: int, sizes=None):
        """Two pieces along `axis`: `sizes`, or halves (num_outputs at opset 18, an even split at 17)."""
        if self.opset >= 18 and (sizes is None or self.chance(50)):
            return self.node("Split", [x], n_out=2, axis=axis, num_outputs=2)
        if sizes is None:
            return self.node("Split", [x], n_out=2, axis=axis)
        return self.node("Split", [x, self.ints(sizes)], n_out=2, axis=axis)

    def ints(self, values) -> str:
        name = self.fresh("i")
        self.g.inits.append(numpy_helper.from_array(np.asarray(values, dtype=np.int64), name))
        return name

    def inp(self, key: str, shape, elem_type: int = F) -> str:
        if key not in self.inputs:
            self.g.input(key, list(shape), elem_type=elem_type)
            self.inputs.add(key)
        return key

    def x(self) -> tuple[str, int]:
        """A [B, S, k] tensor that is not on the stream (it never changes)."""
        x = self.inp("x", [self.B, "s", self.k])
        if self.seq == "s":
            return x, self.k
        return self.src_cls, self.k  # type: ignore[return-value]

    def ids(self, rows: int, key: str = "ids", shape=None) -> str:
        name = self.inp(key, shape or [self.B, "s"], I64)
        self.bounds[name] = min(self.bounds.get(name, rows), rows)
        return name

    def out(self, name: str) -> None:
        if self.in_body:  # a body's outputs are fixed by its If/Loop: what it exposes is dropped
            return
        if name not in self.outputs and name not in self.inputs:
            self.outputs.append(name)

    def keep(self, h: str) -> str:
        self.stream.append(h)
        return h

    def broadcast_shape(self, w: int, rank: int = 3, along: int | None = None, batch_first: bool = True) -> tuple:
        """A constant shape that broadcasts onto [B, S, w] (or a rank-`rank` tensor with w at `along`)."""
        along = rank - 1 if along is None else along
        full = [1] * rank
        full[along] = w
        options = [tuple(full[-(rank - along) :]), tuple(full), (), (1,), tuple([1] * rank)]
        if rank == 3 and along == 2:
            options += [(1, w)]
            if self.B == 2 and batch_first:
                options += [(2, 1, w), (2, 1, 1)]
        return self.pick(options)

    def factor(self) -> str:
        """A data-dependent factor, constant along the normalized axis (never on the stream)."""
        kind = self.pick(["t1", "t", "reduce_x"] if self.seq == "s" else ["t1", "reduce_src", "t_derived"])
        if kind == "t1":
            return self.inp("t1", [self.B, 1, 1])
        if kind == "t_derived":  # an input whose length is written as an expression of another's
            return self.inp("t_cls", [self.B, "s + 1", 1])
        if kind == "t":
            return self.inp("t", [self.B, "s", 1])
        src, _ = self.x()
        return self.reduce("ReduceMean", src, [-1], 1)

    # ---- producers: [B, S, w], zero-mean once their constants are centered ---------------------
    def producer(self, w: int, src: tuple[str, int] | None = None) -> str:
        kinds = ["matmul", "gemm", "conv1d", "conv2d"]
        if src is None and self.seq == "s":
            kinds.insert(1, "gather")
        kind = self.pick(kinds)
        if kind == "gather":
            return self.gather(w)
        src = src or self.x()
        if self.stream and self.chance(self.blockers // 4):  # the stream feeds a producer: the side-effect rule must see it
            src = (self.stream[-1], self.d)
        return getattr(self, kind)(src, w)

    def weight(self, K: int, w: int) -> str:
        """A [K, w] MatMul weight: fresh, tied to an earlier one, or a Transpose of a [w, K] one."""
        if self.chance(10) and self.pool.get((w, K)):
            return self.node("Transpose", [self.pick(self.pool[(w, K)])], perm=[1, 0])
        wrap = self.pick(["identity", "cast", "unsqueeze", "expand", "half"]) if self.chance(10) else None
        if wrap == "cast":
            return self.double((K, w), "Wd")
        if wrap == "half":
            return self.half((K, w), "Wh")
        W = self.const((K, w), "W", tie=True)
        if wrap == "identity":
            return self.node("Identity", [W])
        if wrap == "unsqueeze":
            return self.node("Unsqueeze", [W, self.ints([0])])
        if wrap == "expand":
            return self.node("Expand", [W, self.ints([1, 1, 1])])
        return W

    def matmul(self, src, w: int) -> str:
        x, K = src
        if self.B == 2 and self.chance(8):
            W = self.const((2, K, w), "W3")
        else:
            W = self.weight(K, w)
        y = self.node("MatMul", [x, W])
        if self.chance(60):
            b = self.addend(w, "bias")
            y = self.node("Add", [y, b] if self.chance(80) else [b, y])
        return y

    def gemm(self, src, w: int) -> str:
        x, K = src
        a = self.node("Reshape", [x, self.ints([-1, K])])
        trans_b = self.pick([0, 1])
        W = self.const((w, K) if trans_b else (K, w), "G", tie=True)
        ins = [a, W]
        c_shape = self.pick([None, (w,), (1, w), (), (1,)])
        if c_shape is not None:
            ins.append(self.const(c_shape, "gc", tie=True))
        attrs = {"transB": trans_b}
        if self.chance(30):
            attrs["alpha"] = float(self.pick([0.5, 1.5]))
            attrs["beta"] = float(self.pick([0.7, 2.0]))
        y = self.node("Gemm", ins, **attrs)
        return self.unflatten(y, w, like=x)

    def unflatten(self, y: str, w: int, like: str) -> str:
        """[B*S, w] -> [B, S, w]; `like` is a [B, S, *] tensor that is not on the stream."""
        if self.B == 2 and self.chance(50):
            return self.node("Reshape", [y, self.ints([2, -1, w])])
        head = self.node("Shape", [like], start=0, end=2)
        return self.node("Reshape", [y, self.node("Concat", [head, self.ints([w])], axis=0)])

    def _conv_in(self, src) -> tuple[str, int]:
        if self.seq == "s" and self.chance(40):
            return self.inp("img", [self.B, self.k, "s"]), self.k
        x, K = src
        return self.node("Transpose", [x], perm=[0, 2, 1]), K

    def _groups(self, K: int, w: int) -> int:
        options = [1]
        if K % 2 == 0 and w % 2 == 0:
            options.append(2)
        if w % K == 0:
            options.append(K)
        return self.pick(options) if self.chance(20) else 1

    def conv1d(self, src, w: int) -> str:
        x, K = self._conv_in(src)
        g = self._groups(K, w)
        kk = self.pick([1, 3])
        ins = [x, self.const((w, K // g, kk), "cw")]
        if self.chance(60):
            ins.append(self.const((w,), "cb"))
        y = self.node("Conv", ins, pads=[kk // 2, kk // 2], group=g)
        return self.node("Transpose", [y], perm=[0, 2, 1])

    def conv2d(self, src, w: int) -> str:
        x, K = self._conv_in(src)
        x = self.node("Unsqueeze", [x, self.ints([3])])
        g = self._groups(K, w)
        kk = self.pick([1, 3])
        ins = [x, self.const((w, K // g, kk, 1), "cw")]
        if self.chance(60):
            ins.append(self.const((w,), "cb"))
        y = self.node("Conv", ins, pads=[kk // 2, 0, kk // 2, 0], group=g)
        y = self.node("Transpose", [y], perm=[0, 2, 3, 1])  # [B, S, 1, w]
        if self.chance(50):
            return self.node("Squeeze", [y, self.ints([2])])
        return self.node("Reshape", [y, self.ints([0, 0, w])])

    def gather(self, w: int) -> str:
        tied = [t for t in self.tables if t[2] == w]
        if tied and self.chance(30):
            table, V, _ = self.pick(tied)
        else:
            V = self.pick([7, 5, 11])
            table = self.const((V, w), "E", tie=True)
            self.tables.append((table, V, w))
        return self.node("Gather", [table, self.ids(V)])

    # ---- sums of terms -------------------------------------------------------------------------
    def term(self, w: int) -> str:
        if self.chance(self.blockers):
            kinds = ["input", "act", "mul_vec", "ln_out"] + (["int_table"] if self.seq == "s" else [])
        else:
            kinds = ["const", "producer", "expand"] + (["pos"] if self.seq == "s" else [])
        kind = self.pick(kinds)
        if kind == "const":
            return self.addend(w)
        if kind == "producer":
            return self.producer(w)
        if kind == "expand":
            c = self.const(self.pick([(1, 1, w), (1, w), (1, 1, 1), (w,)]), "ex")
            return self.node("Expand", [c, self.ints(self.pick([[1, 1, w], [1, 1, 1]]))])
        if kind == "pos":  # position table: [s, w], gathered or sliced to the sequence length
            rows = self.pick([9, 12])
            table = self.const((rows, w), "P", tie=True)
            if self.chance(50):
                end = self.node("Shape", [self.inp("x", [self.B, "s", self.k])], start=1, end=2)
                return self.node("Slice", [table, self.ints([0]), end, self.ints([0])])
            return self.node("Gather", [table, self.ids(rows, "pos", ["s"])])
        if kind == "input":
            shape = [self.B, "s", w] if self.seq == "s" else [self.B, self.pick([1, "s + 1"]), w]
            return self.inp(f"extra{w}_{self.seq}", shape)
        if kind == "int_table":  # an integer table read through Cast (and a scale): never centered
            V = self.pick([7, 5])
            table = self.fresh("Eint")
            dtype = self.pick([np.int8, np.int32, np.int64])
            self.g.inits.append(numpy_helper.from_array(self.rng.integers(-20, 20, size=(V, w)).astype(dtype), table))
            y = self.node("Cast", [self.node("Gather", [table, self.ids(V)])], to=F)
            return self.node("Mul", [y, self.const((), "iscale", nonzero=True)]) if self.chance(50) else y
        if kind == "act":
            return self.act(self.producer(w))
        if kind == "mul_vec":
            return self.node("Mul", [self.producer(w), self.scale_vec((w,))])
        return self.ln(self.producer(w), w)

    def act(self, h: str) -> str:
        op = self.pick(["Relu", "Tanh", "Sigmoid", "Gelu"])
        if op == "Gelu":
            self.ms = True
            return self.node("Gelu", [h], domain="com.microsoft")
        return self.node(op, [h])

    def stream_sum(self, w: int, max_terms: int = 3) -> str:
        h = self.producer(w)
        for _ in range(self.draw(st.integers(0, max_terms - 1))):
            t = self.term(w)
            how = self.pick(["add", "add_rev", "sub", "sub_rev", "sum"])
            if how == "add":
                h = self.node("Add", [h, t])
            elif how == "add_rev":
                h = self.node("Add", [t, h])
            elif how == "sub":
                h = self.node("Sub", [h, t])
            elif how == "sub_rev":
                h = self.node("Sub", [t, h])
            else:
                h = self.node("Sum", [h, t, self.producer(w)])
        return h

    # ---- carry ops: [B, S, w] -> [B, S, w] -----------------------------------------------------
    CARRY = [
        "identity", "neg", "cast", "dropout", "mul_scalar", "div_scalar", "mul_other_axis",
        "mul_data", "div_data", "add_const", "sub_const", "rsub_const", "add_stream", "sub_stream",
        "add_self", "transpose", "unsqueeze", "reshape_keep", "reshape_flat", "flatten",
        "split_batch", "split_seq", "concat_seq_pool", "slice_batch", "slice_axis_full",
        "pool_add", "gather_add", "expand_add", "expand_stream",
    ]
    BLOCKERS = [  # refused (exactly or conservatively)
        "reshape_split_back", "concat_axis_swap", "act", "mul_vec", "add_input", "mul_self",
        "mean_shift", "cast_int", "softmax", "shape_of_stream",
    ]

    def carry(self, h: str, w: int) -> str:
        op = self.pick(self.BLOCKERS if self.chance(self.blockers) else self.CARRY)
        return self.keep(getattr(self, f"_c_{op}")(h, w))

    def _c_identity(self, h, w):
        return self.node("Identity", [h])

    def _c_neg(self, h, w):
        return self.node("Neg", [h])

    def _c_cast(self, h, w):
        to = self.pick([F, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BFLOAT16])
        if to == F:
            return self.node("Cast", [h], to=F)
        return self.node("Cast", [self.node("Cast", [h], to=to)], to=F)

    def _c_dropout(self, h, w):
        if self.chance(50):
            return self.node("Dropout", [h])
        ratio = self.fresh("ratio")
        self.g.inits.append(numpy_helper.from_array(np.array(self.pick([0.1, 0.5]), dtype=np.float32), ratio))
        off = self.fresh("train")
        self.g.inits.append(numpy_helper.from_array(np.array(False), off))
        return self.node("Dropout", [h, ratio, off])

    def _c_mul_scalar(self, h, w):
        c = self.const(self.pick([(), (1,), (1, 1, 1)]), "s", nonzero=True, tie=True)
        return self.node("Mul", [h, c] if self.chance(70) else [c, h])

    def _c_div_scalar(self, h, w):
        return self.node("Div", [h, self.const(self.pick([(), (1,)]), "s", nonzero=True)])

    def _c_mul_other_axis(self, h, w):
        shape = (2, 1, 1) if self.B == 2 and self.chance(50) else (1, 1, 1)
        return self.node("Mul", [h, self.const(shape, "s", nonzero=True)])

    def _c_mul_data(self, h, w):
        f = self.factor()
        return self.node("Mul", [h, f] if self.chance(50) else [f, h])

    def _c_div_data(self, h, w):
        f = self.factor()  # the divisor is kept away from 0
        if self.chance(50):
            f = self.node("Exp", [f])
        else:
            one = self.fresh("one")
            self.g.inits.append(numpy_helper.from_array(np.array(1.0, dtype=np.float32), one))
            f = self.node("Add", [self.node("Abs", [f]), one])
        return self.node("Div", [h, f])

    def _c_add_const(self, h, w):
        c = self.addend(w)
        return self.node("Add", [h, c] if self.chance(70) else [c, h])

    def _c_sub_const(self, h, w):
        return self.node("Sub", [h, self.addend(w, "sub")])

    def _c_rsub_const(self, h, w):
        return self.node("Sub", [self.addend(w, "sub"), h])

    def _c_add_stream(self, h, w):
        o = self.stream_sum(w, 2)
        return self.node("Add", [h, o] if self.chance(50) else [o, h])

    def _c_sub_stream(self, h, w):
        o = self.stream_sum(w, 2)
        return self.node("Sub", [h, o] if self.chance(50) else [o, h])

    def _c_add_self(self, h, w):
        return self.node(self.pick(["Add", "Sub"]), [h, h])

    def _c_transpose(self, h, w):
        perm = self.pick([[0, 2, 1], [1, 0, 2], [2, 0, 1], [2, 1, 0], [1, 2, 0]])
        inv = [perm.index(i) for i in range(3)]
        y = self.node("Transpose", [h], perm=perm)
        at = perm.index(2)
        for _ in range(self.draw(st.integers(0, 2))):
            op = self.pick(["neg", "mul", "add"])
            if op == "neg":
                y = self.node("Neg", [y])
            elif op == "mul":
                y = self.node("Mul", [y, self.const((), "s", nonzero=True)])
            else:
                y = self.node("Add", [y, self.const(self.broadcast_shape(w, 3, at, batch_first=perm[0] == 0), "tadd")])
        if at == 2 and self.chance(25):  # an LN in the transposed layout
            self.out(self.ln(y, w))
        return self.node("Transpose", [y], perm=inv)

    def _c_unsqueeze(self, h, w):
        ax = self.pick([0, 1, 2, 3, -1])
        y = self.node("Unsqueeze", [h, self.ints([ax])])
        if self.chance(30):
            y = self.node("Neg", [y])
        if self.chance(30):
            return self.node("Squeeze", [y])
        return self.node("Squeeze", [y, self.ints([ax])])

    def _c_reshape_keep(self, h, w):
        shape = self.pick([[0, 0, w], [0, -1, w]] + ([[2, -1, w]] if self.B == 2 else []))
        return self.node("Reshape", [h, self.ints(shape)])

    def _flat_back(self, y, w, h):
        if self.chance(15):  # Shape of a stream tensor: harmless, but a real exporter pattern
            return self.node("Reshape", [y, self.node("Shape", [h])])
        src, _ = self.x()
        return self.unflatten(y, w, like=src)

    def _c_reshape_flat(self, h, w):
        y = self.node("Reshape", [h, self.ints([-1, w])])
        if self.chance(40):
            y = self.node("Add", [y, self.const(self.pick([(w,), (1, w), ()]), "fadd")])
        if self.chance(20):
            self.out(self.ln(y, w, rank=2))
        return self._flat_back(y, w, h)

    def _c_flatten(self, h, w):
        y = self.node("Flatten", [h], axis=2)
        if self.chance(40):
            y = self.node("Neg", [y])
        return self._flat_back(y, w, h)

    def _c_split_batch(self, h, w):
        if self.B != 2:
            return self._c_split_seq(h, w)
        a, b = self.split2(h, 0, [1, 1])
        return self.node("Concat", [b, a], axis=0)

    def _c_split_seq(self, h, w):
        if self.opset < 18:  # no uneven split of a dynamic axis
            return self._c_concat_seq_pool(h, w)
        a, b = self.split2(h, 1)
        return self.node("Concat", [b, a] if self.chance(50) else [a, b], axis=1)

    def _c_concat_seq_pool(self, h, w):
        o = self.stream_sum(w, 2) if self.chance(50) else h
        c = self.node("Concat", [h, o], axis=self.pick([1, -2]))
        p = self.reduce("ReduceMean", c, [1], 1)
        return self.node("Add", [h, p])

    def _c_slice_batch(self, h, w):
        s = self.node("Slice", [h, self.ints([0]), self.ints([1]), self.ints([0])])
        return self.node("Add", [h, s] if self.chance(50) else [s, h])

    def _c_slice_axis_full(self, h, w):
        if self.chance(50):  # reversed: a permutation of the axis
            return self.node("Slice", [h, self.ints([-1]), self.ints([-BIG]), self.ints([2]), self.ints([-1])])
        return self.node("Slice", [h, self.ints([0]), self.ints([self.pick([w, BIG])]), self.ints([self.pick([2, -1])])])

    def _c_pool_add(self, h, w):
        op = self.pick(["ReduceMean", "ReduceSum"])
        axes = self.pick([[1], [0], [0, 1], [-2]])
        keep = self.pick([1, 0])
        p = self.reduce(op, h, axes, keep)
        if not keep and axes in ([1], [-2]):
            p = self.node("Unsqueeze", [p, self.ints([1])])
        return self.node("Add", [h, p])

    def _c_gather_add(self, h, w):
        idx = self.ints(self.pick([0, -1, 1]))
        g = self.node("Gather", [h, idx], axis=self.pick([1, -2]))  # [B, w]
        return self.node("Add", [h, self.node("Unsqueeze", [g, self.ints([1])])])

    def _c_expand_add(self, h, w):
        c = self.const(self.pick([(1, 1, w), (1, w), (1, 1, 1)]), "ex")
        e = self.node("Expand", [c, self.ints([1, 1, w])])
        return self.node("Add", [h, e])

    def _c_expand_stream(self, h, w):
        if self.chance(50):
            return self.node("Expand", [h, self.ints([1, 1, 1])])
        y = self.node("Expand", [h, self.ints([1, 1, 1, 1])])  # [1, B, S, w]
        return self.node("Squeeze", [y, self.ints([0])])

    def _c_reshape_split_back(self, h, w):
        y = self.node("Reshape", [h, self.ints([0, 0, 2, w // 2])])
        if self.chance(40):
            y = self.node("Neg", [y])
        return self.node("Reshape", [y, self.ints([0, 0, w])])

    def _c_concat_axis_swap(self, h, w):
        a, b = self.split2(h, self.pick([2, -1]))
        return self.node("Concat", [b, a], axis=-1)

    def _c_act(self, h, w):
        return self.act(h)

    def _c_mul_vec(self, h, w):
        return self.node("Mul", [h, self.scale_vec(self.pick([(w,), (1, 1, w)]))])

    def scale_vec(self, shape) -> str:
        """A per-channel scale (an affine chain when it follows a linear layer); sometimes with a 0."""
        if not self.chance(25):
            return self.const(shape, "vec")
        arr = self.rng.normal(0.3, 1.0, size=shape).astype(np.float32)
        arr.reshape(-1)[self.pick(range(arr.size))] = 0.0
        name = self.fresh("vec0")
        self.g.inits.append(numpy_helper.from_array(arr, name))
        return name

    def _c_add_input(self, h, w):
        shape = [self.B, "s", w] if self.seq == "s" else [1, self.pick([1, "s + 1"]), w]
        return self.node("Add", [h, self.inp(f"extra{w}_{self.seq}", shape)])

    def _c_mul_self(self, h, w):
        return self.node("Mul", [h, h])

    def _c_mean_shift(self, h, w):
        m = self.reduce("ReduceMean", h, [-1], 1)
        return self.node("Add", [h, m])

    def _c_cast_int(self, h, w):
        y = self.node("Cast", [self.node("Mul", [h, self.const((), "s10", nonzero=True)])], to=TensorProto.INT32)
        return self.node("Cast", [y], to=F)

    def _c_softmax(self, h, w):
        return self.node("Softmax", [h], axis=-1)

    def _c_shape_of_stream(self, h, w):
        y = self.node("Reshape", [h, self.ints([-1, w])])
        return self.node("Reshape", [y, self.node("Shape", [h])])

    # ---- LayerNorm -----------------------------------------------------------------------------
    def ln(self, h: str, w: int, axis: int = -1, gamma_shape=None, rank: int = 3) -> str:
        self.n_ln += 1
        if not self.in_body:  # (a body's tensors cannot be made graph outputs to check them)
            self.ln_inputs.append(h)
        if axis == -1 and self.chance(15):
            return self.decomposed(h, w)
        self.forms["LayerNormalization"] += 1
        beta_shape = gamma_shape
        if gamma_shape is None:  # [1]: one gamma (or beta) broadcast over the normalized axis
            gamma_shape = (1,) if self.chance(10) else (w,)
            beta_shape = (1,) if self.chance(10) else (w,)
        ins = [h, self.const(gamma_shape, "gamma", tie=True)]
        if self.chance(80):
            ins.append(self.const(beta_shape, "beta", tie=True))
        attrs = {}
        if axis != -1 or self.chance(70):
            attrs["axis"] = axis if self.chance(70) else axis + rank
        if self.chance(70):
            attrs["epsilon"] = self.pick([1e-5, 1e-6, 1e-3])
        n_out = self.pick([1, 2, 3]) if self.chance(15) else 1
        outs = self.node("LayerNormalization", ins, n_out=n_out, **attrs)
        y = outs if n_out == 1 else outs[0]
        if n_out > 1 and self.chance(20):  # Mean (and maybe InvStdDev) used
            self.out(outs[self.pick(range(1, n_out))])
        if self.chance(8):
            self.out(y)
        return y

    def scalar(self, value: float) -> str:
        name = self.fresh("k")
        self.g.inits.append(numpy_helper.from_array(np.array(value, dtype=np.float32), name))
        return name

    def decomposed(self, h: str, w: int) -> str:
        """The decomposed LN of older exporters (ReduceMean, Sub, Pow|Mul, ReduceMean, Add, Sqrt, Div|Reciprocal+Mul, Mul, Add)."""
        self.forms["decomposed LayerNorm"] += 1
        m = self.reduce("ReduceMean", h, [-1], 1)
        dev = self.node("Sub", [h, m])
        sq = self.node("Pow", [dev, self.scalar(2.0)]) if self.chance(50) else self.node("Mul", [dev, dev])
        variance = self.reduce("ReduceMean", sq, [-1], 1)
        var = self.node("Add", [variance, self.scalar(self.pick([1e-5, 1e-6]))])
        root = self.node("Sqrt", [var])
        inner = [m, dev, sq, variance, var, root]
        if self.chance(50):
            y = self.node("Div", [dev, root])
        else:
            inner.append(self.node("Reciprocal", [root]))
            y = self.node("Mul", [dev, inner[-1]])
        if self.chance(10):  # an intermediate (the mean, 1/std, ...) read elsewhere or a graph output
            t = self.pick(inner)
            self.out(t if self.chance(50) else self.node("Neg", [t]))
        if self.chance(85):
            y = self.node("Mul", [y, self.const(self.pick([(w,), (w,), (1,)]), "gamma", tie=True)])
        if self.chance(80):
            y = self.node("Add", [y, self.const(self.pick([(w,), (w,), (1,)]), "beta", tie=True)])
        if self.chance(8):
            self.out(y)
        return y

    def skip_ln(self, w: int) -> str | None:
        """Fuse the last residual Add and the LN reading it into com.microsoft::SkipLayerNormalization
        (as the ORT transformers optimizer does); its sum output 3 keeps the Add's name."""
        if self.residual is None:
            return None
        total, a, b = self.residual
        self.ln_inputs.append(total)
        (add,) = [n for n in self.g.nodes if n.output[0] == total]
        self.g.nodes.remove(add)
        self.ms = True
        self.n_ln += 1
        self.forms["com.microsoft::SkipLayerNormalization"] += 1
        ins = [a, b, self.const((w,), "gamma", tie=True)]
        extra = self.pick([0, 1, 2])  # beta, then bias (a constant added into the stream)
        if extra:
            ins.append(self.const((w,), "beta", tie=True))
        if extra == 2:
            ins.append(self.const((w,), "sbias", tie=True))
        name = self.fresh("skipln_")
        y = f"{name}_out"
        self.g.nodes.append(
            helper.make_node("SkipLayerNormalization", ins, [y, "", "", total], name=name, domain="com.microsoft",
                             epsilon=self.pick([1e-5, 1e-12]))
        )
        self.residual = None
        return y

    # ---- residual blocks -----------------------------------------------------------------------
    def branch(self, n: str, w: int) -> str:
        kind = self.pick(["linear", "mlp", "attn", "scaled", "relu_out"])
        if kind == "linear":
            return getattr(self, self.pick(["matmul", "gemm", "conv1d", "conv2d"]))((n, w), w)
        if kind == "mlp":
            hid = self.node("MatMul", [n, self.const((w, 2 * w), "W1", tie=True)])
            if self.chance(70):
                hid = self.node("Add", [hid, self.const((2 * w,), "b1")])
            return getattr(self, self.pick(["matmul", "gemm", "conv1d"]))((self.act(hid), 2 * w), w)
        if kind == "attn":
            q, k, v = (self.node("MatMul", [n, self.weight(w, w)]) for _ in range(3))
            scores = self.node("MatMul", [q, self.node("Transpose", [k], perm=[0, 2, 1])])
            scores = self.node("Mul", [scores, self.const((), "temp", nonzero=True)])
            ctx = self.node("MatMul", [self.node("Softmax", [scores], axis=-1), v])
            return ctx if self.chance(40) else self.matmul((ctx, w), w)
        if kind == "scaled":
            y = self.matmul((n, w), w)
            return self.node("Mul", [y, self.const((), "ls", nonzero=True)]) if self.chance(50) else self.node("Dropout", [y])
        return self.node("Relu", [self.matmul((n, w), w)])

    def block(self, h: str, w: int) -> str:
        style = "post" if self.chance(self.blockers) else self.pick(["pre", "parallel", "pre2d"])
        fused = self.residual is not None and self.residual[0] == h and style == "pre" and self.chance(30)
        n = self.skip_ln(w) if fused else None
        self.residual = None
        if style == "pre":
            f = self.branch(n or self.ln(h, w), w)
            if self.chance(80):
                h = self.node("Add", [h, f])
                self.residual = (h, self.g.nodes[-1].input[0], f)
            else:
                h = self.node(self.pick(["Add", "Sub"]), [f, h])
        elif style == "post":
            f = self.branch(h, w)
            h = self.ln(self.node("Add", [h, f]), w)
        elif style == "parallel":
            n = self.ln(h, w)
            f1, f2 = self.branch(n, w), self.branch(n, w)
            if self.chance(50):
                h = self.node("Sum", [h, f1, f2])
            else:
                h = self.node("Add", [self.node("Add", [h, f1]), f2])
        else:  # the LN on a 2-D view, consumed by Gemm or MatMul (beta folds into their biases)
            flat = self.node("Reshape", [h, self.ints([-1, w])])
            n = self.ln(flat, w, rank=2)
            if self.chance(50):
                trans_b = self.pick([0, 1])
                ins = [n, self.const((w, w), "G", tie=True)]
                c = self.pick([(w,), (1, w), None, (), (1,)])
                if c is not None:
                    ins.append(self.const(c, "gc"))
                f = self.node("Gemm", ins, transB=trans_b, alpha=float(self.pick([1.0, 0.5])), beta=float(self.pick([1.0, 2.0])))
            else:
                f = self.node("MatMul", [n, self.const((w, w), "W", tie=True)])
                f = self.node("Add", [f, self.const(self.pick([(w,), (1, w)]), "bias")])
            src, _ = self.x()
            h = self.node("Add", [h, self.unflatten(f, w, like=src)])
        self.keep(h)
        for _ in range(self.draw(st.integers(0, 2))):
            h = self.carry(h, w)
        return h

    # ---- terminal views: whatever layout, the LN normalizes the last axis ----------------------
    def final(self, h: str, w: int) -> None:
        view = self.pick(
            ["none", "transpose", "flat", "pool", "pick", "unsqueeze", "slice_axis", "split_axis", "reshape_split", "multi_axis"]
        )
        axis, gamma, width, rank = -1, None, w, 3
        if view in ("flat", "pick"):
            rank = 2
        elif view in ("unsqueeze", "reshape_split", "multi_axis"):
            rank = 4
        if view == "transpose":
            h = self.node("Transpose", [h], perm=[1, 0, 2])
        elif view == "flat":
            h = self.node("Reshape", [h, self.ints([-1, w])])
        elif view == "pool":
            keep = self.pick([0, 1])
            rank = 2 + keep
            h = self.reduce(self.pick(["ReduceMean", "ReduceSum"]), h, [1], keep)
        elif view == "pick":
            h = self.node("Gather", [h, self.ints(self.pick([0, -1]))], axis=1)
        elif view == "unsqueeze":
            h = self.node("Unsqueeze", [h, self.ints([self.pick([0, 2])])])
        elif view == "slice_axis":
            width = w // 2
            start = self.pick([0, w // 2])
            h = self.node("Slice", [h, self.ints([start]), self.ints([start + w // 2]), self.ints([-1])])
        elif view == "split_axis":
            width = w // 2
            h = self.split2(h, -1)[self.pick([0, 1])]
        elif view == "reshape_split":
            width = w // 2
            h = self.node("Reshape", [h, self.ints([0, 0, 2, w // 2])])
        elif view == "multi_axis":
            h = self.node("Reshape", [h, self.ints([0, 0, 2, w // 2])])
            axis, gamma, width = -2, (2, w // 2), w
        y = self.ln(h, width, axis=axis, gamma_shape=gamma, rank=rank)
        if width == self.d and axis == -1 and self.chance(50):
            tied = [t for t in self.tables if t[2] == self.d]
            if tied and self.chance(70):  # LM head tied to the embedding table
                table = self.pick(tied)[0]
                y = self.node("MatMul", [y, self.node("Transpose", [table], perm=[1, 0])])
            else:
                y = self.node("MatMul", [y, self.const((self.d, self.pick([5, self.d])), "head", tie=True)])
        self.out(y)

    # ---- If / Loop bodies: LNs inside, on stream tensors read from the outer scope ------------
    # Suffixes of the names the fold gives new tensors: body inputs and initializers named like
    # them must not be shadowed by (or shadow) what the fold adds.
    SUFFIXES = [".centered", ".zeroed", ".rms", ".beta", ".mean", ".with_beta", ".sum", ".scale"]

    def decoy(self, near: list[str]) -> str | None:
        if not near:
            return None
        name = self.pick(near) + self.pick(self.SUFFIXES)
        if name in self.decoys:
            return None
        self.decoys.add(name)
        return name

    def body(self, t: str, w: int, kind: str, head: bool, near: list[str]):
        """(nodes, initializers, output) of a body computing one [B, S, w] tensor from `t`."""
        saved = self.g.nodes, self.g.inits
        self.g.nodes, self.g.inits = [], []
        self.in_body = True
        try:
            if kind == "ln":
                y = self.ln(t, w)
            elif kind == "ln_producer":  # a linear layer inside the body (its weight may be the main graph's)
                y = self.ln(self.matmul(self.x(), w), w)
            elif kind == "neg":  # the changed stream reaches the body's output: blocks
                y = self.node("Neg", [t])
            else:  # "pass": the branch does not read the stream
                y = self.matmul(self.x(), w)
            if head:  # a linear head: the LN's beta folds into its bias (a body initializer)
                y = self.node("Add", [self.node("MatMul", [y, self.const((w, w), "bW")]), self.const((w,), "bb")])
            body_lns = [n.output[0] for n in self.g.nodes if n.op_type == "LayerNormalization"]
            name = self.decoy(near + body_lns) if self.chance(50) else None
            if name is not None:  # a body initializer named like a tensor the fold may add
                self.g.inits.append(numpy_helper.from_array(self.rng.normal(0.3, 1.0, size=(w,)).astype(np.float32), name))
                y = self.node("Add", [y, name])
            return self.g.nodes, self.g.inits, y
        finally:
            self.g.nodes, self.g.inits = saved
            self.in_body = False

    def near_names(self, t: str) -> list[str]:
        """Names the fold derives new names from: the stream tensor the body reads (explicit
        centering), LN outputs (their RMSNorm and beta tensors), weights (centered copies)."""
        lns = [n.output[0] for n in self.g.nodes if n.op_type in ("LayerNormalization", "SkipLayerNormalization")]
        weights = [i.name for i in self.g.inits if len(i.dims) >= 1]
        return [t] + lns + weights

    def if_block(self, t: str, w: int) -> None:
        """If on a bool input, an LN in each branch (or a pass-through); both branches run in the checks."""
        cond = self.inp("flag", [], TensorProto.BOOL)
        head = self.chance(40)
        near = self.near_names(t)
        kinds = [self.pick(["ln", "ln_producer", "neg"]), self.pick(["ln", "ln_producer", "pass"])]
        bodies = []
        for tag, kind in zip(("then", "else"), kinds):
            nodes, inits, y = self.body(t, w, kind, head, near)
            bodies.append(helper.make_graph(nodes, self.fresh(tag), [], [helper.make_tensor_value_info(y, F, None)], inits))
        name = self.fresh("if_")
        self.g.nodes.append(helper.make_node("If", [cond], [f"{name}_out"], name=name, then_branch=bodies[0], else_branch=bodies[1]))
        self.out(f"{name}_out")

    def loop_block(self, t: str, w: int) -> None:
        """Loop (2 trips): its body computes an LN of `t` as a scan output; the carried state and
        the body's inputs may be named like tensors the fold adds."""
        near = self.near_names(t)
        names = [self.decoy(near) or self.fresh("it"), self.decoy(near) or self.fresh("cond_in"), self.decoy(near) or self.fresh("v_in")]
        nodes, inits, y = self.body(t, w, self.pick(["ln", "ln_producer"]), self.chance(30), near)
        cond_out, v_out = self.fresh("cond_out"), self.fresh("v_out")
        nodes = [helper.make_node("Identity", [names[1]], [cond_out]), helper.make_node("Neg", [names[2]], [v_out])] + nodes
        body = helper.make_graph(
            nodes,
            self.fresh("body"),
            [
                helper.make_tensor_value_info(names[0], I64, []),
                helper.make_tensor_value_info(names[1], TensorProto.BOOL, []),
                helper.make_tensor_value_info(names[2], F, None),
            ],
            [helper.make_tensor_value_info(o, t_, None) for o, t_ in ((cond_out, TensorProto.BOOL), (v_out, F), (y, F))],
            inits,
        )
        trip = self.ints(2)
        name = self.fresh("loop_")
        outs = [f"{name}_state", f"{name}_scan"]
        self.g.nodes.append(helper.make_node("Loop", [trip, "", self.const((w,), "v0")], outs, name=name, body=body))
        for o in outs:
            self.out(o)

    # ---- the model -----------------------------------------------------------------------------
    def build(self) -> Built:
        d = self.d
        h = self.keep(self.stream_sum(d))
        for _ in range(self.draw(st.integers(0, 2))):
            h = self.carry(h, d)
        if self.chance(20):  # class token (ViT): the sequence grows by one
            if self.B == 2:
                target = self.ints([2, 1, d])
            else:
                target = self.node("Concat", [self.node("Shape", [self.inp("x", [self.B, "s", self.k])], start=0, end=1), self.ints([1, d])], axis=0)
            cls = self.node("Expand", [self.const((1, 1, d), "cls"), target])
            h = self.keep(self.node("Concat", [cls, h], axis=1))
            x = self.inp("x", [self.B, "s", self.k])
            self.src_cls = self.node("Concat", [self.node("Slice", [x, self.ints([0]), self.ints([1]), self.ints([1])]), x], axis=1)
            self.seq = "s+1"
            if self.chance(30):  # a derived dim: an input as long as the stream, its length written 's + 1'
                h = self.keep(self.node("Mul", [h, self.inp("t_cls", [self.B, "s + 1", 1])]))
        for _ in range(self.draw(st.integers(0, 3))):
            h = self.block(h, d)
        self.final(h, d)
        # several LNs on one stream, stream tensors exposed, stream tensors consumed elsewhere
        for t in list(self.stream):
            if self.chance(3):
                self.out(t)
            if self.chance(6):
                self.out(self.ln(t, d))
            if self.chance(self.blockers // 6):
                side = self.pick(["matmul", "relu", "rms"])
                if side == "matmul":
                    self.out(self.node("MatMul", [t, self.const((d, 3), "side")]))
                elif side == "relu":
                    self.out(self.node("Relu", [t]))
                else:
                    self.out(self.node("SimplifiedLayerNormalization", [t, self.const((d,), "rms")], axis=-1, epsilon=1e-5))
        if self.chance(15):
            self.if_block(self.pick(self.stream), d)
        if self.chance(10):
            self.loop_block(self.pick(self.stream), d)
        if self.chance(self.blockers // 4):  # a weight that can be overridden at run time
            floats = [i for i in self.g.inits if i.data_type == F and len(i.dims) >= 1]
            if floats:
                init = self.pick(floats)
                self.g.inputs.append(helper.make_tensor_value_info(init.name, F, list(init.dims)))
        for name in self.outputs:
            self.g.output(name)
        model = self.g.model(opset=self.opset, ms_domain=self.ms)
        return Built(model, dict(self.bounds), self.n_ln, self.forms, self.ln_inputs)


@st.composite
def models(draw) -> Built:
    return _Gen(draw).build()


def dim_size(param: str, sizes: dict[str, int]) -> int:
    """A dim written as a name ('s') or as an expression of names ('s + 1')."""
    if param in sizes:
        return sizes[param]
    return int(eval(param, {"__builtins__": {}}, dict(sizes)))  # test code: expressions the generator wrote


def derived_dims(built: Built) -> bool:
    """Whether some input dim is written as an expression ('s + 1')."""
    return any(
        d.HasField("dim_param") and not d.dim_param.isidentifier()
        for vi in built.model.graph.input
        for d in vi.type.tensor_type.shape.dim
    )


def feeds(built: Built, sizes: dict[str, int], seed: int) -> dict[str, np.ndarray]:
    """Random inputs; dims named in `sizes` take those sizes (and expressions of them); a bool
    input is True for odd seeds, False for even ones; initializers listed as inputs are not fed."""
    rng = np.random.default_rng(seed)
    inits = {i.name for i in built.model.graph.initializer}
    out = {}
    for vi in built.model.graph.input:
        if vi.name in inits:
            continue
        dims = [d.dim_value if d.HasField("dim_value") else dim_size(d.dim_param, sizes) for d in vi.type.tensor_type.shape.dim]
        if vi.type.tensor_type.elem_type == I64:
            out[vi.name] = rng.integers(0, built.index_bounds[vi.name], size=dims).astype(np.int64)
        elif vi.type.tensor_type.elem_type == TensorProto.BOOL:
            out[vi.name] = np.full(dims, seed % 2 == 1)
        else:
            out[vi.name] = rng.standard_normal(dims).astype(np.float32)
    return out
