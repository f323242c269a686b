"""Carry out a plan on the model it was computed from (its `BoundPlan`: the plan and the IR
objects it names): center and untie constants, insert explicit centerings, then rewrite each
folded LN (`apply.rewrite`), and remove the constants only the replaced nodes read (`apply.orphans`).

The arithmetic (float64, one rounding back) is in `apply.centering`; centered weights stay lazy until
the model is written.
"""

from __future__ import annotations

import logging

import onnx_ir as ir

from onnx_lnfold.analysis.bound import BoundCentering, BoundEdit, BoundPlan
from onnx_lnfold.apply import notes
from onnx_lnfold.apply.centering import CenteredTensor, RowMeans
from onnx_lnfold.apply.orphans import orphaned_constants, remove_orphans
from onnx_lnfold.apply.rewrite import new_constant, rewrite_layer_norm, value_like, written_axes
from onnx_lnfold.core.ir import constant_of, set_constant_value
from onnx_lnfold.core.names import CENTERING_NODES, CENTERING_STEM, fresh_name, taken_names

logger = logging.getLogger(__name__)


def _derived_copy(graph: ir.Graph, bound: BoundEdit, source: ir.TensorProtocol) -> ir.Value:
    """`source - row means` as a Sub of two constants at the top of the graph that holds the
    source, which ONNX Runtime folds into the centered table at session start (docs/DESIGN.md
    section 3.1)."""
    edit, value = bound.edit, bound.value
    producer = value.producer()  # a Constant node, or none for an initializer
    owner = producer.graph if producer is not None else value.graph or graph
    means = new_constant(owner, RowMeans(source, edit.axis, edit.means_name or ""))  # type: ignore[arg-type]
    centered = ir.Value(name=edit.new_name, shape=value.shape, type=value.type)
    sub = ir.Node("", "Sub", [value, means], outputs=[centered], name=f"{edit.new_name}/sub", doc_string=notes.derived_at_load(edit))
    if producer is not None:
        owner.insert_after(producer, [sub])
    else:
        owner.insert_before(next(iter(owner)), [sub])
    return centered


def _apply_edit(graph: ir.Graph, bound: BoundEdit) -> None:
    edit, value = bound.edit, bound.value
    tensor = constant_of(value)
    assert tensor is not None, edit.tensor
    if edit.untie:
        if edit.means_name:
            copy = _derived_copy(graph, bound, tensor)
        else:
            copy = new_constant(
                graph, CenteredTensor(tensor, edit.axis, edit.new_name or "", edit.weights, edit.block, edit.blocks)
            )
        for node, index in bound.uses:
            node.replace_input_with(index, copy)
        return
    centered = CenteredTensor(tensor, edit.axis, value.name or "", edit.weights, edit.block, edit.blocks)
    set_constant_value(value, centered)


def _apply_centering(graph: ir.Graph, bound: BoundCentering, opset: int, taken: set[str]) -> None:
    """Insert `c = x - ReduceMean(x, axis)` right after x is produced; the planned uses read c."""
    centering, x = bound.centering, bound.value
    mean_shape = None
    if x.shape is not None:
        dims = list(x.shape)
        dims[centering.axis] = 1
        mean_shape = ir.Shape(dims)
    mean = ir.Value(name=fresh_name(f"{x.name}.mean", taken), shape=mean_shape, type=x.type)
    stem = fresh_name(f"{x.name}/{CENTERING_STEM}", taken)
    axes, attrs = written_axes(graph, (centering.axis,), opset, f"{stem}/axes", taken)
    note = notes.centers(centering)
    name = f"{stem}/{CENTERING_NODES['ReduceMean']}"
    reduce = ir.Node("", "ReduceMean", [x, *axes], [*attrs, ir.AttrInt64("keepdims", 1)], outputs=[mean], name=name, doc_string=note)
    centered = value_like(x, centering.new_name)
    sub = ir.Node("", "Sub", [x, mean], outputs=[centered], name=f"{stem}/{CENTERING_NODES['Sub']}", doc_string=note)
    producer = x.producer()
    if producer is None:
        owner = x.graph or graph
        owner.insert_before(next(iter(owner)), [reduce, sub])
    else:
        producer.graph.insert_after(producer, [reduce, sub])
    for node, index in bound.uses:
        node.replace_input_with(index, centered)


def apply_plan(model: ir.Model, bound: BoundPlan) -> None:
    """Mutate `model` as the plan says. The plan must have been computed on this very model."""
    plan, graph = bound.plan, model.graph
    orphans = orphaned_constants(bound)  # before the rewrites remove the nodes that read them
    taken = taken_names(graph) | {e.new_name for e in plan.edits if e.new_name}
    taken |= {c.new_name for c in plan.centerings}
    # Centering first: a beta folded into a consumer's bias is computed with the edited weights.
    for edit in bound.edits:
        _apply_edit(graph, edit)
    opset = model.opset_imports.get("", model.opset_imports.get("ai.onnx", 17))
    for centering in bound.centerings:
        _apply_centering(graph, centering, opset, taken)
    for fold in bound.folds:
        rewrite_layer_norm(graph, fold.decision, fold.rewrite, taken)
    for domain in sorted({node.domain for fold in bound.folds for node in fold.rewrite.emission.nodes} - {""}):
        model.opset_imports.setdefault(domain, 1)  # com.microsoft for SkipSimplifiedLayerNormalization
    # Constant nodes whose every use now reads a centered copy are dead.
    edited = {e.value for e in bound.edits}
    for node in list(graph):
        if node.op_type == "Constant" and node.outputs[0] in edited:
            if not node.outputs[0].uses() and not node.outputs[0].is_graph_output():
                graph.remove(node, safe=True)
    remove_orphans(orphans)
    logger.info(
        "folded %d LayerNorm node(s), centered %d constant(s), inserted %d centering(s)",
        len(plan.folded),
        len(plan.edits),
        len(plan.centerings),
    )
