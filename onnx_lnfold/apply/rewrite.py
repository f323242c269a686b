"""Rewrite one folded LN as the plan says (`Rewrite`, from `decide.targets`): the RMS op it becomes,
one function per emitted op, then what every op shares: beta (an `Add`, or folded into the
consumers' biases), the output name moved onto the new tensor, the replaced nodes removed.

New nodes take the place of the nodes they replace (node order is kept: ONNX Runtime's memory
planning follows it), and every new tensor gets its type and shape, because ONNX shape inference
does not know `SimplifiedLayerNormalization`.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from onnx_lnfold.analysis.plan import LnDecision
from onnx_lnfold.apply.centering import bias_plus_beta
from onnx_lnfold.core.ir import constant_of, is_standard
from onnx_lnfold.core.names import fresh_name
from onnx_lnfold.core.ops import PRIMITIVE_OPS, SKIP_RMS_NORM
from onnx_lnfold.decide.targets import ONNX_RMS_OP, PRIMITIVE_RMS_OP, RMS_OP, SKIP_RMS_OP, Rewrite, bias_slot


def new_constant(graph: ir.Graph, tensor: ir.TensorProtocol) -> ir.Value:
    value = ir.Value(name=tensor.name, shape=ir.Shape(tensor.shape), type=ir.TensorType(tensor.dtype))
    value.const_value = tensor
    graph.register_initializer(value)
    return value


def value_like(value: ir.Value, name: str, dtype: ir.DataType | None = None) -> ir.Value:
    """A new tensor declared as the model declares `value` (its value_info), or, where it declares
    no type, of `dtype`: ONNX's type inference cannot see through the new ops. Never with a shape
    the model does not declare: ONNX Runtime infers the new ops' shapes itself, and a declared one
    tells its optimizer more than it knew of the original, which it acts on outside what the fold
    prices (docs/DESIGN.md section 10)."""
    declared = value.type
    if declared is None and dtype is not None:
        declared = ir.TensorType(dtype)
    return ir.Value(name=name, shape=value.shape, type=declared)


def _read(slots) -> list[ir.Value]:
    return [node.inputs[index] for node, index in slots]  # type: ignore[misc]


def _scale(graph: ir.Graph, rewrite: Rewrite, taken: set[str]) -> ir.Value:
    """The RMSNorm scale: gamma, or ones for a decomposed LN written without one."""
    cand = rewrite.cand
    if cand.scale is not None:
        return cand.scale
    dim, dtype = cand.ones_scale  # type: ignore[misc]
    ones = ir.Tensor(np.ones((dim,), dtype=dtype.numpy()), dtype=dtype, name=fresh_name(f"{cand.name}.scale", taken))
    return new_constant(graph, ones)


def _rms(graph: ir.Graph, decision: LnDecision, rewrite: Rewrite, taken: set[str]) -> ir.Node:
    """SimplifiedLayerNormalization (or RMSNormalization, same inputs and attributes)."""
    cand = rewrite.cand
    y = value_like(cand.out, fresh_name(f"{cand.out.name}.rms", taken), rewrite.out_dtype)
    # Every folded LN normalizes its last axis (the forms keep the others: several-axes,
    # not-last-axis), written -1 as exporters write it: OpenVINO cannot read a
    # SimplifiedLayerNormalization whose axis is written non-negative (its translator builds
    # Range(axis, rank) with the rank as a 1-D shape and refuses the model; the version measured:
    # docs/DESIGN.md section 4).
    assert decision.axis is not None
    attributes = [
        ir.AttrInt64("axis", -1),
        ir.AttrFloat32("epsilon", decision.epsilon),
        ir.AttrInt64("stash_type", 1),
    ]
    inputs = [*_read(rewrite.site.inputs), _scale(graph, rewrite, taken)]
    op = ONNX_RMS_OP if rewrite.op == ONNX_RMS_OP else RMS_OP
    return ir.Node("", op, inputs, attributes, outputs=[y], name=fresh_name(f"{cand.name}/rms", taken))


def _skip_rms(graph: ir.Graph, decision: LnDecision, rewrite: Rewrite, taken: set[str]) -> ir.Node:
    """com.microsoft::SkipSimplifiedLayerNormalization: input + skip (+ bias), normalized; its
    output 3 takes over the residual sum when anything else reads it."""
    cand, site = rewrite.cand, rewrite.site
    inputs = [*_read(site.inputs), _scale(graph, rewrite, taken)]
    if site.skip_bias is not None:
        inputs += _read((site.skip_bias,))
    old_sum, replaced = site.old_sum, rewrite.replaced
    keep_sum = old_sum is not None and (old_sum.is_graph_output() or any(n not in replaced for n, _ in old_sum.uses()))
    y = value_like(cand.out, fresh_name(f"{cand.out.name}.rms", taken), rewrite.out_dtype)
    outputs = [y]
    if keep_sum:  # outputs 1 and 2 (mean, inv_std_var) stay unnamed: not computed
        outputs += [ir.Value(), ir.Value(), value_like(old_sum, fresh_name(f"{old_sum.name}.sum", taken))]  # type: ignore[union-attr]
    rms = ir.Node(
        SKIP_RMS_NORM.domain,
        SKIP_RMS_NORM.op_type,
        inputs,
        [ir.AttrFloat32("epsilon", decision.epsilon)],
        outputs=outputs,
        name=fresh_name(f"{cand.name}/skip_rms", taken),
    )
    if keep_sum:
        rms.outputs[1].name = rms.outputs[2].name = ""
    return rms


def _primitive(graph: ir.Graph, decision: LnDecision, rewrite: Rewrite, taken: set[str]) -> list[ir.Node]:
    """RMSNorm as standard ops, in the form ONNX Runtime's and OpenVINO's RMSNorm fusions both
    recognize (`core.ops.PRIMITIVE_OPS`): `Pow(x, 2)`, `ReduceMean` over the last axis (axes an
    input from opset 18, an attribute below; keepdims), `Add(epsilon)`, `Sqrt`, `Div(x, .)`,
    `Mul(., gamma)`. The constants are of x's type (valid at every opset since Pow-7) and
    scalars; each intermediate is read by the next op alone. A gamma of ones keeps its `Mul`:
    ONNX Runtime's SimplifiedLayerNormFusion needs it (docs/DESIGN.md section 2.5)."""
    pow_, reduce_mean, add, sqrt, div, mul = PRIMITIVE_OPS
    cand = rewrite.cand
    (x,) = _read(rewrite.site.inputs)
    shape = tuple(cand.out.shape) if cand.out.shape is not None else None
    dtype = rewrite.out_dtype or (x.type.dtype if x.type is not None else ir.DataType.FLOAT)
    numpy_type = dtype.numpy()
    base = cand.name

    def constant(what: str, array: np.ndarray, of: ir.DataType) -> ir.Value:
        return new_constant(graph, ir.Tensor(array, dtype=of, name=fresh_name(f"{base}.{what}", taken)))

    def tensor(what: str, dims) -> ir.Value:
        known = ir.Shape(list(dims)) if dims is not None else None
        return ir.Value(name=fresh_name(f"{base}/{what}", taken), shape=known, type=ir.TensorType(dtype))

    rows = (*shape[:-1], 1) if shape is not None else None
    two = constant("two", np.array(2.0, dtype=numpy_type), dtype)
    squares = tensor("squares", shape)
    mean_square = tensor("mean_square", rows)
    with_eps = tensor("mean_square_eps", rows)
    rms = tensor("rms", rows)
    normalized = tensor("normalized", shape)
    y = value_like(cand.out, fresh_name(f"{cand.out.name}.rms", taken), rewrite.out_dtype)
    opset = graph.opset_imports.get("", graph.opset_imports.get("ai.onnx", 18))
    if opset >= 18:
        axes = constant("axes", np.array([-1], dtype=np.int64), ir.DataType.INT64)
        mean = ir.Node("", reduce_mean, [squares, axes], [ir.AttrInt64("keepdims", 1)], outputs=[mean_square])
    else:
        mean = ir.Node("", reduce_mean, [squares], [ir.AttrInt64s("axes", [-1]), ir.AttrInt64("keepdims", 1)], outputs=[mean_square])
    epsilon = constant("epsilon", np.array(decision.epsilon, dtype=numpy_type), dtype)
    nodes = [
        ir.Node("", pow_, [x, two], outputs=[squares]),
        mean,
        ir.Node("", add, [mean_square, epsilon], outputs=[with_eps]),
        ir.Node("", sqrt, [with_eps], outputs=[rms]),
        ir.Node("", div, [x, rms], outputs=[normalized]),
        ir.Node("", mul, [normalized, _scale(graph, rewrite, taken)], outputs=[y]),
    ]
    for node, what in zip(nodes, ("square", "mean", "add_eps", "sqrt", "div", "scale")):
        node.name = fresh_name(f"{base}/rms_{what}", taken)
    return nodes


# The op a target writes -> the function that builds its nodes (a new target op adds its builder here).
EMITTERS = {RMS_OP: _rms, ONNX_RMS_OP: _rms, SKIP_RMS_OP: _skip_rms, PRIMITIVE_RMS_OP: _primitive}


def _add_beta_to_bias(
    graph: ir.Graph,
    slot: tuple[ir.Node, int],
    beta: np.ndarray,
    weight: ir.TensorProtocol,
    taken: set[str],
    *,
    trans: bool = False,
    scale: float = 1.0,
) -> None:
    """The bias at `slot` (node, input index) += scale * (beta @ weight), copying the bias first if
    anything else reads it."""
    how = {"trans": trans, "scale": scale}
    node, bias_index = slot
    old = node.inputs[bias_index]
    tensor = constant_of(old)
    assert tensor is not None
    if len(old.uses()) == 1 and not old.is_graph_output() and old.is_initializer():
        old.const_value = bias_plus_beta(tensor, beta, weight, dtype=tensor.dtype, name=old.name or "", **how)
        return
    name = fresh_name(f"{old.name}.with_beta", taken)
    summed = bias_plus_beta(tensor, beta, weight, dtype=tensor.dtype, name=name, **how)
    node.replace_input_with(bias_index, new_constant(graph, summed))


def _created_bias(graph: ir.Graph, matmul: ir.Node, tensor: ir.TensorProtocol, taken: set[str]) -> ir.Node:
    """An `Add(matmul output, bias)` after a MatMul that had no bias; its output takes over the
    MatMul output's readers and name (a graph output stays one, under its name)."""
    out = matmul.outputs[0]
    name = out.name
    summed = value_like(out, fresh_name(f"{name}.with_bias", taken))
    out.replace_all_uses_with(summed, replace_graph_outputs=True)
    add = ir.Node("", "Add", [out, new_constant(graph, tensor)], outputs=[summed],
                  name=fresh_name(f"{matmul.name or 'matmul'}/bias_from_beta", taken))
    matmul.graph.insert_after(matmul, [add])  # type: ignore[union-attr]
    out.name = fresh_name(f"{name}.without_bias", taken)
    summed.name = name
    return add


def _fold_beta_into_consumers(graph: ir.Graph, sites, beta: np.ndarray, taken: set[str]) -> None:
    """consumer(y + beta) == consumer(y) with bias += beta @ W, for every linear consumer whose
    site is a bias (its own or one created for it); a key projection whose share the attention's
    Softmax removes is left as it is (`decide.softmax_shift`)."""
    for site in sites:
        if site.how == "softmax":
            continue
        node = site.node
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
                _add_beta_to_bias(graph, (node, 2), row, weight, taken, trans=trans_b, scale=scale)
            else:
                name = fresh_name(f"{node.name or 'gemm'}.bias_from_beta", taken)
                tensor = bias_plus_beta(None, row, weight, trans=trans_b, scale=scale, dtype=weight.dtype, name=name)
                node.resize_inputs(3)
                node.replace_input_with(2, new_constant(graph, tensor))
            continue
        if site.how == "created":
            name = fresh_name(f"{node.name or 'matmul'}.bias_from_beta", taken)
            _created_bias(graph, node, bias_plus_beta(None, row, weight, dtype=weight.dtype, name=name), taken)
            continue
        slot = bias_slot(node)
        assert slot is not None, node.name
        _add_beta_to_bias(graph, slot, row, weight, taken)


def rewrite_layer_norm(graph: ir.Graph, decision: LnDecision, rewrite: Rewrite, taken: set[str]) -> None:
    """Replace one folded LN (its nodes, and the residual Add it takes in) by the op planned."""
    cand, site = rewrite.cand, rewrite.site
    out, out_name = cand.out, cand.out.name
    emitted = EMITTERS[rewrite.op](graph, decision, rewrite, taken)
    new_nodes = emitted if isinstance(emitted, list) else [emitted]
    rms = new_nodes[-1]  # the node whose output 0 is the normalized tensor (and 3 the sum, for a Skip op)
    y = rms.outputs[0]
    final = y
    if rewrite.beta.how == "add":
        final = value_like(out, fresh_name(f"{out_name}.beta", taken), rewrite.out_dtype)
        new_nodes.append(ir.Node("", "Add", [y, cand.bias], outputs=[final], name=fresh_name(f"{cand.name}/beta", taken)))
    elif rewrite.beta.how == "consumers":
        beta = np.asarray(constant_of(cand.bias).numpy()).astype(np.float64)  # type: ignore[union-attr]
        _fold_beta_into_consumers(graph, rewrite.beta.sites, beta, taken)
    owner = site.anchor.graph  # the main graph, or the If/Loop body the LN lives in
    owner.insert_after(site.anchor, new_nodes)  # type: ignore[union-attr]
    out.replace_all_uses_with(final, replace_graph_outputs=True)
    old_sum, sum_name = site.old_sum, None
    if old_sum is not None and len(rms.outputs) > 3:
        sum_name = old_sum.name
        old_sum.replace_all_uses_with(rms.outputs[3], replace_graph_outputs=True)
    owner.remove(rewrite.replaced, safe=True)  # type: ignore[union-attr]
    for param in (cand.scale, cand.bias):  # gamma/beta the rewrite no longer reads
        if param is None or param.uses() or param.is_graph_output():
            continue
        if param.is_initializer() and not param.is_graph_input():
            # of the graph that holds it: an If/Loop body's own beta is not the main graph's
            (param.graph or graph).initializers.pop(param.name)
        elif (producer := param.producer()) is not None and producer.op_type == "Constant" and is_standard(producer):
            producer.graph.remove(producer, safe=True)  # type: ignore[union-attr]  # an all-zero beta as TorchScript writes it
    # The replaced tensors' names move to the tensors that now hold their values: consumers,
    # graph outputs and anything downstream that refers to tensors by name stay valid.
    out.name = None
    final.name = out_name
    if sum_name is not None:
        old_sum.name = None  # type: ignore[union-attr]
        rms.outputs[3].name = sum_name
