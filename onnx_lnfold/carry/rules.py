"""The carry table: one rule per op, read by `engine.backward` and `engine.forward` alike.

A rule holds one op's axis bookkeeping once (broadcast alignment, the axis map of a layout op,
which input of a producer is its weight and along which axis) and answers in `Link`s: input `i`
along axis `b` moves output `k` along axis `a`. Asked from an output end (`Out`) it returns the
links into that output axis: the inputs that must be zero-mean (docs/DESIGN.md section 2). Asked
from an input end (`In`) it returns the links out of that input axis: the outputs a shift there
changes (section 3). Both directions read the same links, so they agree by construction;
tests/carry/test_carry_agreement.py checks it on random nodes of every op here.

A refusal is a `Blocked`. Asked from an input end, its reason starts with "it feeds <node>", as
the side-effect rule words what a changed tensor reaches.
"""

from __future__ import annotations

from onnx_lnfold.carry.elementwise import BroadcastRule, DivRule, MulRule, UnaryRule
from onnx_lnfold.carry.layout import ExpandRule, ReduceRule, ReshapeRule, TransposeRule
from onnx_lnfold.carry.pieces import ConcatRule, GatherNDRule, GatherRule, SliceRule, SplitRule, TileRule
from onnx_lnfold.carry.producers import ConvRule, GemmRule, MatMulRule
from onnx_lnfold.carry.rule import Rule
from onnx_lnfold.carry.sequences import ConcatFromSequenceRule, SequenceAtRule, SplitToSequenceRule

# The table. A new carry op or producer is one entry here (and, if no rule fits, one `Rule`).
RULES: dict[str, Rule] = {
    **dict.fromkeys(("Neg", "Identity", "Dropout", "Cast"), UnaryRule()),
    **dict.fromkeys(("Add", "Sub", "Sum"), BroadcastRule()),
    "Mul": MulRule(),
    "Div": DivRule(),
    "MatMul": MatMulRule(),
    "Gemm": GemmRule(),
    "Conv": ConvRule(),
    **dict.fromkeys(("Reshape", "Flatten", "Squeeze", "Unsqueeze"), ReshapeRule()),
    "Transpose": TransposeRule(),
    "Expand": ExpandRule(),
    **dict.fromkeys(("ReduceMean", "ReduceSum"), ReduceRule()),
    "Slice": SliceRule(),
    "Split": SplitRule(),
    "Tile": TileRule(),
    "Concat": ConcatRule(),
    "Gather": GatherRule(),
    "SplitToSequence": SplitToSequenceRule(),
    "SequenceAt": SequenceAtRule(),
    "ConcatFromSequence": ConcatFromSequenceRule(),
    "GatherND": GatherNDRule(),
}
