"""Shapes for the analysis: inferred from the graph itself, with declared shapes as hints.

The analysis follows one axis through Reshape, Transpose, broadcasting and friends, so it needs
ranks and, for reshapes, the dims around that axis. What the graph computes is the authority:
`shapes.infer` runs ONNX shape inference (with data propagation through the Shape/Gather/Concat
chains that build a Reshape's target) and, where that leaves ranks unknown, ONNX Runtime's symbolic
shape inference, both on a light copy. Declared `value_info` is only a hint: it is used where
inference knows nothing, and its integer dims fill dims inference left open, but a declared symbol
never replaces an inferred dim (the fp16 converter and `onnx.shape_inference` write `unk__N` dims
where the graph says exactly which dim it is). Results are kept here, never written into the
model: adding `value_info` changes ONNX Runtime's fusions and memory planning.
"""

from __future__ import annotations

import logging
from collections import Counter

import onnx_ir as ir

from onnx_lnfold.core.ops import NORM_OPS
from onnx_lnfold.shapes.infer import (
    GENERATED_PREFIX,
    Dim,
    Found,
    Inferred,
    Key,
    Shape,
    defining_graph,
    factors,
    infer,
    input_symbols,
    session_view,
    subgraphs,
    tag,
    with_input_shapes,
)

logger = logging.getLogger(__name__)

__all__ = ["Dim", "Shape", "ShapeTable", "dims_equal", "match_reshaped_axis", "product"]


def _dims(shape: ir.Shape | None) -> Shape | None:
    if shape is None:
        return None
    out: list[Dim] = []
    for d in shape:
        if isinstance(d, int):
            out.append(d)
        elif isinstance(d, ir.SymbolicDim) and d.value is not None:
            out.append(d.value)
        else:
            out.append(None)
    return tuple(out)


def _generated(d: Dim) -> bool:
    return isinstance(d, str) and d.startswith(GENERATED_PREFIX)


def _score(d: Dim, inferred: bool) -> int:
    """How much one dim says, and how far to trust it. An inferred integer or input-named dim
    beats anything declared; a declared integer or input-named dim beats a symbol an inference
    made up (which says only "some size"); nothing is worth least."""
    if d is None:
        return 0
    if _generated(d):
        return 2 if inferred else 1
    kind = 2 if isinstance(d, int) else 1
    return kind + (4 if inferred else 2)


def _merge(inferred: list[Shape], hints: list[Shape]) -> Shape | None:
    """One shape from the inferred candidates and the hints (declared), dim by dim.

    Inferences that disagree on the rank make the shape unknown: following an axis through a
    tensor whose rank is in doubt is a guess; a hint whose rank disagrees is ignored. Two
    inferred integers that disagree leave the dim unknown. A hint's dim fills in only where
    inference knows less (see `_score`).
    """
    ranks = {len(s) for s in inferred}
    if len(ranks) > 1:
        return None
    if not inferred:
        return max(hints, key=lambda h: sum(_score(d, False) for d in h)) if hints else None
    rank = ranks.pop()
    merged: list[Dim] = []
    for i in range(rank):
        options = [(shape[i], True) for shape in inferred]
        ints = {d for d, _ in options if isinstance(d, int)}
        if len(ints) > 1:
            merged.append(None)  # two inferences contradict each other: trust neither
            continue
        options += [(hint[i], False) for hint in hints if len(hint) == rank]
        best = max(options, key=lambda o: _score(*o))  # the first of equals: ONNX's inference
        merged.append(best[0])
    return tuple(merged)


# Ops whose output 0 has the rank of input 0.
_SAME_RANK = {
    "FastGelu", "BiasGelu", "Gelu", "QuickGelu", "BiasAdd", "Attention", "MultiHeadAttention",
    "Relu", "Tanh", "Sigmoid", "Erf", "Cast", "Identity", "Neg", "Dropout",
} | {op.op_type for op in NORM_OPS if not op.embed}


class ShapeTable:
    """Shapes of the values of one model, inferred from its graph (never written back).

    `given`: the shapes of graph inputs the caller runs the model at (the verification inputs, or
    `--input-shape`), by input name; they bind the input dims' names to sizes (`bindings`) for
    `concrete`, which the cost rule reads to price an LN at the tokens it runs at. The inferred
    shapes themselves stay symbolic: the analysis must hold for every size."""

    def __init__(self, model: ir.Model, given: dict[str, tuple[int, ...]] | None = None):
        self._model = model
        self._inferred: tuple[Inferred, Inferred, Inferred] | None = None
        self._shared: set[str] | None = None
        self._memo: dict[ir.Value, Shape | None] = {}
        self._session: dict[Key, Found] | None = None
        self._given = dict(given or {})
        self._at_given: Inferred | None = None  # inference with the given input shapes
        self.bindings = _bindings(model, self._given)
        # How ONNX Runtime runs the decomposed LNs it does not fuse, by LN name (`ort_fusions.session_layout`;
        # the cost rule reads it): set by the analysis.
        self.ort_layouts: dict = {}
        # The explicit centerings (by the tensor written) a session ran over another axis than
        # written (`ort_fusions.session_layout.moved_centerings`; priced strided).
        self.moved_centerings: set[str] = set()

    def _sources(self) -> tuple[Inferred, Inferred, Inferred]:
        if self._inferred is None:
            self._inferred = infer(self._model)
            self._shared = input_symbols(self._model)
            self._paths = {id(graph): path for path, graph, _ in subgraphs(self._model.graph)}
        return self._inferred

    @property
    def given(self) -> dict[str, tuple[int, ...]]:
        """The graph input shapes the caller runs the model at (empty: none given)."""
        return dict(self._given)

    def _key(self, value: ir.Value) -> tuple[tuple, str]:
        """(graph path, name), as `shapes.infer` keys results: sibling If branches reuse names."""
        self._sources()
        return self._paths.get(id(defining_graph(value)), ()), value.name or ""

    def dtype(self, value: ir.Value | None) -> ir.DataType | None:
        if value is None:
            return None
        if value.dtype is not None:
            return value.dtype
        key = self._key(value)
        for source in self._sources():  # the graph's own inferences first
            elem = source.get(key, (None, 0))[1]
            if elem:
                return ir.DataType(elem)
        return None

    def shape(self, value: ir.Value | None) -> Shape | None:
        if value is None:
            return None
        if value.const_value is not None:
            return tuple(value.const_value.shape.dims)
        if value in self._memo:
            return self._memo[value]
        by_onnx, by_ort, by_hint = self._sources()
        key = self._key(value)
        inferred = [s for s in (by_onnx.get(key, (None, 0))[0], by_ort.get(key, (None, 0))[0]) if s is not None]
        if value.is_graph_input() and value.graph is self._model.graph:
            declared = _dims(value.shape)  # the model's interface: its own names are the shared ones
        else:
            declared = tag(_dims(value.shape), "declared", self._shared or set())
        hints = [h for h in (declared, by_hint.get(key, (None, 0))[0]) if h is not None]
        shape = _merge(inferred, hints)
        self._memo[value] = shape
        return shape

    def concrete(self, value: ir.Value | None) -> tuple[tuple[int | None, ...], bool] | None:
        """`value`'s shape with every dim the given input shapes fix made a size, the others None;
        and whether any dim needed them (False: the graph itself fixes every size that is known).
        A dim is fixed by them where ONNX inference with the inputs at those shapes finds a size
        (`shapes.infer.with_input_shapes`: a convolution's output length too), or where it is named
        after input dims (a product of such names) the given shapes bind."""
        shape = self.shape(value)
        if shape is None:
            return None
        at_given: Shape | None = None
        if self._given and not all(isinstance(d, int) for d in shape):
            if self._at_given is None:
                self._at_given = with_input_shapes(self._model, self._given)
            at_given = self._at_given.get(self._key(value), (None, 0))[0]
            if at_given is not None and len(at_given) != len(shape):
                at_given = None
        out: list[int | None] = []
        bound = False
        for i, d in enumerate(shape):
            if isinstance(d, int):
                out.append(d)
                continue
            size = at_given[i] if at_given is not None and isinstance(at_given[i], int) else self._bound_size(d)
            out.append(size)
            bound = bound or size is not None
        return tuple(out), bound

    def _bound_size(self, d: Dim) -> int | None:
        """A dim named after input dims (or a product of them), as the given shapes bind them."""
        if not isinstance(d, str) or _generated(d):
            return None
        size = 1
        for f in factors(d):
            if f.isdigit():
                size *= int(f)
            elif f in self.bindings:
                size *= self.bindings[f]
            else:
                return None
        return size

    def session_shape(self, value: ir.Value) -> Shape | None:
        """`value`'s shape as ONNX Runtime's session optimizer sees it (`shapes.infer.session_view`):
        a dim it cannot name is None."""
        if value.const_value is not None:
            return tuple(value.const_value.shape.dims)
        if self._session is None:
            self._session = session_view(self._model)
        return self._session.get(self._key(value), (None, 0))[0]

    def rank(self, value: ir.Value | None, _depth: int = 0) -> int | None:
        shape = self.shape(value)
        if shape is not None:
            return len(shape)
        # ONNX shape inference stops at ops it does not know (ORT's contrib ops: FastGelu,
        # BiasGelu, Attention...). Their output rank is still plain to see.
        node = value.producer() if value is not None else None
        if node is None or _depth > 64:
            return None
        if node.op_type in _SAME_RANK and value is node.outputs[0]:
            return self.rank(node.inputs[0], _depth + 1)
        if node.op_type.startswith("Skip") and len(node.outputs) > 3 and value is node.outputs[3]:
            return self.rank(node.inputs[0], _depth + 1)  # the residual sum
        if node.op_type in ("Add", "Sub", "Mul", "Div", "Sum", "Pow") and value is node.outputs[0]:
            ranks = [self.rank(v, _depth + 1) for v in node.inputs if v is not None]
            if ranks and all(r is not None for r in ranks):
                return max(ranks)  # type: ignore[type-var]
        if node.op_type == "MatMul":
            ranks = [self.rank(v, _depth + 1) for v in node.inputs]
            if all(r is not None and r >= 2 for r in ranks):
                return max(ranks)  # type: ignore[type-var]
        return None


def _bindings(model: ir.Model, given: dict[str, tuple[int, ...]]) -> dict[str, int]:
    """Input dim name -> size, from the shapes given for the main graph's inputs. A name given two
    different sizes (two inputs that disagree) binds none."""
    sizes: dict[str, set[int]] = {}
    for value in model.graph.inputs:
        shape = given.get(value.name or "")
        if shape is None or value.shape is None or len(value.shape) != len(shape):
            continue
        for d, size in zip(value.shape, shape):
            if isinstance(d, ir.SymbolicDim) and d.value:
                sizes.setdefault(d.value, set()).add(int(size))
    return {name: next(iter(s)) for name, s in sizes.items() if len(s) == 1}


def dims_equal(a: Dim, b: Dim) -> bool:
    return a is not None and b is not None and a == b


def product(dims: Shape) -> tuple[int, Counter] | None:
    """A product of dims that compares symbolically: (int factor, multiset of symbols)."""
    factor, symbols = 1, Counter()
    for d in dims:
        if d is None:
            return None
        if isinstance(d, int):
            factor *= d
        elif d.startswith(GENERATED_PREFIX):
            symbols[d] += 1  # an opaque name of one inference run
        else:
            for f in factors(d):  # `batch*seq` is batch times seq
                if f.isdigit():
                    factor *= int(f)
                else:
                    symbols[f] += 1
    return factor, symbols


def match_reshaped_axis(src: Shape, axis: int, dst: Shape) -> int | None:
    """The axis of `dst` that holds `src[axis]` unchanged through a row-major reshape.

    Row-major reshape keeps an axis whole iff the destination has a dim of the same size whose
    trailing product equals the source's trailing product: then every element keeps its index
    along that axis. The match is unique for dims other than 1.
    """
    d = src[axis]
    if d is None or d == 1:
        return None
    suffix = product(src[axis + 1 :])
    if suffix is None:
        return None
    for j, e in enumerate(dst):
        if dims_equal(d, e) and product(dst[j + 1 :]) == suffix:
            return j
    return None
