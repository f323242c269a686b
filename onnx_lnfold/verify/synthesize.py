"""Inputs for verification, synthesized from the graph's input specs.

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
  (attention masks) are ones; floats are standard normal; bools take the value asked for.
"""

from __future__ import annotations

import ast
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx_ir as ir

from onnx_lnfold.core.errors import InvalidInput
from onnx_lnfold.core.ir import constant_of
from onnx_lnfold.core.ops import MS_DOMAIN, NORM_OPS

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


class InputsUnavailable(InvalidInput):
    """Verification inputs cannot be synthesized from the graph (the user has to give them)."""


# --------------------------------------------------------------------------- dims as expressions
_OPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b, ast.FloorDiv: lambda a, b: a // b}


class DimExpr:
    """A symbolic dim: one symbol (`batch`), or arithmetic on symbols and integers as exporters
    write it (`past_sequence_length + 1`, `2*s0`). A name with a dash (`seq-len`) is one symbol."""

    def __init__(self, text: str):
        self.text = text
        self._tree: ast.expr | None = None
        if not re.search(r"\w-\w", text):
            try:
                tree = ast.parse(text.strip(), mode="eval").body
            except SyntaxError:
                tree = None
            if tree is not None and self._valid(tree):
                self._tree = tree
        self.symbols = self._names(self._tree) if self._tree is not None else {text}

    def _valid(self, node: ast.expr) -> bool:
        if isinstance(node, ast.Name):
            return True
        if isinstance(node, ast.Constant):
            return isinstance(node.value, int) and not isinstance(node.value, bool)
        if isinstance(node, ast.BinOp):
            return type(node.op) in _OPS and self._valid(node.left) and self._valid(node.right)
        return False

    def _names(self, node: ast.expr) -> set[str]:
        return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}

    @property
    def is_symbol(self) -> bool:
        return self._tree is None or isinstance(self._tree, ast.Name)

    def evaluate(self, values: dict[str, int]) -> int:
        if self._tree is None:
            return values[self.text]
        return self._eval(self._tree, values)

    def _eval(self, node: ast.expr, values: dict[str, int]) -> int:
        if isinstance(node, ast.Name):
            return values[node.id]
        if isinstance(node, ast.Constant):
            return node.value  # type: ignore[return-value]
        assert isinstance(node, ast.BinOp)
        return _OPS[type(node.op)](self._eval(node.left, values), self._eval(node.right, values))

    def solve(self, target: int, values: dict[str, int]) -> tuple[str, int] | None:
        """The one unknown symbol's value that makes the dim `target`, if it is linear in it."""
        unknown = [s for s in self.symbols if s not in values]
        if len(unknown) != 1:
            return None
        (name,) = unknown
        at0, at1 = self.evaluate({**values, name: 0}), self.evaluate({**values, name: 1})
        slope = at1 - at0
        if slope == 0 or (target - at0) % slope:
            return None
        return name, (target - at0) // slope


# --------------------------------------------------------------------------- index inputs
def _index_bound(value: ir.Value, depth: int = 0) -> int | None:
    """The smallest row count of the Gather tables `value` indexes, if it indexes any."""
    bounds = []
    for node, index in value.uses():
        if node.op_type == "Gather" and index == 1:
            data = node.inputs[0]
            shape = data.shape if data is not None else None
            if shape is None and data is not None:  # a Constant node's table: no declared shape
                table = ir.convenience.get_const_tensor(data)
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
        raise InvalidInput(f"--input-shape names no graph input: {', '.join(sorted(unknown))}")
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
        if dtype.is_floating_point():
            if realistic and _is_image(value, dims):
                feeds[name] = _normalized_image(rng, dims).astype(np_dtype)
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


# --------------------------------------------------------------------------- KV-cache decoders
@dataclass(frozen=True)
class KvCache:
    """The KV-cache inputs of a decoder whose attention is ONNX Runtime's GroupQueryAttention (what
    ONNX Runtime GenAI's model builder writes): its dims are symbols of their own (the head size
    too), and the op wants them consistent: a past of [batch, kv_heads, past, head_size], an
    attention mask of past + new positions, and new tokens of one position when the past is not
    empty (a prompt has an empty past). Read from the graph, and from `genai_config.json` beside
    the model where the graph leaves the head size to a symbol."""

    past: tuple[str, ...]  # the past key and value inputs
    heads: int  # KV heads
    head_size: int
    masks: tuple[str, ...]  # inputs of [batch, past + new]
    tokens: tuple[str, ...]  # inputs of [batch, new]
    max_total: int | None  # the most positions the rotary caches hold

    def shapes(self, batch: int, new: int, past: int) -> dict[str, tuple[int, ...]]:
        shapes = {name: (batch, self.heads, past, self.head_size) for name in self.past}
        shapes.update({name: (batch, past + new) for name in self.masks})
        shapes.update({name: (batch, new) for name in self.tokens})
        return shapes


_GQA = "GroupQueryAttention"


def _static_width(value: ir.Value | None, depth: int = 0) -> int | None:
    """The last dim of `value` where the graph fixes it: declared, or the output width of the
    projection that makes it (MatMul by a constant, MatMulNBits' N), through bias Adds and Casts."""
    if value is None or depth > 8:
        return None
    if value.shape is not None and len(value.shape) and isinstance(value.shape[-1], int):
        return value.shape[-1]
    node = value.producer()
    if node is None:
        return None
    if node.op_type == "MatMulNBits":
        return node.attributes.get_int("N", 0) or None
    if node.op_type in ("MatMul", "Gemm") and len(node.inputs) > 1 and constant_of(node.inputs[1]) is not None:
        dims = tuple(constant_of(node.inputs[1]).shape)
        return dims[0] if node.op_type == "Gemm" and node.attributes.get_int("transB", 0) else dims[-1]
    if node.op_type in ("Add", "Cast", "Identity"):
        return next((w for w in (_static_width(i, depth + 1) for i in node.inputs) if w), None)
    return None


def _graph_inputs_above(value: ir.Value | None, limit: int = 32) -> set[str]:
    """The graph inputs `value` is computed from, within `limit` nodes."""
    found: set[str] = set()
    stack, seen = [value], 0
    while stack and seen < limit:
        v = stack.pop()
        if v is None:
            continue
        if v.is_graph_input():
            found.add(v.name or "")
            continue
        node = v.producer()
        if node is not None:
            seen += 1
            stack.extend(node.inputs)
    return found


def _genai_head_size(folder: Path | None) -> int | None:
    if folder is None:
        return None
    try:
        config = json.loads((folder / "genai_config.json").read_text())
        return int(config["model"]["decoder"]["head_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def kv_cache(model: ir.Model, folder: Path | None = None) -> KvCache | None:
    """The KV cache of a GroupQueryAttention decoder, or None (no such attention, or inputs it
    cannot place)."""
    nodes = [n for n in model.graph if n.domain == MS_DOMAIN and n.op_type == _GQA]
    if not nodes:
        return None
    declared = {v.name: v for v in graph_inputs(model)}
    past: list[str] = []
    masks: set[str] = set()
    sizes, heads, max_total = set(), set(), None
    for node in nodes:
        kv_heads, q_heads = node.attributes.get_int("kv_num_heads", 0), node.attributes.get_int("num_heads", 0)
        for index in (3, 4):
            value = node.inputs[index] if len(node.inputs) > index else None
            if value is None or value.name not in declared:
                return None
            past.append(value.name)
        packed = len(node.inputs) < 2 or node.inputs[1] is None
        width = _static_width(node.inputs[0])
        if width and q_heads and kv_heads:
            sizes.add(width // (q_heads + 2 * kv_heads) if packed else width // q_heads)
        heads.add(kv_heads)
        for index in (5, 6):  # seqlens_k, total_sequence_length: made from the attention mask
            masks |= _graph_inputs_above(node.inputs[index] if len(node.inputs) > index else None)
        cos = constant_of(node.inputs[7]) if len(node.inputs) > 7 and node.inputs[7] is not None else None
        if cos is not None:
            max_total = min(max_total or cos.shape[0], cos.shape[0])
    size = sizes.pop() if len(sizes) == 1 else _genai_head_size(folder)
    if size is None or len(heads) != 1:
        return None
    masks = {m for m in masks if declared[m].shape is not None and len(declared[m].shape) == 2}
    tokens = tuple(
        name
        for name, v in declared.items()
        if name not in masks and name not in past and v.shape is not None and len(v.shape) == 2
        and v.dtype in (ir.DataType.INT64, ir.DataType.INT32)
    )
    return KvCache(tuple(past), heads.pop(), size, tuple(sorted(masks)), tokens, max_total)
