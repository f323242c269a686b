"""Carry: which ops pass a zero mean through, along which axis, in both directions.

One table of rules (`RULES`, one `Rule` per op type, grouped by op family in this folder's
modules) answers both questions the analysis asks (docs/DESIGN.md section 2.2): `backward`, which
inputs must be zero-mean (and along which axes) for an output to be, and `forward`, where a
row-constant shift of an input shows up in the outputs. Both read the same links, so they cannot
disagree (tests/carry/test_carry_agreement.py).
"""

from onnx_lnfold.carry.engine import JOINTLY_LINEAR, Requirement, backward, forward
from onnx_lnfold.carry.rule import axis_vector
from onnx_lnfold.carry.rules import RULES

__all__ = ["JOINTLY_LINEAR", "RULES", "Requirement", "axis_vector", "backward", "forward"]
