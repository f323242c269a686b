"""`carry.backward` and `carry.forward` agree for every op of the carry table, on random nodes.

Both are read off one rule per op (`carry.rules.RULES`); this checks that the reading is the
same both ways: an input that backward requires zero-mean along `b` for output `k` along `a` is
one whose shift along `b` forward sends to output `k` along `a`, and the other way round. Parts
of an axis (`shapes.parts`: blocks of it) are asked too: the part backward asks of an input is one
whose shift forward follows, and a whole-axis requirement never asks for one that would shift
the output block by block (which no LN removes).
"""

from __future__ import annotations

import re

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_lnfold import carry
from onnx_lnfold.carry.rules import RULES
from onnx_lnfold.core.blocked import Blocked
from onnx_lnfold.shapes.parts import WHOLE, Part
from onnx_lnfold.shapes.table import ShapeTable

from conftest import ROOT

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

    def build(self, op: str, inputs: list[str], n_out: int = 1, before=(), **attrs) -> tuple[ir.Node, ShapeTable]:
        """The node under test (after the nodes `before`, which make some of its inputs)."""
        outs = [f"out{k}" for k in range(n_out)]
        node = helper.make_node(op, inputs, outs, name="n", **attrs)
        declared = [helper.make_tensor_value_info(o, F, None) for o in outs]
        graph = helper.make_graph([*before, node], "g", self.inputs, declared, self.inits)
        proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
        proto.ir_version = 9
        model = ir.serde.deserialize_model(proto)
        return model.graph.node(len(before)), ShapeTable(model)


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
        # unknown, so the axis is followed through the target (`shapes.reshape._structural_axis`).
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
    axis = int(rng.integers(0, len(shape)))
    if rng.random() < 0.3:  # pieces of unequal lengths
        return b.build("Split", [b.data(shape), b.ints([shape[axis] // 2 - 1, shape[axis] // 2 + 1])], n_out=2, axis=axis)
    return b.build("Split", [b.data(shape)], n_out=2, axis=axis, num_outputs=2)


def _sequence_of(b: _Node, rng) -> tuple[onnx.NodeProto, list[int], int]:
    """A SplitToSequence of a data input: pieces of 1 (the axis kept or not), or of a length."""
    shape = [2 * d for d in _dims(rng, int(rng.integers(1, 4)))]
    axis = int(rng.integers(0, len(shape)))
    x = b.data(shape)
    choice = int(rng.integers(0, 3))
    if choice == 0:
        node = helper.make_node("SplitToSequence", [x], ["seq"], axis=axis, keepdims=int(rng.integers(0, 2)))
    else:
        sizes = b.ints(2 if choice == 1 else [1, shape[axis] - 1])
        node = helper.make_node("SplitToSequence", [x, sizes], ["seq"], axis=axis)
    return node, shape, axis


def _split_to_sequence(rng):
    b = _Node(rng)
    shape = [2 * d for d in _dims(rng, int(rng.integers(1, 4)))]
    return b.build("SplitToSequence", [b.data(shape), b.ints(2)], axis=int(rng.integers(0, len(shape))))


def _sequence_at(rng):
    b = _Node(rng)
    split, _, _ = _sequence_of(b, rng)
    return b.build("SequenceAt", ["seq", b.ints(int(rng.integers(0, 2)))], before=[split])


def _concat_from_sequence(rng):
    b = _Node(rng)
    split, shape, axis = _sequence_of(b, rng)
    attrs = onnx.helper.get_node_attr_value(split, "keepdims") if len(split.input) == 1 else 1
    new_axis = int(attrs == 0) if rng.random() < 0.8 else int(rng.integers(0, 2))
    at = axis if rng.random() < 0.8 else int(rng.integers(0, len(shape)))
    return b.build("ConcatFromSequence", ["seq"], before=[split], axis=at, new_axis=new_axis)


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
    "SplitToSequence": _split_to_sequence,
    "SequenceAt": _sequence_at,
    "ConcatFromSequence": _concat_from_sequence,
    "GatherND": _gather_nd,
}


def test_every_op_of_the_table_has_a_generator():
    assert set(MAKERS) == set(RULES)


def _broadcast_along(shapes: ShapeTable, node: ir.Node, index: int, axis: int, k: int, out_axis: int) -> bool:
    """Input `index` has size 1 along `axis` where output `k` has more: it carries no mean there,
    and backward asks it to be exactly zero rather than zero-mean."""
    in_shape, out_shape = _shape(shapes, node.inputs[index]), _shape(shapes, node.outputs[k])
    return in_shape[axis] == 1 and out_shape[out_axis] != 1


def _shape(shapes: ShapeTable, value: ir.Value):
    """A tensor's shape; a sequence's is that of the tensor SplitToSequence split (its
    coordinates, as the carry rules track it)."""
    producer = value.producer()
    if producer is not None and producer.op_type == "SplitToSequence":
        return shapes.shape(producer.inputs[0])
    return shapes.shape(value)


def _parts_of(shapes: ShapeTable, value: ir.Value, axis: int) -> list[Part]:
    """The whole axis; blocks of each proper divisor of its length, all of them or the first
    only; and those at position 0 of another axis."""
    shape = _shape(shapes, value) or (None,) * (axis + 1)
    size = shape[axis]
    if not isinstance(size, int):
        return [WHOLE]
    parts = [WHOLE] + [p for d in range(2, size) if size % d == 0 for p in (Part(d), Part(d, frozenset({0})))]
    others = [a for a in range(len(shape)) if a != axis]
    if others:
        parts += [p.with_where({others[0]: frozenset({0})}) for p in parts[:3]]
    return parts


@pytest.mark.parametrize("op", sorted(MAKERS))
def test_backward_and_forward_agree(op):
    rng = np.random.default_rng(sum(map(ord, op)))
    followed = 0  # links seen, so that a generator that only builds refused nodes fails
    for _ in range(CASES_PER_OP):
        node, shapes = MAKERS[op](rng)
        case = f"{op} {[_shape(shapes, v) for v in node.inputs]} -> {[_shape(shapes, v) for v in node.outputs]}"
        for k, out in enumerate(node.outputs):
            for a in range(len(_shape(shapes, out) or ())):
                for part in _parts_of(shapes, out, a):
                    reqs = carry.backward(node, k, a, shapes, part)
                    if isinstance(reqs, Blocked):
                        continue
                    assert reqs, case
                    for req in reqs:
                        if req.axis is None:
                            continue
                        followed += 1
                        moved = carry.forward(node, req.index, req.axis, shapes, req.part)
                        assert isinstance(moved, dict) and moved.get(k, (None,))[0] == a, (case, k, a, part, req, moved)
                        # What the centering does to the output is a shift an LN over it removes.
                        assert not part.uniform or moved[k][1].uniform, (case, k, a, req, moved)
        for i, inp in enumerate(node.inputs):
            for b in range(len(_shape(shapes, inp) or ())):
                for part in _parts_of(shapes, inp, b):
                    moved = carry.forward(node, i, b, shapes, part)
                    if isinstance(moved, Blocked):
                        continue
                    for k, (a, out_part) in moved.items():
                        if _broadcast_along(shapes, node, i, b, k, a):
                            continue
                        reqs = carry.backward(node, k, a, shapes, out_part)
                        assert isinstance(reqs, list), (case, i, b, part, k, a, out_part, reqs)
                        # A product of two per-channel constants: backward picks one as the stream.
                        if op == "Mul" and any(r.factor == i for r in reqs):
                            continue
                        assert any((r.index, r.axis) == (i, b) for r in reqs), (case, i, b, part, k, a, out_part, reqs)
    assert followed > 0


def test_jointly_linear_ops_are_the_sums():
    assert carry.JOINTLY_LINEAR == {"Add", "Sub", "Sum", "Concat", "Gemm", "Conv"}


def test_the_design_lists_every_op_of_the_table():
    """docs/DESIGN.md sections 2.1 (producers) and 2.2 (carry ops) name the ops of the table."""
    design = (ROOT / "docs" / "DESIGN.md").read_text()
    section = design[design.index("### 2.1") : design.index("### 2.3")]
    named = set(re.findall(r"`([A-Z][A-Za-z]+)[(`]", section))
    assert set(RULES) <= named, set(RULES) - named
    assert named - set(RULES) <= {"SkipLayerNormalization"}, named - set(RULES)


# --- the parts are right, numerically ------------------------------------------------------------

# The ops whose rules say something of parts beyond keeping them (and a few that keep them).
_PARTED = ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Split", "Concat", "Gather", "Slice",
           "SequenceAt", "ConcatFromSequence", "MatMul", "Add", "Identity")


def _blocks_view(array: np.ndarray, axis: int, part: Part) -> tuple[np.ndarray, np.ndarray]:
    """The array with `axis` as (count, block), and a mask (broadcastable to it) of the entries
    the part covers: its blocks, at its positions of other axes."""
    size = array.shape[axis]
    block = part.block or size
    view = array.reshape(array.shape[:axis] + (size // block, block) + array.shape[axis + 1 :])
    mask = np.ones(view.shape, dtype=bool)
    if part.blocks is not None:
        chosen = np.zeros(size // block, dtype=bool)
        chosen[list(part.blocks)] = True
        mask &= chosen.reshape((1,) * axis + (-1, 1) + (1,) * (array.ndim - axis - 1))
    for other, positions in part.where:
        at = other if other < axis else other + 1
        keep = np.zeros(view.shape[at], dtype=bool)
        keep[[p for p in positions if p < view.shape[at]]] = True
        mask &= keep.reshape((1,) * at + (-1,) + (1,) * (view.ndim - at - 1))
    return view, mask


def _center(array: np.ndarray, axis: int, part: Part) -> np.ndarray:
    """`array` made zero-mean in `part` (and left alone elsewhere)."""
    view, mask = _blocks_view(array.astype(np.float64), axis, part)
    return (view - view.mean(axis=axis + 1, keepdims=True) * mask).reshape(array.shape)


def _shift(rng, shape, axis: int, part: Part) -> np.ndarray:
    """A random shift constant within each block of `part`, zero outside it."""
    zeros = np.zeros(shape)
    view, mask = _blocks_view(zeros, axis, part)
    values = rng.normal(size=view.shape[: axis + 1] + (1,) + view.shape[axis + 2 :])
    return (np.broadcast_to(values, view.shape) * mask).reshape(shape)


def _holds(array: np.ndarray, axis: int, part: Part) -> bool:
    view, mask = _blocks_view(array, axis, part)
    means = view.mean(axis=axis + 1, keepdims=True)
    return bool(np.all(np.abs(np.where(mask, means, 0.0)) < 1e-9 * (1 + np.abs(array).max(initial=0.0))))


def _is_shift(change: np.ndarray, axis: int, part: Part) -> bool:
    """`change` is constant within each block of `part` and zero outside it."""
    view, mask = _blocks_view(change, axis, part)
    spread = np.abs(view - view.mean(axis=axis + 1, keepdims=True)).max(initial=0.0)
    return bool(spread < 1e-9 and np.abs(np.where(mask, 0.0, view)).max(initial=0.0) < 1e-9)


def _evaluate(shapes: ShapeTable, node: ir.Node, values: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    from onnx.reference import ReferenceEvaluator

    proto = ir.serde.serialize_model(shapes._model)
    for init in proto.graph.initializer:
        if init.name in values and init.data_type == TensorProto.FLOAT:
            init.CopyFrom(numpy_helper.from_array(values[init.name].astype(np.float64), init.name))
    feeds = {i.name: values[i.name].astype(np.float64) for i in proto.graph.input}
    for i in proto.graph.input:
        i.type.tensor_type.elem_type = TensorProto.DOUBLE
    for o in proto.graph.output:
        o.type.tensor_type.elem_type = TensorProto.DOUBLE
    names = [o.name for o in proto.graph.output]
    return dict(zip(names, ReferenceEvaluator(proto).run(None, feeds)))


def _source(value: ir.Value) -> ir.Value:
    """The tensor a sequence's coordinates are those of (itself for a tensor)."""
    producer = value.producer()
    return producer.inputs[0] if producer is not None and producer.op_type == "SplitToSequence" else value


@pytest.mark.parametrize("op", _PARTED)
def test_parts_hold_numerically(op):
    """Backward: inputs made zero-mean in the parts it asks leave the output zero-mean in its
    part. Forward: a shift of an input in a part changes each output it names by a shift in the
    part named, and no other output."""
    rng = np.random.default_rng(7 + sum(map(ord, op)))
    checked = 0
    for _ in range(CASES_PER_OP):
        node, shapes = MAKERS[op](rng)
        graph_values = {v.name: v for v in [*node.graph.inputs, *node.graph.initializers.values()]}
        known = [_shape(shapes, v) for v in graph_values.values()]
        if any(shape is None or not all(isinstance(d, int) for d in shape) for shape in known):
            continue  # named dims: no sizes to draw values of
        base = {name: rng.normal(0.3, 1.0, size=_shape(shapes, v)) for name, v in graph_values.items() if v.dtype == ir.DataType.FLOAT}
        base.update({name: np.asarray(v.const_value.numpy()) for name, v in graph_values.items() if v.dtype != ir.DataType.FLOAT})
        for k, out in enumerate(node.outputs):
            if out.producer() is not node or _shape(shapes, out) is None:
                continue
            for a in range(len(_shape(shapes, out))):
                for part in _parts_of(shapes, out, a):
                    reqs = carry.backward(node, k, a, shapes, part)
                    if isinstance(reqs, Blocked) or any(r.factor is not None for r in reqs):
                        continue
                    values = dict(base)
                    for r in reqs:
                        name = _source(node.inputs[r.index]).name
                        if r.axis is None:
                            values[name] = np.zeros_like(values[name])
                        else:
                            values[name] = _center(values[name], r.axis, r.part)
                    got = _evaluate(shapes, node, values)[out.name]
                    assert _holds(got, a, part), (op, k, a, part, reqs)
                    checked += 1
        for i, inp in enumerate(node.inputs):
            source = _source(inp) if inp is not None else None
            if source is None or source.name not in base or source.dtype != ir.DataType.FLOAT:
                continue
            for b in range(base[source.name].ndim):
                for part in _parts_of(shapes, inp, b):
                    moved = carry.forward(node, i, b, shapes, part)
                    if isinstance(moved, Blocked):
                        continue
                    before = _evaluate(shapes, node, base)
                    shifted = dict(base)
                    shifted[source.name] = base[source.name] + _shift(rng, base[source.name].shape, b, part)
                    after = _evaluate(shapes, node, shifted)
                    for k, out in enumerate(node.outputs):
                        change = after[out.name] - before[out.name]
                        if k in moved:
                            a, out_part = moved[k]
                            assert _is_shift(change, a, out_part), (op, i, b, part, k, moved[k])
                        else:
                            assert np.abs(change).max(initial=0.0) < 1e-9, (op, i, b, part, k)
                    checked += 1
    assert checked > 0
