"""ONNX Runtime transformers-optimizer fusions that need a LayerNormalization, and the LNs whose
fold would cost one.

`onnxruntime.transformers.optimizer.optimize_model` matches op types: a pattern that needs a
`LayerNormalization` does not match a `SimplifiedLayerNormalization`. Two of its fusions are lost
when the fold runs first (figures: README "Deployment pipelines"):

- **EmbedLayerNormalization** (model_type bert): the word, position and token-type `Gather`s,
  their sum and the embeddings LN become one node. It has no RMS form, so folding that LN costs
  the fusion and buys nothing measurable (one LN of a post-LN model). Such an LN is kept
  (`embed_layer_norm_costs`).
- **Reshape -> Gemm -> Reshape to MatMul + Add** (model_type gpt2, its postprocess): only behind
  a `LayerNormalization`, `SkipLayerNormalization` or `FastGelu`. Folding first leaves those
  Gemms; the folds still pay where the optimizer never runs,
  so they are not refused: the report advises the order instead (`_pipeline_order`).

The matching below is the structural core of ORT's own (`fusion_embedlayer.py`,
`onnx_model_gpt2.py`), not a copy: an LN it flags and ORT would not fuse loses a fold worth
nothing measurable; one ORT would fuse and it misses is still covered by the order advice.
"""

from __future__ import annotations

import onnx_ir as ir

from onnx_lnfold._blocked import Blocked
from onnx_lnfold._forms import LnCandidate, LnKind
from onnx_lnfold._ir import constant_of, is_standard

# com.microsoft ops only the transformers optimizer writes: a graph holding one has been
# through it, and folding it costs no fusion the optimizer could still make.
OPTIMIZER_OPS = frozenset(
    {
        "Attention",
        "MultiHeadAttention",
        "GroupQueryAttention",
        "PackedAttention",
        "EmbedLayerNormalization",
        "SkipLayerNormalization",
        "SkipSimplifiedLayerNormalization",
        "FastGelu",
        "BiasGelu",
        "Gelu",
        "QuickGelu",
        "BiasAdd",
        "BiasSplitGelu",
        "RotaryEmbedding",
        "GemmFastGelu",
    }
)

_INTEGER = (ir.DataType.INT64, ir.DataType.INT32)


def optimizer_has_run(graph: ir.Graph) -> bool:
    return any(node.domain == "com.microsoft" and node.op_type in OPTIMIZER_OPS for node in graph)


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


def _embedding_gather(value: ir.Value) -> ir.Node | None:
    """The Gather producing `value` from a constant 2-D table along axis 0, if it is one."""
    node = value.producer()
    if node is None or node.op_type != "Gather" or not is_standard(node):
        return None
    table = constant_of(node.inputs[0])
    if node.attributes.get_int("axis", 0) != 0 or table is None or len(table.shape) != 2:
        return None
    return node


def _derived_from_shape_of(value: ir.Value, ids: ir.Value, limit: int = 12) -> bool:
    """Whether `value` is computed from `Shape(ids)`, looking at most `limit` nodes up."""
    stack, seen = [value], set()
    while stack and len(seen) < limit:
        v = stack.pop()
        node = v.producer()
        if node is None or node in seen:
            continue
        seen.add(node)
        if node.op_type == "Shape" and node.inputs[0] is ids:
            return True
        stack.extend(i for i in node.inputs if i is not None and not i.is_initializer())
    return False


def _positions_of(indices: ir.Value, ids: ir.Value) -> bool:
    """Whether `indices` are the positions `0..seq-1` of `ids` as ORT's matcher knows them: a
    `Slice` of a constant position table or a `Range`, bounded by the ids' own shape (BERT,
    DistilBERT exports), behind at most a few Unsqueeze/Expand/Cast/Reshape. Positions sized from
    another input's shape (the attention mask, as the dynamo exporter writes them) do not match."""
    value = indices
    for _ in range(4):
        node = value.producer()
        if node is None or node.inputs[0] is None:
            return False
        if node.op_type == "Range" or (node.op_type == "Slice" and constant_of(node.inputs[0]) is not None):
            return any(_derived_from_shape_of(i, ids) for i in node.inputs[1:] if i is not None)
        if node.op_type not in ("Unsqueeze", "Expand", "Cast", "Reshape"):
            return False
        value = node.inputs[0]
    return False


def _feeds_attention(value: ir.Value) -> bool:
    """ORT fuses EmbedLayerNormalization only where the LN output feeds attention (Q, K, V)."""
    consumers = [use.node.op_type for use in value.uses()]
    return "Attention" in consumers or consumers.count("MatMul") >= 3


def embed_layer_norm_costs(graph: ir.Graph, candidates: list[LnCandidate]) -> dict[LnCandidate, Blocked]:
    """LNs that the transformers optimizer would fuse with the embeddings into EmbedLayerNormalization,
    with the reason to keep them."""
    if optimizer_has_run(graph):
        return {}
    costly: dict[LnCandidate, str] = {}
    for cand in candidates:
        # A decomposed LN counts too: the optimizer first fuses it into a LayerNormalization.
        if cand.kind not in (LnKind.LAYER_NORM, LnKind.DECOMPOSED) or cand.form_problem:
            continue
        x = cand.x
        if x is None or x.producer() is None or x.producer().op_type != "Add":
            continue
        gathers = [_embedding_gather(leaf) for leaf in _add_leaves(x)]
        if not 2 <= len(gathers) <= 3 or None in gathers:
            continue
        ids = [g.inputs[1] for g in gathers if g.inputs[1].is_graph_input() and g.inputs[1].dtype in _INTEGER]
        if not ids or not _feeds_attention(cand.out):
            continue
        word = ids[0]
        if not any(g.inputs[1] is not word and _positions_of(g.inputs[1], word) for g in gathers):
            continue
        tables = ", ".join(f"'{g.inputs[0].name}'" for g in gathers)
        costly[cand] = Blocked(
            "fusion-cost",
            "kept: ONNX Runtime's transformers optimizer (optimize_model, model_type bert) fuses this LN with "
            f"the embedding Gathers of {tables} into com.microsoft::EmbedLayerNormalization, which has no RMS "
            "form; folding it would cost that fusion and buys nothing measurable (x0.96-1.02 on CPU). "
            "Run the optimizer first: the LNs it leaves fold either way",
        )
    return costly


def gemm_after_layer_norm(graph: ir.Graph, norms: set[ir.Node]) -> list[ir.Node]:
    """The `Reshape -> Gemm -> Reshape` that the gpt2 optimizer turns into MatMul + Add because a
    node of `norms` (LayerNormalization/SkipLayerNormalization) precedes them."""
    found = []
    for node in graph:
        if node.op_type != "Gemm" or not is_standard(node):
            continue
        reshape = node.inputs[0].producer() if node.inputs[0] is not None else None
        if reshape is None or reshape.op_type != "Reshape" or reshape.inputs[0] is None:
            continue
        root = reshape.inputs[0].producer()
        after = [use.node.op_type for use in node.outputs[0].uses()]
        if root in norms and reshape.inputs[0].index() == 0 and "Reshape" in after:
            found.append(node)
    return found
