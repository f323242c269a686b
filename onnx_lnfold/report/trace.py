"""The proof behind each decision, in words (`--verbose`): for a folded LN, the producers whose
constants are centered and the carry ops the zero mean passes through on the way to the LN; for
a kept LN, what blocked it and the node that produced the blocking tensor.

Read from the plan bound to the model it was computed on (`analysis.bound`), before the plan is
applied.
"""

from __future__ import annotations

from collections import Counter

import onnx_ir as ir

from onnx_lnfold import carry
from onnx_lnfold.analysis.bound import BoundPlan, Use
from onnx_lnfold.core.ir import constant_of, nodes_within
from onnx_lnfold.core.names import display_names
from onnx_lnfold.decide.targets import Rewrite
from onnx_lnfold.forms import is_residual_sum, sum_terms
from onnx_lnfold.shapes.table import ShapeTable

# A proof names at most this many carry ops of one LN, then counts the rest: an export's chain of
# thousands of Identity or Reshape nodes is a count, not a page of names.
NAMED_OPS = 30


def _carried(rewrite: Rewrite, leaves: set[Use], shapes: ShapeTable) -> list[ir.Node]:
    """The nodes between the LN and its centered producers, walked as the analysis proved it:
    backwards from the LN's inputs, along the inputs each op needs zero-mean, up to the uses that
    read a centered constant (or an explicitly centered tensor)."""
    cand = rewrite.cand
    seen: set[ir.Node] = set()
    order: list[ir.Node] = []
    stack = [(cand.node, req) for req in cand.terms]
    while stack:
        node, req = stack.pop()
        if _ends(node, req, leaves):
            continue
        value = node.inputs[req.index]
        producer = value.producer()
        if producer is None or producer in seen:
            continue
        if is_residual_sum(value):
            reqs = sum_terms(producer, shapes, req.axis)  # the residual sum, as the analysis reads it
        else:
            reqs = carry.backward(producer, value.index(), req.axis, shapes, req.part)
        if not isinstance(reqs, list):
            continue
        seen.add(producer)
        followed = [r for r in reqs if not _ends(producer, r, leaves)]
        if followed:  # a carry op; a producer that only reads centered constants is not
            order.append(producer)
        stack.extend((producer, r) for r in followed)
    return order


def _ends(node: ir.Node, req, leaves: set[Use]) -> bool:
    """The walk stops at this input: a centered use, a constant, or nothing varying along the axis."""
    inp = node.inputs[req.index] if req.index < len(node.inputs) else None
    return inp is None or req.axis is None or (node, req.index) in leaves or constant_of(inp) is not None


def _names(nodes: list[ir.Node], names: dict[ir.Node, str]) -> str:
    counts = Counter(n.op_type for n in nodes)
    kinds = ", ".join(f"{op} x{n}" for op, n in sorted(counts.items()))
    named = ", ".join(names.get(n, n.name or n.op_type) for n in nodes[:NAMED_OPS])
    more = f" and {len(nodes) - NAMED_OPS} more" if len(nodes) > NAMED_OPS else ""
    return f"{kinds}: {named}{more}"


def explain(model: ir.Model, bound: BoundPlan, shapes: ShapeTable | None = None) -> list[str]:
    """Lines (no indentation of their own) telling each LN's proof, in graph order."""
    plan = bound.plan
    shapes = shapes or ShapeTable(model)
    names = display_names(model.graph)
    position = {node: i for i, node in enumerate(names)}  # display_names lists them in graph order
    lines: list[str] = []
    said: dict[object, str] = {}  # a producer (by tensor) or a carry op already listed, with its LN
    order = {d.node: i for i, d in enumerate(plan.decisions)}

    def told_for(lns: set[str]) -> str:
        """`ln_3`, or `ln_3 and 2 LNs before it`: the size of a line does not grow with depth."""
        last = max(lns, key=order.__getitem__)
        return last if len(lns) == 1 else f"{last} and {len(lns) - 1} LN{'s' * (len(lns) > 2)} before it"

    for d in plan.decisions:
        head = f"{d.node} ({d.op_type}, axis {d.axis}): {d.status}"
        if not d.folded:
            lines.append(head)
            lines.append(f"  blocked: {d.reason}")
            producer = _producer_of(model, d.blocking_tensor)
            if producer is not None:
                lines.append(
                    f"  '{d.blocking_tensor}' is produced by {producer.op_type} '{names.get(producer, producer.name)}'"
                )
            continue
        lines.append(f"{head} -> {d.rewrite}")
        bound_edits = [b for b in bound.edits if d.node in b.edit.required_by]
        edits = [b.edit for b in bound_edits]
        centerings = [b for b in bound.centerings if d.node in b.centering.required_by]
        # Each producer and carry op is told once, for the first LN whose proof has it: a deep
        # stream's later LNs name those LNs instead of repeating their proofs.
        earlier = {said[("edit", e.tensor)] for e in edits if ("edit", e.tensor) in said}
        for b in bound_edits:
            e = b.edit
            if ("edit", e.tensor) in said:
                continue
            said[("edit", e.tensor)] = d.node
            readers = ", ".join(sorted({names.get(n, n.name) for n, _ in b.uses}))
            where = "made exactly zero" if e.axis is None else f"centered along axis {e.axis}"
            if e.means_name:
                where += ", read as table - row means (derived at load: no copy in the file)"
            elif e.untie:
                where += f", as the untied copy '{e.new_name}'"
            lines.append(f"  producer: {e.role} '{e.tensor}' read by {readers}: {where}")
        if earlier:
            shared = sum(1 for e in edits if said[("edit", e.tensor)] != d.node)
            lines.append(f"  and {shared} producer(s) told above, for {told_for(earlier)}")
        for c in centerings:
            lines.append(f"  explicit centering: '{c.centering.tensor}' - ReduceMean over axis {c.centering.axis}")
        leaves = {use for b in bound_edits for use in b.uses} | {use for c in centerings for use in c.uses}
        carried = sorted(_carried(bound.rewrite_for(d.node), leaves, shapes), key=position.__getitem__)
        new = [n for n in carried if ("op", n) not in said]
        if new:
            lines.append(f"  carried through {len(new)} op(s): {_names(new, names)}")
        elif not carried:
            lines.append("  carried through no op: the producers feed the LN directly")
        if len(new) < len(carried):
            lns = {said[("op", n)] for n in carried if ("op", n) in said}
            lines.append(f"  and through {len(carried) - len(new)} op(s) told above, for {told_for(lns)}")
        said.update((("op", n), d.node) for n in new)
    return lines


def _producer_of(model: ir.Model, tensor: str | None) -> ir.Node | None:
    if not tensor:
        return None
    for node in nodes_within(model.graph):
        for out in node.outputs:
            if out is not None and out.name == tensor:
                return node
    return None
