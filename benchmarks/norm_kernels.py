"""Microbenchmark of ORT's CPU normalization kernels, residual Add included.

    python -m benchmarks.norm_kernels [--hidden 768] [--rows 512] [--threads 1] [--seconds 20]

Times, interleaved, one-node graphs (graph optimizations off, so nothing is fused or split):

    add+ln      Add(x, skip) -> LayerNormalization               (what an unfused original runs)
    skip_ln     com.microsoft SkipLayerNormalization              (ORT's fusion of the above)
    add+sln     Add(x, skip) -> SimplifiedLayerNormalization      (what an unfused folded model runs)
    skip_sln    com.microsoft SkipSimplifiedLayerNormalization    (ORT's fusion of the above)
    ln, sln     the normalizations alone

and reports medians (wall and process CPU time) and ratios against add+ln. The Add output is a
graph output too (the residual stream is read again by the next block), as in a real model.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from onnx import TensorProto, helper

from benchmarks.common import ratio_of_medians


def _model(kind: str, d: int) -> bytes:
    X = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", d])
    S = helper.make_tensor_value_info("skip", TensorProto.FLOAT, ["b", "s", d])
    Y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    R = helper.make_tensor_value_info("r", TensorProto.FLOAT, None)
    rng = np.random.default_rng(0)
    g = helper.make_tensor("gamma", TensorProto.FLOAT, [d], (1 + 0.1 * rng.standard_normal(d)).astype(np.float32))
    b = helper.make_tensor("beta", TensorProto.FLOAT, [d], (0.1 * rng.standard_normal(d)).astype(np.float32))
    eps = 1e-5
    nodes, outputs, inputs = [], [Y], [X]
    if kind in ("add+ln", "add+sln", "skip_ln", "skip_sln"):
        inputs.append(S)
        outputs.append(R)
    if kind == "add+ln":
        nodes = [helper.make_node("Add", ["x", "skip"], ["r"]),
                 helper.make_node("LayerNormalization", ["r", "gamma", "beta"], ["y"], axis=-1, epsilon=eps)]
    elif kind == "add+sln":
        nodes = [helper.make_node("Add", ["x", "skip"], ["r"]),
                 helper.make_node("SimplifiedLayerNormalization", ["r", "gamma"], ["y"], axis=-1, epsilon=eps)]
    elif kind == "skip_ln":
        nodes = [helper.make_node("SkipLayerNormalization", ["x", "skip", "gamma", "beta"], ["y", "", "", "r"],
                                  domain="com.microsoft", epsilon=eps)]
    elif kind == "skip_sln":
        nodes = [helper.make_node("SkipSimplifiedLayerNormalization", ["x", "skip", "gamma"], ["y", "", "", "r"],
                                  domain="com.microsoft", epsilon=eps)]
    elif kind == "ln":
        nodes = [helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["y"], axis=-1, epsilon=eps)]
    elif kind == "sln":
        nodes = [helper.make_node("SimplifiedLayerNormalization", ["x", "gamma"], ["y"], axis=-1, epsilon=eps)]
    graph = helper.make_graph(nodes, kind, inputs, outputs, [g, b])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 9
    return m.SerializeToString()


KINDS = ["add+ln", "skip_ln", "add+sln", "skip_sln", "ln", "sln"]


def measure(hidden: int, rows: int, threads: int, seconds: float) -> dict:
    import onnxruntime as ort

    sessions = {}
    for k in KINDS:
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        so.intra_op_num_threads = threads
        so.log_severity_level = 3
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        sessions[k] = ort.InferenceSession(_model(k, hidden), so, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, rows, hidden)).astype(np.float32)
    s = rng.standard_normal((1, rows, hidden)).astype(np.float32)
    feeds = {k: ({"x": x, "skip": s} if len(sessions[k].get_inputs()) == 2 else {"x": x}) for k in KINDS}
    wall = {k: [] for k in KINDS}
    cpu = {k: [] for k in KINDS}
    for _ in range(20):
        for k in KINDS:
            sessions[k].run(None, feeds[k])
    t_end = time.perf_counter() + seconds
    r = 0
    while time.perf_counter() < t_end or r < 50:
        order = KINDS[r % len(KINDS):] + KINDS[:r % len(KINDS)]
        for k in order:
            c0, t0 = time.process_time(), time.perf_counter()
            sessions[k].run(None, feeds[k])
            wall[k].append(time.perf_counter() - t0)
            cpu[k].append(time.process_time() - c0)
        r += 1
    return {"hidden": hidden, "rows": rows, "threads": threads, "rounds": r, "ort": ort.__version__,
            "median_us": {k: {"wall": float(np.median(wall[k]) * 1e6), "cpu": float(np.median(cpu[k]) * 1e6)}
                          for k in KINDS},
            "vs_add+ln": {k: {"wall": ratio_of_medians(np.array(wall["add+ln"]), np.array(wall[k])),
                              "cpu": ratio_of_medians(np.array(cpu["add+ln"]), np.array(cpu[k]))} for k in KINDS}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--rows", type=int, default=512)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=20.0)
    args = ap.parse_args(argv)
    out = measure(args.hidden, args.rows, args.threads, args.seconds)
    print(f"d={args.hidden}, {args.rows} rows, {args.threads} thread(s), {out['rounds']} rounds, ORT {out['ort']}")
    for k in KINDS:
        m, v = out["median_us"][k], out["vs_add+ln"][k]
        print(f"  {k:9s} wall {m['wall']:8.1f} us  cpu {m['cpu']:8.1f} us   add+ln / {k}: wall x{v['wall']['ratio']:.2f} "
              f"[{v['wall']['lo']:.2f}, {v['wall']['hi']:.2f}]  cpu x{v['cpu']['ratio']:.2f} "
              f"[{v['cpu']['lo']:.2f}, {v['cpu']['hi']:.2f}]")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
