"""How ONNX Runtime runs each decomposed LN (docs/DESIGN.md section 4.1), read off the graph an
inference session made of a weightless copy of the original (`probe.session_graph`), so the cost
rule prices what runs rather than what the export wrote.

A decomposed LN (`ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div, Mul, Add`) that ORT fuses runs
as one LayerNormalization kernel: priced as the graph says. One it leaves decomposed runs as its
nodes; where ORT's transpose optimizer moved it off the last axis (a VITS voice writes `Transpose,
LN over the last axis, Transpose` around a [batch, channels, time] stream, and the optimizer
cancels the Transposes through the elementwise nodes, so no LayerNormalization fusion happens),
it runs as 9 nodes over a strided axis, and the Transposes it had removed come back with the fold
(nothing moves a Transpose through SimplifiedLayerNormalization): `decide.costs.OrtLayout`.

Likewise an explicit centering the fold writes (`moved_centerings`), read off the session's graph
of the folded copy: one whose ReduceMean the session runs on another tensor than written (its
transpose optimizer pushed a Transpose down through it) runs over a strided axis.
"""

from __future__ import annotations

import onnx
from onnx import numpy_helper

from onnx_lnfold.analysis.plan import AuxCentering
from onnx_lnfold.core.names import centering_node_name
from onnx_lnfold.decide.costs import OrtLayout
from onnx_lnfold.forms import LnCandidate


def _axes(node: onnx.NodeProto, constants: dict[str, onnx.TensorProto]) -> list[int] | None:
    """The axes a ReduceMean of the session's graph reduces: its attribute, or from opset 18 its
    second input, a small constant the optimized graph holds inline."""
    for attr in node.attribute:
        if attr.name == "axes":
            return list(attr.ints)
    tensor = constants.get(node.input[1]) if len(node.input) > 1 else None
    if tensor is None or tensor.data_location == onnx.TensorProto.EXTERNAL:
        return None
    return [int(a) for a in numpy_helper.to_array(tensor).ravel()]


def _constants(session: onnx.GraphProto) -> dict[str, onnx.TensorProto]:
    """The session graph's constants by name: its initializers and its Constant nodes' values."""
    constants = {t.name: t for t in session.initializer}
    constants.update({n.output[0]: n.attribute[0].t for n in session.node if n.op_type == "Constant" and n.attribute})
    return constants


def decomposed_layouts(candidates: list[LnCandidate], session: onnx.GraphProto) -> dict[str, OrtLayout]:
    """Per decomposed LN (by name) that the session left decomposed over a non-last axis: how it
    runs there. LNs the session fused, or left where the export wrote them, are not listed."""
    by_name = {node.name: node for node in session.node if node.name}
    produced = {out for node in session.node for out in node.output if out}
    constants = _constants(session)
    out: dict[str, OrtLayout] = {}
    for cand in candidates:
        if not cand.form.is_pattern or cand.node.op_type != "ReduceMean" or cand.axis is None:
            continue
        ran = by_name.get(cand.node.name or "")
        if ran is None or ran.op_type != "ReduceMean":
            continue  # fused (or renamed): one kernel, as the graph says
        run = _axes(ran, constants)
        if run is None or not _moved(cand, run):
            continue  # where the export wrote it
        transposes = _removed_transposes(cand, produced)
        out[cand.name] = OrtLayout(strided=True, transposes=transposes)
    return out


def _moved(cand: LnCandidate, run: list[int]) -> bool:
    """Whether the session reduces over other axes than the LN's (`cand.axis`, non-negative)."""
    rank = len(cand.x.shape) if cand.x.shape is not None else None
    if rank is None:
        written = cand.node.attributes.get("axes")
        return written is None or sorted(written.as_ints()) != sorted(run)
    return sorted(a % rank for a in run) not in ([cand.axis], [rank - 1])


def _removed_transposes(cand: LnCandidate, produced: set[str]) -> int:
    """Transposes right before and after the LN that the session removed: a fold brings them back."""
    around = []
    producer = cand.x.producer()
    if producer is not None and producer.op_type == "Transpose":
        around.append(producer)
    around += [use.node for use in cand.out.uses() if use.node.op_type == "Transpose"]
    return sum(1 for node in around if node.outputs[0].name not in produced)


def moved_centerings(centerings: list[AuxCentering], session: onnx.GraphProto) -> set[str]:
    """The tensors of `centerings` whose ReduceMean (`core.names.centering_node_name`) the session
    runs on another tensor or over other axes than written."""
    by_name = {node.name: node for node in session.node if node.op_type == "ReduceMean"}
    constants = _constants(session)
    moved = set()
    for centering in centerings:
        ran = by_name.get(centering_node_name(centering.tensor, "ReduceMean"))
        if ran is None:
            continue  # fused into something else: not a centering's reduction any more
        axes = _axes(ran, constants)
        if ran.input[0] != centering.tensor or (axes is not None and axes != [centering.axis]):
            moved.add(centering.tensor)
    return moved
