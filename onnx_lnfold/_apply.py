"""Carry out a `CenteringPlan` on the model it was computed from: center, untie, rewrite.

Centering is done in float64 and cast back to the tensor's dtype. New nodes take the place of the
LN they replace (node order is kept: ONNX Runtime's memory planning follows it), the LN's output
name survives on the final tensor, and every new tensor gets its type and shape, because ONNX shape
inference does not know `SimplifiedLayerNormalization`.
"""

from __future__ import annotations

import logging

import numpy as np
import onnx_ir as ir

from onnx_lnfold._analyze import RMS_OP, constant_of
from onnx_lnfold._names import fresh_name, taken_names
from onnx_lnfold._plan import CenteringEdit, CenteringPlan, LnDecision

logger = logging.getLogger(__name__)


def _centered(tensor: ir.TensorProtocol, axis: int | None, name: str) -> ir.Tensor:
    data = np.asarray(tensor.numpy())
    wide = data.astype(np.float64)
    if axis is None:
        wide = np.zeros_like(wide)
    else:
        wide = wide - wide.mean(axis=axis, keepdims=True)
    return ir.Tensor(wide.astype(data.dtype), dtype=tensor.dtype, name=name)


def _new_constant(graph: ir.Graph, like: ir.Value, tensor: ir.Tensor) -> ir.Value:
    value = ir.Value(name=tensor.name, shape=ir.Shape(tensor.shape), type=ir.TensorType(tensor.dtype))
    value.const_value = tensor
    graph.register_initializer(value)
    return value


def _apply_edit(graph: ir.Graph, edit: CenteringEdit) -> None:
    value = edit._value
    tensor = constant_of(value)
    assert tensor is not None, edit.tensor
    if edit.untie:
        copy = _new_constant(graph, value, _centered(tensor, edit.axis, edit.new_name or ""))
        for node, index in edit._uses:
            node.replace_input_with(index, copy)
        return
    centered = _centered(tensor, edit.axis, value.name or "")
    producer = value.producer()
    if producer is not None and producer.op_type == "Constant":
        for key in list(producer.attributes):
            del producer.attributes[key]
        producer.attributes["value"] = ir.AttrTensor("value", centered)
    value.const_value = centered


def _add_bias_delta(graph: ir.Graph, node: ir.Node, bias_index: int, delta: np.ndarray, taken: set[str]) -> None:
    """node.inputs[bias_index] += delta, copying the bias first if anything else reads it."""
    old = node.inputs[bias_index]
    tensor = constant_of(old)
    assert tensor is not None
    data = np.asarray(tensor.numpy())
    summed = (data.astype(np.float64) + delta.reshape(data.shape)).astype(data.dtype)
    if len(old.uses()) == 1 and not old.is_graph_output() and old.is_initializer():
        old.const_value = ir.Tensor(summed, dtype=tensor.dtype, name=old.name)
        return
    name = fresh_name(f"{old.name}.with_beta", taken)
    node.replace_input_with(bias_index, _new_constant(graph, old, ir.Tensor(summed, dtype=tensor.dtype, name=name)))


def _fold_beta_into_consumers(graph: ir.Graph, out: ir.Value, beta: np.ndarray, taken: set[str]) -> None:
    """consumer(y + beta) == consumer(y) with bias += beta @ W, for every linear consumer."""
    for node, _ in out.uses():
        weight = np.asarray(constant_of(node.inputs[1]).numpy()).astype(np.float64)  # type: ignore[union-attr]
        if node.op_type == "Gemm":
            attrs = node.attributes
            trans_b = attrs["transB"].as_int() if "transB" in attrs else 0
            alpha = attrs["alpha"].as_float() if "alpha" in attrs else 1.0
            beta_g = attrs["beta"].as_float() if "beta" in attrs else 1.0
            delta = alpha * (beta @ (weight.T if trans_b else weight))
            if len(node.inputs) > 2 and node.inputs[2] is not None:
                _add_bias_delta(graph, node, 2, delta / beta_g, taken)
            else:
                dtype = constant_of(node.inputs[1]).dtype  # type: ignore[union-attr]
                name = fresh_name(f"{node.name or 'gemm'}.bias_from_beta", taken)
                tensor = ir.Tensor((delta / beta_g).astype(dtype.numpy()), dtype=dtype, name=name)
                node.resize_inputs(3)
                node.replace_input_with(2, _new_constant(graph, out, tensor))
            continue
        delta = beta @ weight
        (add, _), = node.outputs[0].uses()
        index = 1 if add.inputs[0] is node.outputs[0] else 0
        _add_bias_delta(graph, add, index, delta, taken)


def _rewrite(graph: ir.Graph, decision: LnDecision, taken: set[str]) -> None:
    ln = decision._node
    x, scale = ln.inputs[0], ln.inputs[1]
    bias = ln.inputs[2] if len(ln.inputs) > 2 else None
    old_out = ln.outputs[0]
    out_name = old_out.name
    stem = ln.name or out_name or "ln"
    rms_out = ir.Value(name=fresh_name(f"{out_name}.rms", taken), shape=old_out.shape, type=old_out.type)
    rms = ir.Node(
        "",
        RMS_OP,
        [x, scale],
        attributes=[
            ir.AttrInt64("axis", decision.axis),  # type: ignore[arg-type]
            ir.AttrFloat32("epsilon", decision.epsilon),
            ir.AttrInt64("stash_type", 1),
        ],
        outputs=[rms_out],
        name=fresh_name(f"{stem}/rms", taken),
    )
    new_nodes = [rms]
    final = rms_out
    if decision.beta == "add":
        final = ir.Value(name=fresh_name(f"{out_name}.beta", taken), shape=old_out.shape, type=old_out.type)
        new_nodes.append(ir.Node("", "Add", [rms_out, bias], outputs=[final], name=fresh_name(f"{stem}/beta", taken)))
    elif decision.beta == "consumers":
        beta = np.asarray(constant_of(bias).numpy()).astype(np.float64)  # type: ignore[union-attr]
        _fold_beta_into_consumers(graph, old_out, beta, taken)
    old_out.replace_all_uses_with(final, replace_graph_outputs=True)
    graph.insert_after(ln, new_nodes)
    graph.remove(ln, safe=True)
    old_out.name = None
    # Keep the LN's output name on the tensor that now holds its value: consumers, graph outputs
    # and anything downstream that refers to tensors by name stay valid.
    final_name = final.name
    final.name = out_name
    if final is not rms_out:
        taken.add(final_name or "")


def apply_plan(model: ir.Model, plan: CenteringPlan) -> None:
    """Mutate `model` as `plan` says. The plan must have been computed on this very model."""
    graph = model.graph
    taken = taken_names(graph) | {e.new_name for e in plan.edits if e.new_name}
    # Centering first: a beta folded into a consumer's bias is computed with the edited weights.
    for edit in plan.edits:
        _apply_edit(graph, edit)
    for decision in plan.folded:
        _rewrite(graph, decision, taken)
    # Constant nodes whose every use now reads a centered copy are dead.
    for node in list(graph):
        if node.op_type == "Constant" and not any(o.uses() or o.is_graph_output() for o in node.outputs):
            if any(e._value is node.outputs[0] for e in plan.edits):
                graph.remove(node, safe=True)
    logger.info("folded %d LayerNorm node(s), centered %d constant(s)", len(plan.folded), len(plan.edits))
