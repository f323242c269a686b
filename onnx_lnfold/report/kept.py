"""Why each kept LN stays, as the report groups it: by the stage and code of its `Blocked`, under
one heading in plain words, each LN with its own specifics (`Blocked.detail`: the tensor, the op
or the figures). The codes and stages are data (`core.blocked`); nothing here reads a reason's
wording, which may change from release to release.
"""

from __future__ import annotations

from onnx_lnfold.analysis.plan import LnDecision
from onnx_lnfold.core.blocked import CODES

# The report's heading for LNs kept at a stage for a code, where the code's own meaning
# (`CODES`) is not what a reader of the report needs first; (stage, None) serves every code of
# that stage without its own entry.
HEADINGS: dict[tuple[str, str | None], str] = {
    ("proof", "normalization-output"): "post-LN: each reads the output of another LayerNorm, whose gamma*n+beta has a "
    "data-dependent mean",
    ("proof", "graph-input"): "the input is a graph input: its mean depends on the data",
    ("proof", "weight-is-input"): "a weight to center is also a graph input: it can be overridden at run time, so it "
    "is not a constant (re-export without keep_initializers_as_inputs=True, or drop the initializers from the "
    "graph inputs)",
    ("side-effect", "graph-output"): "centering would change a graph output (a residual stream exposed as hidden "
    "states, say)",
    ("side-effect", "mixes-shift"): "centering would change a tensor that also feeds a layer mixing its channels",
    ("side-effect", None): "centering would change a tensor read where the change matters",
    ("cost", "fusion-cost"): "ONNX Runtime's transformers optimizer fuses it into EmbedLayerNormalization, which has "
    "no RMS form: run the optimizer first",
    ("cost", "fusion-lost"): "folding it would cost a fusion an ONNX Runtime session makes on the original (checked "
    "on weightless copies)",
    ("cost", "centering-costs-more"): "its fold needs an explicit centering x - ReduceMean(x) that costs ONNX Runtime "
    "more than the LNs it would unlock save (measured kernel costs; each names its table and the shape that decided)",
    ("cost", "costs-more"): "its fold would cost ONNX Runtime more than the LN saves: its beta would stay an Add over "
    "the stream, or need a created bias (measured kernel costs; each LN names its table and the shape that decided)",
    ("cost", "cost-unresolved"): "its cost table cannot tell its fold from the LN (their difference is within the "
    "spread of its figures): never-slower folds only what it shows cheaper",
}


# Codes whose LNs are grouped by their cause (the detail, shared by every LN it keeps: an explicit
# centering and its figures) under the code's heading, the LNs listed by name.
BY_CAUSE = frozenset({"centering-costs-more"})


def heading(stage: str | None, code: str) -> str:
    """The heading of the LNs kept at `stage` for `code`, with the code users can match on."""
    words = HEADINGS.get((stage or "", code)) or HEADINGS.get((stage or "", None)) or CODES[code]
    return f"({code}) {words}"


def explain_kept(decision: LnDecision) -> tuple[str, str]:
    """(heading shared by the LNs kept for the same stage and code, this LN's specifics)."""
    blocked = decision.blocked
    assert blocked is not None, "a folded LN has no reason to stay"
    if blocked.code in BY_CAUSE and blocked.detail:
        return f"{heading(blocked.stage, blocked.code)}: {blocked.detail}", ""
    return heading(blocked.stage, blocked.code), blocked.detail or blocked.reason
