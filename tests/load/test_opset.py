"""`--target onnx` at any opset: the model converted to opset 23 by ONNX's version converter
(`load.opset`, docs/DESIGN.md section 4), checked with the fold, or refused naming the op."""

import re
import shutil

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import helper, numpy_helper

import onnx_lnfold
from onnx_lnfold._cli import EXIT_OK, EXIT_USAGE, main
from onnx_lnfold.load.opset import convert_opset

from conftest import MODELS
from graphs import Graph, decomposed_ln, ops


def test_onnx_target_converts_a_committed_opset_18_model(tmp_path):
    """models/gpt2.onnx (dynamo, opset 18): converted to 23, every LN RMSNormalization, verified
    against the opset-18 original, passing the checker; the exporter's node metadata kept."""
    source = onnx.load(MODELS / "gpt2.onnx")
    assert {o.domain: o.version for o in source.opset_import}[""] == 18
    result = onnx_lnfold.fold(MODELS / "gpt2.onnx", target="onnx")
    plan = result.plan
    assert (plan.converted_from, plan.converted_to) == (18, 23)
    assert plan.to_dict()["opset_converted"] == {"from": 18, "to": 23, "by": "onnx.version_converter"}
    assert result.report.verification.status == "passed"
    folded = result.model_proto
    assert {o.domain: o.version for o in folded.opset_import}[""] == 23 and folded.ir_version >= 11
    counts = ops(folded)
    assert counts.get("RMSNormalization") == 5 and "LayerNormalization" not in counts
    onnx.checker.check_model(folded, full_check=True)
    # What the converter drops and the fold keeps: each node's metadata (the exporter's stack traces).
    kept = {n.name: len(n.metadata_props) for n in folded.graph.node}
    assert all(kept[n.name] == len(n.metadata_props) for n in source.graph.node if n.name in kept)
    text = result.report.format_text()
    assert "Opset: 18 -> 23, converted by onnx.version_converter for --target onnx" in text
    # The command line writes the same model.
    out = tmp_path / "gpt2.rms.onnx"
    assert main([str(MODELS / "gpt2.onnx"), "-o", str(out), "--target", "onnx", "-q"]) == EXIT_OK
    assert ops(onnx.load(out)).get("RMSNormalization") == 5


def test_conversion_keeps_the_weights_it_was_given():
    """No weight is read or copied: the converted model's initializers are the caller's tensors."""
    model = ir.load(str(MODELS / "gpt2.onnx"))
    before = {name: value.const_value for name, value in model.graph.initializers.items()}
    converted = convert_opset(model, 23, "test")
    assert converted.opset_imports[""] == 23 and model.opset_imports[""] == 18  # the caller's unchanged
    large = [name for name, t in before.items() if t.nbytes > 1024]
    assert large and all(converted.graph.initializers[name].const_value is before[name] for name in large)
    assert {name: value.const_value for name, value in model.graph.initializers.items()} == before


def test_a_model_without_layer_norms_is_not_converted(tmp_path):
    g = Graph()
    g.output(g.linear(g.input("x", ["b", 8]), 8, 4, "proj"))
    path = tmp_path / "m.onnx"
    onnx.save(g.model(opset=18), path)
    result = onnx_lnfold.fold(path, target="onnx")
    assert result.plan.converted_from is None and result.model.opset_imports[""] == 18


def test_a_missing_domain_import_is_added_for_the_converter():
    """An ORT-optimizer graph naming com.microsoft ops without that domain's import (which ONNX
    Runtime accepts, the converter's shape inference does not): converted with the import added."""
    model = onnx.load(MODELS / "gpt2_eager_ort_opt0.onnx")
    assert "com.microsoft" not in {o.domain for o in model.opset_import}
    result = onnx_lnfold.fold(MODELS / "gpt2_eager_ort_opt0.onnx", target="onnx")
    assert result.plan.converted_from == 17 and result.report.verification.status == "passed"
    assert {o.domain: o.version for o in result.model_proto.opset_import}["com.microsoft"] == 1


def _blocked_model() -> onnx.ModelProto:
    """Opset 7: a decomposed LN over a linear layer, and a BatchNormalization with spatial=0,
    which the converter cannot take to opset 9 ("Attribute spatial must have value 1")."""
    g = Graph()
    h = g.linear(g.input("x", [2, 4, 8]), 8, 16, "proj")
    g.output(decomposed_ln(g, h, 16, "ln", opset=7))
    # spatial=0: one statistic per element of [C, H, W]
    stats = [numpy_helper.from_array(np.full((3, 4, 4), v, np.float32), f"bn.{k}") for k, v in zip("sbmv", (1.5, 0.1, 0.2, 2.0))]
    g.inits += stats
    y = g.input("image", [1, 3, 4, 4])
    g.nodes.append(helper.make_node("BatchNormalization", [y, *(t.name for t in stats)], ["bn_out"], name="bn", spatial=0))
    g.output("bn_out")
    return g.model(opset=7)


BLOCKED = (
    "{target} writes RMSNormalization (opset 23); this model's default opset is 7, and ONNX's version "
    "converter cannot convert node 'bn' (BatchNormalization): Attribute spatial must have value 1; use another "
    "target, or change that node first"
)


def test_a_blocked_conversion_names_the_op_in_one_line(tmp_path, capsys):
    """The refusal names the option as each surface spells it: `target='onnx'` through the API,
    `--target onnx` on the command line."""
    model = _blocked_model()
    api, cli = BLOCKED.replace("{target}", "target='onnx'"), BLOCKED.replace("{target}", "--target onnx")
    with pytest.raises(onnx_lnfold.InvalidInput, match=f"^{re.escape(api)}$"):
        onnx_lnfold.fold(model, target="onnx")
    with pytest.raises(onnx_lnfold.InvalidInput, match=f"^{re.escape(api)}$"):
        onnx_lnfold.analyze(model, target="onnx")
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    assert main([str(path), "--target", "onnx"]) == EXIT_USAGE
    assert capsys.readouterr().err == f"onnx_lnfold: error: {cli}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]  # nothing written
    ir_model = ir.serde.deserialize_model(model)
    with pytest.raises(ir.passes.PreconditionError, match=re.escape(api)):
        onnx_lnfold.LnFoldPass(target="onnx")(ir_model)
    assert [n.op_type for n in ir_model.graph].count("BatchNormalization") == 1  # changed nothing
    # The default target folds the same model at its own opset.
    assert onnx_lnfold.fold(model, fold_costly=True).plan.folded


def test_the_pass_converts_in_place():
    model = ir.load(str(MODELS / "gpt2.onnx"))
    fold_pass = onnx_lnfold.LnFoldPass(target="onnx")
    result = ir.passes.PassManager([fold_pass])(model)
    assert result.modified and result.model is model and model.opset_imports[""] == 23
    assert [n.op_type for n in model.graph].count("RMSNormalization") == 5
    assert (fold_pass.plan.converted_from, fold_pass.plan.converted_to) == (18, 23)


def test_external_data_stays_external(tmp_path):
    """A model with its weights in a data file converts and folds with them left there."""
    src = tmp_path / "src"
    src.mkdir()
    model = onnx.load(MODELS / "gpt2.onnx")
    onnx.save(model, src / "gpt2.onnx", save_as_external_data=True, location="gpt2.onnx.data", size_threshold=1024)
    out = tmp_path / "out" / "gpt2.rms.onnx"
    out.parent.mkdir()
    assert main([str(src / "gpt2.onnx"), "-o", str(out), "--target", "onnx", "-q"]) == EXIT_OK
    assert (out.parent / "gpt2.rms.onnx.data").exists()
    folded = onnx.load(out, load_external_data=False)
    assert any(t.data_location == onnx.TensorProto.EXTERNAL for t in folded.graph.initializer)
    assert ops(folded).get("RMSNormalization") == 5
    shutil.rmtree(src)  # the output does not read the input's data file
    onnx.checker.check_model(str(out), full_check=True)
