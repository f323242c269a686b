"""Carry rules of producers: MatMul, Gemm and Conv, whose output is zero-mean along its output axis
once a constant weight (and bias) is centered (docs/DESIGN.md section 2.1)."""

from __future__ import annotations

from typing import ClassVar

import onnx_ir as ir

from onnx_lnfold.carry.elementwise import broadcast_link
from onnx_lnfold.carry.rule import End, Link, Out, Rule, fed
from onnx_lnfold.core.blocked import Blocked
from onnx_lnfold.core.ir import (
    node_label,
)
from onnx_lnfold.shapes.table import ShapeTable


class ProducerRule(Rule):
    """An op whose output axis `produced_axis` comes from one axis of a constant weight (and bias):
    centering those makes the output zero-mean whatever the data input. A shift anywhere else
    mixes into every output."""

    jointly_linear = True

    def check(self, node: ir.Node) -> Blocked | None:
        return None

    def produced_axis(self, node: ir.Node, shapes: ShapeTable) -> int | None | Blocked:
        raise NotImplementedError

    def wrong_axis(self, node: ir.Node) -> Blocked:
        raise NotImplementedError

    def weights(self, node: ir.Node, shapes: ShapeTable, axis: int, end: End) -> list[Link] | Blocked:
        """The links from the weight (and bias) to output `axis`."""
        raise NotImplementedError

    def _links(self, node, shapes, end):
        blocked = self.check(node)
        if blocked is not None:
            return blocked
        axis = self.produced_axis(node, shapes)
        if isinstance(axis, Blocked):
            return axis
        if axis is None or (isinstance(end, Out) and end.axis != axis):
            return self.wrong_axis(node)
        return self.weights(node, shapes, axis, end)

    def links(self, node, shapes, end):
        links = self._links(node, shapes, end)
        if isinstance(end, Out):
            return links if isinstance(links, Blocked) else [link for link in links if link.starts_at(end)]
        mine = [] if isinstance(links, Blocked) else [link for link in links if link.starts_at(end)]
        return mine or Blocked("mixes-shift", f"{fed(node)}, {self.spreads_shift(node)}")

    def spreads_shift(self, node: ir.Node) -> str:
        """What the op does to a shift of its data input, for the refusal."""
        return "which mixes the shift into every output"


class MatMulRule(ProducerRule):
    """MatMul(X, W): the last output axis is W's columns."""

    jointly_linear = False  # X and W changing at once change the product bilinearly
    roles: ClassVar[dict[int, str]] = {1: "MatMul weight"}

    def produced_axis(self, node, shapes):
        out_rank, w_rank = shapes.rank(node.outputs[0]), shapes.rank(node.inputs[1])
        if out_rank is None or w_rank is None:
            return Blocked("unknown-shape", f"the shapes around {node_label(node)} are unknown")
        return out_rank - 1 if w_rank >= 2 else None

    def wrong_axis(self, node):
        return Blocked(
            "wrong-axis", f"{node_label(node)} does not produce the normalized axis from its weight's columns"
        )

    def weights(self, node, shapes, axis, end):
        return [Link(1, shapes.rank(node.inputs[1]) - 1, 0, axis)]  # type: ignore[operator]


class GemmRule(ProducerRule):
    """Gemm(A, B, C): output columns (axis 1) are B's columns (its rows with transB), plus C."""

    roles: ClassVar[dict[int, str]] = {1: "Gemm weight", 2: "Gemm bias"}

    def produced_axis(self, node, shapes):
        return 1

    def wrong_axis(self, node):
        return Blocked("wrong-axis", f"{node_label(node)} is normalized along its rows, not its output columns")

    def weights(self, node, shapes, axis, end):
        links = [Link(1, 0 if node.attributes.get_int("transB", 0) else 1, 0, axis)]
        if len(node.inputs) > 2 and node.inputs[2] is not None:
            if isinstance(end, Out) and shapes.shape(node.inputs[2]) is None:
                return Blocked("unknown-shape", f"the shape of the bias of {node_label(node)} is unknown")
            c_rank = shapes.rank(node.inputs[2])
            if c_rank is not None:
                links.append(broadcast_link(node, shapes, 2, c_rank, 2, axis))
        return links


class ConvRule(ProducerRule):
    """Conv(X, W, B) with group 1: output channels (axis 1) are W's and B's axis 0."""

    roles: ClassVar[dict[int, str]] = {1: "Conv weight", 2: "Conv bias"}

    def check(self, node):
        group = node.attributes.get_int("group", 1)
        if group != 1:
            return Blocked(
                "grouped-conv",
                f"{node_label(node)} is a grouped Conv (group={group}): "
                "its output channels cannot be centered by editing weights",
            )
        return None

    def produced_axis(self, node, shapes):
        return 1

    def spreads_shift(self, node):
        group = node.attributes.get_int("group", 1)
        if group == 1:
            return super().spreads_shift(node)
        # Depthwise and grouped: no channel reads another group's, but each weighs the shift by its own
        # kernel, so the change is no longer the same along the channels.
        return f"a grouped Conv (group={group}) that weighs the shift by each channel's own kernel"

    def wrong_axis(self, node):
        return Blocked("wrong-axis", f"{node_label(node)} is normalized along an axis other than its channels")

    def weights(self, node, shapes, axis, end):
        biased = len(node.inputs) > 2 and node.inputs[2] is not None
        return [Link(1, 0, 0, axis)] + ([Link(2, 0, 0, axis)] if biased else [])
