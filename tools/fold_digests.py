"""Fingerprints of what the fold writes, to show a refactoring changed no output.

    python tools/fold_digests.py --write tools/fold_digests.json   # record (before the change)
    python tools/fold_digests.py --check tools/fold_digests.json   # compare (after it)

Folds every committed model (`models/*.onnx`) under each option set below, and the first
`--fuzz N` graphs of the property test's generator (tests/fuzz_graphs.py, derandomized: the
same graphs every run but the last few, so fuzz cases are keyed by the graph and compared where
both runs drew one) with and without explicit centering, all without verification. Records,
per case, the SHA-256 of the folded model's serialized bytes, of its plan (the fields listed in
`_PLAN_FIELDS`: fields added later do not count), of the `-v` proof lines, or of the one-line
error. `--dump DIR` also writes each case's plan and proof as JSON, to diff two runs. `--only
gpt2,bert` folds those committed models alone (and compares only their cases); `--fuzz 0` no fuzz
graph.

The model's digest is of its bytes without what the fold says of itself: node doc_strings that
begin with `NOTE_PREFIX` ("onnx_lnfold: ") and `metadata_props` entries whose key begins with
"onnx_lnfold" (`without_notes`), so that wording them changes no digest.

The digests depend on the onnx, onnx-ir and numpy versions (serialization, float64 sums): compare
runs made in one environment.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODELS = HERE.parent / "models"
sys.path.insert(0, str(HERE.parent))  # this checkout's onnx_lnfold, not whichever is installed
sys.path.insert(0, str(HERE.parent / "tests"))  # the fuzz generator

import onnx_lnfold  # noqa: E402
from onnx_lnfold._pipeline import analyze_for_target  # noqa: E402
from onnx_lnfold.apply.notes import NOTE_PREFIX  # noqa: E402
from onnx_lnfold.report.trace import explain  # noqa: E402

OPTION_SETS: dict[str, dict] = {
    "default": {},
    "no_aux": {"auxiliary_centering": False},
    "fuse_always": {"fuse_residual": "always"},
    "fuse_never": {"fuse_residual": "never"},
    "tied_center": {"tied_weights": "center"},
    "tied_untie": {"tied_weights": "untie"},
    "target_onnx": {"target": "onnx"},
    "target_primitive": {"target": "primitive"},
}

# The plan as it was when the baseline was recorded: later additions do not change its digest.
_PLAN_FIELDS = {
    "decisions": ("node", "op_type", "status", "reason", "axis", "epsilon", "rewrite", "beta", "blocking_tensor", "residual_add"),
    "edits": ("tensor", "axis", "weighted", "role", "uses", "untie", "new_name", "copy_bytes", "required_by", "note"),
    "centerings": ("tensor", "axis", "uses", "new_name", "required_by", "cost", "instead_of_untie", "saved_bytes"),
}


def _sha(data: bytes | str) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()[:16]


def _plan_view(plan: onnx_lnfold.CenteringPlan) -> dict:
    full = plan.to_dict()
    view = {key: [{f: item.get(f) for f in fields} for item in full[key]] for key, fields in _PLAN_FIELDS.items()}
    view["target"], view["advice"] = full["target"], full["advice"]
    return view


def without_notes(proto):
    """A copy of the model proto without the fold's notes on itself: node doc_strings beginning
    with `NOTE_PREFIX`, `metadata_props` entries whose key begins with the package's name (of the
    model, its graphs and their nodes, subgraphs included)."""
    import onnx

    copy = onnx.ModelProto()
    copy.CopyFrom(proto)

    def drop_props(owner) -> None:
        kept = [p for p in owner.metadata_props if not p.key.startswith("onnx_lnfold")]
        if len(kept) != len(owner.metadata_props):
            del owner.metadata_props[:]
            owner.metadata_props.extend(kept)

    def clean(graph) -> None:
        drop_props(graph)
        for node in graph.node:
            if node.doc_string.startswith(NOTE_PREFIX):
                node.ClearField("doc_string")
            drop_props(node)
            for attr in node.attribute:
                for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
                    clean(sub)

    drop_props(copy)
    clean(copy.graph)
    for function in copy.functions:
        for node in function.node:
            if node.doc_string.startswith(NOTE_PREFIX):
                node.ClearField("doc_string")
    return copy


def fingerprint(model, options: dict, dump: Path | None, case: str) -> dict:
    """Digests of one fold: {"model", "plan", "proof"} or {"error"}."""
    try:
        # The proof reads the very model the plan was made on (for --target onnx below opset 23:
        # the converted one).
        analyzed, plan = analyze_for_target(_load(model), onnx_lnfold.FoldOptions(**options))
        proof = explain(analyzed, plan)
        result = onnx_lnfold.fold(model, verify=False, **options)
    except onnx_lnfold.LnFoldError as e:
        # The message under the family's name: the subclasses (InvalidInput, ...) came later, and
        # the digest is of what the user reads.
        return {"error": _sha(f"LnFoldError: {e}")}
    view = _plan_view(result.plan)
    if dump is not None:
        (dump / f"{case}.json").write_text(json.dumps({"plan": view, "proof": proof}, indent=1, default=str))
    return {
        "model": _sha(without_notes(result.model_proto).SerializeToString(deterministic=True)),
        "plan": _sha(json.dumps(view, sort_keys=True, default=str)),
        "proof": _sha("\n".join(proof or [])),
    }


def _load(model):
    from onnx_lnfold.load.model import load_model

    return load_model(model)[0]


def committed_cases(dump: Path | None, only: set[str] | None = None) -> dict[str, dict]:
    """The committed models' cases (those of `only`, by stem, where given)."""
    out = {}
    for path in sorted(MODELS.glob("*.onnx")):
        if only is not None and path.stem not in only:
            continue
        for label, options in OPTION_SETS.items():
            case = f"{path.stem}/{label}"
            out[case] = fingerprint(path, options, dump, case.replace("/", "."))
    return out


def fuzz_cases(count: int, dump: Path | None) -> dict[str, dict]:
    from hypothesis import HealthCheck, given, settings

    from fuzz_graphs import models

    out: dict[str, dict] = {}

    @settings(
        max_examples=count,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(models())
    def each(built):
        # Keyed by the graph itself: hypothesis' last few draws vary from run to run.
        key = _sha(built.model.SerializeToString(deterministic=True))
        for label in ("default", "no_aux"):
            case = f"fuzz-{key}/{label}"
            out[case] = fingerprint(built.model, OPTION_SETS[label], dump, case.replace("/", "."))

    each()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", metavar="FILE.json")
    mode.add_argument("--check", metavar="FILE.json")
    parser.add_argument("--fuzz", type=int, default=300, help="fuzz graphs to fold (default 300)")
    parser.add_argument("--dump", metavar="DIR", help="also write each case's plan and proof as JSON")
    parser.add_argument(
        "--only", metavar="NAME[,NAME]", help="fold these committed models alone (stems of models/*.onnx); with --check, compare their cases"
    )
    args = parser.parse_args()
    only = set(args.only.split(",")) if args.only else None
    if only is not None and args.write:
        parser.error("--only records part of the cases: --write records them all")
    unknown = sorted(only - {p.stem for p in MODELS.glob("*.onnx")}) if only else []
    if unknown:
        parser.error(f"no committed model {', '.join(unknown)}")
    dump = Path(args.dump) if args.dump else None
    if dump is not None:
        dump.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    cases = committed_cases(dump, only)
    if args.fuzz:
        cases.update(fuzz_cases(args.fuzz, dump))
    elapsed = time.monotonic() - started
    if args.write:
        Path(args.write).write_text(json.dumps({"cases": cases}, indent=0, sort_keys=True) + "\n")
        print(f"{len(cases)} cases recorded in {args.write} ({elapsed:.0f} s)")
        return 0
    baseline = json.loads(Path(args.check).read_text())["cases"]
    if only is not None:  # the cases of the models asked for
        baseline = {c: v for c, v in baseline.items() if c.startswith("fuzz-") or c.split("/", 1)[0] in only}
    # Every committed-model case must be there; fuzz graphs are compared where both runs drew them.
    compared = [c for c in baseline.keys() | cases.keys() if not c.startswith("fuzz-") or (c in baseline and c in cases)]
    differ = sorted(c for c in compared if baseline.get(c) != cases.get(c))
    for case in differ:
        print(f"differs: {case}: {baseline.get(case)} -> {cases.get(case)}")
    print(f"{len(compared)} cases compared ({len(cases)} run), {len(differ)} differ from {args.check} ({elapsed:.0f} s)")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
