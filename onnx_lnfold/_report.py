"""The report: the plan, op counts before and after, verification figures, where the output went."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import onnx_ir as ir

from onnx_lnfold._plan import CenteringPlan
from onnx_lnfold._verify import Verification


def count_ops(model: ir.Model) -> dict[str, int]:
    counts = Counter(
        node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}" for node in model.graph
    )
    return dict(sorted(counts.items()))


@dataclass
class FoldReport:
    plan: CenteringPlan
    ops_before: dict[str, int]
    ops_after: dict[str, int]
    verification: Verification
    source: str | None = None
    output: str | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "output": self.output,
            **self.plan.to_dict(),
            "ops_before": self.ops_before,
            "ops_after": self.ops_after,
            "verification": self.verification.to_dict(),
            "notes": self.notes,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def format_text(self) -> str:
        plan = self.plan
        lines = [f"onnx_lnfold: {self.source or '<model>'}"]
        if not plan.decisions:
            lines.append("nothing to fold: the model has no LayerNormalization")
        else:
            lines.append(f"LayerNorm nodes: {len(plan.folded)} folded, {len(plan.kept)} kept (of {len(plan.decisions)})")
            width = max(len(d.node) for d in plan.decisions)
            for d in plan.decisions:
                if d.folded:
                    what = f"-> {d.rewrite}"
                    if d.residual_add:
                        what += f" (with residual Add '{d.residual_add}')"
                    what += {"add": ", beta as Add", "consumers": ", beta folded into consumer biases"}.get(d.beta or "", "")
                else:
                    what = d.reason
                lines.append(f"  {d.node:<{width}}  {d.status:<6}  {what}")
        if plan.edits:
            untied = [e for e in plan.edits if e.untie]
            lines.append(
                f"Centered constants: {len(plan.edits)} ({len(untied)} untied copies, +{plan.untied_bytes:,} bytes)"
            )
            width = max(len(e.tensor) for e in plan.edits)
            for e in plan.edits:
                axis = "zeroed" if e.axis is None else f"axis {e.axis}" + ("*w" if e.weights else "")
                copy = f"  untied -> {e.new_name} (+{e.copy_bytes:,} B)" if e.untie else ""
                lines.append(f"  {e.tensor:<{width}}  {axis:<7}  {e.role}{copy}")
                if e.note:
                    lines.append(f"  {'':<{width}}  {'':<7}  ({e.note})")
        for c in plan.centerings:
            if c.instead_of_untie:
                lines.append(
                    f"Explicit centering: '{c.tensor}' - ReduceMean over axis {c.axis} ({c.cost}) instead of "
                    f"an untied copy of '{c.instead_of_untie}' (saves {c.saved_bytes:,} bytes; --tied-weights untie)"
                )
                continue
            lines.append(
                f"Explicit centering: '{c.tensor}' - ReduceMean over axis {c.axis} ({c.cost}) "
                f"unlocks {len(c.required_by)} LN(s): {', '.join(c.required_by)}"
            )
        changed = sorted(k for k in set(self.ops_before) | set(self.ops_after) if self.ops_before.get(k, 0) != self.ops_after.get(k, 0))
        if changed:
            lines.append("Ops: " + "; ".join(f"{k} {self.ops_before.get(k, 0)} -> {self.ops_after.get(k, 0)}" for k in changed))
        lines.extend(plan.advice)
        v = self.verification
        if v.status == "skipped":
            lines.append(f"Verification: skipped ({v.reason})")
        else:
            shapes = ", ".join(f"{k}{tuple(s)}" for k, s in v.input_shapes.items())
            lines.append(f"Verification ({v.status}, onnxruntime CPU, optimizations off, inputs {shapes}, rtol {v.rtol:g}):")
            for o in v.outputs:
                lines.append(f"  {o.name}: max|diff| {o.max_abs_diff:.3g}, relative {o.rel_diff:.3g}")
            if v.reason:
                lines.append(f"  {v.reason}")
        lines.extend(self.notes)
        if self.output:
            lines.append(f"Wrote {self.output}")
        return "\n".join(lines)
