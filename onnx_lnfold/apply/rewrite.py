"""Rewrite one folded LN as the plan says (`Rewrite`, from `decide.targets`): the nodes its
`emission` records (`decide.emission`: the RMS op, or the primitive target's ops, and beta's Add
where beta stays one), each noting the LN it stands for (`apply.notes`); beta's shares added to
the consumers' biases; the output names moved onto the new tensors; the replaced nodes removed.

New nodes take the place of the nodes they replace (node order is kept: ONNX Runtime's memory
planning follows it), and every new tensor gets its type and shape, because ONNX shape inference
does not know `SimplifiedLayerNormalization`.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from onnx_lnfold.analysis.plan import LnDecision
from onnx_lnfold.apply import notes
from onnx_lnfold.apply.centering import bias_plus_beta
from onnx_lnfold.core.ir import constant_of
from onnx_lnfold.core.names import fresh_name
from onnx_lnfold.decide.emission import Axes, BiasShare, Emission, Filled, Output, Produced
from onnx_lnfold.decide.targets import Rewrite


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


def written_axes(
    graph: ir.Graph, axes: tuple[int, ...], opset: int, stem: str, taken: set[str]
) -> tuple[list[ir.Value], list[ir.Attr]]:
    """A ReduceMean's axes as its opset writes them: (the input, no attribute) from opset 18, where
    axes became an input (a constant named from `stem`); (no input, the attribute) before."""
    if opset >= 18:
        tensor = ir.Tensor(np.array(axes, dtype=np.int64), dtype=ir.DataType.INT64, name=fresh_name(stem, taken))
        return [new_constant(graph, tensor)], []
    return [], [ir.AttrInt64s("axes", list(axes))]


def _output(spec: Output, taken: set[str]) -> ir.Value:
    if spec.stem is None:
        return ir.Value()
    name = fresh_name(spec.stem, taken)
    if spec.like is not None:
        return value_like(spec.like, name, spec.dtype)
    shape = ir.Shape(list(spec.dims)) if spec.dims is not None else None
    return ir.Value(name=name, shape=shape, type=ir.TensorType(spec.dtype))  # type: ignore[arg-type]


def build_nodes(graph: ir.Graph, emission: Emission, opset: int, taken: set[str], notes: list[str]) -> list[ir.Node]:
    """The nodes of `emission`, with `notes[k]` the doc_string of its node k. Names are handed out
    outputs first, then the constants, then the nodes, each in node order; an input slot is read
    now (an earlier rewrite may have replaced the tensor in it)."""
    outputs = [[_output(o, taken) for o in spec.outputs] for spec in emission.nodes]
    inputs: list[list[ir.Value | None]] = []
    attributes: list[list[ir.Attr]] = []
    for spec in emission.nodes:
        read: list[ir.Value | None] = []
        extra: list[ir.Attr] = []
        for source in spec.inputs:
            if isinstance(source, Filled):
                tensor = ir.Tensor(source.array(), dtype=source.dtype, name=fresh_name(source.stem, taken))
                read.append(new_constant(graph, tensor))
            elif isinstance(source, Axes):
                axes_input, extra = written_axes(graph, source.values, opset, source.stem, taken)
                read += axes_input
            elif isinstance(source, Produced):
                read.append(outputs[source.node][source.output])
            elif isinstance(source, tuple):  # an input slot of the original graph
                node, index = source
                read.append(node.inputs[index])
            else:  # a tensor of the original, or an optional input left out
                read.append(source)
        inputs.append(read)
        attributes.append([*extra, *spec.attributes])
    nodes = []
    for k, spec in enumerate(emission.nodes):
        name = fresh_name(spec.stem, taken)
        node = ir.Node(spec.domain, spec.op_type, inputs[k], attributes[k], outputs=outputs[k], name=name, doc_string=notes[k])
        for value, out in zip(node.outputs, spec.outputs):
            if out.stem is None:
                value.name = ""
        nodes.append(node)
    return nodes


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


def _created_bias(graph: ir.Graph, matmul: ir.Node, tensor: ir.TensorProtocol, taken: set[str], note: str) -> None:
    """An `Add(matmul output, bias)` after a MatMul that had no bias; its output takes over the
    MatMul output's readers and name (a graph output stays one, under its name)."""
    out = matmul.outputs[0]
    name = out.name
    summed = value_like(out, fresh_name(f"{name}.with_bias", taken))
    out.replace_all_uses_with(summed, replace_graph_outputs=True)
    add = ir.Node("", "Add", [out, new_constant(graph, tensor)], outputs=[summed],
                  name=fresh_name(f"{matmul.name or 'matmul'}/bias_from_beta", taken), doc_string=note)
    matmul.graph.insert_after(matmul, [add])  # type: ignore[union-attr]
    out.name = fresh_name(f"{name}.without_bias", taken)
    summed.name = name


def _fold_beta_into_consumers(
    graph: ir.Graph, shares: tuple[BiasShare, ...], beta: np.ndarray, taken: set[str], decision: LnDecision
) -> None:
    """consumer(y + beta) == consumer(y) with bias += scale * (beta @ W), for every linear consumer
    the emission gives a share of beta (a key projection whose share the attention's Softmax
    removes has none: `decide.softmax_shift`). W as it is now: centered where the plan centers it."""
    for share in shares:
        node = share.consumer
        weight = constant_of(node.inputs[1])
        assert weight is not None
        # A beta of shape [1] (or a scalar) is broadcast over the normalized axis: beta @ W needs
        # it as a row of K.
        row = np.broadcast_to(beta.reshape(-1), (share.rows,))
        how = {"trans": share.trans, "scale": share.scale}
        if share.how == "bias":
            _add_beta_to_bias(graph, share.slot, row, weight, taken, **how)  # type: ignore[arg-type]
            continue
        name = fresh_name(share.stem, taken)  # type: ignore[arg-type]
        tensor = bias_plus_beta(None, row, weight, dtype=weight.dtype, name=name, **how)
        if share.how == "new_add":
            _created_bias(graph, node, tensor, taken, notes.bias_share(decision, node.name or ""))
        else:
            slot_node, index = share.slot  # type: ignore[misc]
            slot_node.resize_inputs(index + 1)
            slot_node.replace_input_with(index, new_constant(graph, tensor))


def rewrite_layer_norm(graph: ir.Graph, decision: LnDecision, rewrite: Rewrite, taken: set[str]) -> None:
    """Replace one folded LN (its nodes, and the residual Add it takes in) by what its emission
    writes, each new node noting the LN it stands for (`apply.notes`)."""
    cand, site, emission = rewrite.cand, rewrite.site, rewrite.emission
    opset = graph.opset_imports.get("", graph.opset_imports.get("ai.onnx", 18))
    written = [
        notes.adds_beta(decision, rewrite.beta.why) if spec.adds_beta else notes.replaces(decision)
        for spec in emission.nodes
    ]
    new_nodes = build_nodes(graph, emission, opset, taken, written)
    if emission.shares:
        beta = np.asarray(constant_of(cand.bias).numpy()).astype(np.float64)  # type: ignore[union-attr]
        _fold_beta_into_consumers(graph, emission.shares, beta, taken, decision)
    owner = site.anchor.graph  # the main graph, or the If/Loop body the LN lives in
    owner.insert_after(site.anchor, new_nodes)  # type: ignore[union-attr]
    # The tensors the new ones take over: their readers now, their names once the old are gone.
    taken_over = [
        (out.takes, value)
        for node, spec in zip(new_nodes, emission.nodes)
        for value, out in zip(node.outputs, spec.outputs)
        if out.takes is not None
    ]
    for old, new in taken_over:
        old.replace_all_uses_with(new, replace_graph_outputs=True)
    owner.remove(rewrite.replaced, safe=True)  # type: ignore[union-attr]
    # The replaced tensors' names move to the tensors that now hold their values: consumers,
    # graph outputs and anything downstream that refers to tensors by name stay valid.
    for old, new in taken_over:
        name, old.name = old.name, None
        new.name = name
