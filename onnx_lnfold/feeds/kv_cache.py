"""The KV cache of a decoder whose attention is ONNX Runtime's GroupQueryAttention: which graph
inputs are its past keys and values, its attention masks and its new tokens, and the sizes that
keep them consistent, so that a prompt and a decode step can be synthesized for it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import onnx_ir as ir

from onnx_lnfold.core.ir import constant_of
from onnx_lnfold.core.ops import MS_DOMAIN
from onnx_lnfold.feeds.synthesize import graph_inputs


@dataclass(frozen=True)
class KvCache:
    """The KV-cache inputs of a decoder whose attention is ONNX Runtime's GroupQueryAttention (what
    ONNX Runtime GenAI's model builder writes): its dims are symbols of their own (the head size
    too), and the op wants them consistent: a past of [batch, kv_heads, past, head_size], an
    attention mask of past + new positions, and new tokens of one position when the past is not
    empty (a prompt has an empty past). Read from the graph, and from `genai_config.json` beside
    the model where the graph leaves the head size to a symbol."""

    past: tuple[str, ...]  # the past key and value inputs
    heads: int  # KV heads
    head_size: int
    masks: tuple[str, ...]  # inputs of [batch, past + new]
    tokens: tuple[str, ...]  # inputs of [batch, new]
    max_total: int | None  # the most positions the rotary caches hold

    def shapes(self, batch: int, new: int, past: int) -> dict[str, tuple[int, ...]]:
        shapes = {name: (batch, self.heads, past, self.head_size) for name in self.past}
        shapes.update({name: (batch, past + new) for name in self.masks})
        shapes.update({name: (batch, new) for name in self.tokens})
        return shapes


_GQA = "GroupQueryAttention"


def _static_width(value: ir.Value | None, depth: int = 0) -> int | None:
    """The last dim of `value` where the graph fixes it: declared, or the output width of the
    projection that makes it (MatMul by a constant, MatMulNBits' N), through bias Adds and Casts."""
    if value is None or depth > 8:
        return None
    if value.shape is not None and len(value.shape) and isinstance(value.shape[-1], int):
        return value.shape[-1]
    node = value.producer()
    if node is None:
        return None
    if node.op_type == "MatMulNBits":
        return node.attributes.get_int("N", 0) or None
    if node.op_type in ("MatMul", "Gemm") and len(node.inputs) > 1 and constant_of(node.inputs[1]) is not None:
        dims = tuple(constant_of(node.inputs[1]).shape)
        return dims[0] if node.op_type == "Gemm" and node.attributes.get_int("transB", 0) else dims[-1]
    if node.op_type in ("Add", "Cast", "Identity"):
        return next((w for w in (_static_width(i, depth + 1) for i in node.inputs) if w), None)
    return None


def _graph_inputs_above(value: ir.Value | None, limit: int = 32) -> set[str]:
    """The graph inputs `value` is computed from, within `limit` nodes."""
    found: set[str] = set()
    stack, seen = [value], 0
    while stack and seen < limit:
        v = stack.pop()
        if v is None:
            continue
        if v.is_graph_input():
            found.add(v.name or "")
            continue
        node = v.producer()
        if node is not None:
            seen += 1
            stack.extend(node.inputs)
    return found


def _genai_head_size(folder: Path | None) -> int | None:
    if folder is None:
        return None
    try:
        config = json.loads((folder / "genai_config.json").read_text())
        return int(config["model"]["decoder"]["head_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def kv_cache(model: ir.Model, folder: Path | None = None) -> KvCache | None:
    """The KV cache of a GroupQueryAttention decoder, or None (no such attention, or inputs it
    cannot place)."""
    nodes = [n for n in model.graph if n.domain == MS_DOMAIN and n.op_type == _GQA]
    if not nodes:
        return None
    declared = {v.name: v for v in graph_inputs(model)}
    past: list[str] = []
    masks: set[str] = set()
    sizes, heads, max_total = set(), set(), None
    for node in nodes:
        kv_heads, q_heads = node.attributes.get_int("kv_num_heads", 0), node.attributes.get_int("num_heads", 0)
        for index in (3, 4):
            value = node.inputs[index] if len(node.inputs) > index else None
            if value is None or value.name not in declared:
                return None
            past.append(value.name)
        packed = len(node.inputs) < 2 or node.inputs[1] is None
        width = _static_width(node.inputs[0])
        if width and q_heads and kv_heads:
            sizes.add(width // (q_heads + 2 * kv_heads) if packed else width // q_heads)
        heads.add(kv_heads)
        for index in (5, 6):  # seqlens_k, total_sequence_length: made from the attention mask
            masks |= _graph_inputs_above(node.inputs[index] if len(node.inputs) > index else None)
        cos = constant_of(node.inputs[7]) if len(node.inputs) > 7 and node.inputs[7] is not None else None
        if cos is not None:
            max_total = min(max_total or cos.shape[0], cos.shape[0])
    size = sizes.pop() if len(sizes) == 1 else _genai_head_size(folder)
    if size is None or len(heads) != 1:
        return None
    masks = {m for m in masks if declared[m].shape is not None and len(declared[m].shape) == 2}
    tokens = tuple(
        name
        for name, v in declared.items()
        if name not in masks and name not in past and v.shape is not None and len(v.shape) == 2
        and v.dtype in (ir.DataType.INT64, ir.DataType.INT32)
    )
    return KvCache(tuple(past), heads.pop(), size, tuple(sorted(masks)), tokens, max_total)
