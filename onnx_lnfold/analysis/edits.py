"""From proven leaves to the plan's edits (docs/DESIGN.md section 2): which constants to center,
in place or as an untied copy, and which explicit centerings to insert, each bound to the IR
objects it changes (`analysis.bound`). Mutates nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from onnx_lnfold import carry
from onnx_lnfold.analysis.bound import BoundCentering, BoundEdit
from onnx_lnfold.analysis.plan import AuxCentering, CenteringEdit
from onnx_lnfold.analysis.zero_mean import Leaf, Weights
from onnx_lnfold.core.ir import constant_of, is_standard
from onnx_lnfold.core.names import fresh_name
from onnx_lnfold.core.options import UNTIE_BUDGET
from onnx_lnfold.forms import FORMS
from onnx_lnfold.shapes.table import ShapeTable

# Role names live with the producer's carry rule, or with the LN form that reads the constant.
_ROLES = {
    **{(op, index): role for op, rule in carry.RULES.items() for index, role in rule.roles.items()},
    **{(form.op_type, index): role for form in FORMS for index, role in form.roles.items()},
}


def _role(node: ir.Node, index: int) -> str:
    role = _ROLES.get((node.op_type, index))
    if role:
        return role
    if node.op_type in ("Add", "Sub", "Sum"):
        return "added constant"
    return f"{node.op_type} input {index}"


def _sorted_uses(members, names) -> list[tuple[ir.Node, int]]:
    return sorted({(leaf.node, leaf.index) for leaf, _ in members}, key=lambda u: (names[u[0]], u[1]))


def _read_only_through_transpose(value: ir.Value, centered_uses: list[tuple[ir.Node, int]]) -> bool:
    centered = set(centered_uses)
    others = [u.node for u in value.uses() if (u.node, u.idx) not in centered]
    return bool(others) and not value.is_graph_output() and all(n.op_type == "Transpose" for n in others)


# Why a tied table's centered copy is what it is (the report prints these).
_UNTIED_NOTE = (
    "its other uses read it through a Transpose, which ONNX Runtime folds into a copy of its "
    "own: no extra memory at run time; --tied-weights center avoids the copy for two nodes per run"
)
_DERIVED = "the Gathers read table - row means, a Sub of two constants that ONNX Runtime folds at session start"
_DERIVED_NOTE = {
    True: _DERIVED + ": no nodes at run time, no copy in the file, and the memory of the original, whose "
    "Transpose ONNX Runtime folds into a copy of its own either way",
    False: _DERIVED + ": no nodes at run time, no copy in the file, but a second table in memory (the head "
    "reads the table itself; --tied-weights center holds none, for two nodes per run)",
}


def _gather_outputs(members: list[tuple[Leaf, str]]) -> list[tuple[ir.Value, int]] | None:
    """The (output, axis) of each Gather (or GatherND) whose table the leaves center, when
    centering those outputs is the same as centering the table for them: every leaf is such a
    table (rows gathered, so a row's mean is removed either way), unweighted, changing just that
    output."""
    outputs: dict[ir.Value, int] = {}
    for leaf, _ in members:
        node = leaf.node
        if node.op_type not in ("Gather", "GatherND") or leaf.index != 0 or leaf.weights is not None or leaf.axis is None or not leaf.part.uniform:
            return None
        if len(leaf.seeds) != 1 or leaf.seeds[0][0] is not node.outputs[0] or leaf.seeds[0][2] is not None:
            return None
        outputs[node.outputs[0]] = leaf.seeds[0][1]
    return sorted(outputs.items(), key=lambda item: item[0].name or "")


@dataclass(frozen=True)
class Naming:
    """How the plan names things: each node by its display name, and the names already taken,
    which fresh names (`W.centered`, `W.centered_2`) avoid and join."""

    names: dict[ir.Node, str]
    taken: set[str]

    def uses(self, uses: list[tuple[ir.Node, int]]) -> tuple[str, ...]:
        """Each use as "node_name:input_index"."""
        return tuple(f"{self.names[n]}:{i}" for n, i in uses)


def _aux_centering(
    value: ir.Value,
    axis: int,
    uses: list[tuple[ir.Node, int]],
    required_by: tuple[str, ...],
    naming: Naming,
    instead_of_untie: str | None = None,
    saved_bytes: int = 0,
) -> BoundCentering:
    """`value - ReduceMean(value, axis)`, read by `uses` instead of `value`."""
    centering = AuxCentering(
        tensor=value.name or "",
        axis=axis,
        uses=naming.uses(uses),
        new_name=fresh_name(f"{value.name}.centered", naming.taken),
        required_by=required_by,
        instead_of_untie=instead_of_untie,
        saved_bytes=saved_bytes,
    )
    return BoundCentering(centering, value, tuple(uses))


def centering_site(
    value: ir.Value,
    axis: int,
    uses: list[tuple[ir.Node, int]],
    names: dict[ir.Node, str] | None = None,
    shapes: ShapeTable | None = None,
) -> tuple[ir.Value, int, list[tuple[ir.Node, int]]]:
    """Where to put an explicit centering of `value` along `axis` read by `uses`: (tensor, axis,
    its readers). Past the scalar `Mul`s and `Div`s those uses are, when they are its only planned
    reader: a scalar factor commutes with removing a mean, and the scaled tensor changes as a whole
    either way. That keeps the non-linearity the centering follows whole: the TorchScript exporter
    writes GELU as `x * (erf(x / sqrt 2) + 1) * 0.5`, and ONNX Runtime's Gelu fusion wants the
    product before the `* 0.5` read by that Mul alone (docs/DESIGN.md section 2.3). Then past a
    `Transpose` that is its only reader and makes `axis` the last, and, given `shapes`, past the
    constants added to the result (`_past_added_constants`): there ONNX Runtime runs it over the
    last axis, where right past the Transpose it would not."""

    def readers(out: ir.Value) -> list[tuple[ir.Node, int]]:
        key = (lambda u: (names[u[0]], u[1])) if names is not None else (lambda u: (u[0].name or "", u[1]))
        return sorted(((u.node, u.idx) for u in out.uses()), key=key)

    while len(uses) == 1:
        node, index = uses[0]
        out = node.outputs[0] if node.outputs else None
        if out is None or out.is_graph_output() or not out.uses() or not is_standard(node):
            break
        if node.op_type == "Transpose":
            perm = node.attributes.get("perm")
            perm = list(perm.as_ints()) if perm is not None else None
            if perm is None or axis not in perm or perm.index(axis) != len(perm) - 1 or axis == len(perm) - 1:
                break
            value, axis, uses = out, len(perm) - 1, readers(out)
            if shapes is not None:
                value, uses = _past_added_constants(value, uses, shapes, readers)
            break  # the axis is the last: nothing further is cheaper
        if node.op_type not in ("Mul", "Div") or (node.op_type == "Div" and index != 0):
            break
        factor = constant_of(node.inputs[1 - index])
        if factor is None or factor.size != 1 or len(factor.shape) > 1:
            break  # a factor of rank <= 1 keeps the rank, so the axis
        value, uses = out, readers(out)
    return value, axis, uses


def _past_added_constants(value: ir.Value, uses, shapes: ShapeTable, readers) -> tuple[ir.Value, list[tuple[ir.Node, int]]]:
    """`value` moved past the Adds and Subs of a constant that are its only reader (a stem's position
    table), as long as the sum has its shape: the sum of the two centered is the sum centered, and
    the constant is one of the plan's leaves. Written right past a Transpose, a centering does not
    run there: ONNX Runtime's transpose optimizer pushes the Transpose down through its ReduceMean
    (the kept dim of 1 lowers the rank its cost rule counts) and its Sub, and reduces over the
    strided axis. It does not push one through an Add of a constant (no Transpose saved there), so
    past that Add the centering stays on the last axis (tests/ort_fusions pin both)."""
    while len(uses) == 1:
        node, index = uses[0]
        if node.op_type not in ("Add", "Sub") or not is_standard(node) or len(node.inputs) != 2:
            break
        out = node.outputs[0]
        if out is None or out.is_graph_output() or not out.uses() or constant_of(node.inputs[1 - index]) is None:
            break
        shape = shapes.shape(value)
        if shape is None or shapes.shape(out) != shape:
            break  # a constant that widens the tensor would widen the centering
        value, uses = out, readers(out)
    return value, uses


def written_site(root: ir.Value, axis: int, shapes: ShapeTable) -> tuple[ir.Value, int]:
    """(tensor, axis) where `centering_site` writes an explicit centering of `root` over `axis` that
    every reader of `root` reads: what the cost rule prices (`decide.pricing.centering_kind`) and a
    reason names."""
    uses = sorted(((u.node, u.idx) for u in root.uses()), key=lambda u: (u[0].name or "", u[1]))
    value, site_axis, _ = centering_site(root, axis, uses, shapes=shapes)
    return value, site_axis


def plan_edits(
    leaves: list[tuple[Leaf, str]],
    names: dict[ir.Node, str],
    taken: set[str],
    tied_weights: str = "auto",
    model_bytes: int = 0,
    shapes: ShapeTable | None = None,
) -> tuple[list[BoundEdit], list[BoundCentering]]:
    """Group leaves by (tensor, axis). Constants: untie a group unless it covers every use (or,
    for a tied embedding table, center the Gather outputs instead, as `tied_weights` says: one of
    `core.options.TIED_WEIGHTS`; `auto` weighs the copy against `model_bytes`, the model's weights).
    Explicit centerings go where `centering_site` puts them, at the shapes of `shapes`."""
    # Leaves that center blocks of the same length of one constant are one edit: each LN's
    # blocks (q's heads, k's heads of one fused projection) centered together.
    groups: dict[tuple[ir.Value, int | None, bool, Weights, int | None], list[tuple[Leaf, str]]] = {}
    for leaf, ln in leaves:
        groups.setdefault((leaf.value, leaf.axis, leaf.aux, leaf.weights, leaf.part.block), []).append((leaf, ln))
    per_value: dict[ir.Value, int] = {}
    for value, _, aux, _, _ in groups:
        if not aux:
            per_value[value] = per_value.get(value, 0) + 1
    edits: list[BoundEdit] = []
    centerings: list[BoundCentering] = []
    naming = Naming(names, taken)
    for (value, axis, aux, weights, block), members in groups.items():
        uses = _sorted_uses(members, names)
        required_by = tuple(sorted({ln for _, ln in members}))
        if aux:
            if all(weights is None for leaf, _ in members for _, _, weights, _ in leaf.seeds):
                value, axis, uses = centering_site(value, axis, uses, names, shapes)  # type: ignore[arg-type]
            centerings.append(_aux_centering(value, axis, uses, required_by, naming))  # type: ignore[arg-type]
            continue
        untie = per_value[value] > 1 or set(uses) != set(value.uses()) or value.is_graph_output()
        tensor = constant_of(value)
        assert tensor is not None
        nbytes = int(np.prod(tensor.shape.dims, dtype=np.int64) * tensor.dtype.itemsize)
        gathered, note, derive = None, None, False
        if untie and tied_weights != "untie":
            gathered = _gather_outputs(members)
            small = nbytes <= UNTIE_BUDGET * model_bytes
            transposed = _read_only_through_transpose(value, uses)
            if gathered and tied_weights == "auto" and transposed and small:
                gathered, note = None, _UNTIED_NOTE
            elif gathered and (tied_weights == "derive" or (tied_weights == "auto" and transposed)):
                gathered, derive, note = None, True, _DERIVED_NOTE[transposed]
        if gathered:
            for out, out_axis in gathered:
                readers = sorted(((u.node, u.idx) for u in out.uses()), key=lambda u: (names[u[0]], u[1]))
                centerings.append(
                    _aux_centering(out, out_axis, readers, required_by, naming, instead_of_untie=value.name, saved_bytes=nbytes)
                )
            continue
        suffix = ".centered" if axis is not None else ".zeroed"
        if derive:  # the table minus its row means: a Gather table, centered along its rows
            nbytes //= max(int(tensor.shape.dims[axis]), 1)  # type: ignore[index]
        chosen = [leaf.part.blocks for leaf, _ in members]
        blocks = None if block is None or any(c is None for c in chosen) else tuple(sorted(frozenset().union(*chosen)))
        count = tensor.shape.dims[axis] // block if block is not None and axis is not None else None
        if blocks is not None and len(blocks) == count:
            blocks = None  # every block (each head's LN asking for its own)
        edit = CenteringEdit(
            tensor=value.name or "",
            axis=axis,
            role=_role(uses[0][0], uses[0][1]),
            uses=naming.uses(uses),
            untie=untie,
            new_name=fresh_name(f"{value.name}{suffix}", taken) if untie else None,
            copy_bytes=nbytes if untie else 0,
            required_by=required_by,
            weights=weights,
            note=note,
            means_name=fresh_name(f"{value.name}.row_means", taken) if derive else None,
            block=block,
            blocks=blocks,
            block_count=count,
        )
        edits.append(BoundEdit(edit, value, tuple(uses)))
    edits.sort(key=lambda b: (b.edit.tensor, -1 if b.edit.axis is None else b.edit.axis, b.edit.uses))
    centerings.sort(key=lambda b: (b.centering.tensor, b.centering.axis))
    return edits, centerings
