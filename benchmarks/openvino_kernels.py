"""What the nodes a fold writes or removes cost OpenVINO's CPU plugin, against ONNX Runtime's CPU EP:
instructions per run under callgrind of one-node graphs over [tokens, d].

    python -m benchmarks.openvino_kernels [--widths 64 384 768] [--tokens 1024] [--runs 20] [--processes 2]

The cost rule (`decide.costs`, docs/DESIGN.md section 4.1) prices a fold by ONNX Runtime's CPU
kernels. This measures the same kinds of node in OpenVINO, to show what a cost table for OpenVINO
would have to say and whether any fold the rule allows would cost more there. Each graph reads x
[tokens, d] (and a residual r for the Skip kinds), with gamma and beta of d:

    LayerNormalization          LN(x)                                 what the original runs
    SimplifiedLN                SimplifiedLayerNormalization(x)       what a fold runs
    SimplifiedLN + beta Add     SimplifiedLayerNormalization(x) + beta   a fold whose beta stays an Add
    Add + LayerNormalization    LN(x + r)                             what ORT fuses into SkipLayerNormalization
    Add + SimplifiedLN          SimplifiedLayerNormalization(x + r)   what the fold leaves of that
    Centering                   x - ReduceMean(x)                     an explicit centering

Under valgrind the CPU has no AVX-512: OpenVINO runs its AVX2 f32 kernels, and bf16 cannot be
measured this way. One thread everywhere. Per run = (I(2N) - I(N)) / N, every thread's
instructions, each graph in `--processes` valgrind processes (the graphs' order rotated).
Results: benchmarks/results/runtimes/OPENVINO_KERNELS.md and openvino_kernels.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "runtimes"
KINDS = ("LayerNormalization", "SimplifiedLN", "SimplifiedLN + beta Add", "Add + LayerNormalization",
         "Add + SimplifiedLN", "Centering")


def graph(kind: str, d: int):
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.random(d) + 0.5).astype(np.float32), "gamma"),
             numpy_helper.from_array(rng.standard_normal(d).astype(np.float32), "beta"),
             numpy_helper.from_array(np.array([-1], np.int64), "axes")]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["t", d])]
    nodes = []
    x = "x"
    if kind.startswith("Add + "):
        inputs.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, ["t", d]))
        nodes.append(helper.make_node("Add", ["x", "r"], ["s"]))
        x = "s"
    if kind.endswith("LayerNormalization"):
        nodes.append(helper.make_node("LayerNormalization", [x, "gamma", "beta"], ["y"], axis=-1, epsilon=1e-5))
    elif kind == "Centering":
        nodes += [helper.make_node("ReduceMean", [x, "axes"], ["m"], keepdims=1), helper.make_node("Sub", [x, "m"], ["y"])]
    else:
        out = "n" if kind.endswith("beta Add") else "y"
        nodes.append(helper.make_node("SimplifiedLayerNormalization", [x, "gamma"], [out], axis=-1, epsilon=1e-5,
                                      stash_type=1))
        if kind.endswith("beta Add"):
            nodes.append(helper.make_node("Add", ["n", "beta"], ["y"]))
    g = helper.make_graph(nodes, kind, inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["t", d])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)


def child(plan_path: str) -> int:
    import gc

    plan = json.loads(Path(plan_path).read_text())
    runners = []
    for item in plan["graphs"]:
        feeds = {"x": np.random.default_rng(1).standard_normal((plan["tokens"], item["d"])).astype(np.float32)}
        if item["kind"].startswith("Add + "):
            feeds["r"] = np.random.default_rng(2).standard_normal((plan["tokens"], item["d"])).astype(np.float32)
        if plan["runtime"] == "openvino":
            import openvino as ov

            compiled = ov.Core().compile_model(item["path"], "CPU", {"INFERENCE_PRECISION_HINT": "f32",
                                                                    "INFERENCE_NUM_THREADS": 1, "NUM_STREAMS": 1})
            request = compiled.create_infer_request()
            run = (lambda request, feeds: lambda: request.infer(feeds))(request, feeds)
        else:
            import onnxruntime as ort

            so = ort.SessionOptions()
            so.intra_op_num_threads = so.inter_op_num_threads = 1
            so.add_session_config_entry("session.intra_op.allow_spinning", "0")
            sess = ort.InferenceSession(item["path"], so, providers=["CPUExecutionProvider"])
            run = (lambda sess, feeds: lambda: sess.run(None, feeds))(sess, feeds)
        run()
        run()
        runners.append(run)
    gc.collect()
    gc.disable()
    if subprocess.run(["callgrind_control", "-i", "on", str(os.getpid())], capture_output=True).returncode:
        return 3
    for run in runners:
        for count in (plan["runs"], 2 * plan["runs"]):
            os.getpgrp()
            for _ in range(count):
                run()
            os.getsid(0)
    return 0


def measure(runtime: str, graphs: list[dict], tokens: int, runs: int, work: Path, tag: str) -> list[float]:
    prefix = work / f"cg.{tag}"
    plan = work / f"plan.{tag}.json"
    plan.write_text(json.dumps({"runtime": runtime, "graphs": graphs, "tokens": tokens, "runs": runs}))
    cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--separate-threads=yes", "--zero-before=getpgrp",
           "--dump-before=getsid", f"--callgrind-out-file={prefix}", sys.executable, "-m", "benchmarks.openvino_kernels",
           "--child", str(plan)]
    if shutil.which("setarch"):
        cmd = ["setarch", os.uname().machine, "-R"] + cmd
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": str(ROOT)})
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-600:])
    from benchmarks.common import callgrind_dump_totals

    totals = callgrind_dump_totals(prefix)
    if len(totals) != 2 * len(graphs):
        raise RuntimeError(f"{tag}: {len(totals)} dumps for {len(graphs)} graphs")
    return [(totals[2 * i + 1] - totals[2 * i]) / runs for i in range(len(graphs))]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--widths", nargs="+", type=int, default=[64, 384, 768])
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args.child)
    import onnx

    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="lnfold-ovk-") as tmp:
        work = Path(tmp)
        graphs = []
        for d in args.widths:
            for kind in KINDS:
                path = work / f"{kind.replace(' ', '_').replace('+', 'p')}.{d}.onnx"
                onnx.save(graph(kind, d), path)
                graphs.append({"kind": kind, "d": d, "path": str(path)})
        for runtime in ("openvino", "onnxruntime"):
            counts: dict[str, list[float]] = {}
            for k in range(args.processes):
                order = graphs[k % len(graphs):] + graphs[: k % len(graphs)]
                print(f"{runtime}: process {k + 1}/{args.processes}", file=sys.stderr, flush=True)
                for g, n in zip(order, measure(runtime, order, args.tokens, args.runs, work, f"{runtime}.{k}")):
                    counts.setdefault(f"{g['kind']}|{g['d']}", []).append(n)
            results[runtime] = counts
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = "python -m benchmarks.openvino_kernels " + " ".join(argv if argv is not None else sys.argv[1:])
    versions = {m: __import__(m).__version__.split("-")[0] for m in ("onnxruntime", "openvino")}
    (out / "openvino_kernels.json").write_text(json.dumps({"command": command, "versions": versions, "tokens": args.tokens,
                                                           "counts": results}, indent=1) + "\n")
    lines = ["# Node costs in OpenVINO's CPU plugin and ONNX Runtime's CPU EP (instructions per run, callgrind)", "",
             f"Command: `{command}`; {', '.join(f'{k} {v}' for k, v in versions.items())}; {args.tokens} tokens, "
             "one thread, f32 (OpenVINO's AVX2 kernels: valgrind's CPU has no AVX-512). Each figure: the median over "
             f"{args.processes} valgrind processes (their range in parentheses), in thousands of instructions per run; "
             "the ratio columns divide by LayerNormalization of the same width in the same runtime.", "",
             "| d | node(s) | OpenVINO (k) | / LN | ONNX Runtime (k) | / LN |", "|---|---|---|---|---|---|"]
    for d in args.widths:
        base = {rt: float(np.median(results[rt][f"LayerNormalization|{d}"])) for rt in results}
        for kind in KINDS:
            cells = []
            for rt in ("openvino", "onnxruntime"):
                c = results[rt][f"{kind}|{d}"]
                cells += [f"{np.median(c) / 1e3:.0f} ({min(c) / 1e3:.0f}-{max(c) / 1e3:.0f})", f"{np.median(c) / base[rt]:.3f}"]
            lines.append(f"| {d} | {kind} | " + " | ".join(cells) + " |")
    (out / "OPENVINO_KERNELS.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
