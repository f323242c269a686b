"""The read-back of each folded LN: the nodes its emission writes (`check_norm`), found from the
LN's output back through what each reads, every one as planned (op, inputs, attributes, the
constants it creates, the names it takes over); and each consumer's share of its beta
(`check_beta`), recomputed from the original bias and weight."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from onnx_lnfold.core.ir import attr_or_input_ints
from onnx_lnfold.decide.emission import Axes, Filled, Produced
from onnx_lnfold.verify import tensor_checks
from onnx_lnfold.verify.readback.folded import Differs, Folded
from onnx_lnfold.verify.readback.planned import (
    Named,
    PlannedBeta,
    PlannedChanges,
    PlannedNode,
    PlannedNorm,
    PlannedSource,
)
from onnx_lnfold.verify.readback.scopes import attribute_value, input_names, op_of


def _shown(source: PlannedSource) -> str:
    """What a planned input is, in a refusal's list of them."""
    if isinstance(source, Named):
        return source.name if source.name is not None else "(a bias with its share of beta)"
    if isinstance(source, Filled):
        return f"(a constant {source.value:g})"
    if isinstance(source, Axes):
        return "(axes)"
    if isinstance(source, Produced):
        return f"(output {source.output} of the emitted node {source.node})"
    return ""


def _shown_value(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _check_filled(folded: Folded, graph: int, name: str, filled: Filled, what: str) -> None:
    """A constant the emission creates: its shape, type and every entry as planned."""
    written = folded.tensor(graph, name, what)
    values = np.asarray(written.numpy())
    expected = filled.array()
    if written.dtype != filled.dtype or values.shape != expected.shape or not np.array_equal(values, expected):
        raise Differs(
            f"{what}: '{name}' holds {values.reshape(-1)[:3]} of shape {list(values.shape)}, not the planned "
            f"{filled.value:g} of shape {list(filled.shape)}"
        )


def _op_words(op: str) -> str:
    """'SimplifiedLayerNormalization', 'com.microsoft::SkipSimplifiedLayerNormalization'."""
    return op.removeprefix("::")


def _check_node(folded: Folded, n: PlannedNorm, k: int, node: ir.Node, found: list, what: str) -> None:
    """Emitted node `k` of `n` is `node`: its op, inputs, attributes and outputs as planned; the
    emitted nodes it reads go on `found` as (index, node, tensor)."""
    spec: PlannedNode = n.nodes[k]
    op = _op_words(spec.op)
    if op_of(node) != spec.op:
        raise Differs(f"{what}: '{node.outputs[0].name}' is computed by {_op_words(op_of(node))}, not {op}")
    folded.claim(node)
    names = input_names(node)
    axes_at = next((j for j, s in enumerate(spec.inputs) if isinstance(s, Axes)), None)
    given = len(names)
    while given and not names[given - 1]:
        given -= 1
    planned = len(spec.inputs)
    while planned and spec.inputs[planned - 1] is None:
        planned -= 1
    axes_input = axes_at is not None and given > axes_at
    if given != planned - (axes_at is not None and not axes_input):
        shown = [_shown(s) for s in spec.inputs]
        raise Differs(f"{what}: {op} reads {names}, not the planned {shown}")
    for j, source in enumerate(spec.inputs[:given]):
        name = names[j]
        if isinstance(source, Named) and (source.name is not None and name != source.name):
            shown = [_shown(s) for s in spec.inputs]
            raise Differs(f"{what}: {op} reads {names}, not the planned {shown}")
        if source is None and name:
            raise Differs(f"{what}: {op} reads '{name}' as its input {j}, which the plan leaves out")
        if isinstance(source, Filled):
            _check_filled(folded, n.graph, name, source, what)
        elif isinstance(source, Axes):
            folded.tensor(n.graph, name, what)  # its values: `attr_or_input_ints` below
        elif isinstance(source, Produced):
            producer = folded.node_making(n.graph, name, what)
            if len(producer.outputs) <= source.output or producer.outputs[source.output].name != name:
                raise Differs(f"{what}: {op} reads '{name}', not output {source.output} of the node planned before it")
            found.append((source.node, producer, name))
    written = {a: attribute_value(attr) for a, attr in node.attributes.items()}
    if axes_at is not None:
        axes = attr_or_input_ints(node, "axes", axes_at)
        planned_axes = list(spec.inputs[axes_at].values)  # type: ignore[union-attr]
        if axes != planned_axes or (axes_input and "axes" in written):
            raise Differs(f"{what}: {op} is over axes {axes}, not the planned axes {planned_axes}")
        if not axes_input:
            written.pop("axes", None)
    expected = dict(spec.attributes)
    for attr in sorted(written.keys() | expected.keys()):
        if written.get(attr) != expected.get(attr):
            raise Differs(
                f"{what}: {op} has {attr} {_shown_value(written.get(attr))}, where the plan writes "
                f"{_shown_value(expected.get(attr))}"
            )
    outputs = [o.name or "" for o in node.outputs]
    fits = len(outputs) == len(spec.outputs) and all(
        (want is None and name) or name == want for name, want in zip(outputs, spec.outputs)
    )
    if not fits:
        shown = ["(a new tensor)" if o is None else o for o in spec.outputs]
        raise Differs(f"{what}: {op} writes {outputs}, not the planned {shown}")


def check_norm(folded: Folded, n: PlannedNorm) -> int:
    """The nodes one folded LN's emission writes, found from its output back through what each
    reads: each as planned, each once, and all of them."""
    what = f"the RMSNorm of '{n.ln}'"
    last = len(n.nodes) - 1
    found = [(last, folded.node_making(n.graph, n.out, what), n.out)]
    matched: dict[int, ir.Node] = {}
    while found:
        k, node, name = found.pop()
        if k in matched:
            if matched[k] is not node:
                raise Differs(f"{what}: '{name}' is not computed by the node planned ({_op_words(n.nodes[k].op)})")
            continue
        matched[k] = node
        _check_node(folded, n, k, node, found, what)
    missing = sorted(set(range(len(n.nodes))) - set(matched))
    if missing:
        raise Differs(f"{what}: its {_op_words(n.nodes[missing[0]].op)} is not read by the nodes after it")
    folded.emitted[n.ln] = matched
    return 1


def check_beta(folded: Folded, changes: PlannedChanges, b: PlannedBeta) -> int:
    """One consumer's share of beta: the bias it went into is the original's (centered where the
    plan centers it) plus `scale * beta @ W`, within the rounding of its type."""
    what = f"the share of '{b.ln}''s beta in its consumer's bias"
    if b.created_after is not None:
        name = b.created_after.split(":", 1)[1]
        add = folded.node_making(b.graph, name, what)
        if op_of(add) != "::Add" or len(add.inputs) != 2:
            raise Differs(f"{what}: '{name}' is not the MatMul's output plus a created bias")
        matmul = folded.node_making(b.graph, input_names(add)[0], what)
        was = changes.nodes.get(b.created_after)
        if (
            was is None
            or op_of(matmul) != was.op
            or tuple(input_names(matmul))
            != tuple(changes.substitutions.get((b.created_after, i), n) for i, n in enumerate(was.inputs))
        ):
            raise Differs(f"{what}: '{input_names(add)[0]}' is not the MatMul that computed '{name}'")
        folded.claim(add)
        folded.claim(matmul)
        bias_name = input_names(add)[1]
    elif b.read_by is not None:  # the bias Add became an emitted node's bias input (a Skip op's)
        ln, k, j = b.read_by
        reader = folded.emitted.get(ln, {}).get(k)
        if reader is None or len(reader.inputs) <= j or reader.inputs[j] is None:
            raise Differs(f"{what}: the op in the place of '{ln}' reads no bias")
        bias_name = input_names(reader)[j]
    else:
        node = folded.nodes.get(b.node)
        if node is None or len(node.inputs) <= b.index or node.inputs[b.index] is None:
            raise Differs(f"{what}: the node '{b.node}' has no bias input {b.index}")
        bias_name = input_names(node)[b.index]
    written = folded.tensor(b.graph, bias_name, what)
    beta = changes.constants.get(f"{b.graph}:{b.beta}") or folded.scopes.find(changes.constants, b.graph, b.beta)
    weight = folded.constants.get(folded.scoped(b.graph, b.weight) or "")
    if beta is None or weight is None:
        raise Differs(f"{what}: beta '{b.beta}' or the weight '{b.weight}' is not a constant")

    def check() -> None:
        row = np.broadcast_to(np.asarray(beta.numpy()).astype(np.float64).reshape(-1), (b.rows,))
        delta, bound = tensor_checks.beta_through(np.ascontiguousarray(row), weight, b.trans)
        base = np.zeros_like(delta)
        if b.bias is not None:
            original = np.asarray(folded.scopes.find(changes.constants, b.graph, b.bias).numpy())
            centered = b.bias_edit is not None
            base = (
                tensor_checks.centered_float64(original, *b.bias_edit) if centered else original.astype(np.float64)
            ).reshape(-1)
        problem = tensor_checks.check_bias_with_beta(base, b.scale * delta, abs(b.scale) * bound, written)
        if problem:
            raise Differs(f"{what}: '{bias_name}' {problem}")

    folded.later(weight, check)  # the weight is what it reads most of
    return 1
