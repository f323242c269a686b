"""The analysis: which LayerNorms can become RMSNorm, and what to center. Mutates nothing.

Following docs/DESIGN.md sections 2, 3 and 10, in five steps, one module each:

1. **Recognize** (`forms.recognize`): every LN, in any form, as an `LnCandidate`.
2. **Trace** (`analysis.zero_mean`, backward, per LN): prove the LN input zero-mean along its axis by
   walking up through carry ops to the uses of constants to center.
3. **Side effects** (`analysis.side_effects`, forward, global) and the **fold set** (`analysis.fold_set`): every
   tensor the edits change must reach only LNs over that axis; a violation blocks every LN whose
   edits reach it, until none remains; explicit centerings are kept only where they pay.
4. **Edits** (`analysis.edits`): the constants to center (in place or untied) and the centerings to insert.
5. **Fusion cost** (`ort_fusions.fusion_cost`): ONNX Runtime's own optimizers, on weightless copies of the graph
   and of the plan applied to it, decide which LNs to keep because folding them would cost a
   fusion; the plan is made again without them until it loses none (`FusionCheck.settle`, which
   plans through a `Planner`).

The result is a `BoundPlan`: the `CenteringPlan` (plain data) with the IR objects that
`apply_plan` changes to carry it out.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from dataclasses import dataclass

import onnx_ir as ir

from onnx_lnfold.analysis.bound import BoundCentering, BoundFold, BoundPlan
from onnx_lnfold.analysis.edits import plan_edits, written_site
from onnx_lnfold.analysis.fold_set import centering_sets, fold_set, leaf_order, with_auxiliary_centering
from onnx_lnfold.analysis.plan import FOLDED, KEPT, CenteringPlan, LnDecision
from onnx_lnfold.analysis.sinks import Sinks
from onnx_lnfold.core.blocked import Blocked
from onnx_lnfold.core.ir import weight_bytes
from onnx_lnfold.core.names import display_names, taken_names
from onnx_lnfold.core.options import FoldOptions, check_preconditions
from onnx_lnfold.core.quantized import inside_units
from onnx_lnfold.decide.costs import NARROWEST, OrtLayout, Saving, table_for
from onnx_lnfold.decide.pricing import centering_kind
from onnx_lnfold.decide.set_price import price_set
from onnx_lnfold.decide.targets import (
    CenteringSite,
    Rewrite,
    beta_add_note,
    centering_refusal,
    choose_rewrite,
    cost_nodes,
    cost_refusal,
    ln_width,
    once_centered,
    target_refusal,
)
from onnx_lnfold.forms import LnCandidate
from onnx_lnfold.forms.recognize import find_in_functions, find_layer_norms
from onnx_lnfold.shapes.table import ShapeTable

logger = logging.getLogger(__name__)

__all__ = ["Planner", "candidates", "plan_for"]


@dataclass(frozen=True)
class AnalysisContext:
    """What every step of one plan reads, fixed for that plan: the options, the shapes, the LNs as
    sinks of the side-effect rule, the display names, what each LN's fold saves (`_priced`), and
    the tensors no explicit centering may be written at: the outputs of the LNs kept for an ONNX
    Runtime fusion (the fusion would be lost all the same) and those inside a quantized unit."""

    options: FoldOptions
    shapes: ShapeTable
    sinks: Sinks
    names: dict[ir.Node, str]
    savings: dict[LnCandidate, Saving]
    untouchable: frozenset[ir.Value]


def candidates(model: ir.Model, shapes: ShapeTable, names: dict[ir.Node, str] | None = None) -> list[LnCandidate]:
    names = display_names(model.graph) if names is None else names
    return find_layer_norms(model.graph, shapes, names) + find_in_functions(model, names)


@dataclass
class Planner:
    """One model's plans, made as often as the fusion check asks (`FusionCheck.settle`): its LNs,
    found once (`start`), planned with the LNs kept for a fusion (`plan`), priced as ONNX Runtime
    runs them (`run_as`, `reprice_moved`: on `shapes`); and the plans of another model alike
    (`alike`)."""

    model: ir.Model
    options: FoldOptions
    shapes: ShapeTable
    lns: list[LnCandidate]
    names: dict[ir.Node, str]  # `display_names` of the model, which no plan changes

    @classmethod
    def start(cls, model: ir.Model, options: FoldOptions, shapes: ShapeTable) -> Planner:
        """The planner of `model`, its LNs found; raises `InvalidInput` where it has LNs and is not
        at the opset the target needs (`check_preconditions`)."""
        names = display_names(model.graph)
        lns = candidates(model, shapes, names)
        if lns:
            check_preconditions(model, options)
        return cls(model, options, shapes, lns, names)

    def plan(self, kept: dict[str, Blocked]) -> BoundPlan:
        """`plan_for` the model, the LNs of `kept` kept for the reason given."""
        return plan_for(self.model, self.options, self.shapes, self.lns, kept, self.names)

    def run_as(self, layouts: dict[str, OrtLayout]) -> None:
        """Price the decomposed LNs of `layouts` as ONNX Runtime runs them, where not as written."""
        self.shapes.ort_layouts.update(layouts)

    def reprice_moved(self, bound: BoundPlan, moved: set[str]) -> set[str]:
        """The explicit centerings of `bound` that ONNX Runtime runs off their written axis
        (`moved`, by tensor) and that were priced as a centering over the last axis: priced strided,
        as they run, from now on. Returns them (none: the plan's prices stand)."""
        mispriced = {
            b.centering.tensor
            for b in bound.centerings
            if b.centering.tensor in moved and centering_kind(b.value, b.centering.axis, self.shapes) == "Centering"
        }
        self.shapes.moved_centerings |= mispriced
        return mispriced

    def alike(self, other: ir.Model) -> Planner:
        """The planner of `other` (the transformers optimizer's output of this model), with these
        options and the input shapes given here of the inputs it has; its own shapes, priced as
        written."""
        names = {value.name for value in other.graph.inputs}
        given = {name: shape for name, shape in self.shapes.given.items() if name in names}
        return Planner.start(other, self.options, ShapeTable(other, given=given))


def plan_for(
    model: ir.Model,
    options: FoldOptions,
    shapes: ShapeTable,
    candidates: list[LnCandidate],
    kept: dict[str, Blocked],
    names: dict[ir.Node, str] | None = None,
) -> BoundPlan:
    """The plan with the LNs of `kept` (by name) kept for the reason given: what each fold would
    cost (`_priced`), which LNs fold together and through which explicit centerings
    (`_folding`), the constants to center (`analysis.edits`), and every LN's decision (`_folded`,
    `_kept`). `names`: the model's `display_names`, where the caller has them."""
    names = display_names(model.graph) if names is None else names
    sinks = Sinks(candidates)  # every LN removes shifts of its input, folded or kept
    # The LNs the target cannot write (stage "form": whatever their upstream, and whatever it costs).
    unfit = {c.name: r.at_stage("form") for c in candidates if not c.form_problem and (r := target_refusal(c, options, shapes))}
    savings, dearer = _priced(candidates, {**kept, **unfit}, options, shapes)
    foldable = [cand for cand in candidates if cand.name not in kept and cand.name not in unfit and cand not in dearer]
    # No centering reads an LN output kept for a fusion (the fusion would be lost all the same), nor
    # is written inside a quantized unit (`core.quantized`).
    untouchable = frozenset(cand.out for cand in candidates if cand.name in kept) | frozenset(inside_units(model.graph))
    context = AnalysisContext(options, shapes, sinks, names, savings, untouchable)
    active, blocked = _folding(context, foldable, options)
    edits, centerings = _edits(model, active, options, names, shapes)
    blocked.update(_kept_for_cost(context, candidates, {**kept, **unfit}, dearer, active, blocked))
    claimed: set[ir.Node] = set()  # residual Adds already taken in by a fold
    decisions = []
    folds = []
    plain_edits, plain_centerings = [b.edit for b in edits], [b.centering for b in centerings]
    for cand in candidates:
        if cand in active:
            decision, rewrite = _folded(context, cand, plain_edits, plain_centerings, claimed)
            folds.append(BoundFold(decision, rewrite))
        else:
            decision = _kept(cand, blocked.get(cand) or unfit.get(cand.name) or kept[cand.name].at_stage("cost"))
        if cand in savings:
            pricing = savings[cand].pricing
            decision.priced_at, decision.priced_tokens, decision.priced_by_default = (
                pricing.words, pricing.tokens, pricing.by_default
            )
        decisions.append(decision)
    priced = _price_sets(folds, centerings, shapes)
    table = table_for(options)
    costs = f"{table.source} ({table.provider_words}, {table.unit_words})"
    plan = CenteringPlan(
        decisions=decisions,
        edits=plain_edits,
        centerings=plain_centerings,
        target=options.target,
        costs=costs,
        priced_ops=priced,
    )
    return BoundPlan(plan, edits, centerings, folds)


def _price_sets(folds: list[BoundFold], centerings: list[BoundCentering], shapes: ShapeTable) -> dict[str, dict[str, int]]:
    """Price the folds that need explicit centerings in the sets they share them in
    (`decide.set_price`): each of their decisions' cost note names the set's every node, centerings
    included. Returns what the whole plan counts, as ONNX Runtime op types: {"original": ...,
    "emitted": ...}."""
    if not folds:
        return {"original": {}, "emitted": {}}
    by_name = {fold.decision.node: fold for fold in folds}
    needs: dict[str, set[int]] = {fold.decision.node: set() for fold in folds}  # by index in `centerings`
    for i, bound in enumerate(centerings):
        for ln in bound.centering.required_by:
            needs[ln].add(i)
    # The folds that need no centering, priced together (their notes are their own: `_folded`).
    alone = [fold.rewrite for fold in folds if not needs[fold.decision.node]]
    original, emitted = price_set(alone, [], shapes).ops() if alone else (Counter(), Counter())
    for lns, roots in centering_sets(needs):
        members = [by_name[ln] for ln in lns]
        width = ln_width(members[0].rewrite.cand, shapes) or NARROWEST
        priced = [
            (centering_kind(*written_site(b.value, b.centering.axis, shapes), shapes), width)
            for b in (centerings[i] for i in sorted(roots))
        ]
        price = price_set([m.rewrite for m in members], priced, shapes)
        for member in members:
            member.decision.cost_note = price.note()
        was, now = price.ops()
        original, emitted = original + was, emitted + now
    return {"original": dict(sorted(original.items())), "emitted": dict(sorted(emitted.items()))}


def _priced(
    candidates: list[LnCandidate], kept: dict[str, Blocked], options: FoldOptions, shapes: ShapeTable
) -> tuple[dict[LnCandidate, Saving], dict[LnCandidate, Blocked]]:
    """What each LN's fold saves (and its width), and the LNs whose fold would cost ONNX Runtime
    more than the LN by the measured kernel costs (beta left as an Add over the stream, say),
    with the refusal, unless asked to fold them all the same. LNs kept for a fusion (`kept`) are
    neither. The fold is judged as `auto` emits it: fusing residual Adds beyond that ("always")
    is asked for the providers whose fused kernel pays, not the CPU."""
    judged = dataclasses.replace(options, fuse_residual="auto") if options.fuse_residual == "always" else options
    savings = {}
    dearer: dict[LnCandidate, Blocked] = {}
    for cand in candidates:
        if cand.name in kept or cand.form_problem:
            continue
        would_be = choose_rewrite(cand, judged, shapes, set())
        original, emitted = cost_nodes(would_be, shapes)
        savings[cand] = would_be.pricing.saving(emitted, original, original[0][1])
        refusal = cost_refusal(would_be, shapes)
        if refusal is not None and not options.fold_costly:
            dearer[cand] = refusal
    return savings, dearer


def _folding(context: AnalysisContext, foldable: list[LnCandidate], options: FoldOptions):
    """The LNs of `foldable` that fold together (each with its leaves) and why the others do not:
    by edits of constants alone, or with the explicit centerings that pay (never of an LN output
    kept for a fusion). `options`: the context's, or those of the fold that folds whatever it costs."""
    shapes, sinks, names = context.shapes, context.sinks, context.names
    active, blocked = fold_set(foldable, shapes, sinks, names, None)
    if options.auxiliary_centering and blocked:
        paid = None if options.fold_costly else context.savings  # asked to fold whatever it costs
        aux_active, aux_blocked = with_auxiliary_centering(foldable, shapes, sinks, names, paid, context.untouchable)
        # Explicit centering must only ever add folds; the first pass's reasons name the real
        # obstacle for the LNs that stay.
        if set(active) <= set(aux_active) and len(aux_active) > len(active):
            active, blocked = aux_active, {cand: blocked[cand] for cand in aux_blocked}
    return active, blocked


def _edits(model: ir.Model, active, options: FoldOptions, names, shapes: ShapeTable):
    """The constants to center and the centerings to insert for the LNs that fold. Leaves in a
    fixed order: fresh names (`W.centered`, `W.centered_2`) are handed out in it, and a set of
    leaves iterates in an order that changes from run to run."""
    return plan_edits(
        [(leaf, cand.name) for cand, ls in active.items() for leaf in sorted(ls, key=lambda l: leaf_order(l, names))],
        names,
        taken_names(model.graph),
        options.tied_weights if options.auxiliary_centering else "untie",  # no centering nodes at all, as asked
        weight_bytes(model),
        shapes,
    )


def _kept_for_cost(context: AnalysisContext, candidates, kept, dearer, active, blocked):
    """The reasons of the LNs kept for a cost: by the yardstick of the fold that folds whatever it
    costs (`fold_costly`), every LN that fold folds and this one keeps stays for a cost, and says
    which: its own (`decide.targets.cost_refusal`: beta left as an Add, say), or the explicit
    centering its fold needs, which costs more than the LNs it would unlock save together
    (`centering_refusal`, with the figures). The others are reported for what blocks them: an LN
    kept for its cost that no fold can take at all, for the first obstacle its proof meets."""
    if context.options.fold_costly:
        return {}
    if not dearer and not blocked:
        return {}  # no LN kept for its cost, none blocked that a centering could be refused to: nothing to say
    shapes, names, savings = context.shapes, context.names, context.savings
    costly = dataclasses.replace(context.options, fold_costly=True)
    anyway = [cand for cand in candidates if cand.name not in kept]
    possible, _ = _folding(context, anyway, costly)
    _, first = fold_set(list(dearer), shapes, context.sinks, names, None)  # without centerings: the first obstacle
    why: dict[LnCandidate, Blocked] = {}
    for cand, refusal in dearer.items():
        why[cand] = refusal.at_stage("cost") if cand in possible else first[cand]
    # Each LN the centerings it needs, in a fixed order (leaves are a set, whose order changes
    # from run to run); priced in the sets that share them, less what the plan already centers.
    axes: dict[ir.Value, int] = {}
    needs: dict[LnCandidate, list[ir.Value]] = {}
    for cand, leaves in possible.items():
        for leaf in sorted(leaves, key=lambda l: leaf_order(l, names)):
            if leaf.aux:
                axes.setdefault(leaf.value, leaf.axis)  # type: ignore[arg-type]
                needs.setdefault(cand, []).append(leaf.value)
    planned = {leaf.value for cand in active for leaf in active[cand] if leaf.aux}
    for lns, roots in centering_sets({c: set(r) for c, r in needs.items()}):
        held = [c for c in lns if c not in active and c not in dearer and c in blocked and c not in why]
        if not held:
            continue
        added = [r for r in dict.fromkeys(r for c in lns for r in needs[c]) if r not in planned]
        unlocked = [c for c in lns if c not in active]
        saved = [savings[c] for c in unlocked if c in savings and c not in dearer]  # held LNs are among them
        sites = [CenteringSite(site.name or "", site_axis, centering_kind(site, site_axis, shapes)) for site, site_axis in (written_site(r, axes[r], shapes) for r in added)]
        for cand in held:
            constants = sum(not leaf.aux for leaf in possible[cand])
            own = [site for r, site in zip(added, sites) if r in needs[cand]]
            why[cand] = centering_refusal(own, sites, len(unlocked), saved, constants).at_stage("cost")
    return why


def _folded(context: AnalysisContext, cand: LnCandidate, edits, centerings, claimed) -> tuple[LnDecision, Rewrite]:
    n = sum(1 for e in edits if cand.name in e.required_by)
    aux = [c.tensor for c in centerings if cand.name in c.required_by]
    centered = f"{', '.join(repr(t) for t in aux)} {'is' if len(aux) == 1 else 'are'} centered explicitly" if aux else ""
    reason = f"input is zero-mean {once_centered(n, centered)}"
    shapes, names = context.shapes, context.names
    everywhere = frozenset(c.tensor for c in centerings)
    rewrite = choose_rewrite(cand, context.options, shapes, claimed, everywhere, frozenset(aux))
    decision = LnDecision(
        node=cand.name,
        op_type=str(cand.kind),
        status=FOLDED,
        proof=reason,
        axis=cand.axis,
        epsilon=cand.epsilon,
        rewrite=rewrite.op,
        beta=rewrite.beta.how,  # type: ignore[arg-type]
        beta_sites=tuple(site.describe(names) for site in rewrite.beta.sites),
        residual_add=names[rewrite.residual_add] if rewrite.residual_add else None,
        cost_note=beta_add_note(rewrite, shapes) if rewrite.beta.how == "add" else None,
    )
    return decision, rewrite


def _kept(cand: LnCandidate, blocked: Blocked) -> LnDecision:
    return LnDecision(
        node=cand.name, op_type=str(cand.kind), status=KEPT, axis=cand.axis, epsilon=cand.epsilon, blocked=blocked
    )
