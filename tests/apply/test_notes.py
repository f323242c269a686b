"""What the folded model says of each node the fold writes (`apply.notes`): its doc_string, as
Netron shows it, names the LN it stands for and why that is exact, and begins with `NOTE_PREFIX`,
which tools/fold_digests.py strips to compare two folds' outputs."""

import importlib.util

import onnx

import onnx_lnfold
from onnx_lnfold.apply.notes import NOTE_PREFIX

from conftest import MODELS, ROOT

_spec = importlib.util.spec_from_file_location("fold_digests", ROOT / "tools" / "fold_digests.py")
fold_digests = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fold_digests)  # type: ignore[union-attr]


def _fold(name: str, **options):
    result = onnx_lnfold.fold(MODELS / f"{name}.onnx", verify=False, **options)
    return onnx.load(MODELS / f"{name}.onnx"), result


def test_every_node_the_fold_writes_says_which_ln_it_replaces_and_why():
    """BERT: RMSNorm ops, beta's Adds and explicit centerings; the original's nodes keep their own."""
    original, result = _fold("bert")
    before = {n.name: n.doc_string for n in original.graph.node}
    written = [n for n in result.model_proto.graph.node if n.name not in before]
    assert {n.op_type for n in written} >= {"SimplifiedLayerNormalization", "Add", "ReduceMean", "Sub"}
    assert all(n.doc_string.startswith(NOTE_PREFIX) for n in written)
    assert all(n.doc_string == before[n.name] for n in result.model_proto.graph.node if n.name in before)
    by_ln = {d.node: d for d in result.plan.folded}
    for node in written:
        if node.op_type == "SimplifiedLayerNormalization":
            ln = by_ln[node.name.rsplit("/", 1)[0]]
            assert node.doc_string == f"{NOTE_PREFIX}replaces LayerNormalization '{ln.node}' ({ln.proof})"
            assert ln.proof.startswith("input is zero-mean once ")
        if node.op_type in ("ReduceMean", "Sub"):
            (centering,) = [c for c in result.plan.centerings if node.name.startswith(f"{c.tensor}/")]
            assert f"centers '{centering.tensor}' over axis {centering.axis}" in node.doc_string
            assert all(f"'{ln}'" in node.doc_string for ln in centering.required_by)


def test_the_primitive_targets_six_ops_each_name_their_ln():
    original, result = _fold("gpt2", target="primitive")
    before = {n.name for n in original.graph.node}
    notes = [n.doc_string for n in result.model_proto.graph.node if n.name not in before and n.op_type == "Pow"]
    assert len(notes) == len(result.plan.folded)
    assert {note.split("'")[1] for note in notes} == {d.node for d in result.plan.folded}


def test_the_digest_drops_the_notes_and_nothing_else():
    _, result = _fold("bert")
    proto = result.model_proto
    proto.graph.node[0].doc_string = "the exporter's own"
    onnx.helper.set_model_props(proto, {"onnx_lnfold.version": "x", "source": "kept"})
    stripped = fold_digests.without_notes(proto)
    assert not any(n.doc_string.startswith(NOTE_PREFIX) for n in stripped.graph.node)
    assert stripped.graph.node[0].doc_string == "the exporter's own"
    assert {p.key: p.value for p in stripped.metadata_props} == {"source": "kept"}
    assert [n.name for n in stripped.graph.node] == [n.name for n in proto.graph.node]
    assert any(n.doc_string.startswith(NOTE_PREFIX) for n in proto.graph.node)  # the proto given is left as it is
