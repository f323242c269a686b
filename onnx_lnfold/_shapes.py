"""Static shapes for the analysis: what the model declares, completed by ONNX shape inference.

The analysis follows one axis through Reshape, Transpose, broadcasting and friends, so it needs
ranks and, for reshapes, the dims around that axis. Exporters usually write `value_info`; where
they do not, ONNX shape inference fills the gap. Inference runs on a light copy of the graph (large
initializers become typed graph inputs) and its results are kept here, never written into the
model: adding `value_info` changes ONNX Runtime's fusions and memory planning.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Union

import onnx
import onnx_ir as ir

logger = logging.getLogger(__name__)

# A dim is an int, a symbol name, or None when nothing is known about it.
Dim = Union[int, str, None]
Shape = tuple[Dim, ...]

# Initializers above this many elements are declared as typed inputs for inference: their values
# never matter to shapes, and copying them would cost memory on multi-GB models.
_INLINE_LIMIT = 4096


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


def _proto_dims(type_proto: onnx.TypeProto) -> Shape | None:
    if not type_proto.HasField("tensor_type") or not type_proto.tensor_type.HasField("shape"):
        return None
    out: list[Dim] = []
    for d in type_proto.tensor_type.shape.dim:
        if d.HasField("dim_value"):
            out.append(d.dim_value)
        elif d.HasField("dim_param") and d.dim_param:
            out.append(d.dim_param)
        else:
            out.append(None)
    return tuple(out)


def _light_proto(model: ir.Model) -> onnx.ModelProto:
    """The graph with small constants only: large initializers become typed graph inputs.

    Built node by node so that no large tensor is ever copied into protobuf (serializing the
    whole model would hold every weight in memory once more).
    """
    g = model.graph
    graph = onnx.GraphProto(name=g.name or "graph")
    declared = set()
    for value in g.inputs:
        graph.input.append(ir.serde.serialize_value(value))
        declared.add(value.name)
    for name, value in g.initializers.items():
        tensor = value.const_value
        if tensor is None:
            continue
        if tensor.size <= _INLINE_LIMIT and not isinstance(tensor, ir.ExternalTensor):
            graph.initializer.append(ir.serde.serialize_tensor(tensor))
        elif name not in declared:
            graph.input.append(onnx.helper.make_tensor_value_info(name, int(tensor.dtype), list(tensor.shape.dims)))
    outputs = {v.name for v in g.outputs}
    for node in g:
        graph.node.append(ir.serde.serialize_node(node))
        for out in node.outputs:  # declared value_info helps inference through unknown ops
            if out.name and out.name not in outputs and (out.type is not None or out.shape is not None):
                graph.value_info.append(ir.serde.serialize_value(out))
    for value in g.outputs:
        graph.output.append(ir.serde.serialize_value(value))
    proto = onnx.helper.make_model(
        graph, opset_imports=[onnx.helper.make_opsetid(d, v) for d, v in model.opset_imports.items()]
    )
    proto.ir_version = model.ir_version
    for function in model.functions.values():
        proto.functions.append(ir.serde.serialize_function(function))
    return proto


def _infer(model: ir.Model) -> dict[tuple[tuple, str], tuple[Shape | None, int]]:
    """Run ONNX shape inference on a light copy; return (shape, elem type) by (graph path, value name)."""
    try:
        proto = _light_proto(model)
    except Exception as e:  # a model the IR cannot write back cannot be inferred either
        logger.debug("shape inference skipped: %s", e)
        return {}
    try:
        inferred = onnx.shape_inference.infer_shapes(proto, data_prop=True)
    except Exception as e:  # custom ops or malformed graphs: fall back to declared shapes
        logger.debug("shape inference failed: %s", e)
        return {}
    shapes: dict[tuple[tuple, str], tuple[Shape | None, int]] = {}
    graphs = [((), inferred.graph)]
    while graphs:  # If/Loop/Scan bodies carry their own value_info
        path, g = graphs.pop()
        for vi in list(g.value_info) + list(g.output) + list(g.input):
            if vi.type.HasField("tensor_type"):
                shapes[(path, vi.name)] = (_proto_dims(vi.type), vi.type.tensor_type.elem_type)
        for index, node in enumerate(g.node):
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    graphs.append(((*path, (index, attr.name, 0)), attr.g))
                graphs.extend(((*path, (index, attr.name, k)), sub) for k, sub in enumerate(attr.graphs))
    return shapes


def _graph_paths(graph: ir.Graph, path: tuple = ()) -> dict[int, tuple]:
    """Where each (sub)graph sits, as `_infer` keys it: sibling If branches reuse value names
    (optimum's merged decoders do), so a name alone does not say which value it is."""
    paths = {id(graph): path}
    for index, node in enumerate(graph):
        for attr in node.attributes.values():
            if attr.type == ir.AttributeType.GRAPH:
                paths.update(_graph_paths(attr.as_graph(), (*path, (index, attr.name, 0))))
            elif attr.type == ir.AttributeType.GRAPHS:
                for k, sub in enumerate(attr.as_graphs()):
                    paths.update(_graph_paths(sub, (*path, (index, attr.name, k))))
    return paths


# Ops whose output 0 has the rank of input 0.
_SAME_RANK = {
    "FastGelu", "BiasGelu", "Gelu", "QuickGelu", "BiasAdd", "Attention", "MultiHeadAttention",
    "SkipLayerNormalization", "SkipSimplifiedLayerNormalization", "SimplifiedLayerNormalization",
    "LayerNormalization", "Relu", "Tanh", "Sigmoid", "Erf", "Cast", "Identity", "Neg", "Dropout",
}


class ShapeTable:
    """Shapes of the values of one graph, as declared or inferred (never written back)."""

    def __init__(self, model: ir.Model):
        self._inferred: dict[tuple[tuple, str], tuple[Shape | None, int]] | None = None
        self._model = model

    def _lookup(self, value: ir.Value) -> tuple[Shape | None, int]:
        if self._inferred is None:
            self._inferred = _infer(self._model)
            self._paths = _graph_paths(self._model.graph)
        producer = value.producer()
        graph = producer.graph if producer is not None else value.graph
        return self._inferred.get((self._paths.get(id(graph), ()), value.name or ""), (None, 0))

    def dtype(self, value: ir.Value | None) -> ir.DataType | None:
        if value is None:
            return None
        if value.dtype is not None:
            return value.dtype
        elem = self._lookup(value)[1]
        return ir.DataType(elem) if elem else None

    def shape(self, value: ir.Value | None) -> Shape | None:
        if value is None:
            return None
        if value.const_value is not None:
            return tuple(value.const_value.shape.dims)
        declared = _dims(value.shape)
        if declared is not None and all(d is not None for d in declared):
            return declared
        inferred = self._lookup(value)[0]
        if declared is None:
            return inferred
        if inferred is None or len(inferred) != len(declared):
            return declared
        return tuple(d if d is not None else i for d, i in zip(declared, inferred))

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
        else:
            symbols[d] += 1
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
