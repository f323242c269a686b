"""What a fold did, written into the model it wrote: `metadata_props` entries under `onnx_lnfold.`,
which Netron shows as the model's properties and `onnx.load(path).metadata_props` lists.

    onnx_lnfold.version        0.1.0
    onnx_lnfold.options        --target onnx --fold-costly        ("defaults" where none was given)
    onnx_lnfold.folded         5 of 5 LayerNorms folded: 5 LayerNormalization -> SimplifiedLayerNormalization
    onnx_lnfold.verification   passed: verified (in float64, worst relative diff 4.9e-07), rtol 0.0001

Only a fold that changed the model records itself: where nothing was folded the output is the input
as it was (the input's own bytes where it has no external data), its entries included. A model
folded again gets this fold's entries in place of the earlier fold's (`drop_provenance` before it
is written), one entry per key: onnx.checker refuses a model with two entries of one key.

The verdict is known only after the output is staged (the check reads the staged file), so the
entries are added by `StagedModel.commit(metadata)`, appended to the written file.
"""

from __future__ import annotations

import shlex
from collections import Counter
from typing import Protocol

import onnx_ir as ir

from onnx_lnfold.analysis.plan import CenteringPlan
from onnx_lnfold.core.options import FOLD_OPTIONS, FoldOptions
from onnx_lnfold.core.version import VERSION
from onnx_lnfold.verify.verdict import Verification

# Every key this module writes starts with it; every key that starts with it is this tool's.
PREFIX = "onnx_lnfold."


class FoldOutcome(Protocol):
    """What provenance reads of a fold: a `report.fold_report.FoldReport` (the report step comes
    after this one, so it is named here by what it holds)."""

    @property
    def plan(self) -> CenteringPlan: ...

    @property
    def verification(self) -> Verification: ...


def options_words(options: FoldOptions) -> str:
    """The options as the command line spells them (`--target onnx --fold-costly`): the flags that
    differ from the defaults, in the order of `core.options.FOLD_OPTIONS`; "defaults" where none does."""
    args = [arg for option in FOLD_OPTIONS for arg in option.cli_args(getattr(options, option.name))]
    return shlex.join(args) if args else "defaults"


def folded_words(plan: CenteringPlan) -> str:
    """`5 of 5 LayerNorms folded: 5 LayerNormalization -> SimplifiedLayerNormalization`; the kept
    ones counted by their code (`core.blocked.CODES`)."""
    text = f"{len(plan.folded)} of {len(plan.decisions)} LayerNorms folded"
    rewrites = Counter((d.op_type, d.rewrite) for d in plan.folded)
    if rewrites:
        text += ": " + ", ".join(f"{n} {op} -> {rewrite}" for (op, rewrite), n in rewrites.items())
    kept = Counter(d.code for d in plan.kept)
    if kept:
        text += f"; {len(plan.kept)} kept (" + ", ".join(f"{code} {n}" for code, n in kept.most_common()) + ")"
    return text


def verification_words(verification: Verification) -> str:
    """`passed: verified (in float64, worst relative diff 4.9e-07), rtol 0.0001`: the status, then
    the summary line's verdict (the judgment and the figure it rests on), then the tolerance."""
    text = f"{verification.status}: {verification.verdict()}"
    if verification.outputs and verification.rtol is not None:
        text += f", rtol {verification.rtol:g}"
    return text


def provenance(report: FoldOutcome, options: FoldOptions) -> dict[str, str]:
    """The `metadata_props` entries that say what the fold of `report` did, with `options`."""
    return {
        PREFIX + "version": VERSION,
        PREFIX + "options": options_words(options),
        PREFIX + "folded": folded_words(report.plan),
        PREFIX + "verification": verification_words(report.verification),
    }


def drop_provenance(model: ir.Model) -> dict[str, str]:
    """Remove the entries an earlier fold wrote (they describe the model before this fold changed
    it) and return them."""
    dropped = {key: value for key, value in model.metadata_props.items() if key.startswith(PREFIX)}
    for key in dropped:
        del model.metadata_props[key]
    return dropped


__all__ = [
    "PREFIX",
    "FoldOutcome",
    "drop_provenance",
    "folded_words",
    "options_words",
    "provenance",
    "verification_words",
]
