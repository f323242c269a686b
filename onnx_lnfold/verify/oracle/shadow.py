"""Models widened to a wider float type, to be run where the narrow one cannot be, or to be run in
the precision that serves as the truth:

- bfloat16 models, verified through float32 shadows (`float32_shadow`): ONNX Runtime's CPU
  provider lacks most bf16 kernels, so both models are compared with every bf16 tensor, type and
  Cast widened to float32. That checks the graph transformation exactly, with the folded model's
  centered weights as they were rounded to bf16; how far that rounding leaves each centered weight
  from a zero mean is reported beside it (`bfloat16_rounding`).
- float64 twins (`float64_twin`): every float tensor, type, Cast target and dtype attribute
  widened to double, so that `onnx.reference` evaluates the network in float64 (`verify.oracle.reference`,
  docs/DESIGN.md section 6).

The widening is one walk over the model (initializers, value types, constant tensors in every
form, dtype attributes), the same for both, in If/Loop/Scan bodies and model-local functions too.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir

from onnx_lnfold.analysis.plan import CenteringPlan
from onnx_lnfold.core.ir import graphs_of, nodes_within

_BF16 = onnx.TensorProto.BFLOAT16
_FLOAT = onnx.TensorProto.FLOAT
_DOUBLE = onnx.TensorProto.DOUBLE
_DTYPE_ATTRIBUTES = {"to", "dtype", "output_dtype"}
# Ops whose output type, without a dtype attribute, is float32 whatever their inputs.
_FLOAT_BY_DEFAULT = {"RandomNormal", "RandomUniform"}


@dataclass(frozen=True)
class _Widening:
    narrow: frozenset[int]  # the element types widened
    wide: int  # to this one

    def tensor(self, tensor: onnx.TensorProto) -> None:
        if tensor.data_type not in self.narrow:
            return
        values = onnx.numpy_helper.to_array(tensor).astype(onnx.helper.tensor_dtype_to_np_dtype(self.wide))
        tensor.CopyFrom(onnx.numpy_helper.from_array(values, tensor.name))

    def type(self, type_proto: onnx.TypeProto) -> None:
        kind = type_proto.WhichOneof("value")
        if kind in ("tensor_type", "sparse_tensor_type"):
            inner = getattr(type_proto, kind)
            if inner.elem_type in self.narrow:
                inner.elem_type = self.wide
        elif kind in ("sequence_type", "optional_type"):
            self.type(getattr(type_proto, kind).elem_type)
        elif kind == "map_type":
            self.type(type_proto.map_type.value_type)

    def graph(self, graph: onnx.GraphProto) -> None:
        for tensor in graph.initializer:
            self.tensor(tensor)
        for sparse in graph.sparse_initializer:
            self.tensor(sparse.values)
        for info in (*graph.input, *graph.output, *graph.value_info):
            self.type(info.type)
        self.nodes(graph.node)

    def nodes(self, nodes) -> None:
        """Dtype attributes, constant tensors and subgraphs of `nodes` (a graph's or a function's)."""
        for node in nodes:
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.INT and attr.name in _DTYPE_ATTRIBUTES and attr.i in self.narrow:
                    attr.i = self.wide
                elif attr.type == onnx.AttributeProto.TENSOR:
                    self.tensor(attr.t)
                elif attr.type == onnx.AttributeProto.SPARSE_TENSOR:
                    self.tensor(attr.sparse_tensor.values)
                elif attr.type == onnx.AttributeProto.TENSORS:
                    for t in attr.tensors:
                        self.tensor(t)
                elif attr.type == onnx.AttributeProto.GRAPH:
                    self.graph(attr.g)
                elif attr.type == onnx.AttributeProto.GRAPHS:
                    for g in attr.graphs:
                        self.graph(g)
            if _FLOAT in self.narrow:
                self._float_defaults(node)

    def _float_defaults(self, node: onnx.NodeProto) -> None:
        """What is float32 without being written: a Constant's `value_float(s)`, the zeros of a
        ConstantOfShape without a value, a random op without a dtype."""
        names = {a.name for a in node.attribute}
        dtype = onnx.helper.tensor_dtype_to_np_dtype(self.wide)
        if node.op_type == "Constant" and names & {"value_float", "value_floats"}:
            (attr,) = [a for a in node.attribute if a.name in ("value_float", "value_floats")]
            values = np.array(attr.f if attr.name == "value_float" else list(attr.floats), dtype=dtype)
            node.attribute.remove(attr)
            node.attribute.append(onnx.helper.make_attribute("value", onnx.numpy_helper.from_array(values)))
        elif node.op_type == "ConstantOfShape" and "value" not in names:
            node.attribute.append(onnx.helper.make_attribute("value", onnx.numpy_helper.from_array(np.zeros(1, dtype))))
        elif node.op_type in _FLOAT_BY_DEFAULT and "dtype" not in names:
            node.attribute.append(onnx.helper.make_attribute("dtype", self.wide))

    def model(self, proto: onnx.ModelProto) -> None:
        self.graph(proto.graph)
        for function in proto.functions:
            self.nodes(function.node)


_TO_FLOAT32 = _Widening(frozenset({_BF16}), _FLOAT)
_TO_FLOAT64 = _Widening(frozenset({_BF16, onnx.TensorProto.FLOAT16, _FLOAT}), _DOUBLE)


def _load(model: bytes | str | Path | onnx.ModelProto) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        return copy
    return onnx.load_from_string(model) if isinstance(model, bytes) else onnx.load(str(model))


def float32_shadow(model: bytes | str | Path) -> bytes:
    """The model with every bfloat16 tensor, value type and Cast target widened to float32."""
    proto = _load(model)
    _TO_FLOAT32.model(proto)
    return proto.SerializeToString()


def float64_twin(model: bytes | str | Path | onnx.ModelProto) -> onnx.ModelProto:
    """The model with every float tensor (fp32, fp16, bf16), value type, Cast target and dtype
    attribute widened to float64 (a ModelProto given is not changed)."""
    proto = _load(model)
    _TO_FLOAT64.model(proto)
    return proto


def widen_to_float64(proto: onnx.ModelProto) -> None:
    """Widen `proto` in place as `float64_twin` does (for a structure without weights, say)."""
    _TO_FLOAT64.model(proto)


def widen_feeds(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: v.astype(np.float32) if v.dtype.name == "bfloat16" else v for k, v in feeds.items()}


def float64_feeds(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: v.astype(np.float64) if v.dtype.kind == "f" or v.dtype.name == "bfloat16" else v for k, v in feeds.items()}


def has_bfloat16(model: ir.Model) -> bool:
    """Whether any tensor of the model, subgraphs included, is bfloat16 (or a Cast makes one)."""
    bf16 = ir.DataType.BFLOAT16
    for graph in graphs_of(model):
        if any(v.dtype == bf16 for v in (*graph.inputs, *graph.outputs, *graph.initializers.values())):
            return True
    for node in nodes_within(model.graph):
        if any(v is not None and v.dtype == bf16 for v in node.outputs):
            return True
        if node.op_type == "Cast" and node.attributes.get_int("to", 0) == bf16:
            return True
    return False


def bfloat16_rounding(model: ir.Model, plan: CenteringPlan) -> list[str]:
    """How far rounding to bf16 left each centered weight from a zero mean along its axis:
    the float32 shadow checks the transformation, this is what the narrow type adds to it."""
    initializers = {}
    for graph in graphs_of(model):
        initializers.update(graph.initializers)
    worst: tuple[float, str] | None = None
    for edit in plan.edits:
        value = initializers.get(edit.new_name if edit.untie else edit.tensor)
        if value is None or value.const_value is None or value.dtype != ir.DataType.BFLOAT16 or edit.weights:
            continue
        array = value.const_value.numpy().astype(np.float64)
        scale = float(np.abs(array).max()) if array.size else 0.0
        if scale == 0.0:
            continue
        leftover = np.abs(array) if edit.axis is None else np.abs(array.mean(axis=edit.axis))
        relative = float(leftover.max()) / scale
        if worst is None or relative > worst[0]:
            worst = (relative, value.name or "")
    if worst is None:
        return []
    return [
        f"bfloat16 rounding of the centered weights: mean left along the centered axis up to {worst[0]:.3g} "
        f"of the weight's max |w| ('{worst[1]}'); the float32 shadows above include it"
    ]
