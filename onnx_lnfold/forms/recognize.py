"""Recognize: every LayerNorm of a model, in any form (`forms`), as an `LnCandidate`."""

from __future__ import annotations

import onnx_ir as ir

from onnx_lnfold.core.blocked import Blocked
from onnx_lnfold.core.ir import nodes_within
from onnx_lnfold.core.ops import LAYER_NORM, SKIP_LAYER_NORM
from onnx_lnfold.forms import FORMS, LnCandidate
from onnx_lnfold.forms.layer_norm import LayerNormForm
from onnx_lnfold.shapes.table import ShapeTable


def find_layer_norms(graph: ir.Graph, shapes: ShapeTable, names: dict[ir.Node, str]) -> list[LnCandidate]:
    """Every LayerNorm of the graph and its subgraphs (If/Loop/Scan bodies), in any recognized
    form, in graph order."""
    found = []
    for node in nodes_within(graph):
        for form in FORMS:
            cand = form.match(node, names[node], shapes)
            if cand is not None:
                found.append(cand)
                break
    return found


def find_in_functions(model: ir.Model, names: dict[ir.Node, str]) -> list[LnCandidate]:
    """LNs inside model-local functions: reported, not folded (a function body is shared by
    every call, and its constants by every caller)."""
    found = []
    for function in model.functions.values():
        for node in nodes_within(function):
            if node.op_type in (LAYER_NORM.op_type, SKIP_LAYER_NORM.op_type):
                name = f"{function.name}/{node.name or node.op_type}"
                cand = LnCandidate(_IN_FUNCTION, node, name, node.outputs[0], None, None, None, 0.0)
                cand.form_problem = Blocked(
                    "in-function",
                    f"it is inside model-local function '{function.domain}::{function.name}'; inline "
                    "functions first (onnx.inliner.inline_local_functions) to fold it",
                )
                found.append(cand)
    return found


_IN_FUNCTION = LayerNormForm()  # reported under the LayerNormalization kind, whichever op it is
