"""The structural pre-filters of the fusion check (`ort_fusions.fusion_cost`): where, by the graph
alone, ONNX Runtime's optimizers may find a fusion that a fold would cost, so that they are not run
on graphs where they have nothing to find; and the settings a user would give the transformers
optimizer (`attention_heads`, `hidden_size`). Nothing here runs ONNX Runtime or changes the graph.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx_ir as ir

from onnx_lnfold.core.ir import is_standard
from onnx_lnfold.forms import LnCandidate, LnKind


def _constant(value: ir.Value | None) -> ir.TensorProtocol | None:
    """A true constant's tensor, looked at without `onnx_ir.convenience.get_const_tensor` (which
    names the tensor it returns and may rewrite the value's shape: the check must change nothing)."""
    if value is None or value.is_graph_input():
        return None
    if value.const_value is not None:
        return value.const_value
    node = value.producer()
    if node is None or node.op_type != "Constant" or not is_standard(node) or len(node.attributes) != 1:
        return None
    ((key, attr),) = node.attributes.items()
    if attr.is_ref():
        return None
    if key == "value":
        return attr.value
    if key in ("value_int", "value_ints"):
        return ir.Tensor(np.array(attr.value, dtype=np.int64))
    return None


def _ints(value: ir.Value | None) -> list[int] | None:
    tensor = _constant(value)
    if tensor is None or tensor.dtype not in (ir.DataType.INT64, ir.DataType.INT32):
        return None
    return [int(v) for v in np.asarray(tensor.numpy()).reshape(-1)]


def _add_leaves(value: ir.Value, depth: int = 2) -> list[ir.Value]:
    """The addends of a sum `Add(Add(a, b), c)`, `Add(a, b)`, ... up to `depth` Adds deep."""
    node = value.producer()
    if node is None or node.op_type != "Add" or not is_standard(node) or depth == 0:
        return [value]
    leaves: list[ir.Value] = []
    for inp in node.inputs:
        if inp is None:
            return [value]
        leaves.extend(_add_leaves(inp, depth - 1) if len(inp.uses()) == 1 else [inp])
    return leaves


def _is_embedding_gather(value: ir.Value) -> bool:
    node = value.producer()
    if node is None or node.op_type != "Gather" or not is_standard(node):
        return False
    table = _constant(node.inputs[0])
    return table is not None and len(table.shape) == 2


def embedding_sums(candidates: list[LnCandidate]) -> list[LnCandidate]:
    """LNs reading a sum of at least two embedding Gathers: where the optimizer's
    EmbedLayerNormalization matcher starts (a decomposed LN counts: it makes it an LN first)."""
    found = []
    for cand in candidates:
        if cand.form_problem or cand.kind not in (LnKind.LAYER_NORM, LnKind.DECOMPOSED, LnKind.SKIP_LAYER_NORM):
            continue
        inputs = list(cand.node.inputs[:2]) if cand.kind == LnKind.SKIP_LAYER_NORM else [cand.x]
        leaves = [leaf for value in inputs if value is not None for leaf in _add_leaves(value)]
        if sum(_is_embedding_gather(leaf) for leaf in leaves) >= 2:
            found.append(cand)
    return found


def gemm_after_layer_norm(graph: ir.Graph, norms: set[ir.Node]) -> list[ir.Node]:
    """The `Reshape -> Gemm -> Reshape` behind a node of `norms` (the folded LNs): where the gpt2
    optimizer's postprocess may turn a Gemm into MatMul + Add."""
    found = []
    for node in graph:
        if node.op_type != "Gemm" or not is_standard(node):
            continue
        reshape = node.inputs[0].producer() if node.inputs[0] is not None else None
        if reshape is None or reshape.op_type != "Reshape" or reshape.inputs[0] is None:
            continue
        root = reshape.inputs[0].producer()
        after = [use.node.op_type for use in node.outputs[0].uses()]
        if root in norms and "Reshape" in after:
            found.append(node)
    return found


def _reshape_target(node: ir.Node) -> list[int | None] | None:
    """A Reshape's target shape, entries not known as constants None (a Concat of pieces)."""
    target = node.inputs[1] if len(node.inputs) > 1 else None
    values = _ints(target)
    if values is not None:
        return values
    concat = target.producer() if target is not None else None
    if concat is None or concat.op_type != "Concat":
        return None
    out: list[int | None] = []
    for piece in concat.inputs:
        ints = _ints(piece)
        if ints is None:
            out.append(None)  # a dim computed from a shape: one entry, as exporters write them
        else:
            out.extend(ints)
    return out


def attention_heads(graph: ir.Graph, hidden: int) -> int:
    """The head count users pass to the optimizer (`num_heads`), read from the attention's
    `Reshape(x, [batch, seq, heads, head_size])` targets; 0 (the optimizer detects it) if none."""
    counts: Counter[int] = Counter()
    for node in graph:
        if node.op_type != "Reshape" or not is_standard(node):
            continue
        target = _reshape_target(node)
        if target is None or len(target) != 4 or not isinstance(target[3], int) or target[3] <= 1:
            continue
        heads = target[2] if isinstance(target[2], int) and target[2] > 0 else hidden // target[3]
        if heads > 1 and heads * target[3] == hidden:
            counts[heads] += 1
    return counts.most_common(1)[0][0] if counts else 0


def hidden_size(cand: LnCandidate) -> int:
    """The LN's width, read from its constant gamma (0 where it has none)."""
    scale = _constant(cand.scale)
    return int(scale.shape[-1]) if scale is not None and len(scale.shape) else 0


__all__ = ["attention_heads", "embedding_sums", "gemm_after_layer_norm", "hidden_size"]
