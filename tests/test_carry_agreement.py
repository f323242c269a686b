"""`_carry.backward` and `_carry.forward` agree for every op of the carry table, on random nodes.

Both are read off one rule per op (`_carry_rules.RULES`); this checks that the reading is the
same both ways: an input that backward requires zero-mean along `b` for output `k` along `a` is
one whose shift along `b` forward sends to output `k` along `a`, and the other way round.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_lnfold import _carry
from onnx_lnfold._carry_rules import RULES
from onnx_lnfold._shapes import ShapeTable

CASES_PER_OP = 25
F = TensorProto.FLOAT


class _Node:
    """One node under test with its inputs: data (graph inputs) or constants."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng
        self.inputs: list[onnx.ValueInfoProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.names: list[str] = []

    def data(self, shape) -> str:
        name = f"in{len(self.names)}"
        self.inputs.append(helper.make_tensor_value_info(name, F, list(shape)))
        self.names.append(name)
        return name

    def const(self, array) -> str:
        name = f"in{len(self.names)}"
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        self.names.append(name)
        return name

    def ints(self, values) -> str:
        return self.const(np.asarray(values, dtype=np.int64))

    def weight(self, shape) -> str:
        return self.const(self.rng.normal(0.3, 1.0, size=shape).astype(np.float32))

    def build(self, op: str, inputs: list[str], n_out: int = 1, **attrs) -> tuple[ir.Node, ShapeTable]:
        outs = [f"out{k}" for k in range(n_out)]
        node = helper.make_node(op, inputs, outs, name="n", **attrs)
        declared = [helper.make_tensor_value_info(o, F, None) for o in outs]
        graph = helper.make_graph([node], "g", self.inputs, declared, self.inits)
        proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
        proto.ir_version = 9
        model = ir.serde.deserialize_model(proto)
        return model.graph.node(0), ShapeTable(model)


def _dims(rng, rank: int) -> list[int]:
    return [int(d) for d in rng.integers(2, 5, size=rank)]


def _broadcastable(rng, out: list[int]) -> list[int]:
    """A shape numpy broadcasts to `out`: a suffix of it, some dims set to 1."""
    shape = out[int(rng.integers(0, len(out) + 1)) :]
    return [1 if rng.random() < 0.3 else d for d in shape]


def _unary(op):
    def make(rng):
        b = _Node(rng)
        x = b.data(_dims(rng, int(rng.integers(1, 5))))
        if op == "Cast":
            return b.build(op, [x], to=int(rng.choice([TensorProto.FLOAT, TensorProto.DOUBLE])))
        if op == "Dropout":
            extra = [b.const(np.float32(0.1)), b.const(np.bool_(False))] if rng.random() < 0.5 else []
            return b.build(op, [x, *extra], n_out=int(rng.integers(1, 3)))
        return b.build(op, [x])

    return make


def _elementwise(op):
    def make(rng):
        b = _Node(rng)
        out = _dims(rng, int(rng.integers(1, 5)))
        n_in = int(rng.integers(2, 4)) if op == "Sum" else 2
        names = []
        for i in range(n_in):
            shape = out if i == 0 else _broadcastable(rng, out)
            if op in ("Mul", "Div") and i == 1 and rng.random() < 0.4:
                # a constant per-channel scale along one axis: the affine chain
                shape = [1] * len(out)
                axis = int(rng.integers(0, len(out)))
                shape[axis] = out[axis]
                names.append(b.weight(shape))
            else:
                names.append(b.data(shape) if i == 0 or rng.random() < 0.5 else b.weight(shape))
        if rng.random() < 0.5:
            names.reverse()
        return b.build(op, names)

    return make


def _matmul(rng):
    b = _Node(rng)
    lead = _dims(rng, int(rng.integers(0, 3)))
    k, n = _dims(rng, 2)
    w_shape = ([k, n] if rng.random() < 0.7 else [*lead[-1:], k, n]) if lead else [k, n]
    return b.build("MatMul", [b.data([*lead, 3, k]), b.weight(w_shape)])


def _gemm(rng):
    b = _Node(rng)
    m, k, n = _dims(rng, 3)
    trans_b = int(rng.integers(0, 2))
    ins = [b.data([m, k]), b.weight([n, k] if trans_b else [k, n])]
    c = [None, [], [n], [1, n], [m, n], [1], [m, 1]][int(rng.integers(0, 7))]
    if c is not None:
        ins.append(b.weight(c))
    return b.build("Gemm", ins, transB=trans_b)


def _conv(rng):
    b = _Node(rng)
    group = int(rng.choice([1, 1, 2]))
    c_in, c_out = 2 * group, 2 * int(rng.integers(1, 3))
    ins = [b.data([2, c_in, 5, 5]), b.weight([c_out, c_in // group, 3, 3])]
    if rng.random() < 0.6:
        ins.append(b.weight([c_out]))
    return b.build("Conv", ins, group=group)


def _reshape(rng):
    b = _Node(rng)
    shape = _dims(rng, int(rng.integers(2, 5)))
    cut = int(rng.integers(0, len(shape)))
    target = [*shape[:cut], int(np.prod(shape[cut : cut + 2]))] + shape[cut + 2 :]  # merge two dims
    if rng.random() < 0.5:
        shape, target = target, shape  # or split one
    if rng.random() < 0.5 and cut > 0:
        # Named leading dims copied by 0s and the rest flattened by -1: the output's last dim is
        # unknown, so the axis is followed through the target (`_reshape._structural_axis`).
        shape = [f"d{i}" for i in range(len(shape))]
        target = [0] * cut + [-1]
    return b.build("Reshape", [b.data(shape), b.ints(target)])


def _flatten(rng):
    b = _Node(rng)
    shape = _dims(rng, int(rng.integers(2, 5)))
    return b.build("Flatten", [b.data(shape)], axis=int(rng.integers(0, len(shape) + 1)))


def _squeeze(rng):
    b = _Node(rng)
    shape = _dims(rng, int(rng.integers(1, 4)))
    where = sorted(rng.choice(len(shape) + 1, size=int(rng.integers(1, 3)), replace=True))
    for offset, w in enumerate(where):
        shape.insert(int(w) + offset, 1)
    ones = [i for i, d in enumerate(shape) if d == 1]
    return b.build("Squeeze", [b.data(shape), b.ints(ones)])


def _unsqueeze(rng):
    b = _Node(rng)
    shape = _dims(rng, int(rng.integers(1, 4)))
    out_rank = len(shape) + int(rng.integers(1, 3))
    axes = sorted(int(a) for a in rng.choice(out_rank, size=out_rank - len(shape), replace=False))
    return b.build("Unsqueeze", [b.data(shape), b.ints(axes)])


def _transpose(rng):
    b = _Node(rng)
    shape = _dims(rng, int(rng.integers(1, 5)))
    if rng.random() < 0.2:
        return b.build("Transpose", [b.data(shape)])
    return b.build("Transpose", [b.data(shape)], perm=[int(p) for p in rng.permutation(len(shape))])


def _expand(rng):
    b = _Node(rng)
    out = _dims(rng, int(rng.integers(1, 5)))
    return b.build("Expand", [b.data(_broadcastable(rng, out) or [1]), b.ints(out)])


def _reduce(op):
    def make(rng):
        b = _Node(rng)
        shape = _dims(rng, int(rng.integers(1, 5)))
        axes = sorted(int(a) for a in rng.choice(len(shape), size=int(rng.integers(1, len(shape) + 1)), replace=False))
        return b.build(op, [b.data(shape), b.ints(axes)], keepdims=int(rng.integers(0, 2)))

    return make


def _slice(rng):
    b = _Node(rng)
    shape = _dims(rng, int(rng.integers(1, 5)))
    axes = sorted(int(a) for a in rng.choice(len(shape), size=int(rng.integers(1, len(shape) + 1)), replace=False))
    starts = [int(rng.integers(0, 2)) for _ in axes]
    ends = [shape[a] if rng.random() < 0.4 and s == 0 else shape[a] - 1 for a, s in zip(axes, starts)]
    return b.build("Slice", [b.data(shape), b.ints(starts), b.ints(ends), b.ints(axes)])


def _split(rng):
    b = _Node(rng)
    shape = [2 * d for d in _dims(rng, int(rng.integers(1, 4)))]
    return b.build("Split", [b.data(shape)], n_out=2, axis=int(rng.integers(0, len(shape))), num_outputs=2)


def _concat(rng):
    b = _Node(rng)
    shape = _dims(rng, int(rng.integers(1, 4)))
    axis = int(rng.integers(0, len(shape)))
    pieces = []
    for _ in range(int(rng.integers(2, 4))):
        piece = list(shape)
        piece[axis] = int(rng.integers(1, 4))
        pieces.append(b.data(piece) if rng.random() < 0.6 else b.weight(piece))
    return b.build("Concat", pieces, axis=axis)


def _gather(rng):
    b = _Node(rng)
    shape = _dims(rng, int(rng.integers(1, 4)))
    axis = int(rng.integers(0, len(shape)))
    indices = rng.integers(0, shape[axis], size=_dims(rng, int(rng.integers(0, 3))))
    return b.build("Gather", [b.weight(shape), b.ints(indices)], axis=axis)


def _tile(rng):
    b = _Node(rng)
    shape = [1 if rng.random() < 0.2 else d for d in _dims(rng, int(rng.integers(1, 5)))]
    repeats = [1 if rng.random() < 0.5 else int(rng.integers(2, 4)) for _ in shape]
    return b.build("Tile", [b.data(shape), b.ints(repeats)])


def _gather_nd(rng):
    b = _Node(rng)
    batch_dims = int(rng.integers(0, 2))
    shape = _dims(rng, batch_dims + int(rng.integers(1, 4)))
    k = int(rng.integers(0, len(shape) - batch_dims + 1))  # k == rank - batch_dims: single elements
    lead = _dims(rng, int(rng.integers(0, 3)))
    indices = rng.integers(0, 2, size=[*shape[:batch_dims], *lead, k])  # every dim is at least 2
    data = b.weight(shape) if rng.random() < 0.5 else b.data(shape)  # a table, or a stream carried
    return b.build("GatherND", [data, b.ints(indices)], batch_dims=batch_dims)


MAKERS = {
    **{op: _unary(op) for op in ("Neg", "Identity", "Dropout", "Cast")},
    **{op: _elementwise(op) for op in ("Add", "Sub", "Sum", "Mul", "Div")},
    "MatMul": _matmul,
    "Gemm": _gemm,
    "Conv": _conv,
    "Reshape": _reshape,
    "Flatten": _flatten,
    "Squeeze": _squeeze,
    "Unsqueeze": _unsqueeze,
    "Transpose": _transpose,
    "Expand": _expand,
    **{op: _reduce(op) for op in ("ReduceMean", "ReduceSum")},
    "Slice": _slice,
    "Split": _split,
    "Tile": _tile,
    "Concat": _concat,
    "Gather": _gather,
    "GatherND": _gather_nd,
}


def test_every_op_of_the_table_has_a_generator():
    assert set(MAKERS) == set(RULES)


def _broadcast_along(shapes: ShapeTable, node: ir.Node, index: int, axis: int, k: int, out_axis: int) -> bool:
    """Input `index` has size 1 along `axis` where output `k` has more: it carries no mean there,
    and backward asks it to be exactly zero rather than zero-mean."""
    in_shape, out_shape = shapes.shape(node.inputs[index]), shapes.shape(node.outputs[k])
    return in_shape[axis] == 1 and out_shape[out_axis] != 1


@pytest.mark.parametrize("op", sorted(MAKERS))
def test_backward_and_forward_agree(op):
    rng = np.random.default_rng(sum(map(ord, op)))
    followed = 0  # links seen, so that a generator that only builds refused nodes fails
    for _ in range(CASES_PER_OP):
        node, shapes = MAKERS[op](rng)
        case = f"{op} {[shapes.shape(v) for v in node.inputs]} -> {[shapes.shape(v) for v in node.outputs]}"
        for k, out in enumerate(node.outputs):
            for a in range(shapes.rank(out) or 0):
                reqs = _carry.backward(node, k, a, shapes)
                if isinstance(reqs, _carry.Blocked):
                    continue
                assert reqs, case
                for req in reqs:
                    if req.axis is None:
                        continue
                    followed += 1
                    moved = _carry.forward(node, req.index, req.axis, shapes)
                    assert isinstance(moved, dict) and moved.get(k) == a, (case, k, a, req, moved)
        for i, inp in enumerate(node.inputs):
            for b in range(shapes.rank(inp) or 0):
                moved = _carry.forward(node, i, b, shapes)
                if isinstance(moved, _carry.Blocked):
                    continue
                for k, a in moved.items():
                    if _broadcast_along(shapes, node, i, b, k, a):
                        continue
                    reqs = _carry.backward(node, k, a, shapes)
                    assert isinstance(reqs, list), (case, i, b, k, a, reqs)
                    # A product of two per-channel constants: backward picks one as the stream.
                    if op == "Mul" and any(r.factor == i for r in reqs):
                        continue
                    assert any((r.index, r.axis) == (i, b) for r in reqs), (case, i, b, k, a, reqs)
    assert followed > 0


def test_jointly_linear_ops_are_the_sums():
    assert _carry.JOINTLY_LINEAR == {"Add", "Sub", "Sum", "Concat", "Gemm", "Conv"}


def test_the_design_lists_every_op_of_the_table():
    """docs/DESIGN.md sections 2.1 (producers) and 2.2 (carry ops) name the ops of the table."""
    design = (Path(__file__).parents[1] / "docs" / "DESIGN.md").read_text()
    section = design[design.index("### 2.1") : design.index("### 2.3")]
    named = set(re.findall(r"`([A-Z][A-Za-z]+)[(`]", section))
    assert set(RULES) <= named, set(RULES) - named
    assert named - set(RULES) <= {"SkipLayerNormalization"}, named - set(RULES)
