"""Carry out a `CenteringPlan` on the model it was computed from: center, untie, rewrite.

The arithmetic (float64, one rounding back) is in `_centering`; centered weights stay lazy
until the model is written. New nodes take the place of the
nodes they replace (node order is kept: ONNX Runtime's memory planning follows it), the LN's output
name survives on the final tensor, and every new tensor gets its type and shape, because ONNX shape
inference does not know `SimplifiedLayerNormalization`.
"""

from __future__ import annotations

import logging

import numpy as np
import onnx_ir as ir

from onnx_lnfold._centering import CenteredTensor, bias_plus_beta
from onnx_lnfold._names import fresh_name, taken_names
from onnx_lnfold._plan import AuxCentering, CenteringEdit, CenteringPlan, LnDecision
from onnx_lnfold._recognize import SKIP_LAYER_NORM
from onnx_lnfold._ir import constant_of
from onnx_lnfold._targets import ONNX_RMS_OP, RMS_OP, SKIP_RMS_OP, bias_slot

logger = logging.getLogger(__name__)


def _new_constant(graph: ir.Graph, tensor: ir.TensorProtocol) -> ir.Value:
    value = ir.Value(name=tensor.name, shape=ir.Shape(tensor.shape), type=ir.TensorType(tensor.dtype))
    value.const_value = tensor
    graph.register_initializer(value)
    return value


def _like(value: ir.Value, name: str, inferred=(None, None)) -> ir.Value:
    """A new tensor with the type and shape of `value` (they become its value_info), or the
    inferred ones where the model declares none: shape inference cannot see through the new ops."""
    shape, dtype = value.shape, value.type
    if shape is None and inferred[0] is not None:
        shape = ir.Shape(list(inferred[0]))
    if dtype is None and inferred[1] is not None:
        dtype = ir.TensorType(inferred[1])
    return ir.Value(name=name, shape=shape, type=dtype)


def _apply_edit(graph: ir.Graph, edit: CenteringEdit) -> None:
    value = edit._value
    tensor = constant_of(value)
    assert tensor is not None, edit.tensor
    if edit.untie:
        copy = _new_constant(graph, CenteredTensor(tensor, edit.axis, edit.new_name or "", edit.weights))
        for node, index in edit._uses:
            node.replace_input_with(index, copy)
        return
    centered = CenteredTensor(tensor, edit.axis, value.name or "", edit.weights)
    producer = value.producer()
    if producer is not None and producer.op_type == "Constant":
        for key in list(producer.attributes):
            del producer.attributes[key]
        producer.attributes["value"] = ir.AttrTensor("value", centered)
    value.const_value = centered


def _apply_centering(graph: ir.Graph, centering: AuxCentering, opset: int, taken: set[str]) -> None:
    """Insert `c = x - ReduceMean(x, axis)` right after x is produced; the planned uses read c."""
    x = centering._value
    mean_shape = None
    if x.shape is not None:
        dims = list(x.shape)
        dims[centering.axis] = 1
        mean_shape = ir.Shape(dims)
    mean = ir.Value(name=fresh_name(f"{x.name}.mean", taken), shape=mean_shape, type=x.type)
    stem = fresh_name(f"{x.name}/center", taken)
    if opset >= 18:
        axes = _new_constant(graph, ir.Tensor(np.array([centering.axis], dtype=np.int64), name=fresh_name(f"{stem}/axes", taken)))
        reduce = ir.Node("", "ReduceMean", [x, axes], [ir.AttrInt64("keepdims", 1)], outputs=[mean], name=f"{stem}/mean")
    else:
        attrs = [ir.AttrInt64s("axes", [centering.axis]), ir.AttrInt64("keepdims", 1)]
        reduce = ir.Node("", "ReduceMean", [x], attrs, outputs=[mean], name=f"{stem}/mean")
    centered = _like(x, centering.new_name)
    sub = ir.Node("", "Sub", [x, mean], outputs=[centered], name=f"{stem}/sub")
    producer = x.producer()
    if producer is None:
        owner = x.graph or graph
        owner.insert_before(next(iter(owner)), [reduce, sub])
    else:
        producer.graph.insert_after(producer, [reduce, sub])
    for node, index in centering._uses:
        node.replace_input_with(index, centered)


def _add_beta_to_bias(
    graph: ir.Graph,
    node: ir.Node,
    bias_index: int,
    beta: np.ndarray,
    weight: ir.TensorProtocol,
    taken: set[str],
    *,
    trans: bool = False,
    scale: float = 1.0,
) -> None:
    """node.inputs[bias_index] += scale * (beta @ weight), copying the bias first if anything
    else reads it."""
    how = {"trans": trans, "scale": scale}
    old = node.inputs[bias_index]
    tensor = constant_of(old)
    assert tensor is not None
    if len(old.uses()) == 1 and not old.is_graph_output() and old.is_initializer():
        old.const_value = bias_plus_beta(tensor, beta, weight, dtype=tensor.dtype, name=old.name or "", **how)
        return
    name = fresh_name(f"{old.name}.with_beta", taken)
    summed = bias_plus_beta(tensor, beta, weight, dtype=tensor.dtype, name=name, **how)
    node.replace_input_with(bias_index, _new_constant(graph, summed))


def _fold_beta_into_consumers(graph: ir.Graph, consumers: list[ir.Node], beta: np.ndarray, taken: set[str]) -> None:
    """consumer(y + beta) == consumer(y) with bias += beta @ W, for every linear consumer."""
    for node in consumers:
        weight = constant_of(node.inputs[1])
        assert weight is not None
        attrs = node.attributes
        trans_b = node.op_type == "Gemm" and bool(attrs.get_int("transB", 0))
        # A beta of shape [1] (or a scalar) is broadcast over the normalized axis: beta @ W
        # needs it as a row of K.
        rows = weight.shape[1] if trans_b else weight.shape[0]
        row = np.broadcast_to(beta.reshape(-1), (rows,))
        if node.op_type == "Gemm":
            scale = attrs.get_float("alpha", 1.0) / attrs.get_float("beta", 1.0)  # Gemm computes alpha * (A @ B) + beta_g * C
            if len(node.inputs) > 2 and node.inputs[2] is not None:
                _add_beta_to_bias(graph, node, 2, row, weight, taken, trans=trans_b, scale=scale)
            else:
                name = fresh_name(f"{node.name or 'gemm'}.bias_from_beta", taken)
                tensor = bias_plus_beta(None, row, weight, trans=trans_b, scale=scale, dtype=weight.dtype, name=name)
                node.resize_inputs(3)
                node.replace_input_with(2, _new_constant(graph, tensor))
            continue
        slot = bias_slot(node)
        assert slot is not None, node.name
        _add_beta_to_bias(graph, slot[0], slot[1], row, weight, taken)


def _scale(graph: ir.Graph, decision: LnDecision, taken: set[str]) -> ir.Value:
    """The RMSNorm scale: gamma, or ones for a decomposed LN written without one."""
    cand = decision._cand
    if cand.scale is not None:
        return cand.scale
    dim, dtype = cand.ones_scale
    ones = ir.Tensor(np.ones((dim,), dtype=dtype.numpy()), dtype=dtype, name=fresh_name(f"{cand.name}.scale", taken))
    return _new_constant(graph, ones)


def _rewrite(graph: ir.Graph, decision: LnDecision, taken: set[str]) -> None:
    cand = decision._cand
    out = cand.out
    out_name = out.name
    stem = cand.name
    removed = set(cand.nodes)
    epsilon = ir.AttrFloat32("epsilon", decision.epsilon)
    old_sum = None  # the residual sum a SkipSimplifiedLayerNormalization takes over
    if decision.rewrite == SKIP_RMS_OP:
        if cand.kind == SKIP_LAYER_NORM:
            node = cand.node
            inputs = [node.inputs[0], node.inputs[1], node.inputs[2]]
            if len(node.inputs) > 4 and node.inputs[4] is not None:
                inputs.append(node.inputs[4])
            old_sum = node.outputs[3] if len(node.outputs) > 3 else None
            anchor = node
        else:
            add = decision._residual_add
            inputs = [add.inputs[0], add.inputs[1], _scale(graph, decision, taken)]
            bias_add = decision._bias_add
            if bias_add is not None:  # x + bias + skip: the bias becomes the op's bias input
                slot = 0 if inputs[0] is bias_add.outputs[0] else 1
                is_const = [constant_of(v) is not None for v in bias_add.inputs]
                inputs[slot] = bias_add.inputs[is_const.index(False)]
                inputs.append(bias_add.inputs[is_const.index(True)])
                removed.add(bias_add)
            old_sum = add.outputs[0]
            anchor = add
            removed.add(add)
        keep_sum = old_sum is not None and (
            old_sum.is_graph_output() or any(n not in removed for n, _ in old_sum.uses())
        )
        y = _like(out, fresh_name(f"{out_name}.rms", taken), decision._out_type)
        outputs = [y]
        if keep_sum:  # outputs 1 and 2 (mean, inv_std_var) stay unnamed: not computed
            outputs += [ir.Value(), ir.Value(), _like(old_sum, fresh_name(f"{old_sum.name}.sum", taken))]
        rms = ir.Node(
            "com.microsoft",
            "SkipSimplifiedLayerNormalization",
            inputs,
            [epsilon],
            outputs=outputs,
            name=fresh_name(f"{stem}/skip_rms", taken),
        )
        if keep_sum:
            rms.outputs[1].name = rms.outputs[2].name = ""
    else:
        anchor = cand.nodes[-1]  # a pattern's nodes are in data order, so this one comes last
        op = ONNX_RMS_OP if decision.rewrite == ONNX_RMS_OP else RMS_OP
        y = _like(out, fresh_name(f"{out_name}.rms", taken), decision._out_type)
        rms = ir.Node(
            "",
            op,
            [cand.x, _scale(graph, decision, taken)],
            [ir.AttrInt64("axis", decision.axis), epsilon, ir.AttrInt64("stash_type", 1)],  # type: ignore[arg-type]
            outputs=[y],
            name=fresh_name(f"{stem}/rms", taken),
        )
    new_nodes = [rms]
    final = y
    if decision.beta == "add":
        final = _like(out, fresh_name(f"{out_name}.beta", taken), decision._out_type)
        new_nodes.append(ir.Node("", "Add", [y, cand.bias], outputs=[final], name=fresh_name(f"{stem}/beta", taken)))
    elif decision.beta == "consumers":
        beta = np.asarray(constant_of(cand.bias).numpy()).astype(np.float64)  # type: ignore[union-attr]
        _fold_beta_into_consumers(graph, decision._beta_consumers, beta, taken)
    owner = anchor.graph  # the main graph, or the If/Loop body the LN lives in
    owner.insert_after(anchor, new_nodes)
    out.replace_all_uses_with(final, replace_graph_outputs=True)
    sum_name = None
    if old_sum is not None and len(rms.outputs) > 3:
        sum_name = old_sum.name
        old_sum.replace_all_uses_with(rms.outputs[3], replace_graph_outputs=True)
    owner.remove(removed, safe=True)
    for param in (cand.scale, cand.bias):  # gamma/beta the rewrite no longer reads
        if param is not None and param.is_initializer() and not param.uses() and not param.is_graph_output():
            if not param.is_graph_input():
                # of the graph that holds it: an If/Loop body's own beta is not the main graph's
                (param.graph or graph).initializers.pop(param.name)
    # The replaced tensors' names move to the tensors that now hold their values: consumers,
    # graph outputs and anything downstream that refers to tensors by name stay valid.
    out.name = None
    final.name = out_name
    if sum_name is not None:
        old_sum.name = None
        rms.outputs[3].name = sum_name


def apply_plan(model: ir.Model, plan: CenteringPlan) -> None:
    """Mutate `model` as `plan` says. The plan must have been computed on this very model."""
    graph = model.graph
    taken = taken_names(graph) | {e.new_name for e in plan.edits if e.new_name}
    taken |= {c.new_name for c in plan.centerings}
    # Centering first: a beta folded into a consumer's bias is computed with the edited weights.
    for edit in plan.edits:
        _apply_edit(graph, edit)
    opset = model.opset_imports.get("", model.opset_imports.get("ai.onnx", 17))
    for centering in plan.centerings:
        _apply_centering(graph, centering, opset, taken)
    for decision in plan.folded:
        _rewrite(graph, decision, taken)
    if any(d.rewrite == SKIP_RMS_OP for d in plan.folded) and "com.microsoft" not in model.opset_imports:
        model.opset_imports["com.microsoft"] = 1
    # Constant nodes whose every use now reads a centered copy are dead.
    edited = {e._value for e in plan.edits}
    for node in list(graph):
        if node.op_type == "Constant" and node.outputs[0] in edited:
            if not node.outputs[0].uses() and not node.outputs[0].is_graph_output():
                graph.remove(node, safe=True)
    logger.info(
        "folded %d LayerNorm node(s), centered %d constant(s), inserted %d centering(s)",
        len(plan.folded),
        len(plan.edits),
        len(plan.centerings),
    )
