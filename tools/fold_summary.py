"""Fold every committed model and print what happened to its LayerNorms.

    python tools/fold_summary.py [--ort-nodes]      # one line each: folded, centerings, untied bytes, verification
    python tools/fold_summary.py --markdown         # the README's "What folds" table (analysis only)
    python tools/fold_summary.py --readme           # write that table into README.md
    python tools/fold_summary.py --markdown --trained DIR   # the real trained models of DIR/MANIFEST.json

`--ort-nodes` also prints the node count of the graph ONNX Runtime itself optimizes (level ALL)
for the original and the folded model. The table is the default options' plan of each model, no
inputs given (the cost rule prices every LN at the graph's own shapes, else its default), models
with the same outcome on one row; tests/surface/test_readme.py checks the README's copy against it.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path

import onnx

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MODELS = ROOT / "models"
README = ROOT / "README.md"
sys.path.insert(0, str(ROOT))  # this checkout's onnx_lnfold, not whichever is installed

import onnx_lnfold  # noqa: E402

# The README's generated blocks: between these lines, the output of `--markdown` (and with `--trained`).
BLOCKS = {
    "committed": ("<!-- what-folds: python tools/fold_summary.py --readme -->", "<!-- /what-folds -->"),
    "trained": ("<!-- what-folds-trained: python tools/fold_summary.py --readme --trained DIR -->", "<!-- /what-folds-trained -->"),
}


def committed_models() -> list[Path]:
    """Every committed test model: models/*.onnx and the GenAI builder outputs."""
    return sorted(MODELS.glob("*.onnx")) + sorted(MODELS.glob("genai/*/model.onnx"))


def trained_models(folder: Path) -> list[Path]:
    manifest = json.loads((folder / "MANIFEST.json").read_text())["models"]
    return [folder / entry["file"] for entry in manifest.values() if (folder / entry["file"]).is_file()]


def model_name(path: Path) -> str:
    return path.parent.name if path.name == "model.onnx" else path.stem


def outcome(path: Path) -> tuple[str, str]:
    """(LNs folded, why the rest stay) of the default plan of the model at `path`."""
    plan = onnx_lnfold.analyze(path)
    if not plan.decisions:
        return "no LayerNorm", "-"
    folded = f"{len(plan.folded)}/{len(plan.decisions)}"
    if plan.centerings:
        folded += f", {len(plan.centerings)} explicit centering{'s' * (len(plan.centerings) != 1)}"
    kept = Counter(d.code for d in plan.kept)
    why = ", ".join(f"`{code}`" + (f" x{n}" if n > 1 else "") for code, n in sorted(kept.items())) or "-"
    return folded, why


def markdown(paths: list[Path]) -> str:
    """The table: one row per outcome, its models in the order given."""
    rows: dict[tuple[str, str], list[str]] = {}
    for path in paths:
        rows.setdefault(outcome(path), []).append(model_name(path))
    lines = ["| models | LNs folded | why the rest stay (code x LNs) |", "| --- | --- | --- |"]
    lines += [f"| {', '.join(names)} | {folded} | {why} |" for (folded, why), names in rows.items()]
    return "\n".join(lines)


def readme_block(text: str, block: str = "committed") -> str:
    """The generated table `block` in the README's `text`."""
    begin, end = BLOCKS[block]
    return text[text.index(begin) + len(begin) : text.index(end)].strip()


def write_readme(table: str, block: str) -> None:
    text = README.read_text()
    begin, end = BLOCKS[block]
    start, stop = text.index(begin) + len(begin), text.index(end)
    README.write_text(text[:start] + "\n" + table + "\n" + text[stop:])


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
    parser.add_argument("--markdown", action="store_true", help="print the README's table")
    parser.add_argument("--readme", action="store_true", help="write the table into README.md")
    parser.add_argument("--trained", type=Path, help="a folder of real trained models (MANIFEST.json) instead")
    args = parser.parse_args()
    if args.markdown or args.readme:
        table = markdown(trained_models(args.trained) if args.trained else committed_models())
        if args.readme:
            write_readme(table, "trained" if args.trained else "committed")
        else:
            print(table)
        return 0
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
