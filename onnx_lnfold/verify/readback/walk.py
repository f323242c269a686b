"""The walk of the read-back over the folded model as written: the structure first (the graph's
inputs, outputs and opset; each folded LN's emission and its shares of beta, `rewrites`; each
explicit centering; each centered constant and table derived at load; every other node and
tensor as it was), then the tensor checks in the order of the file."""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass

import onnx_ir as ir

from onnx_lnfold.core.ir import attr_or_input_ints
from onnx_lnfold.verify import tensor_checks
from onnx_lnfold.verify.oracle.paced import drain
from onnx_lnfold.verify.readback.folded import Differs, Folded, model_of
from onnx_lnfold.verify.readback.planned import PlannedCentering, PlannedChanges, PlannedEdit
from onnx_lnfold.verify.readback.rewrites import check_beta, check_norm
from onnx_lnfold.verify.readback.scopes import as_was, input_names, op_of, opset_of, same_axis
from onnx_lnfold.verify.sessions import ModelBytesOrPath


@dataclass
class ReadBack:
    checked: int = 0  # the planned changes read back: tensors edited, nodes rewritten or inserted
    unchanged: int = 0  # tensors found byte for byte the original's
    problem: str = ""  # the first difference the plan does not account for, named


def _check_centering(folded: Folded, c: PlannedCentering) -> int:
    what = f"the explicit centering of '{c.tensor}'"
    sub = folded.node_making(c.graph, c.new_name, what)
    if op_of(sub) != "::Sub" or input_names(sub)[0] != c.tensor:
        raise Differs(f"{what}: '{c.new_name}' is {op_of(sub)} {input_names(sub)}, not '{c.tensor}' - its mean")
    mean = folded.node_making(c.graph, input_names(sub)[1], what)
    if op_of(mean) != "::ReduceMean" or input_names(mean)[0] != c.tensor or mean.attributes.get_int("keepdims", 1) != 1:
        raise Differs(f"{what}: '{input_names(sub)[1]}' is not ReduceMean('{c.tensor}') with keepdims")
    axes = attr_or_input_ints(mean, "axes", 1)
    if axes is None or len(axes) != 1 or not same_axis(axes[0], c.axis, c.rank):
        raise Differs(f"{what}: the mean is over axes {axes}, not the planned axis {c.axis}")
    if len(mean.inputs) > 1 and mean.inputs[1] is not None:
        folded.tensor(c.graph, input_names(mean)[1], what)
    folded.claim(sub)
    folded.claim(mean)
    return 1


def _check_edit(folded: Folded, changes: PlannedChanges, e: PlannedEdit) -> int:
    original = changes.constants.get(f"{e.graph}:{e.tensor}")
    if original is None:
        raise Differs(f"the edit of '{e.tensor}': no such constant in the original")
    if e.means:
        what = f"the table '{e.written}' derived at load"
        sub = folded.node_making(e.graph, e.written, what)
        if op_of(sub) != "::Sub" or input_names(sub) != [e.tensor, e.means]:
            raise Differs(f"{what}: it is {op_of(sub)} {input_names(sub)}, not '{e.tensor}' - '{e.means}'")
        folded.claim(sub)
        problem = tensor_checks.check_row_means(original, folded.tensor(e.graph, e.means, what), e.axis or 0)
        if problem:
            raise Differs(f"the row means '{e.means}' of '{e.tensor}' {problem}")
        return 1
    scoped = folded.scoped(e.graph, e.written)
    took_beta = any(b.bias == e.tensor and b.graph == e.graph and b.bias_edit for b in changes.betas)
    if scoped is None and took_beta:  # a Constant node's bias, copied with its beta: read back there
        return 0
    if scoped is None:
        raise Differs(f"the centered '{e.written}' is not a constant of the folded model")
    if scoped in folded.claimed_tensors:  # a bias centered and given a beta: read back with its beta
        return 0
    written = folded.tensor(e.graph, e.written, "")

    def check() -> None:
        problem = tensor_checks.check_centered(original, written, e.axis, e.weights, e.block, e.blocks)
        if problem:
            along = (
                "made zero" if e.axis is None else f"centered along axis {e.axis}" + (" in blocks" if e.block else "")
            )
            raise Differs(f"the written '{e.written}' is not '{e.tensor}' {along}: it {problem}")

    folded.later(written, check)
    return 1


def _check_rest(folded: Folded, changes: PlannedChanges) -> ReadBack:
    """Every node and tensor no planned change claimed: as it was."""
    done = ReadBack()
    beta_slots = {(b.node, b.index) for b in changes.betas if b.created_after is None}
    for key, node in folded.nodes.items():
        if key in folded.claimed_nodes:
            continue
        was = changes.nodes.get(key)
        if was is None:
            raise Differs(f"the node '{key}' ({op_of(node)}) is not in the original and the plan does not insert it")
        now = as_was(node)
        if now.op != was.op or now.outputs != was.outputs or now.attributes != was.attributes:
            raise Differs(
                f"the node '{key}' ({now.op}) differs from the original's ({was.op}) in its op, outputs or attributes"
            )
        expected = tuple(changes.substitutions.get((key, i), name) for i, name in enumerate(was.inputs))
        if now.inputs == expected:
            continue
        # a bias input the plan gave a beta (a Gemm's C it may have created): read back by `check_beta`
        resized = was.op == "::Gemm" and len(expected) == 2 and len(now.inputs) == 3 and (key, 2) in beta_slots
        differing = [i for i, (a, b) in enumerate(zip(now.inputs, expected)) if a != b]
        if (len(now.inputs) != len(expected) and not resized) or any((key, i) not in beta_slots for i in differing):
            raise Differs(f"the node '{key}' reads {list(now.inputs)}, where the plan has it read {list(expected)}")
    gone = set(changes.nodes) - set(folded.nodes) - changes.removed
    # an edited constant's node, untied away; the node of a constant the fold leaves unread
    dead = gone & ({f"{e.graph}:{e.tensor}" for e in changes.edits} | changes.orphans)
    if gone - dead:
        key = sorted(gone - dead)[0]
        raise Differs(f"the node '{key}' ({changes.nodes[key].op}) is gone, and the plan does not remove it")
    # a Constant node's output goes with its node, accounted for above
    missing = set(changes.constants) - set(folded.constants) - changes.orphans - changes.removed - dead
    if missing:
        name = sorted(missing)[0].split(":", 1)[1]
        raise Differs(f"the constant '{name}' is gone, and the plan does not remove it")
    for scoped, tensor in folded.constants.items():
        if scoped in folded.claimed_tensors:
            continue
        name = scoped.split(":", 1)[1]
        original = changes.constants.get(scoped)
        if original is None:
            raise Differs(f"the tensor '{name}' is not in the original and the plan does not add it")
        folded.later(tensor, _unchanged_check(name, original, tensor))
        done.unchanged += 1
    return done


def _unchanged_check(name: str, original: ir.TensorProtocol, written: ir.TensorProtocol) -> Callable[[], None]:
    def check() -> None:
        problem = tensor_checks.check_unchanged(original, written)
        if problem:
            raise Differs(f"the tensor '{name}' {problem}, and no edit of the plan accounts for it")

    return check


def read_back(folded: ModelBytesOrPath | ir.Model, changes: PlannedChanges) -> ReadBack:
    """Account for every difference between the model as it was (`changes`) and `folded`, as
    written: the number of planned changes read back, or the first difference the plan does not
    account for."""
    return drain(read_back_steps(folded, changes))


def read_back_steps(folded: ModelBytesOrPath | ir.Model, changes: PlannedChanges) -> Generator[float, None, ReadBack]:
    """`read_back` a tensor at a time: the structure first, then the tensor checks in the order of
    the file, yielding the share of their bytes read after each (the check advances its passes over
    a file together, `verify.oracle.paced`). A difference in the structure is reported before one
    in the values."""
    model = model_of(folded)
    view = Folded(model)
    checked = 0
    try:
        if [v.name or "" for v in model.graph.outputs] != changes.outputs:
            raise Differs(
                f"the graph outputs are {[v.name for v in model.graph.outputs]}, not the original's {changes.outputs}"
            )
        if [v.name or "" for v in model.graph.inputs] != changes.inputs:
            raise Differs(
                f"the graph inputs are {[v.name for v in model.graph.inputs]}, not the original's {changes.inputs}"
            )
        if opset_of(model) != changes.opset:
            raise Differs(f"the model is at opset {opset_of(model)}, not the original's {changes.opset}")
        for n in changes.norms:
            checked += check_norm(view, n)
        for b in changes.betas:  # before the edits: a bias centered and given a beta is read back here
            checked += check_beta(view, changes, b)
        for c in changes.centerings:
            checked += _check_centering(view, c)
        for e in changes.edits:
            checked += _check_edit(view, changes, e)
        rest = _check_rest(view, changes)
        total, done = max(sum(c.nbytes for c in view.tensor_checks), 1), 0
        for tensor_check in sorted(view.tensor_checks, key=lambda c: c.position):
            tensor_check.run()
            done += tensor_check.nbytes
            yield done / total
    except Differs as e:
        return ReadBack(checked, 0, str(e))
    rest.checked = checked
    return rest
