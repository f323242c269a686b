"""`com.microsoft::EmbedLayerNormalization` (ONNX Runtime's transformers optimizer, BERT-like
models): the embedding Gathers, their sum and the LN fused in one op. It has no RMS counterpart:
recognized so the report names it, never folded."""

from __future__ import annotations

import onnx_ir as ir

from onnx_lnfold.core.blocked import Blocked
from onnx_lnfold.core.ops import EMBED_LAYER_NORM, MS_DOMAIN
from onnx_lnfold.forms.base import LnCandidate, LnForm, LnKind
from onnx_lnfold.shapes.table import ShapeTable


class EmbedLayerNormForm(LnForm):
    kind = LnKind.EMBED_LAYER_NORM
    op_type = EMBED_LAYER_NORM.op_type

    def match(self, node: ir.Node, name: str, shapes: ShapeTable) -> LnCandidate | None:
        if not (node.domain == MS_DOMAIN and node.op_type == EMBED_LAYER_NORM.op_type):
            return None
        cand = LnCandidate(self, node, name, node.outputs[0], None, None, None, 0.0)
        cand.form_problem = Blocked(
            "no-rms-form", "EmbedLayerNormalization fuses the embeddings with the LN and has no RMSNorm counterpart"
        )
        return cand
