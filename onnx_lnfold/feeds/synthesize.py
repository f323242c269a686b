"""Feeds synthesized from the graph's input specs, for verification and the benchmarks.

What a real export accepts is read from the graph, not guessed from input names:

- dims are solved as a system: a dim written as an expression (`past_sequence_length + 1`,
  `past_sequence_length + sequence_length`) is evaluated from the symbols it names, so an
  attention mask gets the total length of the past and the new tokens;
- a symbol first met at axis 0 is the batch size; every other symbol (sequence, past length)
  gets the sequence length, so a KV cache is never empty;
- an input that feeds a convolution gets the channels of its weight and a spatial size the
  convolutions accept: the grid of a position table the patch embedding is added to (ViT),
  otherwise one that leaves `sequence_length` positions after the chain of strided
  convolutions that reads it (an audio feature extractor);
- integer inputs that index a table (Gather) are drawn inside its row count; other integers
  (attention masks) are ones; floats are standard normal, but for parameters of the run (below);
  bools take the value asked for.

A float input the graph fixes entirely (no dynamic dim), with at most `_PARAMETER_ELEMENTS` elements
along at most one axis, is a parameter of the run, not data, and N(0, 1) can be outside its
domain: a scalar is a knob (a speed, a length or noise scale, a temperature) whose default is 1 and
which may have to be positive (a speed of -0.3 tiles nothing), so it is drawn log-uniform in
`_KNOB_RANGE`, around 1 and never 1 itself (a scale the fold mishandled still shows); a vector is a
conditioning vector (a style or speaker embedding, a row of a learned table), drawn N(0, 1) at
`_VECTOR_SCALE`: of the order of the data, modest enough that a model that turns it into lengths
(a duration predictor) stays near the range it was trained on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from onnx_lnfold.core.errors import InvalidInput
from onnx_lnfold.core.ir import const_tensor, constant_of
from onnx_lnfold.core.ops import NORM_OPS
from onnx_lnfold.core.options import SettingMismatch
from onnx_lnfold.feeds.budget import check_size
from onnx_lnfold.feeds.dims import DimExpr

# Ops an index tensor may pass through on its way to a Gather without changing its values.
_INDEX_PASSTHROUGH = {"Cast", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity", "Expand"}


# Ops between a graph input and the convolution that reads it which keep its spatial axes
# (casts, normalization of pixel values, an Unsqueeze that adds the channel axis of audio).
_TO_CONV = {"Cast", "Identity", "Unsqueeze", "Mul", "Div", "Add", "Sub"}


# Ops between two convolutions of a feature extractor that keep the length of the spatial axes
# (a Transpose pair around a LayerNormalization over channels, as Wav2Vec2's "layer" norm has it,
# a Reshape pair around an InstanceNormalization, as its GroupNorm is exported; inputs are
# synthesized from the folded model, so its RMSNorms too). A wrong guess costs nothing: the
# original model is the judge of every input set.
_BETWEEN_CONVS = _TO_CONV | {
    "Relu", "Gelu", "Erf", "Tanh", "Sigmoid", "LeakyRelu", "Softplus", "Pow", "Sqrt", "Neg",
    "InstanceNormalization", "GroupNormalization", "BatchNormalization", "Transpose", "Reshape", "Dropout", "Pad",
} | {op.op_type for op in NORM_OPS if not (op.skip or op.embed)}  # fmt: skip


_POOLS = {"MaxPool", "AveragePool", "LpPool"}


# The longest side of a patch grid the sizes above give an image without a position table.
_MAX_GRID_SIDE = 16


# How image preprocessors normalize pixels in [0, 1] (ImageNet's statistics, per RGB channel).
_IMAGE_MEAN = (0.485, 0.456, 0.406)


_IMAGE_STD = (0.229, 0.224, 0.225)


# The largest parameter input (see the module's docstring): a style or speaker embedding has 64 to
# 512 entries; an input that large or larger the graph fixes entirely is data of a static export.
_PARAMETER_ELEMENTS = 1024


_KNOB_RANGE = (0.8, 1.25)  # a scalar parameter's values, log-uniform: a quarter either side of 1


_VECTOR_SCALE = 0.5  # the standard deviation of a vector parameter's entries


class InputsUnavailable(InvalidInput):
    """Verification inputs cannot be synthesized from the graph (the user has to give them)."""


# --------------------------------------------------------------------------- index inputs
def _index_bound(value: ir.Value, depth: int = 0) -> int | None:
    """The smallest row count of the Gather tables `value` indexes, if it indexes any."""
    bounds = []
    for node, index in value.uses():
        if node.op_type == "Gather" and index == 1:
            data = node.inputs[0]
            shape = data.shape if data is not None else None
            if shape is None and data is not None:  # a Constant node's table: no declared shape
                table = const_tensor(data)
                shape = table.shape if table is not None else None
            axis = node.attributes.get_int("axis", 0)
            if shape is not None and -len(shape) <= axis < len(shape) and isinstance(shape[axis], int):
                bounds.append(shape[axis])
        elif node.op_type in _INDEX_PASSTHROUGH and index == 0 and depth < 8:
            bound = _index_bound(node.outputs[0], depth + 1)
            if bound is not None:
                bounds.append(bound)
        elif node.op_type == "Add" and depth < 8:  # an offset (OPT's positions + 2)
            offset = _constant_scalar(node.inputs[1 - index])
            bound = _index_bound(node.outputs[0], depth + 1) if offset is not None and offset >= 0 else None
            if bound is not None:
                bounds.append(max(bound - offset, 1))
    return min(bounds) if bounds else None


def _constant_scalar(value: ir.Value | None) -> int | None:
    tensor = value.const_value if value is not None else None
    if tensor is None or tensor.size != 1 or not tensor.dtype.is_integer():
        return None
    return int(tensor.numpy().reshape(()))


# --------------------------------------------------------------------------- conv geometry
@dataclass
class _ConvStep:
    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads: tuple[int, ...]  # begin..., end...
    auto_pad: str

    def input_size(self, out: int, axis: int) -> int:
        """The smallest input length along spatial `axis` that gives `out` positions."""
        k, s, d = self.kernel[axis], self.strides[axis], self.dilations[axis]
        if self.auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            return max(1, (out - 1) * s + 1)
        n = len(self.kernel)
        pad = self.pads[axis] + self.pads[axis + n] if self.pads else 0
        return max(1, (out - 1) * s + d * (k - 1) + 1 - pad)


def _conv_step(node: ir.Node) -> _ConvStep | None:
    if node.op_type == "Conv":
        weight = node.inputs[1] if len(node.inputs) > 1 else None
        shape = weight.shape if weight is not None else None
        if shape is None or not all(isinstance(d, int) for d in shape[2:]):
            return None
        kernel = tuple(int(d) for d in shape[2:])
        kernel = tuple(node.attributes.get_ints("kernel_shape", kernel))
    elif node.op_type in _POOLS and "kernel_shape" in node.attributes:
        kernel = tuple(node.attributes.get_ints("kernel_shape", ()))
    else:
        return None
    n = len(kernel)
    auto_pad = node.attributes.get_string("auto_pad", "NOTSET")
    attrs = node.attributes
    strides, dilations = attrs.get_ints("strides", (1,) * n), attrs.get_ints("dilations", (1,) * n)
    return _ConvStep(kernel, tuple(strides), tuple(dilations), tuple(attrs.get_ints("pads", ())), auto_pad)


def _first_conv(value: ir.Value) -> ir.Node | None:
    """The Conv that reads `value` (through casts, scaling and an Unsqueeze), if one does."""
    frontier, seen = [value], set()
    while frontier and len(seen) < 16:
        v = frontier.pop(0)
        for node, index in v.uses():
            if node.op_type == "Conv" and index == 0:
                return node
            if node.op_type in _TO_CONV and id(node) not in seen:
                seen.add(id(node))
                frontier.extend(node.outputs)
    return None


def _conv_chain(conv: ir.Node) -> list[_ConvStep]:
    """`conv` and the strided convolutions and pools after it along the stream (a feature
    extractor), up to the first op that moves or mixes the spatial axes."""
    chain: list[_ConvStep] = []
    node: ir.Node | None = conv
    visited = 0
    while node is not None and visited < 64:
        step = _conv_step(node)
        if step is not None:
            chain.append(step)
        following = None
        for use, index in node.outputs[0].uses():
            # Elementwise ops may read the stream as either operand (GELU as `0.5 * (x * ...)`).
            if use.op_type in _BETWEEN_CONVS or (index == 0 and (use.op_type == "Conv" or use.op_type in _POOLS)):
                following = use
                break
        node, visited = following, visited + 1
    return chain


# Ops between a patch convolution and the Add of its position table that keep the patches whole
# (flattening the grid, moving the channels last, a class token concatenated in front).
_TO_POSITIONS = {"Reshape", "Flatten", "Transpose", "Concat", "Identity", "Cast", "Unsqueeze", "Squeeze"}


def _positions_rows(value: ir.Value) -> int | None:
    """How many positions a constant position table added to the patches holds: a constant
    `[1, T, C]` or `[T, C]`, or a Gather of a constant table by constant position ids (the ids'
    count: a CLIP tower's `position_embedding(position_ids)`)."""
    tensor = constant_of(value)
    if tensor is not None:
        shape = tuple(tensor.shape)
        return shape[-2] if len(shape) in (2, 3) and (len(shape) == 2 or shape[0] == 1) else None
    producer = value.producer()
    if producer is None or producer.op_type != "Gather" or producer.attributes.get_int("axis", 0) != 0:
        return None
    table, ids = producer.inputs[0], producer.inputs[1]
    if constant_of(table) is None:
        return None
    positions = constant_of(ids)
    return positions.size if positions is not None and positions.size > 1 else None


def _patch_positions(conv: ir.Node) -> int | None:
    """The number of positions of the table the patch embeddings meet: from the patch conv's
    output, through the layout ops that flatten the grid, to the Add of the positions."""
    frontier, seen = [conv.outputs[0]], set()
    while frontier and len(seen) < 16:
        v = frontier.pop(0)
        for node, index in v.uses():
            if id(node) in seen:
                continue
            seen.add(id(node))
            if node.op_type == "Add":
                other = node.inputs[1 - index] if len(node.inputs) == 2 else None
                rows = _positions_rows(other) if other is not None else None
                if rows is not None:
                    return rows
            elif node.op_type in _TO_POSITIONS:
                frontier.extend(node.outputs)
    return None


def _position_grid(conv: ir.Node, model: ir.Model) -> int | None:
    """The side of the patch grid a position table holds: T (or T - 1, with a class token) a
    square. The table is the one the patches are added to; when no such Add is found, a constant
    `[1, T, C]` or `[T, C]` with the patch conv's C output channels (a text tower's tables
    could match that too, so it is the fallback only)."""
    rows = _patch_positions(conv)
    if rows is not None:
        return _square_side(rows)
    weight = conv.inputs[1]
    if weight is None or weight.shape is None or not isinstance(weight.shape[0], int):
        return None
    channels = weight.shape[0]
    for init in model.graph.initializers.values():
        shape = init.shape
        if shape is None or len(shape) not in (2, 3) or shape[-1] != channels or (len(shape) == 3 and shape[0] != 1):
            continue
        side = _square_side(shape[-2])
        if side is not None:
            return side
    return None


def _square_side(rows) -> int | None:
    """The side of a square grid of `rows` positions, or of `rows - 1` (a class token first)."""
    if not isinstance(rows, int) or rows < 2:
        return None
    for grid in (rows, rows - 1):
        side = math.isqrt(grid)
        if side > 1 and side * side == grid:
            return side
    return None


def _conv_dims(value: ir.Value, model: ir.Model, sequence_length: int) -> dict[int, int]:
    """Sizes for the axes of a graph input that a convolution reads: {axis: size}."""
    if value.shape is None:
        return {}
    conv = _first_conv(value)
    if conv is None:
        return {}
    chain = _conv_chain(conv)
    if not chain:
        return {}
    rank = len(value.shape)
    spatial = len(chain[0].kernel)
    dims: dict[int, int] = {}
    weight = conv.inputs[1]
    if rank == spatial + 2 and weight is not None and weight.shape is not None and isinstance(weight.shape[1], int):
        group = conv.attributes.get_int("group", 1)
        dims[1] = weight.shape[1] * group
    side = _position_grid(conv, model) if spatial == 2 else None
    first_spatial = rank - spatial  # the trailing axes: [N, C, H, W], or [N, samples] unsqueezed
    for i in range(spatial if first_spatial >= 1 else 0):
        axis = first_spatial + i
        if side is not None:
            dims[axis] = chain[0].input_size(side, i)
            continue
        # A sequence along each axis of an image is its square: 16 x 16 patches at most.
        size = sequence_length if spatial == 1 else min(sequence_length, _MAX_GRID_SIDE)
        for step in reversed(chain):
            if len(step.kernel) == spatial:
                size = step.input_size(size, i)
        dims[axis] = size
    return dims


# --------------------------------------------------------------------------- synthesis
def graph_inputs(model: ir.Model) -> list[ir.Value]:
    return [v for v in model.graph.inputs if not v.is_initializer()]


def _declared(dim) -> DimExpr | int | None:
    if isinstance(dim, int):
        return dim
    return DimExpr(dim.value) if isinstance(dim, ir.SymbolicDim) and dim.value else None


def _declared_dims(values: list[ir.Value]) -> dict[str, list[DimExpr | int | None]]:
    return {v.name or "": [_declared(d) for d in v.shape] for v in values if v.shape is not None}


def dim_rereadings(model: ir.Model, shapes: dict[str, tuple[int, ...]]) -> list[dict[tuple[str, int], DimExpr]]:
    """Other readings of the declared input dims, tried when the original does not run on the
    first: a dim declared as one symbol that the graph's outputs only use inside a sum. A merged
    decoder declares `attention_mask [batch, sequence_length]` (from its branch without cache)
    while its cached branch needs `past_sequence_length + sequence_length`, the length its
    `present` outputs declare."""
    inputs = [v for v in graph_inputs(model) if v.name not in shapes]
    declared = _declared_dims(inputs)
    input_symbols = {s for dims in declared.values() for d in dims if isinstance(d, DimExpr) for s in d.symbols}
    sums = {}
    for dims in _declared_dims(list(model.graph.outputs)).values():
        for d in dims:
            if isinstance(d, DimExpr) and not d.is_symbol and d.symbols <= input_symbols:
                sums.setdefault(d.text, d)
    rereadings = []
    for name, dims in declared.items():
        for axis, d in enumerate(dims):
            if axis == 0 or not isinstance(d, DimExpr) or not d.is_symbol:
                continue
            for total in sums.values():
                if d.symbols < total.symbols:
                    rereadings.append({(name, axis): total})
    return rereadings


def _dim_sizes(
    model: ir.Model,
    inputs: list[ir.Value],
    shapes: dict[str, tuple[int, ...]],
    batch_size: int,
    sequence_length: int,
    overrides: dict[tuple[str, int], DimExpr] | None = None,
) -> dict[str, tuple[int, ...]]:
    """Concrete shapes for every input not in `shapes`, symbols solved consistently.
    `overrides` replaces the declared dim of (input, axis) with another expression."""
    values: dict[str, int] = {}
    exprs = _declared_dims(inputs)
    for (name, axis), expr in (overrides or {}).items():
        exprs[name][axis] = expr
    # 1. The user's shapes fix the symbols their dims name (solving `p + 1 = 9` for p).
    for name, shape in shapes.items():
        for expr, size in zip(exprs.get(name, []), shape):
            if isinstance(expr, DimExpr):
                solved = expr.solve(size, values)
                if solved is not None:
                    values.setdefault(*solved)
    # 2. The graph's geometry: channels and spatial sizes of inputs that convolutions read.
    for value in inputs:
        if value.name in shapes:
            continue
        for axis, size in _conv_dims(value, model, sequence_length).items():
            expr = exprs[value.name or ""][axis]
            if isinstance(expr, DimExpr):
                solved = expr.solve(size, values)
                if solved is not None:
                    values.setdefault(*solved)
    # 3. Every other symbol: batch where it is met at axis 0, else the sequence length.
    for dims in exprs.values():
        for axis, expr in enumerate(dims):
            if isinstance(expr, DimExpr) and expr.is_symbol:
                for symbol in expr.symbols:
                    values.setdefault(symbol, batch_size if axis == 0 else sequence_length)
    for dims in exprs.values():
        for expr in dims:
            if isinstance(expr, DimExpr):
                for symbol in expr.symbols:
                    values.setdefault(symbol, sequence_length)
    result = {}
    for value in inputs:
        name = value.name or ""
        if name in shapes:
            continue
        if value.shape is None:
            raise InputsUnavailable(f"graph input '{name}' has no shape")
        sizes = []
        for axis, expr in enumerate(exprs[name]):
            if isinstance(expr, int):
                sizes.append(expr)
            elif expr is None:  # an unnamed dynamic dim
                sizes.append(batch_size if axis == 0 else sequence_length)
            else:
                size = expr.evaluate(values)
                if size < 0:
                    raise InputsUnavailable(f"graph input '{name}': dim '{expr.text}' comes out negative ({size})")
                sizes.append(size)
        result[name] = tuple(sizes)
    return result


def synthesized_shapes(
    model: ir.Model, shapes: dict[str, tuple[int, ...]], batch_size: int, sequence_length: int
) -> dict[str, tuple[int, ...]]:
    """The shapes `synthesize_inputs` gives the inputs not in `shapes`, nothing allocated."""
    return _dim_sizes(model, graph_inputs(model), shapes, batch_size, sequence_length)


def synthesize_inputs(
    model: ir.Model,
    shapes: dict[str, tuple[int, ...]] | None = None,
    *,
    batch_size: int = 2,
    sequence_length: int = 8,
    seed: int = 0,
    bool_value: bool = True,
    overrides: dict[tuple[str, int], DimExpr] | None = None,
    realistic: bool = False,
) -> dict[str, np.ndarray]:
    """Feeds for every graph input; `realistic`: ids spread over their whole table and images
    normalized as a preprocessor does (see the module's docstring)."""
    shapes = dict(shapes or {})
    rng = np.random.default_rng(seed)
    declared = graph_inputs(model)
    unknown = set(shapes) - {v.name for v in declared}
    if unknown:
        raise SettingMismatch(f"{{input_shapes}} names no graph input: {', '.join(sorted(unknown))}")
    dims_of = {**_dim_sizes(model, declared, shapes, batch_size, sequence_length, overrides), **shapes}
    feeds: dict[str, np.ndarray] = {}
    for value in declared:
        name = value.name or ""
        dims = dims_of[name]
        dtype = value.dtype
        if dtype is None:
            raise InputsUnavailable(f"graph input '{name}' has no element type")
        try:
            np_dtype = dtype.numpy()
        except (TypeError, ValueError, NotImplementedError):
            np_dtype = None
        if np_dtype is None:
            raise InputsUnavailable(f"graph input '{name}' is {dtype.name}, which has no numpy type")
        check_size(value, dims, sequence_length)  # before anything of its size is allocated
        if dtype.is_floating_point():
            if realistic and _is_image(value, dims):
                feeds[name] = _normalized_image(rng, dims).astype(np_dtype)
            elif _is_parameter(value, dims) and math.prod(dims) == 1:
                low, high = np.log(_KNOB_RANGE)
                feeds[name] = np.asarray(np.exp(rng.uniform(low, high, dims)), dtype=np_dtype)
            elif _is_parameter(value, dims):
                feeds[name] = (_VECTOR_SCALE * rng.standard_normal(dims)).astype(np_dtype)
            else:
                feeds[name] = rng.standard_normal(dims).astype(np_dtype)
        elif dtype == ir.DataType.BOOL:
            feeds[name] = np.full(dims, bool_value, dtype=bool)
        elif dtype.is_integer():
            bound = _index_bound(value)
            if bound is not None and realistic:
                feeds[name] = _spread_ids(rng, bound, dims).astype(np_dtype)
            elif bound is not None:
                feeds[name] = rng.integers(0, bound, size=dims).astype(np_dtype)
            else:
                feeds[name] = np.ones(dims, dtype=np_dtype)
        else:
            raise InputsUnavailable(f"graph input '{name}' is {dtype.name}")
    return feeds


def _is_parameter(value: ir.Value, dims: tuple[int, ...]) -> bool:
    """A parameter of the run (see the module's docstring): fixed by the graph, a scalar or a
    vector of at most `_PARAMETER_ELEMENTS`."""
    fixed = value.shape is not None and all(isinstance(d, int) for d in value.shape)
    return fixed and sum(d > 1 for d in dims) <= 1 and math.prod(dims) <= _PARAMETER_ELEMENTS


def _spread_ids(rng: np.random.Generator, bound: int, dims: tuple[int, ...]) -> np.ndarray:
    """Ids over the whole table, in random order: evenly spaced from 0 to bound - 1 (every row,
    repeated, where there are more ids than rows)."""
    count = int(np.prod(dims, dtype=np.int64))
    if count < 2:
        return rng.integers(0, bound, size=dims)
    ids = np.resize(np.arange(bound), count) if count >= bound else np.linspace(0, bound - 1, count).round()
    return rng.permutation(ids.astype(np.int64)).reshape(dims)


def _is_image(value: ir.Value, dims: tuple[int, ...]) -> bool:
    """An [N, 3, H, W] input that a convolution over 3 channels reads: RGB pixels."""
    conv = _first_conv(value) if len(dims) == 4 and dims[1] == 3 else None
    weight = conv.inputs[1] if conv is not None and len(conv.inputs) > 1 else None
    return weight is not None and weight.shape is not None and len(weight.shape) == 4 and weight.shape[1] == 3


def _normalized_image(rng: np.random.Generator, dims: tuple[int, ...]) -> np.ndarray:
    pixels = rng.uniform(0.0, 1.0, dims)
    mean, std = (np.reshape(v, (1, 3, 1, 1)) for v in (_IMAGE_MEAN, _IMAGE_STD))
    return (pixels - mean) / std
