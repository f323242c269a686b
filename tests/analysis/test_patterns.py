"""Exported models behind two carry patterns (models/make/export_pattern_models.py): slow, they export
with torch. The rules themselves are tested fast on graphs built in code (tests/carry/test_carry.py's
Tile cases, tests/carry/test_producers.py's GatherND ones)."""

from __future__ import annotations

import subprocess
import sys

import onnx
import pytest

import onnx_lnfold

from conftest import MODELS


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    out = tmp_path_factory.mktemp("patterns")
    subprocess.run([sys.executable, str(MODELS / "export_pattern_models.py"), str(out)], check=True)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_timesformer_class_token_tiled_over_frames_folds_every_ln(exported, exporter):
    """Before: 2/7 (the Tile of the class token broke the chain, and the two last LNs folded
    through an explicit centering)."""
    path = exported / f"timesformer_{exporter}.onnx"
    assert any(n.op_type == "Tile" for n in onnx.load(path).graph.node)
    result = onnx_lnfold.fold(path)
    assert (len(result.plan.folded), len(result.plan.decisions)) == (7, 7), [(d.node, d.reason) for d in result.plan.kept]
    assert result.report.verification.status == "passed" and result.report.verification.max_rel_diff < 1e-5
    assert not result.plan.centerings and not any(e.untie for e in result.plan.edits)


@pytest.mark.slow
def test_whisper_decoder_positions_by_gather_nd_fold_without_explicit_centering(exported):
    """Before: 7/7 through one explicit centering of the GatherND's output (1 ReduceMean + 1 Sub
    per run); now the position table is centered in place."""
    path = exported / "whisper_decoder_dynamo.onnx"
    model = onnx.load(path)
    (lookup,) = [n for n in model.graph.node if n.op_type == "GatherND" and n.input[0] in {i.name for i in model.graph.initializer}]
    result = onnx_lnfold.fold(path)
    assert len(result.plan.folded) == len(result.plan.decisions) == 7
    assert result.report.verification.status == "passed" and result.report.verification.max_rel_diff < 1e-5
    # (The tied token table may be centered at its Gather's output, as --tied-weights says.)
    assert lookup.output[0] not in {c.tensor for c in result.plan.centerings}
    (table,) = [e for e in result.plan.edits if e.tensor == lookup.input[0]]
    assert (table.axis, table.role, table.untie) == (1, "embedding table", False)
