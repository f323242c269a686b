"""`python -m benchmarks.fold_then_quantize` cannot rot between its runs on the trained models: here
it runs end to end on the committed models/bert.onnx (two kinds, two input sets, the timing at its
smallest), and a kind that finds nothing to quantize is reported as skipped. No timing is asserted."""

from __future__ import annotations

import json
import math

import pytest
from onnx import TensorProto, helper

from benchmarks.fold_then_quantize import KINDS, main, quantize


@pytest.fixture(scope="module")
def bert_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("fold_then_quantize")
    main(
        [
            "--models",
            "bert",
            "--kinds",
            "dynamic_int8,matmul_nbits_int4",
            "--sets",
            "2",
            "--calibration",
            "2",
            "--processes",
            "2",
            "--rounds",
            "2",
            "--out",
            str(out),
        ]
    )
    return out, json.loads((out / "fold_then_quantize.json").read_text())["models"][0]


def test_every_kind_is_measured_against_the_fp32_original(bert_run):
    _, result = bert_run
    fold = result["fold"]
    # bert's defaults keep every LN: the fold quantized is then the one with fold_costly
    assert fold["options"] == "fold_costly" and fold["folded"] > 0 and fold["verification"] == "passed"
    assert fold["fp32"]["max rel (worst output)"]["max"] < 1e-4
    assert [k["kind"] for k in result["kinds"]] == ["dynamic_int8", "matmul_nbits_int4"]
    for kind in result["kinds"]:
        for variant in ("quantized_original", "quantized_folded"):
            rel = kind[variant]["max rel (worst output)"]
            assert len(rel["per_set"]) == 2 and all(math.isfinite(v) for v in rel["per_set"])
            assert 1e-4 < rel["median"] < 0.5  # quantized, and still the model
        # the difference is taken set by set, both against the same fp32 outputs
        original = kind["quantized_original"]["cosine (worst output)"]["per_set"]
        folded = kind["quantized_folded"]["cosine (worst output)"]["per_set"]
        diff = kind["folded_minus_original"]["cosine (worst output)"]
        assert diff["min"] == pytest.approx(min(f - o for f, o in zip(folded, original)))
        assert kind["speed"]["processes"] == 2 and kind["speed"]["median_ms"]["folded"] > 0


def test_the_report_has_a_row_per_kind_and_measure(bert_run):
    out, _ = bert_run
    text = (out / "README.md").read_text()
    for kind in ("dynamic_int8", "matmul_nbits_int4"):
        assert f"| bert | {kind} | cosine (worst output) |" in text
        assert f"| bert | {kind} | max rel (worst output) |" in text
    assert "| bert | fold_costly |" in text


def test_a_model_without_the_op_a_kind_quantizes_is_skipped(tmp_path):
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    source = tmp_path / "relu.onnx"
    source.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    assert "MatMulNBits" in KINDS["matmul_nbits_int4"].writes
    with pytest.raises(LookupError, match="no op it quantizes"):
        quantize("matmul_nbits_int4", source, tmp_path / "relu.int4.onnx", [])


def test_a_run_of_some_models_replaces_their_rows_and_keeps_the_others(bert_run, tmp_path):
    out, result = bert_run
    previous = json.loads((out / "fold_then_quantize.json").read_text())
    other = {k: v for k, v in result.items() if k != "run"} | {"model": "other_model"}  # as written before runs
    (tmp_path / "fold_then_quantize.json").write_text(json.dumps(previous | {"models": [other, result]}))
    main(["--models", "bert", "--kinds", "dynamic_int8", "--sets", "2", "--calibration", "2", "--processes", "0",
          "--out", str(tmp_path)])  # fmt: skip
    kept, rerun = json.loads((tmp_path / "fold_then_quantize.json").read_text())["models"]
    assert kept["model"] == "other_model" and kept["kinds"] == other["kinds"]
    assert kept["run"]["date"] == previous["machine"]["date"] and kept["run"]["processes"] == 2
    assert rerun["model"] == "bert" and [k["kind"] for k in rerun["kinds"]] == ["dynamic_int8"]
    assert rerun["run"]["processes"] == 0 and "speed" not in rerun["kinds"][0]
    text = (tmp_path / "README.md").read_text()
    assert "| other_model | matmul_nbits_int4 | cosine (worst output) |" in text
    assert "| bert | matmul_nbits_int4 |" not in text
    assert f"(run {previous['machine']['date']}," in text  # each model's run, the rows being from two
