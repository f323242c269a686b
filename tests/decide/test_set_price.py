"""A fold is priced with every node it adds (docs/DESIGN.md section 2.3, `decide.set_price`): the LNs
that fold through explicit centerings are priced together with those centerings, each counted once;
the set folds only where the whole pays; the report names every node counted; and what the plan
counts is what ONNX Runtime's optimized graphs of the original and the fold differ by."""

from __future__ import annotations

from collections import Counter

import onnx
import onnxruntime as ort
import pytest

import onnx_lnfold

from conftest import MODELS
from graphs import Graph

D, TOKENS = 256, 128


def pieces_model(pieces: int) -> onnx.ModelProto:
    """One LN over `Concat(gate_1, ..., gate_k) + r` (k gates x * sigmoid(x) of projections, joined
    along the sequence; `r` a graph input): ONNX Runtime fuses the residual Add and the LN into
    SkipLayerNormalization, and the LN's input is zero-mean only once every gate's output and `r`
    are centered explicitly: k + 1 centerings, no stream sum to center once for them all."""
    g = Graph()
    parts = []
    for i in range(pieces):
        h = g.linear(g.input(f"x{i}", [1, TOKENS // pieces, D]), D, D, f"proj{i}")
        parts.append(g.node("Mul", [h, g.node("Sigmoid", [h])], name=f"gate{i}"))
    joined = g.node("Concat", parts, name="join", axis=1) if pieces > 1 else parts[0]
    total = g.node("Add", [joined, g.input("r", [1, TOKENS, D])], name="residual")
    g.output(g.linear(g.ln(total, D, "ln"), D, D, "head"))
    return g.model()


@pytest.mark.parametrize("pieces", [1, 2])
def test_an_ln_folds_where_the_centerings_it_needs_pay_together(pieces):
    plan = onnx_lnfold.analyze(pieces_model(pieces), keep_ort_fusions=False)
    (folded,) = plan.folded
    assert len(plan.centerings) == pieces + 1
    note = folded.cost_note
    assert (
        note.startswith("it pays: the LN and the")
        and f"{pieces + 1} x an explicit centering (ReduceMean + Sub)" in note
    )
    assert "SkipLayerNormalization" in note and f"at {TOKENS} tokens" in note


@pytest.mark.parametrize("pieces", [4, 8])
def test_an_ln_is_kept_where_its_centerings_cost_more_together_than_it_saves(pieces):
    """Each centering alone costs less than the LN's fold saves; all of them do not."""
    plan = onnx_lnfold.analyze(pieces_model(pieces), keep_ort_fusions=False)
    (kept,) = plan.kept
    assert not plan.folded and not plan.centerings
    assert kept.stage == "cost" and kept.code == "centering-costs-more"
    assert f"the {pieces + 1} centerings it needs cost" in kept.reason and "'r' - ReduceMean over axis 2" in kept.reason
    costly = onnx_lnfold.analyze(pieces_model(pieces), keep_ort_fusions=False, fold_costly=True)
    (forced,) = costly.folded
    assert len(costly.centerings) == pieces + 1
    assert forced.cost_note.startswith("folded as asked (--fold-costly), though for the LN and the")


def _optimized_ops(model: onnx.ModelProto, tmp_path, name: str) -> Counter:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.optimized_model_filepath = str(tmp_path / f"{name}.optimized.onnx")
    ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return Counter(node.op_type for node in onnx.load(options.optimized_model_filepath).graph.node)


CASES = [
    *[
        (name, costly)
        for name in ("bert", "gpt2", "bert_dynamic_int8", "bert_matmul_nbits_int4", "bert_int8_cast_mul")
        for costly in (False, True)
    ],
    ("gpt2_dynamic_int8", True),
]


@pytest.mark.parametrize(("name", "costly"), CASES)
def test_what_the_plan_counts_is_what_onnx_runtime_runs(name, costly, tmp_path):
    """The op types and counts the plan priced (`priced_ops`) are what ONNX Runtime's optimized
    graph of the fold has more or fewer than its optimized graph of the original, node for node:
    centerings, beta Adds, the residual Adds a SkipLayerNormalization had taken in, and the bias
    Add of a projection, counted only where no quantized matmul's fusion takes it in."""
    model = onnx.load(str(MODELS / f"{name}.onnx"))
    result = onnx_lnfold.fold(model, verify=False, fold_costly=costly)
    assert result.plan.folded
    before, after = _optimized_ops(model, tmp_path, "original"), _optimized_ops(result.model_proto, tmp_path, "folded")
    ran = Counter({op: after[op] - before[op] for op in before | after if after[op] != before[op]})
    priced = Counter(result.plan.priced_ops["emitted"])
    priced.subtract(result.plan.priced_ops["original"])
    assert +priced == +ran and -priced == -ran, (dict(ran), dict(priced))


def test_each_kept_ln_names_the_centerings_it_needs_and_the_set_it_is_priced_in():
    """adaln_torchscript: each block's gated residual branch (a Mul by a data-dependent gate) is
    centered explicitly; an LN further down the stream needs every branch above it, and the 4 LNs
    sharing those 4 centerings are priced together. Each LN's reason names only its own."""
    plan = onnx_lnfold.analyze(MODELS / "adaln_torchscript.onnx")
    kept = [d for d in plan.kept if d.code == "centering-costs-more"]
    assert len(kept) == 4
    named = [d.reason.split(" inserted")[0].count("ReduceMean over axis") for d in kept]
    assert named == [1, 2, 3, 4]
    assert all("the 4 centerings that the 4 LNs sharing them need cost" in d.reason for d in kept)
    assert len({d.blocked.detail for d in kept}) == 1  # one set: the report groups them under it
