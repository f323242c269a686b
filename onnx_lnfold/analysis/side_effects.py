"""The side-effect rule (docs/DESIGN.md section 3): every tensor that centering changes must reach
only LNs over its axis, through carry ops, and never be a graph output.

`side_effects` follows the shift of every leaf forward (`carry.forward`) at once and returns each
place it is not absorbed, with the leaves whose shift reaches it. Mutates nothing.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import onnx_ir as ir

from onnx_lnfold import carry
from onnx_lnfold.analysis.sinks import Sinks
from onnx_lnfold.analysis.zero_mean import Leaf, Weights, weigh
from onnx_lnfold.core.blocked import Blocked
from onnx_lnfold.core.ir import node_label, reads_only_shape
from onnx_lnfold.shapes.parts import Part
from onnx_lnfold.shapes.table import ShapeTable


@dataclass
class Violation:
    blocked: Blocked  # its source is the tensor that would change
    sources: int  # bitmask over leaves


def side_effects(leaves: list[Leaf], shapes: ShapeTable, sinks: Sinks) -> list[Violation]:
    """Propagate every leaf's shift forward; report each place it is not absorbed."""
    changed: dict[ir.Value, list] = {}  # value -> [axis, source mask, weights, part]
    touched: dict[ir.Node, dict[int, int]] = {}  # node -> {changed input index: mask}
    violations: dict[tuple[str, str], Violation] = {}  # keyed by (tensor, reason)
    queue: deque[ir.Value] = deque()
    broken: set[ir.Node] = set()  # nodes that already refused a shift (one reason per node is enough)

    def violate(code: str, reason: str, tensor: str, mask: int, detail: str | None = None) -> None:
        v = violations.setdefault((tensor, reason), Violation(Blocked(code, reason, tensor, detail=detail), 0))
        v.sources |= mask

    def would_change(value: ir.Value, code: str, why: str | None, mask: int) -> None:
        """`value` changes, and that is what `why` says is wrong with it (None: a graph output)."""
        change = f"'{value.name}' would change" + (f", and {why}" if why else "")
        reason = f"tensor '{value.name}' would change, and " + (why or "it is a graph output")
        violate(code, reason, value.name, mask, change)

    def mark(value: ir.Value, axis: int, mask: int, weights: Weights, part: Part) -> None:
        entry = changed.get(value)
        if entry is None:
            changed[value] = [axis, mask, weights, part]
            queue.append(value)
            return
        # Two changes of one tensor add up: q's and k's heads of one fused projection, say.
        both = entry[3].union(part) if entry[0] == axis and entry[2] == weights else None
        if both is None:
            violate(
                "incompatible-changes",
                f"tensor '{value.name}' would change in two incompatible ways (different axes, blocks or per-channel weights)",
                value.name,
                mask | entry[1],
            )
        elif entry[1] | mask != entry[1] or both != entry[3]:
            entry[1] |= mask
            entry[3] = both
            queue.append(value)

    for i, leaf in enumerate(leaves):
        touched.setdefault(leaf.node, {})
        touched[leaf.node][leaf.index] = touched[leaf.node].get(leaf.index, 0) | (1 << i)
        for value, axis, weights, part in leaf.seeds:
            mark(value, axis, 1 << i, weights, part)

    while queue:
        value = queue.popleft()
        axis, mask, weights, part = changed[value]
        if value.is_graph_output():
            would_change(value, "graph-output", None, mask)
        for node, index in value.uses():
            uses = touched.setdefault(node, {})
            uses[index] = uses.get(index, 0) | mask
            absorbed = sinks.absorbs(node, index, axis, shapes)
            moved: dict[int, tuple[int, Part]] | Blocked
            if absorbed is not None:
                # An LN removes a shift uniform along its axis; the shape a Shape reads never moves.
                if weights is not None or (not part.uniform and not reads_only_shape(node)):
                    moved = Blocked(
                        "non-uniform-change", f"it feeds {node_label(node)}, and its change is not uniform along the axis"
                    )
                else:
                    moved = absorbed if isinstance(absorbed, Blocked) else {k: (a, part) for k, a in absorbed.items()}
            else:
                moved = carry.forward(node, index, axis, shapes, part)
                if weights is not None and node.op_type == "Slice":
                    moved = Blocked("scaled-slice", f"it feeds {node_label(node)} while scaled per channel")
            if isinstance(moved, Blocked):
                would_change(value, moved.code, moved.reason, mask)
                broken.add(node)
                continue
            out_weights = weights
            if node.op_type == "Mul" and moved:
                out_rank = shapes.rank(node.outputs[0]) or 0
                factor = carry.axis_vector(node, 1 - index, out_rank, moved[0][0], shapes)
                if factor is not None:
                    out_weights = weigh(weights, factor, divide=True)
            for k, (out_axis, out_part) in moved.items():
                if k < len(node.outputs) and node.outputs[k] is not None:
                    mark(node.outputs[k], out_axis, mask, out_weights, out_part)

    for node, uses in touched.items():
        jointly_linear = node.op_type in carry.JOINTLY_LINEAR or sinks.adds_inputs(node)
        if len(uses) > 1 and not jointly_linear and node not in broken:
            if all((node, i) in sinks.uses for i in uses):
                continue
            mask = 0
            for m in uses.values():
                mask |= m
            names = ", ".join(f"'{node.inputs[i].name}'" for i in sorted(uses))
            violate(
                "several-inputs-change",
                f"{node_label(node)} would see several of its inputs ({names}) change at once",
                node.inputs[min(uses)].name or "",
                mask,
            )
    return list(violations.values())
