"""The written model says what the fold did: `save.provenance`'s entries, appended to the staged
file by `StagedModel.commit(metadata)` without writing the model again."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest

import onnx_lnfold
from onnx_lnfold.core.options import FoldOptions
from onnx_lnfold.load.model import load_model
from onnx_lnfold.save.provenance import PREFIX, drop_provenance, options_words, provenance
from onnx_lnfold.save.staged import StagedModel

from graphs import Graph

D = 16


def _model(d: int = D) -> onnx.ModelProto:
    """An LN on the graph input (kept: no weight edit centers data) and one after a Linear (folded)."""
    g = Graph(seed=3)
    x = g.input("x", ["batch", "seq", d])
    y = g.ln(x, d, "ln_input")
    y = g.ln(g.linear(y, d, d, "proj"), d, "ln_proj")
    g.output(g.linear(y, d, d, "head"), ["batch", "seq", d])
    return g.model()


def _feeds(seed: int = 0) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).normal(size=(2, 5, D)).astype(np.float32)}


def _run(model) -> list[np.ndarray]:
    """ONNX Runtime's outputs for a model file (a path) or serialized model (bytes)."""
    source = model if isinstance(model, bytes) else str(model)
    session = ort.InferenceSession(source, providers=["CPUExecutionProvider"])
    return session.run(None, _feeds())


def _entries(path) -> list[tuple[str, str]]:
    return [(e.key, e.value) for e in onnx.load(str(path), load_external_data=False).metadata_props]


# The standard ops of `--target primitive`: onnx.checker knows their schemas (not ONNX Runtime's).
OPTIONS = FoldOptions(target="primitive", fold_costly=True, auxiliary_centering=False)


def _unsaid(folded: onnx_lnfold.FoldResult) -> ir.Model:
    """A copy of the folded model as the pipeline stages it: without the entries `fold()` set on the
    model it returns (a staged model takes them when committed)."""
    model = ir.from_proto(folded.model_proto)
    drop_provenance(model)
    return model


@pytest.fixture(scope="module")
def folded() -> onnx_lnfold.FoldResult:
    return onnx_lnfold.fold(_model(), options=OPTIONS)


def test_the_entries_say_the_version_options_what_was_folded_and_the_verdict(folded):
    entries = provenance(folded.report, OPTIONS)
    assert all(key.startswith(PREFIX) for key in entries)
    assert entries[PREFIX + "version"] == onnx_lnfold.__version__
    assert entries[PREFIX + "options"] == "--target primitive --no-aux-centering --fold-costly"
    assert entries[PREFIX + "folded"] == (
        "1 of 2 LayerNorms folded: 1 LayerNormalization -> Pow/ReduceMean/Add/Sqrt/Div/Mul; 1 kept (graph-input 1)"
    )
    verification = folded.report.verification
    assert verification.status == "passed"
    assert entries[PREFIX + "verification"] == f"passed: {verification.verdict()}, rtol {verification.rtol:g}"
    assert "in float64, worst relative diff" in entries[PREFIX + "verification"]


def test_the_options_are_spelled_as_the_command_line_takes_them():
    assert options_words(FoldOptions()) == "defaults"
    spelled = options_words(FoldOptions(target="onnx", auxiliary_centering=False, costs="my costs.json"))
    assert spelled == "--target onnx --no-aux-centering --costs 'my costs.json'"


def test_entries_appended_at_commit_load_check_and_run(folded, tmp_path):
    model = _unsaid(folded)
    staged = StagedModel(model, tmp_path / "out.onnx")
    written = staged.path.read_bytes()
    entries = provenance(folded.report, OPTIONS)
    path = staged.commit(entries)
    data = path.read_bytes()
    assert data.startswith(written) and len(data) > len(written)  # appended: nothing before it moved
    assert _entries(path) == list(entries.items())
    assert model.metadata_props == entries  # the model in memory says what its file says
    onnx.checker.check_model(str(path))
    got, expected = onnx.load(str(path)), ir.to_proto(model)  # the model serialized with its entries
    assert {e.key: e.value for e in expected.metadata_props} == entries
    for proto in (got, expected):
        proto.ClearField("metadata_props")
    assert got == expected  # the rest as written: the model parses as before
    np.testing.assert_array_equal(_run(path)[0], _run(expected.SerializeToString())[0])
    reloaded, _ = load_model(path)  # the package's own reader (the file walked, not parsed whole)
    assert reloaded.metadata_props == entries


def test_a_model_folded_again_has_one_entry_per_key(folded, tmp_path):
    """An earlier fold's entries are dropped before the output is written; this fold's replace them."""
    first = tmp_path / "first.onnx"
    staged = StagedModel(_unsaid(folded), first)
    staged.commit({**provenance(folded.report, OPTIONS), PREFIX + "folded": "an earlier fold"})
    again = _model()
    again.metadata_props.extend(
        onnx.load(str(first)).metadata_props
    )  # the original, as if folded by an earlier version
    onnx.helper.set_model_props(again, {**{e.key: e.value for e in again.metadata_props}, "author": "someone"})
    result = onnx_lnfold.fold(again, options=OPTIONS)
    said = provenance(result.report, OPTIONS)
    assert said[PREFIX + "folded"] != "an earlier fold"
    assert result.model.metadata_props == {"author": "someone", **said}  # this fold's, in place of the earlier
    second = StagedModel(result.model, tmp_path / "second.onnx").commit(said)  # held already: not appended again
    keys = [key for key, _ in _entries(second)]
    assert sorted(keys) == sorted({*provenance(result.report, OPTIONS), "author"})  # each once
    assert dict(_entries(second))[PREFIX + "folded"].startswith("1 of 2 LayerNorms folded")
    onnx.checker.check_model(str(second))
    _run(second)


def test_an_entry_the_written_file_holds_with_another_value_is_refused_and_nothing_is_written(folded, tmp_path):
    model = _unsaid(folded)
    model.metadata_props[PREFIX + "version"] = "0.0.1"
    staged = StagedModel(model, tmp_path / "out.onnx")
    with pytest.raises(ValueError, match="already holds 'onnx_lnfold.version' with another value"):
        staged.commit(provenance(folded.report, OPTIONS))
    assert list(tmp_path.iterdir()) == []  # neither the output nor its staging folder
    assert model.metadata_props == {PREFIX + "version": "0.0.1"}


def test_an_entry_the_written_file_holds_with_the_same_value_is_not_written_twice(folded, tmp_path):
    entries = provenance(folded.report, OPTIONS)
    model = _unsaid(folded)
    model.metadata_props[PREFIX + "version"] = entries[PREFIX + "version"]
    path = StagedModel(model, tmp_path / "out.onnx").commit(entries)
    assert sorted(_entries(path)) == sorted(entries.items())
    onnx.checker.check_model(str(path))


def test_an_unchanged_copy_stays_the_input_bytes_and_takes_no_metadata(tmp_path):
    source = tmp_path / "in.onnx"
    onnx.save(_model(), source)
    model, _ = load_model(source)
    staged = StagedModel(model, tmp_path / "out.onnx", copy_of=source)
    with pytest.raises(ValueError, match="unchanged copy"):
        staged.commit({PREFIX + "version": onnx_lnfold.__version__})
    assert not (tmp_path / "out.onnx").exists()
    staged = StagedModel(model, tmp_path / "out.onnx", copy_of=source)
    assert staged.commit().read_bytes() == source.read_bytes()


def test_external_data_keeps_its_reference_and_bytes(tmp_path):
    source = tmp_path / "in.onnx"
    onnx.save(
        _model(), source, save_as_external_data=True, all_tensors_to_one_file=True, location="in.data", size_threshold=0
    )
    result = onnx_lnfold.fold(source, options=OPTIONS)
    staged = StagedModel(result.model, tmp_path / "out.onnx", rebind=True)
    assert staged.data_name == "out.onnx.data"
    weights = staged.data_path.read_bytes()
    entries = provenance(result.report, OPTIONS)
    path = staged.commit(entries)
    assert (tmp_path / "out.onnx.data").read_bytes() == weights
    assert sorted(_entries(path)) == sorted(entries.items())
    proto = onnx.load(str(path), load_external_data=False)
    locations = {e.value for t in proto.graph.initializer for e in t.external_data if e.key == "location"}
    assert locations == {"out.onnx.data"}
    onnx.checker.check_model(str(path))
    np.testing.assert_allclose(_run(path)[0], _run(source)[0], rtol=1e-4, atol=1e-5)
    reloaded, _ = load_model(path)
    assert reloaded.metadata_props == entries


def test_streamed_weights_are_read_back_from_the_committed_file(tmp_path):
    """A one-file output streams its large weights and, with `rebind`, the model reads them from
    the committed file by offset: the entries appended after them move none."""
    d = 256  # 256 x 256 float32: streamed
    g = Graph(seed=5)
    x = g.input("x", ["batch", "seq", d])
    g.output(g.ln(g.linear(x, d, d, "proj"), d, "ln"), ["batch", "seq", d])
    result = onnx_lnfold.fold(g.model(), options=OPTIONS)
    before = {name: v.const_value.numpy().copy() for name, v in result.model.graph.initializers.items()}
    staged = StagedModel(result.model, tmp_path / "out.onnx", rebind=True)
    path = staged.commit(provenance(result.report, OPTIONS))
    after = {name: v.const_value for name, v in result.model.graph.initializers.items()}
    assert any(type(t).__name__ == "FileRegionTensor" for t in after.values())  # read from the file
    for name, values in before.items():
        np.testing.assert_array_equal(after[name].numpy(), values)
    onnx.checker.check_model(str(path))
