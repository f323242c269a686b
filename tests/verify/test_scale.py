"""Verification at scale (issue 23 item 3): on a multi-GB external-data model the default
verification must refuse the wrong folds that tests/verify/test_float64.py refuses on small ones.

The mutation: ONE centered constant in ONE layer (the MLP output projection of a middle block of a
2.5 GB GPT-2-style pre-LN model, made by models/make/make_large_model.py) off by 1e-6 of its largest
entry, in the written and in the exact values alike; every other centered constant is right. The
command line, default options, must refuse it (exit 1, nothing written, nothing staged left in the
destination folder) and say what the verdict rests on. The control: the same model, unmutated,
folds and passes, and its summary line names what its verdict rests on as the report does.

Only a float64 judgment sees this fold's error as the fold's (3e-5 relative in ONNX Runtime: within
rtol 1e-4, which the fallback without float64 widens by ten times the original's float32
sensitivity): the default verification's float64 allowance grows with the fold's own time (3x it for
the first input set), so it is judged in float64 at this size, on 2 shared cores, every run; the
check also runs block by block here, forced (in 5 blocks), as a model larger than the memory does.

One model build (about 40 s, 2.5 GB in a temporary folder) for both; each fold takes about a
minute; the test process peaks at about 5 GB. Slow: run with --runslow.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from onnx_lnfold._cli import EXIT_OK, EXIT_VERIFY, main
from onnx_lnfold.apply import centering
from onnx_lnfold.verify.oracle import blockwise
from onnx_lnfold.verify.verdict import EXACT_RTOL, FLOAT64, RTOL_ONLY, SENSITIVITY

from helpers import make_large_model

pytestmark = pytest.mark.slow

HIDDEN, LAYERS, VOCAB = 1536, 25, 50257  # 2.51e9 bytes of float32 weights (1024 positions)
MUTATED = f"blocks.{LAYERS // 2}.fc2.weight"  # a centered MatMul weight (it feeds the residual stream)
RESTS_ON = {FLOAT64: "in float64", SENSITIVITY: "without float64", RTOL_ONLY: "by rtol alone"}


@pytest.fixture(scope="module")
def large_model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("scale")
    path = make_large_model.make_model(folder / "large.onnx", hidden=HIDDEN, layers=LAYERS, vocab=VOCAB, positions=1024)
    weights = path.stat().st_size + (folder / "large.onnx.data").stat().st_size
    assert weights > 2.5e9 > 2**31
    return path


def _one_constant_off(monkeypatch, name: str, relative: float = 1e-6) -> list[str]:
    """Shift the centered constant `name` alone by `relative` of its largest entry (as
    test_float64's `_off_by_a_small_constant` does to every one); returns the names shifted."""
    blocks = centering.CenteredTensor._float64_blocks
    shifted: list[str] = []

    def wrong(self, block_bytes):
        if self.name != name:
            yield from blocks(self, block_bytes)
            return
        shifted.append(self.name)
        for rows, wide in blocks(self, block_bytes):
            yield rows, wide - relative * (np.abs(wide).max() if wide.size else 0.0)

    monkeypatch.setattr(centering.CenteredTensor, "_float64_blocks", wrong)
    return shifted


@pytest.fixture(autouse=True)
def blockwise_runs(monkeypatch):
    """Both models run block by block (blocks of about 0.5 GB of weights), as at any size over a
    quarter of the memory available; the blocks made are listed."""
    made = []
    monkeypatch.setattr(blockwise, "blockwise_above", lambda: 0)
    monkeypatch.setattr(blockwise, "block_bytes", lambda: 500_000_000)
    init = blockwise.BlockwiseSession.__init__

    def counting(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(len(self.cut.blocks))

    monkeypatch.setattr(blockwise.BlockwiseSession, "__init__", counting)
    yield made
    assert made and all(count > 2 for count in made)


def _fold(src, tmp_path, capsys):
    """The command line, default verification, into an empty folder; (exit code, summary line,
    stderr, the --json report, the destination folder)."""
    dest = tmp_path / "out"
    dest.mkdir()
    report = tmp_path / "report.json"
    code = main([str(src), "-o", str(dest / "folded.onnx"), "--json", str(report)])
    out, err = capsys.readouterr()
    summary = next(line for line in out.splitlines() if line.startswith("onnx_lnfold:"))
    print(summary)  # the verdict line, in the test's own output (-s)
    return code, summary, err, json.loads(report.read_text()), dest


def test_one_constant_off_in_one_layer_of_a_multi_gb_model_is_refused(large_model, tmp_path, capsys, monkeypatch):
    shifted = _one_constant_off(monkeypatch, MUTATED)
    code, summary, err, report, dest = _fold(large_model, tmp_path, capsys)
    assert shifted and set(shifted) == {MUTATED}  # the constant is centered, and it alone was shifted
    assert MUTATED in {edit["tensor"] for edit in report["edits"]}
    verification = report["verification"]
    assert code == EXIT_VERIFY, (
        f"the wrong fold was accepted: {summary} (judged on {verification['judgment']}: "
        f"{verification['judgment_reason']})"
    )
    assert list(dest.iterdir()) == []  # nothing written, nothing staged left behind
    assert verification["status"] == "failed"
    assert "(nothing written)" in summary and "verification FAILED" in summary
    # The read-back refuses it first, whichever judgment the run could afford.
    assert f"verification failed: the folded model is not what the plan wrote: the written '{MUTATED}'" in err


def test_the_same_model_unmutated_folds_and_says_what_its_verdict_rests_on(large_model, tmp_path, capsys):
    code, summary, err, report, dest = _fold(large_model, tmp_path, capsys)
    verification = report["verification"]
    assert code == EXIT_OK, err
    assert sorted(p.name for p in dest.iterdir()) == ["folded.onnx", "folded.onnx.data"]
    assert verification["status"] == "passed"
    assert verification["judgment"] == FLOAT64, verification["judgment_reason"]
    assert f"verified ({RESTS_ON[FLOAT64]}, " in summary and "worst relative diff " in summary
    (logits,) = verification["outputs"]
    assert logits["float64_exact"] <= EXACT_RTOL

