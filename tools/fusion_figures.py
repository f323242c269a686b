#!/usr/bin/env python
"""What ONNX Runtime fuses on the original and on the fold, per model (docs/DESIGN.md section 10).

    python tools/fusion_figures.py [NAME_OR_PATH ...]     # default: the BERT-family and fusion models

For each model: the LNs folded with the fusion check and without it (`keep_ort_fusions=False`),
the codes that kept LNs for a fusion; ONNX Runtime's own node counts after `optimize_model`
(model_type bert, opt_level 0 and 1, the num_heads/hidden_size read from the graph) of the
original, of the fold and of the unchecked fold, with their EmbedLayerNormalization counts; the
contrib (fused) ops of an ORT_ENABLE_ALL CPU session that differ between the original and each
fold (the normalizations change on purpose); whether the weightless
copy gives ORT the same op counts as the real model; and the CPU seconds the check costs
(analysis with and without it, child processes included).
"""

from __future__ import annotations

import contextlib
import io
import logging
import resource
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODELS = HERE.parent / "models"
sys.path.insert(0, str(HERE.parent))

import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
from onnxruntime.transformers.optimizer import optimize_model  # noqa: E402

import onnx_lnfold  # noqa: E402
from onnx_lnfold.load.model import load_model  # noqa: E402
from onnx_lnfold.ort_fusions.fusion_cost import attention_heads, embedding_sums  # noqa: E402
from onnx_lnfold.ort_fusions.weightless import WeightlessFolder, weightless_clone  # noqa: E402

DEFAULT = [
    "bert", "bert_torchscript", "bert_ort_opt0", "bert_ort_opt1", "distilbert_torchscript",
    "gpt_neo", "pegasus_decoder", "whisper_encoder_torchscript", "wav2vec2_stable", "gpt2",
]


def _cpu() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def optimized(model, heads: int, hidden: int, level: int) -> tuple[int, int]:
    with contextlib.redirect_stdout(io.StringIO()):
        result = optimize_model(model, "bert", heads, hidden, opt_level=level)
    nodes = result.model.graph.node
    return len(nodes), sum(n.op_type == "EmbedLayerNormalization" for n in nodes)


def session_ops(model: str | bytes) -> Counter:
    with tempfile.TemporaryDirectory() as tmp:
        options = ort.SessionOptions()
        options.log_severity_level = 3
        options.optimized_model_filepath = str(Path(tmp) / "o.onnx")
        ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
        graph = onnx.load(str(Path(tmp) / "o.onnx"), load_external_data=False).graph
    return Counter(f"{n.domain}::{n.op_type}" for n in graph.node if n.domain not in ("", "ai.onnx"))


def _saved(proto: onnx.ModelProto, tmp: Path, name: str) -> str:
    path = tmp / name
    onnx.save(proto, str(path), save_as_external_data=proto.ByteSize() > 1_500_000_000)
    return str(path)


def figures(path: Path) -> None:
    name = path.stem
    started = _cpu()
    checked = onnx_lnfold.analyze(path)
    check_cpu = _cpu() - started
    started = _cpu()
    onnx_lnfold.analyze(path, keep_ort_fusions=False)
    plain_cpu = _cpu() - started
    on = onnx_lnfold.fold(path, verify=False)
    off = onnx_lnfold.fold(path, verify=False, keep_ort_fusions=False)
    codes = Counter(d.code for d in checked.kept if d.code in ("fusion-cost", "fusion-lost"))
    model, _ = load_model(path)
    from onnx_lnfold.analysis.planner import candidates
    from onnx_lnfold.shapes.table import ShapeTable

    sums = embedding_sums(candidates(model, ShapeTable(model)))
    hidden = max((int(c.scale.shape[-1]) for c in sums if c.scale is not None and c.scale.shape), default=0)
    heads = attention_heads(model.graph, hidden) if hidden else 0
    print(f"{name}: folded {len(on.plan.folded)}/{len(on.plan.decisions)} (unchecked {len(off.plan.folded)}), "
          f"kept for a fusion {dict(codes) or '-'}; check {check_cpu:.1f} s CPU vs analysis {plain_cpu:.1f} s")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        sources = {"original": str(path), "fold": _saved(on.model_proto, tmp, "fold.onnx"),
                   "unchecked fold": _saved(off.model_proto, tmp, "off.onnx")}
        if sums:
            for level in (0, 1):
                counts = {k: optimized(v, heads, hidden if heads else 0, level) for k, v in sources.items()}
                print(f"  optimize_model(bert, opt_level {level}, num_heads {heads}, hidden_size {hidden if heads else 0}): "
                      + ", ".join(f"{k} {n} nodes ({e} EmbedLayerNormalization)" for k, (n, e) in counts.items()))
        before = session_ops(sources["original"])
        for label in ("fold", "unchecked fold"):
            after = session_ops(sources[label])
            changed = {op: f"{before[op]} -> {after[op]}" for op in sorted(set(before) | set(after)) if before[op] != after[op]}
            print(f"  contrib ops of an ORT_ENABLE_ALL session, original -> {label}: {changed or 'the same'}")
        with WeightlessFolder() as folder:
            copy = str(folder.write(weightless_clone(model, folder), "copy.onnx"))
            same = session_ops(copy) == session_ops(str(path))
            if sums:
                same = same and all(optimized(copy, heads, hidden if heads else 0, lv) == optimized(str(path), heads, hidden if heads else 0, lv) for lv in (0, 1))
            print(f"  weightless copy gives ORT the same op counts: {same}")


def main(argv: list[str]) -> None:
    logging.disable(logging.WARNING)
    for item in argv or DEFAULT:
        path = Path(item) if item.endswith(".onnx") else MODELS / f"{item}.onnx"
        t = time.monotonic()
        figures(path)
        print(f"  ({time.monotonic() - t:.0f} s wall, shared machine)")


if __name__ == "__main__":
    main(sys.argv[1:])
