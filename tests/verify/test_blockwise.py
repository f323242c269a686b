"""Models run block by block (verify.oracle.cut, verify.oracle.blockwise): the cut is sound, and a check run that
way takes the same verdict on the same figures as one ONNX Runtime session, refuses what it
refuses, and writes no copy of the model.

The threshold is forced low (every model runs block by block, in blocks of about 50 kB of weights)
on the committed models, whose weights are a few hundred kB."""

from __future__ import annotations

import logging

import onnx
import pytest

import onnx_lnfold
from onnx_lnfold._cli import main
from onnx_lnfold.io import scratch
from onnx_lnfold.verify import passes, side_by_side
from onnx_lnfold.verify.check import check_equivalence
from onnx_lnfold.verify.judges import float64
from onnx_lnfold.verify.oracle import blockwise
from onnx_lnfold.verify.oracle.cut import cut, node_reads
from onnx_lnfold.verify.oracle.reference import exact_tensors
from onnx_lnfold.verify.readback import ReadBack
from onnx_lnfold.verify.request import VerifyRequest
from onnx_lnfold.verify.verdict import FLOAT64, SENSITIVITY

from conftest import MODELS
from helpers import fold_with_a_wrong_epsilon

BLOCK_BYTES = 50_000


def _force(monkeypatch) -> list[tuple[str, int]]:
    """From now on every model runs block by block, in small blocks; returns the list of the block
    runs made (label, number of blocks)."""
    made = []
    monkeypatch.setattr(blockwise, "blockwise_above", lambda: 0)
    monkeypatch.setattr(blockwise, "block_bytes", lambda: BLOCK_BYTES)
    init = blockwise.BlockwiseSession.__init__

    def counting(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append((self.label, len(self.cut.blocks)))

    monkeypatch.setattr(blockwise.BlockwiseSession, "__init__", counting)
    return made


@pytest.fixture
def forced(monkeypatch):
    return _force(monkeypatch)


@pytest.mark.parametrize("name", ["gpt2.onnx", "bert.onnx", "bloom.onnx"])
def test_the_cut_covers_the_graph_in_an_order_that_runs(name):
    graph = onnx.load(MODELS / name).graph
    found = cut(graph, BLOCK_BYTES)
    assert sorted(found.order) == list(range(len(graph.node)))
    assert len(found.blocks) > 2
    assert [b.start for b in found.blocks[1:]] == [b.stop for b in found.blocks[:-1]]
    assert found.blocks[0].start == 0 and found.blocks[-1].stop == len(graph.node)
    weights = {t.name for t in graph.initializer}
    available = {i.name for i in graph.input if i.name not in weights}
    for block in found.blocks:
        assert set(block.inputs) <= available  # made before the block, or fed
        made = set()
        for position in range(block.start, block.stop):
            node = graph.node[found.order[position]]
            for read in node_reads(node):
                assert read in available or read in made or read in block.weights
            made.update(node.output)
        # The tensors kept across the cut are what later blocks and the graph's outputs read.
        later = {n for b in found.blocks if b.start >= block.stop for n in b.inputs} | {o.name for o in graph.output}
        assert set(block.outputs) == made & later
        available |= set(block.outputs)


def test_the_cuts_fall_where_few_tensors_are_live():
    """On GPT-2 each cut carries the residual stream and what every layer reads (the mask and
    positions), not a layer's inner tensors."""
    found = cut(onnx.load(MODELS / "gpt2.onnx").graph, BLOCK_BYTES)
    crossing = [len(b.inputs) for b in found.blocks[1:]]
    assert max(crossing) <= 10 and min(crossing) <= 3, crossing


def _figures(verification):
    return [
        (o.name, o.rel_diff, o.max_abs_diff, o.sensitivity, o.written, o.exact, o.original_error, o.fold_error)
        for o in verification.outputs
    ]


@pytest.mark.parametrize("budget", [None, 0])
@pytest.mark.parametrize("name", ["gpt2.onnx", "bert.onnx"])
def test_a_check_run_block_by_block_takes_the_same_verdict_on_the_same_figures(name, budget, monkeypatch):
    # Block by block the twins run on the first input set (verify.side_by_side): so here too.
    monkeypatch.setattr(float64, "within", lambda compared, *args: compared[:1])
    whole = onnx_lnfold.fold(MODELS / name, float64_budget=budget).report.verification
    forced = _force(monkeypatch)
    blocks = onnx_lnfold.fold(MODELS / name, float64_budget=budget).report.verification
    assert forced and all(count > 2 for _, count in forced)
    if budget == 0:  # the sensitivity: the perturbed original, block by block
        assert any(label.endswith("its weights perturbed") for label, _ in forced)
    assert blocks.status == whole.status == "passed"
    assert blocks.judgment == whole.judgment == (SENSITIVITY if budget == 0 else FLOAT64)
    assert _figures(blocks) == _figures(whole)


@pytest.mark.parametrize("budget", [None, 0])
def test_a_wrong_fold_is_refused_block_by_block(monkeypatch, forced, budget):
    fold_with_a_wrong_epsilon(monkeypatch)
    with pytest.raises(onnx_lnfold.VerificationFailed) as info:
        onnx_lnfold.fold(MODELS / "gpt2.onnx", float64_budget=budget)
    assert "the folded model is not what the plan wrote" in str(info.value)  # the read-back, first
    # The judge on its own, block by block: with the read-back out of the way it refuses the fold too.
    monkeypatch.setattr(passes, "read_back", lambda *args: ReadBack())
    monkeypatch.setattr(side_by_side, "read_back_steps", _no_read_back)  # where it runs beside the others
    with pytest.raises(onnx_lnfold.VerificationFailed) as info:
        onnx_lnfold.fold(MODELS / "gpt2.onnx", float64_budget=budget)
    verification = info.value.report.verification
    assert forced and verification.status == "failed"
    assert verification.judgment == (SENSITIVITY if budget == 0 else FLOAT64)
    assert "output 'logits' differs" in str(info.value)


def _no_read_back(*args):
    return ReadBack()
    yield


def test_the_check_of_a_model_with_external_data_writes_no_copy(tmp_path, monkeypatch, forced):
    """Block by block, the fold's own output is all the check reads: no scratch copy of either model
    (the staged output aside), not for the sensitivity either."""
    source = tmp_path / "in" / "gpt2.onnx"
    source.parent.mkdir()
    proto = onnx.load(MODELS / "gpt2.onnx")
    onnx.save(proto, source, save_as_external_data=True, location="gpt2.onnx.data", size_threshold=0)
    made = scratch.make

    def staging_only(kind, *args, **kwargs):
        assert kind == "staging", f"a '{kind}' scratch copy was made"
        return made(kind, *args, **kwargs)

    monkeypatch.setattr(scratch, "make", staging_only)
    destination = tmp_path / "out" / "folded.onnx"
    destination.parent.mkdir()
    for budget in ([], ["--float64-budget", "0"]):
        assert main([str(source), "-o", str(destination), *budget]) == 0
        assert sorted(p.name for p in destination.parent.iterdir()) == ["folded.onnx", "folded.onnx.data"]
    assert {label for label, _ in forced} >= {"gpt2.onnx", "gpt2.onnx, its weights perturbed"}
    assert sorted(p.name for p in source.parent.iterdir()) == ["gpt2.onnx", "gpt2.onnx.data"]


def _recorded(label, steps, log):
    """`steps` with each share it yields logged as (label, share)."""
    try:
        while True:
            share = next(steps)
            log.append((label, share))
            yield share
    except StopIteration as stop:
        return stop.value


def _recording(monkeypatch) -> list[tuple[str, float]]:
    log: list[tuple[str, float]] = []
    together = side_by_side.run_together

    def recording(passes, *args):
        for p in passes:
            p.steps = _recorded(p.label, p.steps, log)
        together(passes, *args)

    monkeypatch.setattr(side_by_side, "run_together", recording)
    return log


def test_the_passes_over_a_model_run_side_by_side(monkeypatch, forced):
    """Block by block, both models in ONNX Runtime and their float64 twins step through the weights
    together (verify.oracle.paced): each pass reads a block while the others are within a block of
    it, and the judge takes the twins those passes gave (it runs none of its own)."""
    log = _recording(monkeypatch)
    monkeypatch.setattr(passes.EachAlone, "twins", lambda *args: pytest.fail("the twins ran again"))
    monkeypatch.setattr(side_by_side, "PASS_WORKERS", 1)  # one step at a time: the order is the pacing's
    verification = onnx_lnfold.fold(MODELS / "gpt2.onnx").report.verification
    assert verification.status == "passed" and verification.judgment == FLOAT64
    labels = [
        "the original in onnxruntime",
        "the fold in onnxruntime",
        "the original in float64",
        "the fold in float64",
        "the read-back",
    ]
    assert sorted({label for label, _ in log}) == sorted(labels)
    # The widest step of any pass: how far apart they may be when one steps.
    shares: dict[str, float] = dict.fromkeys(labels, 0.0)
    widest = 0.0
    for label, share in log:
        widest = max(widest, share - shares[label])
        shares[label] = share
    shares = dict.fromkeys(labels, 0.0)
    for label, share in log:
        behind = min((s for s in shares.values() if s < 1.0), default=1.0)  # those at 1.0 are done
        assert shares[label] <= behind + 1e-12  # the one furthest behind steps
        shares[label] = share
    assert all(abs(s - 1.0) < 1e-9 for s in shares.values())
    last_ort = max(i for i, (label, _) in enumerate(log) if label == "the original in onnxruntime")
    first_twin = min(i for i, (label, _) in enumerate(log) if label == "the original in float64")
    assert first_twin < last_ort and widest < 0.5


def test_side_by_side_the_twins_judge_the_first_set_and_keep_their_deadline(monkeypatch, forced):
    """Beside ONNX Runtime's passes the twins run on the first input set (the others compared in ONNX
    Runtime, the note says why), and the original's twin is paced by its own time: over its
    allowance it stops and the fold is judged without float64, the reason given."""
    monkeypatch.setattr(passes.EachAlone, "twins", lambda *args: pytest.fail("the twins ran again"))
    verification = onnx_lnfold.fold(MODELS / "gpt2.onnx").report.verification
    assert verification.status == "passed" and verification.judgment == FLOAT64
    assert any(
        note.startswith("judged in float64 on the first 1 of 3 input sets") and "block by block" in note
        for note in verification.notes
    ), verification.notes
    monkeypatch.setattr(side_by_side, "first_allowance", lambda *args: 1e-6)
    verification = onnx_lnfold.fold(MODELS / "gpt2.onnx").report.verification
    assert verification.status == "passed" and verification.judgment == SENSITIVITY
    assert "over its allowance" in verification.judgment_reason


@pytest.mark.parametrize("budget", [None, 0])
def test_each_pass_says_where_it_is_to_the_progress_it_is_given_and_to_the_log(tmp_path, forced, budget, caplog):
    """Block by block, the passes (side by side by default, each alone with a float64 budget of 0 s,
    the perturbed original's among them) say which block or share of the weights they are on to
    the request's `progress`, and to the log."""
    result = onnx_lnfold.fold(MODELS / "gpt2.onnx", verify=False)
    computed = exact_tensors(result.model)  # before it is written: writing rounds them
    result.save(tmp_path / "folded.onnx")
    said: list[str] = []
    request = VerifyRequest(float64_budget=budget, computed=computed, progress=said.append)
    with caplog.at_level(logging.INFO, logger="onnx_lnfold.verify.oracle"):
        verification = check_equivalence(MODELS / "gpt2.onnx", tmp_path / "folded.onnx", result.model, request)
    assert verification.status == "passed"
    expected = [
        "Verifying in onnxruntime: gpt2.onnx, block 1 of ",
        "Verifying in onnxruntime: folded.onnx, block 1 of ",
    ]
    if budget is None:
        expected += [
            "Verifying in float64: the original, 100% ",
            "Verifying in float64: the fold, as written and exact, 100% ",
        ]
    else:
        expected += ["Verifying in onnxruntime: gpt2.onnx, its weights perturbed, block 1 of "]
    for start in expected:
        assert any(line.startswith(start) for line in said), (start, said)
    assert sorted(said) == sorted(r.getMessage() for r in caplog.records if r.getMessage().startswith("Verifying in "))
