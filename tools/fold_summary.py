"""Fold every committed model and print one line each: LNs folded / total, explicit centerings,
untied bytes, and the verification figure (max |diff| / max |ref| over outputs, ONNX Runtime CPU).

    python tools/fold_summary.py [--ort-nodes]

`--ort-nodes` also prints the node count of the graph ONNX Runtime itself optimizes (level ALL)
for the original and the folded model.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import onnx

HERE = Path(__file__).resolve().parent
MODELS = HERE.parent / "models"
sys.path.insert(0, str(HERE.parent))  # this checkout's onnx_lnfold, not whichever is installed

import onnx_lnfold  # noqa: E402


def ort_optimized_nodes(path: Path, out: Path) -> int:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.optimized_model_filepath = str(out)
    options.log_severity_level = 3
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return len(onnx.load(out).graph.node)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ort-nodes", action="store_true")
    args = parser.parse_args()
    names = list(json.loads((MODELS / "manifest.json").read_text())["models"])
    print(f"{'model':28} {'folded':>7} {'centerings':>10} {'untied B':>9} {'max rel diff':>13}" + ("  ORT nodes" if args.ort_nodes else ""))
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            path = MODELS / f"{name}.onnx"
            result = onnx_lnfold.fold(path)
            plan, v = result.plan, result.report.verification
            diff = f"{v.max_rel_diff:.2e}" if v.status == "passed" else v.status
            line = (
                f"{name:28} {len(plan.folded):>3}/{len(plan.decisions):<3} {len(plan.centerings):>10} "
                f"{plan.untied_bytes:>9} {diff:>13}"
            )
            if args.ort_nodes:
                folded = Path(tmp) / "folded.onnx"
                result.save(folded)
                before = ort_optimized_nodes(path, Path(tmp) / "a.onnx")
                after = ort_optimized_nodes(folded, Path(tmp) / "b.onnx")
                line += f"  {before} -> {after}"
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
