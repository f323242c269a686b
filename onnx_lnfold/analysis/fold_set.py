"""Which LNs fold together (docs/DESIGN.md sections 2.3 and 3): trace every candidate, drop those
whose edits have side effects until none do, and, with explicit centering allowed, keep only the
centerings that pay for themselves. Mutates nothing.

Cost model: an explicit centering costs one ReduceMean + Sub per run, and each LN it unlocks saves
what its fold saves (LayerNormalization -> SimplifiedLayerNormalization, or ORT's slow fused
SkipLayerNormalization replaced), by the measured kernel costs of `decide.costs`. The LNs and the
centerings they need are priced as sets (`centering_sets`: LNs linked through a centering they
share): a set's centerings are kept only when its LNs save more than all of them cost together, by
more than the figures' spread, at the tokens they run at. Where a set does not pay, the centering
that earns least is denied and the fold set is recomputed without it.
"""

from __future__ import annotations

import logging
from typing import TypeVar

import onnx_ir as ir

from onnx_lnfold import carry
from onnx_lnfold.analysis.edits import written_site
from onnx_lnfold.analysis.side_effects import side_effects
from onnx_lnfold.analysis.sinks import Sinks
from onnx_lnfold.analysis.zero_mean import Leaf, Tracer
from onnx_lnfold.core.blocked import Blocked
from onnx_lnfold.core.ir import NARROW_FLOAT_TYPES, constant_of
from onnx_lnfold.core.ops import NORMALIZATION_TYPES
from onnx_lnfold.core.values import is_zero
from onnx_lnfold.decide.costs import Saving
from onnx_lnfold.decide.pricing import centering_kind
from onnx_lnfold.forms import LnCandidate
from onnx_lnfold.shapes.table import ShapeTable

logger = logging.getLogger(__name__)

# What each LN's fold saves per run (`decide.costs.Saving`: with its spread, its width and the pricing
# it comes from); an LN without an entry saves nothing. None: every LN folds whatever it costs
# (`fold_costly`), and a centering is used wherever it unlocks one.
Savings = dict[LnCandidate, Saving]
K = TypeVar("K")
R = TypeVar("R")


def _centering_pays(cands, savings: Savings | None, kind: str = "Centering") -> bool:
    """`kind`: the centering's cost kind (`decide.pricing.centering_kind`: over the last axis or not)."""
    if savings is None:  # folding whatever it costs: any LN it unlocks is reason enough
        return bool(cands)
    priced = sorted((savings[c] for c in cands if c in savings), key=lambda s: s.width is None)
    if not priced:
        return False
    # The LNs a centering unlocks read the one stream it centers: one width, one token count.
    return priced[0].pricing.centering_pays(priced[0].width, priced, kind)


def centering_sets(needs: dict[K, set[R]]) -> list[tuple[list[K], list[R]]]:
    """The LNs of `needs` (each with the centerings its fold needs) in sets linked through the
    centerings they share, each set with all its centerings; in the order of `needs`. An LN that
    needs none is in no set."""
    owner: dict[R, int] = {}
    groups: list[tuple[list[K], list[R]]] = []
    for ln, roots in needs.items():
        if not roots:
            continue
        joined = sorted({owner[r] for r in roots if r in owner})
        if joined:
            into = joined[0]
            for other in joined[1:]:  # this LN links sets made so far: merge them into the first
                lns, more = groups[other]
                groups[into][0].extend(lns)
                groups[into][1].extend(more)
                for r in more:
                    owner[r] = into
                groups[other] = ([], [])
        else:
            into = len(groups)
            groups.append(([], []))
        groups[into][0].append(ln)
        for r in roots:
            if owner.get(r) != into:
                owner[r] = into
                groups[into][1].append(r)
    return [group for group in groups if group[0]]


def _unpaid_roots(
    unlocked: dict[ir.Value, set[LnCandidate]], kinds: dict[ir.Value, str], savings: Savings | None
) -> set[ir.Value]:
    """The centerings to deny this round: in each set of LNs and the centerings they need
    (`centering_sets`), none where the set pays as a whole, else the one that earns least (what
    the LNs it unlocks save, each LN's saving shared evenly among the centerings it needs, less its
    own cost); every centering whose LNs save nothing by the table."""
    if savings is None:  # folding whatever it costs: every centering that unlocks an LN stays
        return set()
    needs: dict[LnCandidate, set[ir.Value]] = {}
    for root, cands in unlocked.items():
        for cand in cands:
            needs.setdefault(cand, set()).add(root)
    poor: set[ir.Value] = set()
    for cands, roots in centering_sets(needs):
        priced = sorted((savings[c] for c in cands if c in savings), key=lambda s: s.width is None)
        if not priced or priced[0].width is None:
            poor |= set(roots)
            continue
        # The centerings of a set read the streams its LNs normalize: one width, one token count.
        pricing, width = priced[0].pricing, priced[0].width
        if pricing.centerings_pay([(kinds[r], width) for r in roots], priced):
            continue

        def earned(root: ir.Value) -> tuple[float, str]:
            shares = sum(savings[c].amount / len(needs[c]) for c in unlocked[root] if c in savings)
            return shares - pricing.total([(kinds[root], width)]), root.name or ""

        poor.add(min(roots, key=earned))
    return poor


def leaf_order(leaf: Leaf, names: dict[ir.Node, str]) -> tuple:
    axis = -1 if leaf.axis is None else leaf.axis
    blocks = sorted(leaf.part.blocks) if leaf.part.blocks is not None else []
    return (names[leaf.node], leaf.index, leaf.aux, axis, leaf.weights is not None, leaf.weights or (), leaf.part.block or 0, blocks)


def fold_set(
    candidates: list[LnCandidate],
    shapes: ShapeTable,
    sinks: Sinks,
    names: dict[ir.Node, str],
    aux_denied: set[ir.Value] | None,
    junctions: frozenset[ir.Value] = frozenset(),
) -> tuple[dict[LnCandidate, frozenset[Leaf]], dict[LnCandidate, Blocked]]:
    """Trace every candidate, then drop those whose edits have side effects, until none do."""
    patterns = {cand.out: f"the LayerNorm pattern at '{cand.name}'" for cand in candidates if cand.form.is_pattern}
    tracer = Tracer(shapes, sinks, aux_denied, patterns, junctions)
    blocked: dict[LnCandidate, Blocked] = {}
    active: dict[LnCandidate, frozenset[Leaf]] = {}
    for cand in candidates:
        if cand.form_problem:
            blocked[cand] = cand.form_problem.at_stage("form")
            continue
        traced = tracer.prove(cand.node, cand.terms)
        if isinstance(traced, Blocked):
            blocked[cand] = traced.at_stage("proof")
        else:
            active[cand] = traced
    while active:
        leaves = sorted({leaf for ls in active.values() for leaf in ls}, key=lambda l: leaf_order(l, names))
        index = {leaf: i for i, leaf in enumerate(leaves)}
        violations = side_effects(leaves, shapes, sinks)
        if not violations:
            break
        for cand, ls in list(active.items()):
            mask = 0
            for leaf in ls:
                mask |= 1 << index[leaf]
            hit = [v for v in violations if v.sources & mask]
            if hit:
                first = min(hit, key=lambda v: (v.blocked.source, v.blocked.reason)).blocked
                blocked[cand] = first.at_stage("side-effect")
                del active[cand]
                logger.debug("%s blocked: %s", cand.name, first.reason)
    return active, blocked


def _junction_roots(
    blocked, shapes: ShapeTable, savings: Savings | None, exclude: frozenset[ir.Value] = frozenset()
) -> frozenset[ir.Value]:
    """Stream sums (Add/Sub/Sum of two computed tensors) that the blocked LNs' inputs come from
    through carry ops, each where the LNs it would newly unlock pay for its centering (any one of
    them, where every fold is asked for: `savings` None), most shared first.

    Centering such a sum explicitly can unlock LNs that no weight edit reaches: in a Wav2Vec2
    encoder the stream starts as `projection + GELU(grouped conv(projection))`; the GELU output
    cannot be centered, and centering the projection changes the grouped conv's input, but the
    sum itself can be centered once for every LN downstream. One LN can be reason enough: ELECTRA's
    and DETR's first sum reads a projection the Q/K/V MatMuls read too (centering its weights
    would change them), DeBERTa's a masked LN output; where ORT runs that LN fused with its
    residual Add, the one centering costs less than SkipLayerNormalization's kernel.
    """
    memo: dict[tuple[ir.Value, int], frozenset[tuple[ir.Value, int]]] = {}
    reached: dict[ir.Value, set[LnCandidate]] = {}
    axes: dict[ir.Value, int] = {}
    for cand in blocked:
        if cand.axis is not None and cand.x is not None:
            for value, axis in _sums_above(cand.x, cand.axis, shapes, memo):
                reached.setdefault(value, set()).add(cand)
                axes.setdefault(value, axis)
    roots: set[ir.Value] = set()
    covered: set[LnCandidate] = set()
    for value, cands in sorted(reached.items(), key=lambda item: (-len(item[1]), item[0].name or "")):
        new = cands - covered
        kind = centering_kind(*written_site(value, axes[value], shapes), shapes)
        if value not in exclude and new and _centering_pays(new, savings, kind):
            roots.add(value)
            covered |= cands
    return frozenset(roots)


def _sums_above(start: ir.Value, axis: int, shapes: ShapeTable, memo) -> frozenset[tuple[ir.Value, int]]:
    """The stream sums `start` comes from through carry ops (itself included), each with the axis
    the LN's axis is there, memoized per (tensor, axis); iterative, because streams are deep."""
    stack = [((start, axis), False)]
    while stack:
        key, expanded = stack.pop()
        if key in memo:
            continue
        value, ax = key
        node = value.producer()
        if node is None or node.op_type in NORMALIZATION_TYPES:
            memo[key] = frozenset()
            continue
        reqs = carry.backward(node, value.index(), ax, shapes)
        if isinstance(reqs, Blocked):
            memo[key] = frozenset()
            continue
        inputs = [(node.inputs[r.index], r.axis) for r in reqs if r.axis is not None and r.index < len(node.inputs)]
        computed = [
            (v, a) for v, a in inputs if v is not None and constant_of(v) is None and not v.is_graph_input() and not is_zero(v, exact=False)
        ]
        if not expanded:
            stack.append((key, True))
            stack.extend((child, False) for child in computed if child not in memo)
            continue
        found = set().union(*(memo[child] for child in computed)) if computed else set()
        if node.op_type in ("Add", "Sub", "Sum") and len(computed) >= 2:
            found.add(key)
        memo[key] = frozenset(found)
    return memo[(start, axis)]


def _mixed_precision_roots(unlocked, shapes: ShapeTable) -> set[ir.Value]:
    """fp16/bf16 roots that unlock an LN of another precision. A mean computed and subtracted in
    10 or 7 mantissa bits leaves a residual mean at that type's rounding: noise for an LN of the
    same type (fp16 models centered explicitly drift from their fp32 original no more than
    unfolded ones: README "Deployment pipelines"), far above the noise of an fp32 LN reached
    through a widening Cast (found by the fuzz test)."""
    return {
        root
        for root, cands in unlocked.items()
        if shapes.dtype(root) in NARROW_FLOAT_TYPES and any(shapes.dtype(cand.x) != shapes.dtype(root) for cand in cands)
    }


# Rounds of stream-sum centering tried for LNs that stay blocked (each round tries new sums only).
_JUNCTION_ROUNDS = 8


def with_auxiliary_centering(candidates, shapes, sinks, names, savings: Savings | None, denied: frozenset = frozenset()):
    """Fold with explicit centering roots allowed (but at `denied`, nor where one would be written
    at a tensor of `denied`: `analysis.edits.written_site`), denying the roots whose LNs save less than they
    cost; then, where LNs stay blocked, try centering the stream sums they share (`_junction_roots`)."""
    active, blocked = _aux_fold(candidates, shapes, sinks, names, frozenset(), savings, denied)
    # Rounds until no new sum helps: a sum shared by many blocked LNs can unlock only some of
    # them (the rest need a sum further down), and a fold must not leave for a second run what
    # a further round would find (folding a folded model changes nothing).
    junctions: frozenset[ir.Value] = frozenset()
    tried: frozenset[ir.Value] = frozenset()
    for _ in range(_JUNCTION_ROUNDS):
        new = _junction_roots(blocked, shapes, savings, exclude=tried | denied)
        if not new:
            break
        tried |= new
        with_junctions = _aux_fold(candidates, shapes, sinks, names, junctions | new, savings, denied)
        if set(active) <= set(with_junctions[0]) and len(with_junctions[0]) > len(active):
            (active, blocked), junctions = with_junctions, junctions | new
    return active, blocked


def _aux_fold(candidates, shapes, sinks, names, junctions: frozenset[ir.Value], savings: Savings | None, never=frozenset()):
    denied: set[ir.Value] = set(never)
    while True:
        active, blocked = fold_set(candidates, shapes, sinks, names, denied, junctions)
        unlocked: dict[ir.Value, set[LnCandidate]] = {}
        sites: dict[ir.Value, tuple[ir.Value, int]] = {}  # where each root's centering is written
        for cand, leaves in active.items():
            for leaf in sorted(leaves, key=lambda l: leaf_order(l, names)):
                if leaf.aux:
                    unlocked.setdefault(leaf.value, set()).add(cand)
                    if leaf.value not in sites:
                        sites[leaf.value] = written_site(leaf.value, leaf.axis, shapes)  # type: ignore[arg-type]
        kinds = {root: centering_kind(*site, shapes) for root, site in sites.items()}
        poor = _unpaid_roots(unlocked, kinds, savings)
        poor |= {root for root, (site, _) in sites.items() if site in never}  # written into a tensor it may not be
        poor |= {root for root in junctions if root not in unlocked}  # blocked otherwise: prove it instead
        poor |= _mixed_precision_roots(unlocked, shapes)
        if not poor:
            return active, blocked
        denied |= poor - junctions
        junctions = junctions - poor
