"""How a mean along one axis moves through one node (docs/DESIGN.md section 2).

Two questions are asked of every node, one per direction:

- `backward`: for output `k` to be zero-mean along `axis`, which inputs must be zero-mean, and
  along which of their axes? (Producers such as MatMul answer "the weight, along its output
  axis"; the data input is free because a centered weight makes any input's product centered.)
- `forward`: if input `i` changes by a shift that is constant along `axis`, which outputs change,
  and is each change still a shift constant along one of their axes?

Both questions may be asked of a `Part` of the axis (`shapes.parts`: blocks of it, positions of other
axes), and answer with the part on the other side.

Both are read off the same per-op rule in `carry.rules.RULES` (its `Link`s), so the analysis
and the side-effect check cannot disagree. Both return a `Blocked` (its code and reason) when the
node breaks the chain. Axes are always non-negative.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx_ir as ir

from onnx_lnfold.carry.rule import In, Link, Out, axis_vector, fed
from onnx_lnfold.carry.rules import RULES
from onnx_lnfold.core.blocked import Blocked
from onnx_lnfold.core.ir import is_standard, node_label, reads_only_shape
from onnx_lnfold.core.ops import LAYER_NORM
from onnx_lnfold.core.quantized import QUANTIZED_WHY, is_quantized_node
from onnx_lnfold.shapes.parts import WHOLE, Part
from onnx_lnfold.shapes.table import ShapeTable

__all__ = ["JOINTLY_LINEAR", "RULES", "WHOLE", "Part", "Requirement", "axis_vector", "backward", "forward"]


@dataclass(frozen=True)
class Requirement:
    """Input `index` must be zero-mean along `axis` (its own coordinates).

    `axis=None` means the input does not vary along the tracked axis (missing by broadcasting, or
    of size 1 there): its contribution is constant along the axis, so it must be exactly zero.
    """

    index: int
    axis: int | None
    # Index of a constant input that multiplies this one and varies along the axis (a layer
    # scale): then `input * factor`, not the input, must be zero-mean (an affine chain).
    factor: int | None = None
    part: Part = WHOLE  # which part of the axis: blocks, positions of other axes (`shapes.parts`)


# Ops whose changed inputs add up linearly: several of them may change at once. (An LN form whose
# inputs add up, SkipLayerNormalization, says so itself: `Sinks.adds_inputs`.)
JOINTLY_LINEAR = {op for op, rule in RULES.items() if rule.jointly_linear}


def _far(link: Link, part: Part) -> Part:
    """The part at the far end of `link` from an end with `part`."""
    if link.broadcast:
        return WHOLE  # constant along the axis: all of it must be zero, whatever the part
    return link.part if link.part is not None else part.without_where()


def backward(
    node: ir.Node, output_index: int, axis: int, shapes: ShapeTable, part: Part = WHOLE
) -> list[Requirement] | Blocked:
    """Which inputs must be zero-mean for `node.outputs[output_index]` to be zero-mean along `axis`
    (in `part`): centering them shifts the output within that part."""
    if is_quantized_node(node):
        return Blocked("quantized", f"{node_label(node)} is quantized: {QUANTIZED_WHY}")
    if not is_standard(node):
        return Blocked("not-carried", f"{node_label(node)} ({node.domain}) does not carry a zero mean")
    rule = RULES.get(node.op_type)
    links = rule.links(node, shapes, Out(output_index, axis, part)) if rule is not None else []
    if isinstance(links, Blocked):
        return links
    if not links:
        return Blocked("not-carried", f"{node_label(node)} does not carry a zero mean")
    return [
        Requirement(link.input, None if link.broadcast else link.in_axis, link.factor, _far(link, part)) for link in links
    ]


def forward(
    node: ir.Node, input_index: int, axis: int, shapes: ShapeTable, part: Part = WHOLE
) -> dict[int, tuple[int, Part]] | Blocked:
    """Where a shift constant along `axis` (in `part`) at input `input_index` goes: {output
    index: (axis, part)}; {} when no output changes."""
    if _only_shape_read(node, input_index):
        return {}  # e.g. TorchScript's `x[:, :, -1].shape`: a Gather along the axis read by Shape
    rule = RULES.get(node.op_type) if is_standard(node) else None
    if rule is None:
        return Blocked("not-carried", f"{fed(node)}, which does not pass a mean shift through")
    links = rule.links(node, shapes, In(input_index, axis, part))
    if isinstance(links, Blocked):
        return links
    return {link.output: (link.out_axis, _far(link, part)) for link in links}


# Inputs whose values never decide the shape of the node's outputs (only their shapes do), by op:
# None for every input. Reshape's target, Expand's shape, Slice's bounds, If's condition... do.
_SHAPE_BLIND_INPUTS: dict[str, set[int] | None] = {
    **dict.fromkeys(
        ("Add", "Sub", "Mul", "Div", "Pow", "Sum", "Neg", "Identity", "Cast", "Dropout", "Relu", "Gelu",
         "Erf", "Tanh", "Sigmoid", "Sqrt", "Exp", "Abs", "MatMul", "Gemm", "Softmax", "Transpose", "Concat",
         LAYER_NORM.op_type, "Conv"),
        None,
    ),
    **dict.fromkeys(
        ("Gather", "GatherElements", "GatherND", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Expand",
         "Slice", "Split", "Tile", "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin"),
        {0},
    ),
}


def _only_shape_read(node: ir.Node, input_index: int) -> bool:
    """Whether a change of input `input_index` reaches nothing but Shape/Size nodes: the node's
    outputs are read only for their shapes, which do not depend on that input's values."""
    if not is_standard(node) or node.op_type not in _SHAPE_BLIND_INPUTS:
        return False
    blind = _SHAPE_BLIND_INPUTS[node.op_type]
    if blind is not None and input_index not in blind:
        return False
    for out in node.outputs:
        if out is None:
            continue
        if out.is_graph_output():
            return False
        if not all(reads_only_shape(use.node) for use in out.uses()):
            return False
    return True


