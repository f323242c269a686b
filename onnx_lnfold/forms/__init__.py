"""The forms a LayerNorm takes in a graph, one module each (docs/DESIGN.md section 5).

A form (`LnForm`) recognizes its LN (`match`: an `LnCandidate` with the inputs that must be
zero-mean, or the `Blocked` that rules it out whatever its upstream), says what its nodes do with a
shift of their inputs (`absorbs`: the analysis' sinks come from the candidates only), and where its
fold goes (`site`). `FORMS` is every form, in the order they are tried on a node.
"""

from onnx_lnfold.forms.base import LnCandidate, LnForm, LnKind, RewriteSite
from onnx_lnfold.forms.decomposed import DecomposedForm
from onnx_lnfold.forms.embed_layer_norm import EmbedLayerNormForm
from onnx_lnfold.forms.keras_layer_norm import KerasLayerNormForm
from onnx_lnfold.forms.layer_norm import LayerNormForm
from onnx_lnfold.forms.moments import MomentsForm
from onnx_lnfold.forms.skip_layer_norm import SkipLayerNormForm, is_residual_sum, sum_terms

FORMS = (LayerNormForm(), SkipLayerNormForm(), EmbedLayerNormForm(), DecomposedForm(), MomentsForm(), KerasLayerNormForm())

__all__ = ["FORMS", "LnCandidate", "LnForm", "LnKind", "RewriteSite", "is_residual_sum", "sum_terms"]
