"""The transformers optimizer's output with this model's own values (docs/DESIGN.md section 10,
item 4): what the fold would make of it, where the optimizer ran on a weightless copy.

The optimizer ran on zeros (`ort_fusions.weightless`), and the analysis reads values (an all-zero
beta is no beta, a constant zero is zero-mean already), so its output is not analyzed as it came
back (`ort_fusions.light`). Every initializer and Constant of that output named as one of this
model's, with its type and shape, is given this model's tensor (the same object: nothing is copied
or read); every other large tensor was made by the optimizer from the zeros (a concatenated
Q/K/V weight, a constant-folded transpose), and becomes a graph input, a value the analysis knows
nothing of, so that what folds there is a lower bound. Small tensors keep the values the copy kept.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx
import onnx_ir as ir

from onnx_lnfold.core.ir import graphs_of, is_standard
from onnx_lnfold.core.ops import MS_DOMAIN


def already_optimized(model: ir.Model) -> bool:
    """Whether the main graph holds an ONNX Runtime contrib op (domain com.microsoft): the output
    of its transformers optimizer (or of another of its tools), which it would not change again."""
    return any(node.domain == MS_DOMAIN for node in model.graph)


def _constant_tensor(node: ir.Node) -> ir.TensorProtocol | None:
    """A `Constant` node's tensor attribute `value`, where it has one."""
    if node.op_type != "Constant" or not is_standard(node):
        return None
    attr = node.attributes.get("value")
    if attr is None or attr.is_ref() or attr.type != ir.AttributeType.TENSOR:
        return None
    return attr.value


def own_tensors(model: ir.Model) -> dict[str, ir.TensorProtocol]:
    """Every initializer and Constant tensor of the model's graphs (bodies included), by name."""
    found: dict[str, ir.TensorProtocol] = {}
    for graph in graphs_of(model):
        for name, value in graph.initializers.items():
            if value.const_value is not None:
                found.setdefault(name, value.const_value)
        for node in graph:
            tensor = _constant_tensor(node)
            if tensor is not None and node.outputs and node.outputs[0].name:
                found.setdefault(node.outputs[0].name, tensor)
    return found


@dataclass
class Rebound:
    """The optimizer's output as an `ir.Model` holding this model's tensors, and the names of the
    large tensors the optimizer made from the zeros, now graph inputs (none: the analysis of it
    reads what this model holds)."""

    model: ir.Model
    unknown: tuple[str, ...]


def _alike(a: ir.TensorProtocol, b: ir.TensorProtocol) -> bool:
    return a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape)


def _as_input(model: ir.Model, old: ir.Value, tensor: ir.TensorProtocol) -> None:
    """Make the tensor `old` held a graph input of the main graph, of its type and shape; `old`
    must be detached from its graph (an initializer popped, a Constant removed) but its uses."""
    name = old.name
    new = ir.Value(type=ir.TensorType(tensor.dtype), shape=ir.Shape(list(tensor.shape)))
    ir.convenience.replace_all_uses_with(old, new)
    for graph in graphs_of(model):
        for i, out in enumerate(graph.outputs):
            if out is old:
                graph.outputs[i] = new
    new.name = name
    model.graph.inputs.append(new)


def rebound(optimized: onnx.ModelProto, model: ir.Model) -> Rebound:
    """`optimized` (the optimizer's output on a weightless copy of `model`, its large tensors
    references: `ort_fusions.light`) with `model`'s tensors bound by name, the other large ones
    graph inputs. Raises ValueError where an output of the main graph is made by nothing (the
    optimizer's output of a merged decoder, whose If it dropped)."""
    graph = optimized.graph
    made = {name for node in graph.node for name in node.output}
    made |= {v.name for v in graph.input} | {t.name for t in graph.initializer}
    missing = [out.name for out in graph.output if out.name not in made]
    if missing:
        raise ValueError(f"the optimizer's output is no valid graph: nothing makes its output '{missing[0]}'")
    out = ir.serde.deserialize_model(optimized)
    own = own_tensors(model)
    unknown: list[str] = []
    for graph in graphs_of(out):
        for name, value in list(graph.initializers.items()):
            tensor = value.const_value
            if tensor is None:
                continue
            if name in own and _alike(own[name], tensor):
                value.const_value = own[name]
            elif isinstance(tensor, ir.ExternalTensor):  # large, and made from the zeros
                graph.initializers.pop(name)
                value.const_value = None
                _as_input(out, value, tensor)
                unknown.append(name)
        for node in list(graph):
            tensor = _constant_tensor(node)
            if tensor is None or not node.outputs:
                continue
            name = node.outputs[0].name or ""
            if name in own and _alike(own[name], tensor):
                node.attributes["value"] = ir.AttrTensor("value", own[name])
                node.outputs[0].const_value = own[name]
            elif isinstance(tensor, ir.ExternalTensor):
                value = node.outputs[0]
                graph.remove(node)
                _as_input(out, value, tensor)
                unknown.append(name)
    return Rebound(out, tuple(unknown))


__all__ = ["Rebound", "already_optimized", "own_tensors", "rebound"]
