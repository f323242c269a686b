"""How a mean along one axis moves through one node (docs/DESIGN.md section 2).

Two questions are asked of every node, one per direction, and both are answered from the same
per-op axis bookkeeping so that the analysis and the side-effect check can never disagree:

- `backward`: for output `k` to be zero-mean along `axis`, which inputs must be zero-mean, and
  along which of their axes? (Producers such as MatMul answer "the weight, along its output
  axis"; the data input is free because a centered weight makes any input's product centered.)
- `forward`: if input `i` changes by a shift that is constant along `axis`, which outputs change,
  and is each change still a shift constant along one of their axes?

Both return a `Blocked` (its code and reason) when the node breaks the chain. Axes are always
non-negative.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from onnx_lnfold._blocked import Blocked
from onnx_lnfold._ir import FLOAT_TYPES, NARROW_FLOAT_TYPES, attr_or_input_ints, is_standard, node_label, normalize_axis
from onnx_lnfold._reshape import reshaped_axis
from onnx_lnfold._shapes import Shape, ShapeTable

@dataclass(frozen=True)
class Requirement:
    """Input `index` must be zero-mean along `axis` (its own coordinates).

    `axis=None` means the input does not vary along the tracked axis (missing by broadcasting, or
    of size 1 there): its contribution is constant along the axis, so it must be exactly zero.
    """

    index: int
    axis: int | None
    # Index of a constant input that multiplies this one and varies along the axis (a layer
    # scale): then `input * factor`, not the input, must be zero-mean (an affine chain).
    factor: int | None = None


def axis_vector(node: ir.Node, index: int, out_rank: int, axis: int, shapes: ShapeTable) -> np.ndarray | None:
    """Input `index` of `node` as a 1-D vector along output `axis`, if it is a constant that varies
    along that axis only (a per-channel scale); else None."""
    value = node.inputs[index]
    if value is None or value.is_graph_input():
        return None
    tensor = ir.convenience.get_const_tensor(value)
    if tensor is None:
        return None
    shape = tuple(tensor.shape.dims)
    in_axis = axis - (out_rank - len(shape))
    if in_axis < 0 or shape[in_axis] == 1:
        return None
    if any(d != 1 for i, d in enumerate(shape) if i != in_axis):
        return None  # checked before reading: a weight matrix is never loaded just to say no
    return np.asarray(tensor.numpy()).astype(np.float64).reshape(-1)


def _aligned(out_rank: int, in_shape: Shape, out_shape: Shape | None, axis: int) -> int | None:
    """Numpy broadcasting: the input axis aligned with output `axis`, or None if the input is
    constant along it (missing, or size 1 broadcast to more)."""
    in_axis = axis - (out_rank - len(in_shape))
    if in_axis < 0:
        return None
    if in_shape[in_axis] == 1 and (out_shape is None or out_shape[axis] != 1):
        return None
    return in_axis


def _constant_along(shapes: ShapeTable, value: ir.Value | None, out_rank: int, axis: int) -> bool:
    shape = shapes.shape(value)
    if shape is None:
        return False
    in_axis = axis - (out_rank - len(shape))
    return in_axis < 0 or shape[in_axis] == 1


def _out_rank(node: ir.Node, shapes: ShapeTable, index: int = 0) -> int | None:
    rank = shapes.rank(node.outputs[index])
    if rank is None and node.op_type in _ELEMENTWISE:
        ranks = [shapes.rank(v) for v in node.inputs if v is not None]
        if ranks and all(r is not None for r in ranks):
            rank = max(ranks)  # type: ignore[type-var]
    return rank


_ELEMENTWISE = {"Add", "Sub", "Sum", "Mul", "Div"}
_UNARY = {"Neg", "Identity", "Dropout", "Cast"}
_RESHAPES = {"Reshape", "Flatten", "Squeeze", "Unsqueeze"}
# Ops whose changed inputs add up linearly: several of them may change at once.
# (SkipLayerNormalization normalizes input + skip + bias.)
JOINTLY_LINEAR = {"Add", "Sub", "Sum", "Concat", "Gemm", "Conv", "SkipLayerNormalization"}


def _unary_check(node: ir.Node, shapes: ShapeTable) -> Blocked | None:
    if node.op_type == "Cast":
        to = ir.DataType(node.attributes.get_int("to", 0))
        if to not in FLOAT_TYPES:
            return Blocked("not-float-cast", f"{node_label(node)} casts to {to.name}, not a float type")
        if to in NARROW_FLOAT_TYPES and shapes.dtype(node.inputs[0]) != to:
            # Rounding to fewer bits is not linear: the centered tensor rounds differently, and
            # the difference is no longer a shift the LN removes.
            return Blocked("narrowing-cast", f"{node_label(node)} narrows to {to.name}, whose rounding does not commute with centering")
    if node.op_type == "Dropout" and len(node.inputs) > 2 and node.inputs[2] is not None:
        mode = ir.convenience.get_const_tensor(node.inputs[2])
        if mode is None or bool(np.asarray(mode.numpy()).reshape(-1)[0]):
            return Blocked("training-dropout", f"{node_label(node)} may run in training mode")
    return None


def _reduce_axes(node: ir.Node, rank: int) -> list[int] | Blocked:
    axes = attr_or_input_ints(node, "axes", 1)
    if axes is None:
        return Blocked("axes-not-constant", f"{node_label(node)} reduces over axes that are not constant")
    if not axes:
        if node.attributes.get_int("noop_with_empty_axes", 0):
            return []
        return list(range(rank))
    return sorted(normalize_axis(a, rank) for a in axes)


def _layout_axis(node: ir.Node, shapes: ShapeTable, axis: int, *, forward: bool) -> int | Blocked:
    """Map `axis` between input 0 and output 0 of a layout op (either direction)."""
    op = node.op_type
    src, dst = (node.inputs[0], node.outputs[0]) if forward else (node.outputs[0], node.inputs[0])
    if op in _RESHAPES:
        mapped = reshaped_axis(node, shapes, axis, forward=forward)
        if mapped is None:
            return Blocked("axis-not-kept", f"{node_label(node)} does not keep the normalized axis whole")
        return mapped
    src_shape, dst_shape = shapes.shape(src), shapes.shape(dst)
    if src_shape is None or dst_shape is None:
        return Blocked("unknown-shape", f"the shape around {node_label(node)} is unknown, so the axis cannot be followed")
    if op == "Transpose":
        perm_attr = node.attributes.get("perm")
        perm = list(perm_attr.as_ints()) if perm_attr else list(reversed(range(len(src_shape))))
        return perm.index(axis) if forward else perm[axis]
    if op == "Expand":
        offset = len(dst_shape) - len(src_shape)  # forward: out rank - in rank; backward: its negative
        if forward:
            return axis + offset
        if axis + offset >= 0:
            return axis + offset
        return Blocked("axis-not-kept", f"{node_label(node)} broadcasts along the axis")
    if op in ("ReduceMean", "ReduceSum"):
        in_rank = len(src_shape) if forward else len(dst_shape)
        reduced = _reduce_axes(node, in_rank)
        if isinstance(reduced, Blocked):
            return reduced
        keep = node.attributes.get_int("keepdims", 1)
        kept = [a for a in range(in_rank) if a not in reduced]
        if forward:
            if axis in reduced:
                return Blocked("axis-not-kept", f"{node_label(node)} reduces over the normalized axis")
            return axis if keep else kept.index(axis)
        in_axis = axis if keep else kept[axis]
        if in_axis in reduced:
            return Blocked("axis-not-kept", f"{node_label(node)} reduces over the normalized axis")
        return in_axis
    if op == "Slice":
        in_shape = src_shape if forward else dst_shape
        out_shape = dst_shape if forward else src_shape
        sliced = attr_or_input_ints(node, "axes", 3)
        if sliced is None:
            return Blocked("axes-not-constant", f"{node_label(node)} slices axes that are not constant")
        if not sliced:
            starts = attr_or_input_ints(node, "starts", 1) or []
            sliced = list(range(len(starts)))
        sliced = [normalize_axis(a, len(in_shape)) for a in sliced]
        if axis in sliced and (in_shape[axis] is None or in_shape[axis] != out_shape[axis]):
            return Blocked("axis-not-kept", f"{node_label(node)} slices the normalized axis")
        return axis
    if op in ("Split", "Concat"):
        rank = len(src_shape)
        along = normalize_axis(node.attributes.get_int("axis", 0), rank)
        if along == axis:
            return Blocked("axis-not-kept", f"{node_label(node)} splits or joins along the normalized axis")
        return axis
    raise AssertionError(op)


def _gather_axis(node: ir.Node, shapes: ShapeTable, axis: int, *, forward: bool) -> int | Blocked:
    data_shape = shapes.shape(node.inputs[0])
    indices_rank = shapes.rank(node.inputs[1])
    if data_shape is None or indices_rank is None:
        return Blocked("unknown-shape", f"the shape around {node_label(node)} is unknown, so the axis cannot be followed")
    g = normalize_axis(node.attributes.get_int("axis", 0), len(data_shape))
    if forward:  # data axis -> output axis
        if axis == g:
            return Blocked("axis-not-kept", f"{node_label(node)} gathers along the normalized axis")
        return axis if axis < g else axis + indices_rank - 1
    if axis < g:
        return axis
    if axis >= g + indices_rank:
        return axis - indices_rank + 1
    return Blocked("axis-not-kept", f"the normalized axis of {node_label(node)} comes from its indices")


_LAYOUT = {"Transpose", "Expand", "ReduceMean", "ReduceSum", "Slice", "Split", "Concat"} | _RESHAPES


def backward(node: ir.Node, output_index: int, axis: int, shapes: ShapeTable) -> list[Requirement] | Blocked:
    """Which inputs must be zero-mean for `node.outputs[output_index]` to be zero-mean along `axis`."""
    op = node.op_type
    if not is_standard(node):
        return Blocked("not-carried", f"{node_label(node)} ({node.domain}) does not carry a zero mean")
    if op in _UNARY:
        return _unary_check(node, shapes) or [Requirement(0, axis)]
    if op in _ELEMENTWISE:
        out_rank = _out_rank(node, shapes)
        in_shapes = [shapes.shape(v) for v in node.inputs]
        if out_rank is None or any(s is None for s in in_shapes):
            return Blocked("unknown-shape", f"the shapes around {node_label(node)} are unknown")
        out_shape = shapes.shape(node.outputs[0])
        aligned = [_aligned(out_rank, s, out_shape, axis) for s in in_shapes]  # type: ignore[arg-type]
        if op in ("Add", "Sub", "Sum"):
            return [Requirement(i, a) for i, a in enumerate(aligned)]
        if op == "Div":
            if aligned[1] is not None:
                return Blocked("varying-factor", f"{node_label(node)} divides by a tensor that varies along the normalized axis")
            return [Requirement(0, aligned[0])]
        # Mul: a factor constant along the axis keeps a zero mean zero.
        if aligned[0] is not None and aligned[1] is None:
            return [Requirement(0, aligned[0])]
        if aligned[1] is not None and aligned[0] is None:
            return [Requirement(1, aligned[1])]
        if aligned[0] is None:
            return Blocked("constant-along-axis", f"{node_label(node)} multiplies two tensors that are constant along the normalized axis")
        for factor in (1, 0):  # a constant per-channel scale: an affine chain
            if axis_vector(node, factor, out_rank, axis, shapes) is not None:
                return [Requirement(1 - factor, aligned[1 - factor], factor=factor)]
        return Blocked(
            "varying-factor",
            f"{node_label(node)} multiplies by a tensor that varies along the normalized axis "
            "and is not a constant per-channel scale",
        )
    if op == "MatMul":
        out_rank = _out_rank(node, shapes)
        b_rank = shapes.rank(node.inputs[1])
        if out_rank is None or b_rank is None:
            return Blocked("unknown-shape", f"the shapes around {node_label(node)} are unknown")
        if b_rank < 2 or axis != out_rank - 1:
            return Blocked("wrong-axis", f"{node_label(node)} does not produce the normalized axis from its weight's columns")
        return [Requirement(1, b_rank - 1)]
    if op == "Gemm":
        if axis != 1:
            return Blocked("wrong-axis", f"{node_label(node)} is normalized along its rows, not its output columns")
        reqs = [Requirement(1, 0 if node.attributes.get_int("transB", 0) else 1)]
        if len(node.inputs) > 2 and node.inputs[2] is not None:
            c_shape = shapes.shape(node.inputs[2])
            if c_shape is None:
                return Blocked("unknown-shape", f"the shape of the bias of {node_label(node)} is unknown")
            reqs.append(Requirement(2, _aligned(2, c_shape, shapes.shape(node.outputs[0]), 1)))
        return reqs
    if op == "Conv":
        if node.attributes.get_int("group", 1) != 1:
            return Blocked(
                "grouped-conv",
                f"{node_label(node)} is a grouped Conv (group={node.attributes.get_int('group', 1)}): "
                "its output channels cannot be centered by editing weights",
            )
        if axis != 1:
            return Blocked("wrong-axis", f"{node_label(node)} is normalized along an axis other than its channels")
        reqs = [Requirement(1, 0)]
        if len(node.inputs) > 2 and node.inputs[2] is not None:
            reqs.append(Requirement(2, 0))
        return reqs
    if op == "Gather":
        mapped = _gather_axis(node, shapes, axis, forward=False)
        return mapped if isinstance(mapped, Blocked) else [Requirement(0, mapped)]
    if op == "Concat":
        mapped = _layout_axis(node, shapes, axis, forward=False)
        if isinstance(mapped, Blocked):
            return mapped
        return [Requirement(i, mapped) for i in range(len(node.inputs))]
    if op in _LAYOUT:
        mapped = _layout_axis(node, shapes, axis, forward=False)
        if isinstance(mapped, Blocked):
            return mapped
        if op == "Expand" and shapes.shape(node.inputs[0])[mapped] == 1:  # type: ignore[index]
            return [Requirement(0, None)]
        return [Requirement(0, mapped)]
    return Blocked("not-carried", f"{node_label(node)} does not carry a zero mean")


def absorbs(node: ir.Node, input_index: int, axis: int, shapes: ShapeTable) -> dict[int, int] | Blocked | None:
    """Whether `node` removes a shift along `axis` arriving at `input_index`.

    Returns None when the node is not a normalization at all, a reason when it is one that cannot
    absorb this shift, and otherwise the outputs that still carry the shift (SkipLayerNorm's sum).
    """
    if node.op_type in ("Shape", "Size") and is_standard(node):
        return {}  # reads only the shape, which a shift leaves alone
    if node.op_type == "LayerNormalization" and is_standard(node):
        if input_index != 0:
            return Blocked("normalization-parameter", f"it is the scale or bias of {node_label(node)}")
        rank = shapes.rank(node.inputs[0])
        if rank is None:
            return Blocked("unknown-shape", f"the rank of the input of {node_label(node)} is unknown")
        first = normalize_axis(node.attributes.get_int("axis", -1), rank)
        if first != axis or axis != rank - 1:
            return Blocked("normalizes-other-axis", f"{node_label(node)} normalizes over other axes than the shifted one")
        if any(out is not None and (out.uses() or out.is_graph_output()) for out in node.outputs[1:]):
            return Blocked("stats-output-used", f"{node_label(node)} exposes its Mean/InvStdDev outputs")
        return {}
    if node.op_type == "SkipLayerNormalization" and node.domain == "com.microsoft":
        if input_index not in (0, 1, 4):
            return Blocked("normalization-parameter", f"it is the gamma or beta of {node_label(node)}")
        rank = shapes.rank(node.inputs[input_index])
        if rank is None or axis != rank - 1:
            return Blocked("normalizes-other-axis", f"{node_label(node)} normalizes over the last axis, not the shifted one")
        outs = node.outputs
        if any(i < len(outs) and outs[i] is not None and (outs[i].uses() or outs[i].is_graph_output()) for i in (1, 2)):
            return Blocked("stats-output-used", f"{node_label(node)} exposes its Mean/InvStdDev outputs")
        if len(outs) > 3 and outs[3] is not None:
            return {3: shapes.rank(outs[3]) - 1} if shapes.rank(outs[3]) else {3: axis}
        return {}
    return None


# Inputs whose values never decide the shape of the node's outputs (only their shapes do), by op:
# None for every input. Reshape's target, Expand's shape, Slice's bounds, If's condition... do.
_SHAPE_BLIND_INPUTS: dict[str, set[int] | None] = {
    **dict.fromkeys(
        ("Add", "Sub", "Mul", "Div", "Pow", "Sum", "Neg", "Identity", "Cast", "Dropout", "Relu", "Gelu",
         "Erf", "Tanh", "Sigmoid", "Sqrt", "Exp", "Abs", "MatMul", "Gemm", "Softmax", "Transpose", "Concat",
         "LayerNormalization", "Conv"),
        None,
    ),
    **dict.fromkeys(
        ("Gather", "GatherElements", "GatherND", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Expand",
         "Slice", "Split", "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin"),
        {0},
    ),
}


def _only_shape_read(node: ir.Node, input_index: int) -> bool:
    """Whether a change of input `input_index` reaches nothing but Shape/Size nodes: the node's
    outputs are read only for their shapes, which do not depend on that input's values."""
    if not is_standard(node) or node.op_type not in _SHAPE_BLIND_INPUTS:
        return False
    blind = _SHAPE_BLIND_INPUTS[node.op_type]
    if blind is not None and input_index not in blind:
        return False
    for out in node.outputs:
        if out is None:
            continue
        if out.is_graph_output():
            return False
        if any(use.node.op_type not in ("Shape", "Size") or not is_standard(use.node) for use in out.uses()):
            return False
    return True


def forward(node: ir.Node, input_index: int, axis: int, shapes: ShapeTable) -> dict[int, int] | Blocked:
    """Where a shift constant along `axis` at input `input_index` goes: {output index: axis}."""
    op = node.op_type
    why = f"it feeds {node_label(node)}"
    if _only_shape_read(node, input_index):
        return {}  # e.g. TorchScript's `x[:, :, -1].shape`: a Gather along the axis read by Shape
    if not is_standard(node):
        return Blocked("not-carried", f"{why}, which does not pass a mean shift through")
    if op in _UNARY:
        reason = _unary_check(node, shapes)
        return reason.reworded(f"{why}: {reason.reason}") if reason else {0: axis}
    if op in _ELEMENTWISE:
        out_rank = _out_rank(node, shapes)
        in_rank = shapes.rank(node.inputs[input_index])
        if out_rank is None or in_rank is None:
            return Blocked("unknown-shape", f"{why}, whose shapes are unknown")
        out_axis = axis + out_rank - in_rank
        if op in ("Add", "Sub", "Sum"):
            return {0: out_axis}
        if op == "Div" and input_index == 1:
            return Blocked("non-data-input", f"{why} as the divisor")
        other = node.inputs[1 - input_index]
        if not _constant_along(shapes, other, out_rank, out_axis):
            if op == "Mul" and axis_vector(node, 1 - input_index, out_rank, out_axis, shapes) is not None:
                return {0: out_axis}  # a per-channel scale: the caller rescales the shift
            return Blocked("varying-factor", f"{why}, which multiplies it by a tensor that varies along the axis")
        return {0: out_axis}
    if op == "MatMul":
        b_rank = shapes.rank(node.inputs[1])
        out_rank = _out_rank(node, shapes)
        if input_index == 1 and b_rank is not None and b_rank >= 2 and axis == b_rank - 1 and out_rank:
            return {0: out_rank - 1}
        return Blocked("mixes-shift", f"{why}, which mixes the shift into every output")
    if op == "Gemm":
        if input_index == 1 and axis == (0 if node.attributes.get_int("transB", 0) else 1):
            return {0: 1}
        if input_index == 2:
            c_rank = shapes.rank(node.inputs[2])
            if c_rank is not None and axis + 2 - c_rank == 1:
                return {0: 1}
        return Blocked("mixes-shift", f"{why}, which mixes the shift into every output")
    if op == "Conv":
        if node.attributes.get_int("group", 1) == 1 and input_index in (1, 2) and axis == 0:
            return {0: 1}
        return Blocked("mixes-shift", f"{why}, which mixes the shift into every output")
    if op == "Gather":
        if input_index != 0:
            return Blocked("non-data-input", f"{why} as indices")
        mapped = _gather_axis(node, shapes, axis, forward=True)
        return mapped.reworded(f"{why}: {mapped.reason}") if isinstance(mapped, Blocked) else {0: mapped}
    if op in _LAYOUT:
        if input_index != 0 and op != "Concat":
            return Blocked("non-data-input", f"{why} as a shape or axes input")
        if op == "Concat":
            src_rank = shapes.rank(node.inputs[input_index])
            along = node.attributes.get_int("axis", 0)
            if src_rank is None:
                return Blocked("unknown-shape", f"{why}, whose shapes are unknown")
            if normalize_axis(along, src_rank) == axis:
                return Blocked("axis-not-kept", f"{why}, which joins along the shifted axis")
            return {0: axis}
        mapped = _layout_axis(node, shapes, axis, forward=True)
        if isinstance(mapped, Blocked):
            return mapped.reworded(f"{why}: {mapped.reason}")
        if op == "Split":
            return {i: mapped for i in range(len(node.outputs))}
        return {0: mapped}
    return Blocked("not-carried", f"{why}, which does not pass a mean shift through")
