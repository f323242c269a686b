"""What the folded model says of each node the fold writes, in the node's doc_string (Netron shows
it): the LN it stands for, and why that is exact. Every note begins with `NOTE_PREFIX`, which a
tool comparing two folds' outputs strips (tools/fold_digests.py); the read-back ignores doc_strings.
"""

from __future__ import annotations

from onnx_lnfold.analysis.plan import AuxCentering, CenteringEdit, LnDecision

NOTE_PREFIX = "onnx_lnfold: "


def _ln(decision: LnDecision) -> str:
    return f"{decision.op_type} '{decision.node}'"


def _lns(names: tuple[str, ...]) -> str:
    return ", ".join(f"'{name}'" for name in names)


def replaces(decision: LnDecision) -> str:
    """On the nodes written in a folded LN's place (its RMSNorm op, the primitive target's ops):
    `replaces LayerNormalization 'ln_1' (input is zero-mean once 3 constants are centered)`."""
    return f"{NOTE_PREFIX}replaces {_ln(decision)} ({decision.proof})"


def adds_beta(decision: LnDecision, why: str | None) -> str:
    """On the Add of a folded LN's beta after its RMSNorm, where beta stays an Add (`why`)."""
    stays = f" (beta stays an Add: {why})" if why else ""
    return f"{NOTE_PREFIX}adds the beta of {_ln(decision)} after the RMSNorm that replaces it{stays}"


def bias_share(decision: LnDecision, consumer: str) -> str:
    """On the Add of a bias created after a MatMul for its share of a folded LN's beta."""
    return (
        f"{NOTE_PREFIX}adds to '{consumer}' its share of the beta of {_ln(decision)}, beta @ W, which the RMSNorm "
        f"in the LN's place leaves out: (y + beta) @ W = y @ W + beta @ W"
    )


def centers(centering: AuxCentering) -> str:
    """On an explicit centering's ReduceMean and Sub."""
    return (
        f"{NOTE_PREFIX}centers '{centering.tensor}' over axis {centering.axis} (minus its mean), which makes the "
        f"input of {_lns(centering.required_by)} zero-mean"
    )


def derived_at_load(edit: CenteringEdit) -> str:
    """On the Sub of a table centered at load (its row means subtracted, folded by ONNX Runtime)."""
    return (
        f"{NOTE_PREFIX}'{edit.tensor}' minus its row means '{edit.means_name}' over axis {edit.axis}: a centered copy "
        f"ONNX Runtime folds at load, which makes the input of {_lns(edit.required_by)} zero-mean"
    )
