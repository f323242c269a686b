"""The read-back: every tensor and node in which the folded model, as written, differs from the
model it was folded from is accounted for by the plan, and checked (docs/DESIGN.md section 6).

`planned_changes` (`planned`) is taken from the bound plan and the model just before `apply_plan`
(the plan's IR objects are then intact): each node as it was, and what the plan changes
(`PlannedChanges`). `read_back` then reads the folded model from its file and walks it (`walk`):

- each folded LN's emission (`rewrites`): the nodes its rewrite's record (`decide.emission`) says
  it writes, the record the rewrite built them from, found from the LN's output back: each op, its
  inputs (the planned tensors, the constants it creates with their values, the emitted node before
  it), its attributes, and the names it takes over (the LN's output, the residual sum);
- each consumer's share of beta: the bias it went into, recomputed from the original
  (`verify.tensor_checks.check_bias_with_beta`);
- each explicit centering: `Sub(x, ReduceMean(x))` over the planned axis, keepdims;
- each centered weight (`verify.tensor_checks.check_centered`), each table derived at load (its Sub
  and its row means);
- every other node as it was (op, attributes, inputs, where the plan has a use read a centered
  tensor that one), every other constant byte for byte the original's, every removed node one the
  plan removes, every constant of the original there but those only the removed nodes read
  (`PlannedChanges.orphans`, `apply.orphans`), the graph inputs, outputs and opset as they were.

The first thing that differs and that the plan does not account for refuses the fold, named; a
node's doc_string is no difference (the fold notes on each node it writes what it stands for).
Tensors are read a block of rows at a time, external data unmapped once read.
"""

from onnx_lnfold.verify.readback.planned import PlannedChanges, planned_changes
from onnx_lnfold.verify.readback.walk import ReadBack, read_back, read_back_steps

__all__ = ["PlannedChanges", "ReadBack", "planned_changes", "read_back", "read_back_steps"]
