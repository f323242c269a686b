"""The constants a fold leaves without a reader (`orphaned_constants`), and their removal
(`remove_orphans`).

A folded LN's nodes go, and with them the only readers of some constants: gamma and beta where the
RMSNorm does not read them, a decomposed LN's Pow exponent, epsilon and axes. Written, each would
be a tensor no node reads (ONNX Runtime removes every one at session start, saying so), so the fold
does not write them. The set is stated before the plan is applied, from the nodes it replaces and
what each rewrite's emission reads, so that the check's read-back (`verify.readback`) reads the
written model against it rather than inferring it from the file.
"""

from __future__ import annotations

import onnx_ir as ir

from onnx_lnfold.analysis.bound import BoundPlan
from onnx_lnfold.core.ir import is_standard


def _stored(value: ir.Value) -> bool:
    """An initializer that is no graph input, or the output of a standard Constant node."""
    if value.is_initializer():
        return not value.is_graph_input()
    producer = value.producer()
    return producer is not None and producer.op_type == "Constant" and is_standard(producer)


def orphaned_constants(bound: BoundPlan) -> list[ir.Value]:
    """The constants that only the nodes the plan replaces read, in the model the plan was made on
    (call before `apply_plan` changes it): each read by a replaced node, read by nothing else (no
    other node of any graph, no node the rewrites emit) and no graph output. A constant the
    original already left unread, or one read elsewhere, is never among them; nor is anything in a
    model-local function, where no LN is replaced. In the order first read."""
    replaced = {node for fold in bound.folds for node in fold.rewrite.replaced}
    emitted: set[ir.Value] = set()
    for fold in bound.folds:
        for spec in fold.rewrite.emission.nodes:
            for source in spec.inputs:
                if isinstance(source, ir.Value):
                    emitted.add(source)
                elif isinstance(source, tuple):  # an input slot of the original graph
                    read = source[0].inputs[source[1]]
                    if read is not None:
                        emitted.add(read)
    found: dict[ir.Value, None] = {}
    for fold in bound.folds:
        for node in (*fold.rewrite.cand.nodes, *fold.rewrite.taken_in):
            for value in node.inputs:
                if value is None or value in found or value in emitted or not _stored(value):
                    continue
                if value.producer() in replaced or value.is_graph_output():
                    continue  # a Constant node of the LN itself goes with it
                if all(user in replaced for user, _ in value.uses()):
                    found[value] = None
    return list(found)


def remove_orphans(orphans: list[ir.Value]) -> None:
    """Remove each of `orphans` (`orphaned_constants`, listed before the plan was applied) that
    nothing reads now: its initializer from the graph that holds it, or its Constant node."""
    for value in orphans:
        if value.uses() or value.is_graph_output():
            continue
        producer = value.producer()
        if producer is not None:
            if producer.graph is not None:
                producer.graph.remove(producer, safe=True)
        elif value.graph is not None and value.name in value.graph.initializers:
            value.graph.initializers.pop(value.name)
