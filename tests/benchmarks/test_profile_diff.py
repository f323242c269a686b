"""`python -m benchmarks.profile_diff --files ORIGINAL FOLDED FEEDS` on a real model's files cannot
rot between its runs: here it profiles a tiny GELU-stem stream (an explicit centering, as the
Whisper encoder's fold has) and its fold. No timing is asserted: only that every normalization
node, the centering and the whole run are accounted for on both sides, the nodes both run apart."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx

import onnx_lnfold

from conftest import ROOT
from graphs import gelu_stem_stream


def test_two_files_are_profiled_node_by_node(tmp_path):
    model = gelu_stem_stream()
    original, folded, feeds = tmp_path / "original.onnx", tmp_path / "folded.onnx", tmp_path / "feeds.npz"
    onnx.save(model, original)
    result = onnx_lnfold.fold(model, fold_costly=True)
    assert [c.tensor for c in result.plan.centerings]  # the stream is centered explicitly
    onnx.save(result.model_proto, folded)
    np.savez(feeds, x=np.random.default_rng(0).standard_normal((1, 4, 8)).astype(np.float32))
    out = tmp_path / "profile.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.profile_diff", "--files", str(original), str(folded), str(feeds),
         "--runs", "2", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["model"] == "original" and report["runs"] == 2
    pairs = [(p["original"][1], p["folded"][1]) for p in report["norm_nodes"]]
    assert len(pairs) == 2  # as ONNX Runtime ran them: the residual LN may run fused with its Add
    assert {a for a, _ in pairs} <= {"LayerNormalization", "SkipLayerNormalization"}
    assert {b for _, b in pairs} <= {"SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization"}
    assert "centering:ReduceMean" in report["group_us"]["folded"]
    assert "centering:ReduceMean" not in report["group_us"]["original"]
    assert report["by_op_us"]["SimplifiedLayerNormalization"][0] == 0 < report["by_op_us"]["SimplifiedLayerNormalization"][1]
    assert "normalization group" in proc.stdout and "paired by position" in proc.stdout
    # the run split into what the fold changed and what both run: outside the group, the MLP's bias
    # Add, which the original's SkipLayerNormalization takes in and the fold runs apart
    assert report["only_original"] == {} and report["only_folded"] == {"Add": 1}
    assert report["shared_nodes"] > 0 and "what the fold changed" in proc.stdout
    shared = {name for name, *_ in report["shared_moved_most"]}
    assert shared and not shared & {p["folded"][0] for p in report["norm_nodes"]}
