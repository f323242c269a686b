"""What folds cost together as ONNX Runtime runs them (docs/DESIGN.md section 2.3): the LNs that fold
through explicit centerings they share are priced as one set, every node their folds write and each
centering once, against the nodes they replace. Its words name every node counted; its node counts,
as ONNX Runtime op types (`decide.costs.KIND_OPS`), are what its optimized graphs of the original and
the fold differ by (tests/decide/test_set_price.py)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from onnx_lnfold.decide.costs import KIND_OPS, Comparison
from onnx_lnfold.decide.targets import NODE_WORDS, Rewrite, described_nodes
from onnx_lnfold.shapes.table import ShapeTable

# A priced node: (kind of `decide.costs.KINDS`, width, the words a reason names it by).
Node = tuple[str, int, str]


@dataclass(frozen=True)
class SetPrice:
    """One set of folds priced together: the nodes they replace and the nodes they write (centerings
    included, each once), with both costs and their spread in the set's table's unit."""

    lns: int
    centerings: int
    original: tuple[Node, ...]
    emitted: tuple[Node, ...]
    comparison: Comparison
    figures: str  # "8.08M against 11.42M instructions per run at 8192 tokens (the default)"
    provider: str  # "ONNX Runtime's CPU EP"

    def ops(self) -> tuple[Counter, Counter]:
        """(original, emitted) as ONNX Runtime op types and their counts."""
        return _ops(self.original), _ops(self.emitted)

    def note(self) -> str:
        """Why the set folds, naming every node counted: it pays, or it was asked for."""
        what, before = counted(self.emitted), counted(self.original)
        one = self.lns == 1
        lns = "the LN" if one else f"{self.lns} LNs"
        if self.centerings:
            centerings = (
                "the explicit centering" if self.centerings == 1 else f"the {self.centerings} explicit centerings"
            )
            lns += f" and {centerings} {'it needs' if one else 'they need'}, priced together"
        if self.comparison.cheaper:
            return f"it pays: {lns}: {what} cost less than {before} on {self.provider}: {self.figures}"
        if self.comparison.dearer:
            return f"folded as asked (--fold-costly), though for {lns}, {what} cost more than {before}: {self.figures}"
        return f"folded as asked (--fold-costly), though for {lns}, its table cannot tell {what} from {before}: {self.figures}"


def price_set(rewrites: list[Rewrite], centerings: list[tuple[str, int]], shapes: ShapeTable) -> SetPrice:
    """The folds of `rewrites` and the explicit centerings they need ((kind, width) each: "Centering"
    or "StridedCentering", `decide.pricing.centering_kind`), priced together: each fold at its own
    LN's pricing, the centerings at the first's."""
    pricing = rewrites[0].pricing
    original: list[Node] = []
    emitted: list[Node] = []
    cost_original = cost_emitted = spread = 0.0
    for rewrite in rewrites:
        was, now = described_nodes(rewrite, shapes)
        original += was
        emitted += now
        for nodes, is_original in ((was, True), (now, False)):
            plain = [(kind, w) for kind, w, _ in nodes]
            total = rewrite.pricing.total(plain)
            cost_original += total if is_original else 0.0
            cost_emitted += 0.0 if is_original else total
            spread += rewrite.pricing.spread(plain)
    emitted += [(kind, w, NODE_WORDS[kind]) for kind, w in centerings]
    cost_emitted += pricing.total(centerings)
    spread += pricing.spread(centerings)
    table = pricing.table
    cmp = Comparison(cost_emitted, cost_original, spread)
    figures = f"{table.figure(cmp.emitted)} against {table.figure(cmp.original)} {table.unit_words} {pricing.words}"
    return SetPrice(len(rewrites), len(centerings), tuple(original), tuple(emitted), cmp, figures, table.provider_words)


def counted(nodes: tuple[Node, ...] | list[Node]) -> str:
    """`4 x the residual Add + 4 x SimplifiedLayerNormalization + an Add of beta`: each kind of node
    named once, with how many there are, in the order first met."""
    counts = Counter(word for _, _, word in nodes)
    return " + ".join(word if n == 1 else f"{n} x {word}" for word, n in counts.items())


def _ops(nodes: tuple[Node, ...]) -> Counter:
    ops: Counter = Counter()
    for kind, _, _ in nodes:
        ops.update(KIND_OPS[kind])
    return ops
