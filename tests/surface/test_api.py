"""The Python API: fold() on every kind of input, the onnx-ir pass, beta placement, dtypes, idempotence."""

import sys

import numpy as np
import onnx
import onnx_ir as ir
import onnx_ir.passes.common as common_passes
import pytest

import onnx_lnfold

from conftest import MODELS
from graphs import Graph, assert_equivalent, fold_checked, ops


def _pre_ln(dtype=np.float32, seed=0, act="Gelu") -> onnx.ModelProto:
    g = Graph(seed=seed, dtype=dtype)
    ids = g.input("ids", ["b", "s"], elem_type=onnx.TensorProto.INT64)
    h0 = g.node("Gather", [g.const("wte", (30, 16)), ids], name="embed")
    h1 = g.node("Add", [h0, g.linear(g.node(act, [g.linear(g.ln(h0, 16, "ln1"), 16, 32, "fc")]), 32, 16, "proj")])
    g.output(g.ln(h1, 16, "ln_f"))
    return g.model(opset=20)


def test_fold_accepts_a_path_a_proto_and_an_ir_model(tmp_path):
    proto = _pre_ln()
    path = tmp_path / "m.onnx"
    onnx.save(proto, path)
    for source in (path, str(path), proto, ir.serde.deserialize_model(proto)):
        result = onnx_lnfold.fold(source)
        assert len(result.plan.folded) == 2
        assert result.report.verification.status == "passed"


def test_callers_objects_are_never_mutated():
    proto = _pre_ln()
    before = proto.SerializeToString()
    onnx_lnfold.fold(proto)
    assert proto.SerializeToString() == before
    model = ir.serde.deserialize_model(proto)
    onnx_lnfold.fold(model)
    assert sum(n.op_type == "LayerNormalization" for n in model.graph) == 2
    assert not np.allclose(model.graph.initializers["wte"].const_value.numpy().mean(axis=1), 0)


def test_pass_composes_in_a_pass_manager():
    model = ir.serde.deserialize_model(_pre_ln())
    fold_pass = onnx_lnfold.LnFoldPass()
    manager = ir.passes.PassManager([fold_pass, common_passes.RemoveUnusedNodesPass()])
    result = manager(model)
    assert result.modified
    assert len(fold_pass.plan.folded) == 2
    assert assert_equivalent(_pre_ln(), ir.to_proto(result.model)) < 1e-5
    # A second run has nothing left to do.
    assert not onnx_lnfold.LnFoldPass()(result.model).modified


def test_folding_twice_changes_nothing_the_second_time():
    first = onnx_lnfold.fold(MODELS / "gpt2.onnx").model_proto
    second = onnx_lnfold.fold(first)
    assert not second.plan.folded and not second.plan.edits
    assert second.model_proto.SerializeToString() == first.SerializeToString()


def test_same_input_gives_byte_identical_output():
    a = onnx_lnfold.fold(MODELS / "vit.onnx", verify=False).model_proto.SerializeToString()
    b = onnx_lnfold.fold(MODELS / "vit.onnx", verify=False).model_proto.SerializeToString()
    assert a == b


def test_beta_folds_into_linear_consumers_or_stays_an_add():
    result = fold_checked(_pre_ln(), folded=2)
    assert result.plan.decision_for("ln1").beta == "consumers"  # ln1 feeds only fc (MatMul + bias Add)
    assert result.plan.decision_for("ln1").beta_sites == ("fc/matmul: its bias",)
    # ln_f is a graph output: its beta stays an Add. It folds all the same: ORT runs the original's
    # residual Add + ln_f as SkipLayerNormalization, which costs more than the residual Add,
    # SimplifiedLayerNormalization and beta's Add together (_costs); `auto` leaves that Add
    # unfused, SkipSimplifiedLayerNormalization costing more than Add + SimplifiedLayerNormalization.
    assert result.plan.decision_for("ln_f").beta == "add"
    assert result.plan.decision_for("ln_f").rewrite == "SimplifiedLayerNormalization"
    assert ops(result.model_proto)["Add"] == ops(_pre_ln())["Add"] + 1


def test_fuse_residual_always_takes_the_residual_and_its_bias_add():
    result = onnx_lnfold.fold(_pre_ln(), fuse_residual="always")
    assert result.report.verification.status == "passed"
    assert_equivalent(_pre_ln(), result.model_proto)
    # ln_f's beta Add is new; its residual Add became SkipSimplifiedLayerNormalization's sum and
    # the projection's bias Add before it the op's bias input (as ORT's own fusion does).
    assert ops(result.model_proto)["Add"] == ops(_pre_ln())["Add"] - 1
    (skip,) = [n for n in result.model_proto.graph.node if n.op_type == "SkipSimplifiedLayerNormalization"]
    assert list(skip.input)[3] == "proj.bias"


def test_beta_folds_into_gemm_bias_even_when_absent():
    """A Gemm without C gets one (where it costs less than beta's Add: a narrower output)."""
    g = Graph()
    x = g.input("x", [4, 8])
    h = g.node("Gemm", [x, g.const("w", (8, 384)), g.const("c", (384,))])
    n = g.ln(h, 384, "ln")
    g.output(g.node("Gemm", [n, g.const("w2", (6, 384))], transB=1, alpha=0.5, name="head"))
    result = fold_checked(g.model(), folded=1)
    assert result.plan.decision_for("ln").beta == "consumers"
    assert result.plan.decision_for("ln").beta_sites == ("head: a bias created for it",)
    head = next(n for n in result.model.graph if n.name == "head")
    assert len(head.inputs) == 3 and head.inputs[2].const_value is not None


@pytest.mark.parametrize("with_c", [True, False])
def test_beta_stays_an_add_before_a_gemm_that_ignores_its_bias(with_c):
    """Gemm with beta=0 ignores C: LN's beta cannot go there (found by review: a division by
    that zero raised ZeroDivisionError)."""
    g = Graph()
    x = g.input("x", [4, 8])
    n = g.ln(g.node("Gemm", [x, g.const("w", (8, 16)), g.const("c", (16,))]), 16, "ln")
    inputs = [n, g.const("w2", (16, 6))] + ([g.const("c2", (6,))] if with_c else [])
    g.output(g.node("Gemm", inputs, beta=0.0, name="head"))
    result = fold_checked(g.model(), folded=1)
    assert result.plan.decision_for("ln").beta == "add"
    # Left as an Add, beta costs more than the LN saves: by default the LN is kept.
    d = onnx_lnfold.analyze(g.model()).decision_for("ln")
    assert d.code == "costs-more" and "its beta would stay a separate Add over the LN's output (Gemm 'head' reads it)" in d.reason


@pytest.mark.parametrize("dtype,rtol", [(np.float16, 1e-2), (np.float64, 1e-4)])
def test_other_float_dtypes(dtype, rtol):
    # ORT has no float64 Gelu (Erf) kernel on CPU.
    result = fold_checked(_pre_ln(dtype=dtype, act="Relu"), folded=2, rtol=rtol)
    assert result.report.verification.rtol == rtol
    assert result.model.graph.initializers["wte"].const_value.dtype == ir.DataType.from_numpy(np.dtype(dtype))


def test_fold_without_onnxruntime_raises_unless_verification_is_declined(monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(onnx_lnfold.NotVerified, match=r"onnxruntime is not installed; pip install 'onnx_lnfold\[ort\]'"):
        onnx_lnfold.fold(_pre_ln())
    result = onnx_lnfold.fold(_pre_ln(), verify=False)
    assert len(result.plan.folded) == 2
    assert result.report.verification.status == "skipped"


def test_verification_failure_raises_instead_of_returning_a_model():
    with pytest.raises(onnx_lnfold.VerificationFailed) as info:
        onnx_lnfold.fold(_pre_ln(), rtol=1e-12)
    assert info.value.report.verification.status == "failed"
    assert "> rtol 1e-12" in str(info.value)


def test_node_order_and_value_info_are_kept():
    original = onnx.load(MODELS / "gpt2.onnx")
    result = onnx_lnfold.fold(original, fuse_residual="always")
    folded = result.model_proto
    new_ops = {"SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization"}
    fused = {d.residual_add for d in result.plan.folded if d.residual_add}
    assert len(fused) == 4
    # LNs, and the residual Adds that became SkipSimplifiedLayerNormalization, are replaced in place;
    # every other node keeps its place (identified by its first output).
    before = [
        n.output[0]
        for n in original.graph.node
        if n.op_type != "LayerNormalization" and n.name not in fused
    ]
    inserted = {c.new_name for c in result.plan.centerings} | {f"{c.tensor}.mean" for c in result.plan.centerings}
    inserted |= {e.new_name for e in result.plan.edits if e.means_name}  # a derived table's Sub
    after = [
        n.output[0]
        for n in folded.graph.node
        if n.op_type not in new_ops and not n.name.endswith("/beta") and n.output[0] not in inserted
    ]
    assert after == before
    info_before = {v.name for v in original.graph.value_info}
    info_after = {v.name: v for v in folded.graph.value_info}
    alive = {o for n in folded.graph.node for o in n.output} - {o.name for o in folded.graph.output}
    assert info_before & alive <= set(info_after)
    assert len(info_before & alive) > 100
    for node in folded.graph.node:
        for out in filter(None, node.output):
            if node.op_type in new_ops or node.name.endswith("/beta"):
                assert out in info_after and info_after[out].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
                assert len(info_after[out].type.tensor_type.shape.dim) == 3


def test_emitted_op_attributes():
    folded = onnx_lnfold.fold(MODELS / "gpt2.onnx", verify=False, fuse_residual="always").model_proto
    rms = [n for n in folded.graph.node if n.op_type == "SimplifiedLayerNormalization"]
    skip = [n for n in folded.graph.node if n.op_type == "SkipSimplifiedLayerNormalization"]
    assert len(rms) == 1 and len(skip) == 4
    for node in rms:
        assert node.domain == ""
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert attrs["axis"] == -1 and attrs["stash_type"] == 1  # negative: OpenVINO refuses a non-negative one
        assert attrs["epsilon"] == pytest.approx(1e-5)
    for node in skip:
        assert node.domain == "com.microsoft"
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert attrs["epsilon"] == pytest.approx(1e-5)  # written: the op's default is 1e-12
    # Where the residual sum feeds the next block, output 3 carries it; outputs 1 and 2 stay empty.
    with_sum = [n for n in skip if len(n.output) == 4]
    assert len(with_sum) == 3 and all(n.output[1] == n.output[2] == "" for n in with_sum)


def test_report_serializes_everything_a_pipeline_needs():
    report = onnx_lnfold.fold(MODELS / "gpt2.onnx").report.to_dict()
    assert report["folded"] == 5 and report["kept"] == 0
    first = report["decisions"][0]
    assert set(first) >= {"node", "op_type", "status", "reason", "beta", "beta_sites", "stage", "code"}
    assert first["beta"] == "consumers" and first["beta_sites"] == ["node_addmm: its bias"]
    assert report["ops_before"]["LayerNormalization"] == 5 and "LayerNormalization" not in report["ops_after"]
    assert report["verification"]["status"] == "passed" and report["verification"]["max_rel_diff"] < 1e-5
    assert report["untied_bytes"] == 2048 and len(report["edits"]) == 10  # the tied table derived: its row means
    # BERT (post-LN): the embeddings LN would keep its beta as an Add: kept, for its cost. Each
    # other LN reads the one before through a residual Add that ORT fuses with it into
    # SkipLayerNormalization, whose CPU kernel costs more than an explicit centering of that LN's
    # output, the Add, SimplifiedLayerNormalization and beta's Add together: each folds so.
    bert = onnx_lnfold.fold(MODELS / "bert.onnx").report.to_dict()
    assert bert["folded"] == 4 and bert["kept"] == 1 and len(bert["centerings"]) == 4
    assert (bert["decisions"][0]["stage"], bert["decisions"][0]["code"]) == ("cost", "costs-more")


# --- issue 11: analyze() takes what fold() takes; Verification.passed; the package ------------


def test_analyze_accepts_a_path_a_proto_and_an_ir_model(tmp_path):
    proto = _pre_ln()
    path = tmp_path / "m.onnx"
    onnx.save(proto, path)
    model = ir.serde.deserialize_model(proto)
    for source in (path, str(path), proto, model):
        plan = onnx_lnfold.analyze(source)
        assert [d.node for d in plan.folded] == ["ln1", "ln_f"] and len(plan.edits) == 3
    assert sum(n.op_type == "LayerNormalization" for n in model.graph) == 2  # read, not changed
    assert proto.SerializeToString() == onnx.load(path).SerializeToString()
    bert = onnx_lnfold.analyze(MODELS / "bert.onnx", auxiliary_centering=False)
    assert len(bert.folded) == 0 and [d.code for d in bert.kept][:2] == ["costs-more", "normalization-output"]


@pytest.mark.parametrize("bad,message", [(42, "got int"), ("no/such.onnx", "no such file")])
def test_analyze_bad_input_is_an_lnfold_error(bad, message):
    with pytest.raises(onnx_lnfold.LnFoldError, match=message):
        onnx_lnfold.analyze(bad)


def test_one_exception_family_under_lnfold_error(tmp_path):
    """`except LnFoldError` catches everything the tool refuses; each kind has its own class."""
    family = (onnx_lnfold.InvalidInput, onnx_lnfold.CannotWrite, onnx_lnfold.VerificationFailed, onnx_lnfold.NotVerified)
    assert all(issubclass(kind, onnx_lnfold.LnFoldError) for kind in family)
    assert issubclass(onnx_lnfold.NotVerified, onnx_lnfold.VerificationFailed)
    assert issubclass(onnx_lnfold.InvalidInput, ValueError)  # a bad option value is a ValueError too
    with pytest.raises(onnx_lnfold.InvalidInput, match="no such file"):
        onnx_lnfold.fold(tmp_path / "missing.onnx")
    with pytest.raises(onnx_lnfold.InvalidInput, match="unknown target 'rms'"):
        onnx_lnfold.FoldOptions(target="rms")
    result = onnx_lnfold.fold(_pre_ln(), verify=False)
    with pytest.raises(onnx_lnfold.CannotWrite, match="output folder does not exist"):
        result.save(tmp_path / "no" / "m.onnx")
    with pytest.raises(onnx_lnfold.LnFoldError) as info:  # a failed check, caught by the base
        onnx_lnfold.fold(_pre_ln(), rtol=1e-12)
    assert type(info.value) is onnx_lnfold.VerificationFailed and info.value.report.refused


def test_dir_lists_the_public_names_only():
    public = dir(onnx_lnfold)
    assert public == sorted([*onnx_lnfold.__all__, "__version__"])
    assert not {"Any", "TYPE_CHECKING", "annotations", "importlib"} & set(public)
    assert {"fold", "analyze", "FoldResult", "LnFoldError", "InvalidInput"} <= set(public)


def test_verification_passed_beside_status():
    result = onnx_lnfold.fold(_pre_ln())
    assert result.report.verification.passed is True and result.report.verification.status == "passed"
    assert onnx_lnfold.fold(_pre_ln(), verify=False).report.verification.passed is False
    with pytest.raises(onnx_lnfold.VerificationFailed) as info:
        onnx_lnfold.fold(_pre_ln(), rtol=1e-12)
    assert info.value.report.verification.passed is False
    assert info.value.report.elapsed_s > 0


@pytest.mark.parametrize(
    "keywords,sentence",
    [
        ({"rtol": -1}, "rtol must be a positive number, not -1"),
        ({"rtol": float("nan")}, "rtol must be a positive number, not nan"),
        ({"float64_budget": -1}, "float64_budget must be a number of seconds, 0 or more, not -1"),
    ],
)
def test_check_settings_out_of_range_are_refused_before_the_load(keywords, sentence, tmp_path):
    """Validated once, for every surface, before any work: the path does not even exist."""
    with pytest.raises(onnx_lnfold.InvalidInput) as refused:
        onnx_lnfold.fold(tmp_path / "absent.onnx", **keywords)
    assert str(refused.value) == sentence


def test_fold_writes_its_output_once_it_passed_and_says_what_was_done(tmp_path):
    """`fold(output=)` stages the fold beside its destination, checks the staged file and commits
    it: the report records the write, and the model says what the fold did in `metadata_props`."""
    path = tmp_path / "m.onnx"
    onnx.save(_pre_ln(), path)
    out = tmp_path / "m.lnfold.onnx"
    result = onnx_lnfold.fold(path, output=out)
    assert result.report.output == str(out) and result.report.size_after == out.stat().st_size
    written = {p.key: p.value for p in onnx.load(out).metadata_props}
    assert written["onnx_lnfold.verification"].startswith("passed: ")
    assert written["onnx_lnfold.folded"].startswith(f"{len(result.plan.folded)} of {len(result.plan.decisions)} ")
    assert dict(result.model.metadata_props) == written
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.lnfold.onnx", "m.onnx"]  # nothing staged left


def test_fold_writes_nothing_it_refuses(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(_pre_ln(), path)
    out = tmp_path / "m.lnfold.onnx"
    with pytest.raises(onnx_lnfold.VerificationFailed) as refused:
        onnx_lnfold.fold(path, output=out, rtol=1e-30)
    assert refused.value.report.output is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


@pytest.mark.parametrize("setting", [{"rtol": -1}, {"rtol": float("nan")}, {"float64_budget": -1}, {"input_shapes": {"x": (2, -1)}}])
def test_a_setting_out_of_range_is_refused_before_any_work(tmp_path, setting):
    missing = tmp_path / "not-there.onnx"  # not loaded: the request is refused first
    with pytest.raises(onnx_lnfold.InvalidInput, match=next(iter(setting))):
        onnx_lnfold.fold(missing, **setting)


def test_a_setting_that_does_not_fit_the_model_is_named_as_the_api_spells_it(tmp_path):
    """The command line says `--input-shape` and `--inputs` (tests/surface/test_cli.py); `fold()`
    and `analyze()` say the keywords they were given."""
    path = tmp_path / "m.onnx"
    onnx.save(_pre_ln(), path)
    with pytest.raises(onnx_lnfold.InvalidInput, match=r"^input_shapes names no graph input: nope \(the graph inputs: ids\)$"):
        onnx_lnfold.fold(path, input_shapes={"nope": (1, 2)})
    with pytest.raises(onnx_lnfold.InvalidInput, match=r"^inputs: 'ids' has rank 3, the graph input has rank 2$"):
        onnx_lnfold.analyze(path, inputs={"ids": np.zeros((1, 2, 3), np.int64)})
