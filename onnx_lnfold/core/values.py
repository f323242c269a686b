"""What a tensor holds for every model input, read from the graph: the one value every element
of it is (`fill_of`), seen through the ops exporters write around constants (docs/DESIGN.md
section 2.5). Pure: reads the IR, mutates nothing.

TorchScript writes `LayerNorm(bias=False)` and `elementwise_affine=False` as an all-zero beta and
an all-one gamma; `torch.zeros_like(x)` becomes `ConstantOfShape(Shape(x))` (TorchScript) or an
`Expand` of a zero (dynamo); a zero can reach a graph through `Cast`, `Reshape`, `Unsqueeze`. A
zero tensor is already zero-mean, and a zero beta is no beta: the steps that ask read this.

Two strengths. `exact=True`: the value for every input, bit for bit (an LN's beta dropped must
have been an exact zero). `exact=False` also takes `Mul(x, 0)` as 0, which it is wherever `x` is
finite: a zero-mean proof may, because a row holding inf or NaN makes LayerNorm and RMSNorm both
NaN whatever the proof says.
"""

from __future__ import annotations

import contextlib
import weakref

import numpy as np
import onnx_ir as ir

from onnx_lnfold.core.ir import FLOAT_TYPES, constant_of, is_standard, release_tensor

# Ops whose output holds only values of their first input (moved, repeated, reshaped, selected).
_PASS_FIRST = frozenset(
    {"Identity", "Expand", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Transpose", "Tile", "Slice", "Gather"}
)
_INT_TYPES = frozenset({ir.DataType.INT64, ir.DataType.INT32, ir.DataType.INT8, ir.DataType.UINT8, ir.DataType.BOOL})
# Deep enough for every chain of these ops an exporter writes around one constant.
_MAX_DEPTH = 16
# Elements of a tensor compared with its first at a time (`_tensor_fill`), after a first look at
# a few (a page of float32), which settles a trained weight without touching more of its file.
_COMPARED = 1 << 18
_FIRST_COMPARED = 1 << 10


def fill_of(value: ir.Value | None, exact: bool = True, memo: dict | None = None) -> float | None:
    """The one value every element of `value` holds for every model input (a float; a product of
    two such values to float64's precision, exact for 0 and 1), or None when it is not one value or
    the graph does not show it. `memo`: a dict the caller keeps while the graph does not change,
    where the ops that only pass their first input on are walked once (a chain of Identity nodes
    is otherwise walked again from each of its tensors)."""
    return _fill(value, exact, 0, memo)


def is_zero(value: ir.Value | None, exact: bool = True, memo: dict | None = None) -> bool:
    fill = fill_of(value, exact, memo)
    return fill is not None and fill == 0.0


def _passes(value: ir.Value | None) -> ir.Node | None:
    """The node `value` comes from where it only passes its first input on, else None."""
    if value is None or value.is_graph_input():
        return None
    node = value.producer()
    if node is None or not is_standard(node) or value.index() != 0:
        return None
    op = node.op_type
    return node if op in _PASS_FIRST or (op == "Dropout" and _inference_dropout(node)) else None


def _reach(value: ir.Value, memo: dict) -> tuple[ir.Value | None, int]:
    """The first tensor up the ops that pass `value` on that is not passed on, and how many of them
    lie between; a distance over `_MAX_DEPTH` is `_MAX_DEPTH + 1` (no walk goes further). One
    iterative walk to that tensor (or to one already in `memo`) answers for every tensor on the way,
    each kept in `memo`: the next query, up or down the chain, is answered at once."""
    path: list[ir.Value] = []
    seen: set[ir.Value] = set()
    current: ir.Value | None = value
    while True:
        if current is not None and current in memo:
            end, steps = memo[current]
            break
        node = _passes(current)
        if node is None:
            end, steps = current, 0
            break
        if current in seen:  # a cycle of such ops (an invalid graph): no walk ever leaves it
            end, steps = None, _MAX_DEPTH + 1
            break
        seen.add(current)
        path.append(current)
        current = node.inputs[0] if node.inputs else None
    for passed in reversed(path):
        steps = min(steps + 1, _MAX_DEPTH + 1)
        if steps > _MAX_DEPTH:
            end = None
        memo[passed] = (end, steps)
    return end, steps


def _fill(value: ir.Value | None, exact: bool, depth: int, memo: dict | None = None) -> float | None:
    if memo is not None and _passes(value) is not None:
        # what the recursion below would reach through the ops that pass their input on
        end, steps = _reach(value, memo)
        if depth + steps > _MAX_DEPTH:
            return None
        value, depth = end, depth + steps
    if value is None or value.is_graph_input() or depth > _MAX_DEPTH:
        return None
    node = value.producer()
    if node is None:
        tensor = constant_of(value)  # an initializer
        return None if tensor is None else _tensor_fill(tensor)
    if not is_standard(node) or value.index() != 0:
        return None
    op = node.op_type
    if op == "Constant":
        return _constant_node_fill(node)
    if op == "ConstantOfShape":
        attr = node.attributes.get("value")
        return 0.0 if attr is None else _tensor_fill(attr.as_tensor())  # the spec's default: a float 0
    if op in _PASS_FIRST or (op == "Dropout" and _inference_dropout(node)):
        return _fill(node.inputs[0] if node.inputs else None, exact, depth + 1, memo)
    if op == "Cast":
        fill = _fill(node.inputs[0], exact, depth + 1, memo)
        return _cast(fill, node.attributes.get_int("to", 0))
    if op == "Neg":
        fill = _fill(node.inputs[0], exact, depth + 1, memo)
        return None if fill is None else -fill
    if op == "Concat":
        fills = {_fill(v, exact, depth + 1, memo) for v in node.inputs}
        return fills.pop() if len(fills) == 1 else None
    if op in ("Mul", "Add", "Sub") and len(node.inputs) == 2:
        a, b = (_fill(v, exact, depth + 1, memo) for v in node.inputs)
        if a is not None and b is not None:
            if op == "Mul":  # two floats' product is exact in float64: it is 0 or 1 where theirs is
                return float(np.multiply(a, b))
            if 0.0 in (a, b):  # adding a zero: the other, in any precision (a sum of two others may round)
                return b if a == 0.0 and op == "Add" else (-b if a == 0.0 else a)
            return None
        if op == "Mul" and not exact and 0.0 in (a, b):
            return 0.0  # x * 0, for every finite x
    return None


def _constant_node_fill(node: ir.Node) -> float | None:
    """A Constant node's fill, read from its attribute as it is (`ir.convenience.get_const_tensor`
    names the attribute's tensor after the output: this analysis changes nothing)."""
    if len(node.attributes) != 1:
        return None
    name, attr = next(iter(node.attributes.items()))
    if attr.is_ref():
        return None
    if name == "value":
        return _tensor_fill(attr.as_tensor())
    if name in ("value_float", "value_floats", "value_int", "value_ints"):
        values = np.asarray(attr.value, dtype=np.float64).reshape(-1)
        return float(values[0]) if values.size and np.all(values == values[0]) else None
    return None


# Fills already read, by tensor (an onnx-ir tensor is immutable; its identity is its key): the
# proofs ask about the same biases and weights many times, and each read maps an external file.
_FILLS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _tensor_fill(tensor: ir.TensorProtocol) -> float | None:
    try:
        return _FILLS[tensor]
    except (KeyError, TypeError):  # TypeError: a tensor that cannot be weakly referenced
        pass
    fill = _read_fill(tensor)
    with contextlib.suppress(TypeError):
        _FILLS[tensor] = fill
    return fill


def _read_fill(tensor: ir.TensorProtocol) -> float | None:
    """The one value every element of `tensor` holds, or None. Compared a stretch at a time: a
    weight that holds several values shows it in its first stretch (the rest of a mapped weight is
    never touched), and an external weight's map is closed once read, or its pages would stay in
    the process's memory for as long as the tensor lives (every weight the proofs asked about)."""
    if tensor.size == 0 or tensor.dtype not in FLOAT_TYPES | _INT_TYPES:
        return None
    try:
        flat = np.asarray(tensor.numpy()).reshape(-1)
        first = flat[0]
        if not np.all(flat[:_FIRST_COMPARED] == first):  # a trained weight: one page of it says so
            return None
        for start in range(0, flat.size, _COMPARED):
            if not np.all(flat[start : start + _COMPARED] == first):
                return None
        return float(first)
    finally:
        flat = None
        release_tensor(tensor)


def _cast(fill: float | None, to: int) -> float | None:
    """`fill` cast to the ONNX type `to`, where that is exact to tell (0 and 1 are every type's)."""
    if fill is None:
        return None
    if fill in (0.0, 1.0):
        return fill
    try:
        dtype = ir.DataType(to)
    except ValueError:
        return None
    if dtype not in FLOAT_TYPES:
        return None
    return float(np.asarray(fill, dtype=np.float64).astype(dtype.numpy()))


def _inference_dropout(node: ir.Node) -> bool:
    """A Dropout that passes its input: no training_mode input, or a constant false one."""
    if len(node.inputs) < 3 or node.inputs[2] is None:
        return True
    flag = constant_of(node.inputs[2])
    return flag is not None and not bool(np.asarray(flag.numpy()).reshape(-1)[0])
