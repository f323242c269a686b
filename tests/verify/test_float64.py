"""Verification judged in float64 (docs/DESIGN.md section 6): the float64 twins and the ops they
need (`verify.oracle.reference`), the judgment itself (a fold exact in float64 passes where ONNX Runtime's own
float32 noise exceeds the tolerance; a wrong fold smaller than that noise is refused), the
fallback when no float64 run is possible, and the realistic-scale inputs.
"""

from __future__ import annotations

import json
import math

import numpy as np
import onnx
import onnx.reference
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

import onnx_lnfold
from onnx_lnfold.apply import centering
from onnx_lnfold.feeds.sets import verification_input_sets
from onnx_lnfold.verify import passes
from onnx_lnfold.verify.oracle.reference import Float64Model, Float64Unavailable
from onnx_lnfold.verify.oracle.shadow import float64_twin
from onnx_lnfold.verify.readback import ReadBack
from onnx_lnfold.verify.sessions import run_model
from onnx_lnfold.verify.verdict import EXACT_RTOL, FLOAT64, SENSITIVITY

from conftest import MODELS
from graphs import Graph
from helpers import fold_with_a_wrong_epsilon, run_cli

F, D = TensorProto.FLOAT, TensorProto.DOUBLE
MS = "com.microsoft"


# --------------------------------------------------------------------------- ONNX Runtime's ops
def _one_node(op: str, inputs: dict[str, np.ndarray], n_out: int = 1, domain: str = "", opset: int = 18, **attrs):
    """A model of one `op` node over float32 graph inputs, its outputs `y0`, `y1`, ... untyped."""
    outputs = [f"y{i}" for i in range(n_out)]
    node = helper.make_node(op, list(inputs), outputs, domain=domain, **attrs)
    graph = helper.make_graph(
        [node],
        op,
        [helper.make_tensor_value_info(name, F, list(a.shape)) for name, a in inputs.items()],
        [helper.make_tensor_value_info(name, F, None) for name in outputs],
    )
    opsets = [helper.make_opsetid("", opset)] + ([helper.make_opsetid(MS, 1)] if domain == MS else [])
    return helper.make_model(graph, opset_imports=opsets, ir_version=9)


RNG = np.random.default_rng(11)
X = RNG.standard_normal((2, 5, 16)).astype(np.float32) + 0.5
SKIP = RNG.standard_normal((2, 5, 16)).astype(np.float32)
VEC = {name: RNG.standard_normal(16).astype(np.float32) for name in ("gamma", "beta", "bias")}

ORT_OPS = {
    "SimplifiedLayerNormalization": ("", {"x": X, "gamma": VEC["gamma"]}, 2, {"axis": -1, "epsilon": 1e-5}),
    "SkipSimplifiedLayerNormalization": (MS, {"x": X, "skip": SKIP, "gamma": VEC["gamma"], "bias": VEC["bias"]}, 4, {"epsilon": 1e-5}),
    "SkipLayerNormalization": (MS, {"x": X, "skip": SKIP, "gamma": VEC["gamma"], "beta": VEC["beta"], "bias": VEC["bias"]}, 4, {"epsilon": 1e-5}),
    "FastGelu": (MS, {"x": X, "bias": VEC["bias"]}, 1, {}),
    "BiasGelu": (MS, {"x": X, "bias": VEC["bias"]}, 1, {}),
    "Gelu": (MS, {"x": X}, 1, {}),
    "QuickGelu": (MS, {"x": X}, 1, {"alpha": 1.5}),
}  # fmt: skip


@pytest.mark.parametrize("op", sorted(ORT_OPS))
def test_onnx_runtime_ops_in_float64_match_its_kernels(op):
    """Each OpRun computes what ONNX Runtime's CPU kernel computes (its float32 run is one rounding
    away), in float64: outputs in double, and every output the kernel fills."""
    domain, inputs, n_out, attrs = ORT_OPS[op]
    model = _one_node(op, inputs, n_out, domain, **attrs)
    ort = run_model(model.SerializeToString(), inputs)
    ours = Float64Model(model).run(inputs)
    for name, value in ort.items():
        if value.size == 0 or (op.startswith("Skip") and name in ("y1", "y2")):
            continue  # the kernel leaves the mean and inv_std_var outputs unfilled
        assert ours[name].dtype == np.float64 and ours[name].shape == value.shape, name
        np.testing.assert_allclose(ours[name], value, rtol=0, atol=3e-6 * np.abs(value).max())
    if op.startswith("Skip"):  # all four outputs are arrays: the evaluator binds each one
        np.testing.assert_allclose(ours["y3"], X.astype(np.float64) + SKIP + VEC["bias"], rtol=1e-12)
        assert all(isinstance(ours[f"y{i}"], np.ndarray) for i in range(4))


def test_standard_ops_the_reference_gets_wrong_in_float64():
    """Erf and Gelu (opset 20) in double, not through float32; GatherElements past 32 rows; a
    Loop without a condition input (it means true) stacks its scan outputs."""
    x = (RNG.standard_normal((3, 40)) * 2).astype(np.float32)
    erf = Float64Model(_one_node("Erf", {"x": x})).run({"x": x})["y0"]
    assert erf.dtype == np.float64
    np.testing.assert_array_equal(erf, np.vectorize(math.erf)(x.astype(np.float64)))
    for approximate in ("none", "tanh"):
        gelu = _one_node("Gelu", {"x": x}, opset=20, approximate=approximate)
        ours = Float64Model(gelu).run({"x": x})["y0"]
        np.testing.assert_allclose(ours, run_model(gelu.SerializeToString(), {"x": x})["y0"], atol=3e-6)
    table = RNG.standard_normal((40, 3)).astype(np.float32)
    idx = RNG.integers(-40, 40, (5, 3))
    model = _one_node("GatherElements", {"t": table}, axis=0)
    model.graph.input.append(helper.make_tensor_value_info("i", TensorProto.INT64, [5, 3]))
    model.graph.node[0].input.append("i")
    got = Float64Model(model).run({"t": table, "i": idx})["y0"]
    np.testing.assert_array_equal(got, run_model(model.SerializeToString(), {"t": table, "i": idx})["y0"])

    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Neg", ["v_in"], ["v_out"]),
         helper.make_node("Mul", ["x", "v_in"], ["scan"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []), helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_in", F, [3])],
        [helper.make_tensor_value_info(n, t, None) for n, t in (("cond_out", TensorProto.BOOL), ("v_out", F), ("scan", F))],
    )  # fmt: skip
    loop = helper.make_node("Loop", ["m", "", "v0"], ["v", "scans"], body=body)
    graph = helper.make_graph(
        [loop], "loop", [helper.make_tensor_value_info(n, t, s) for n, t, s in (("m", TensorProto.INT64, []), ("v0", F, [3]), ("x", F, [2, 3]))],
        [helper.make_tensor_value_info(n, F, None) for n in ("v", "scans")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)
    feeds = {"m": np.array(4), "v0": np.ones(3, np.float32), "x": RNG.standard_normal((2, 3)).astype(np.float32)}
    ort, ours = run_model(model.SerializeToString(), feeds), Float64Model(model).run(feeds)
    assert ours["scans"].shape == ort["scans"].shape == (4, 2, 3)
    np.testing.assert_allclose(ours["scans"], ort["scans"], rtol=1e-6)


def test_the_twin_is_float64_everywhere():
    """Float32 and float16 initializers, Constant value_float(s), a ConstantOfShape without a value,
    Cast targets, an If body and a model-local function: the twin computes all of it in double."""
    g = Graph()
    x = g.input("x", [2, 3])
    weight = g.node("Cast", [g.const("h", value=np.full(3, 1 / 3, np.float16), dtype=np.float16)], to=F)
    half = g.node("Cast", [g.node("Mul", [x, weight])], to=TensorProto.FLOAT16)  # no float16 rounding in the twin
    scalar = g.node("Constant", [], value_float=1 / 3)
    ones = g.node("ConstantOfShape", [g.ints("shape", [2, 3])])
    y = g.node("Add", [g.node("Add", [g.node("Cast", [half], to=F), scalar]), ones])
    branch = helper.make_graph(
        [helper.make_node("Constant", [], ["third"], value_floats=[1 / 3]), helper.make_node("Mul", [y, "third"], ["b"])],
        "then", [], [helper.make_tensor_value_info("b", F, None)],
    )  # fmt: skip
    out = g.node("If", [g.input("flag", [], TensorProto.BOOL)], then_branch=branch, else_branch=branch)
    g.output(g.node("Erfish", [out], domain="local"))
    model = g.model()
    model.opset_import.append(helper.make_opsetid("local", 1))
    model.functions.append(
        helper.make_function("local", "Erfish", ["a"], ["b"], [helper.make_node("Erf", ["a"], ["b"])], [helper.make_opsetid("", 18)])
    )
    twin = float64_twin(model)
    assert {t.data_type for t in twin.graph.initializer} - {TensorProto.INT64} == {D}
    assert [a.i for n in twin.graph.node for a in n.attribute if a.name == "to"] == [D, D, D]
    constants = [n for n in twin.graph.node if n.op_type in ("Constant", "ConstantOfShape")]
    assert [(n.attribute[0].name, n.attribute[0].t.data_type) for n in constants] == [("value", D), ("value", D)]
    feeds = {"x": RNG.standard_normal((2, 3)).astype(np.float32), "flag": np.array(True)}
    got = Float64Model(model).run(feeds)[g.outputs[0].name]
    x64, third = feeds["x"].astype(np.float64), float(np.float32(1 / 3))
    expected = np.vectorize(math.erf)((x64 * float(np.float16(1 / 3)) + third + 0) * third)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, expected, rtol=1e-15)  # no float32 anywhere on the way


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_an_embedding_table_is_read_only_where_gathered(tmp_path, dtype, monkeypatch):
    """A Gather of a float table, as an embedding reads it: the twin widens only the rows gathered
    (negative indices counting from the end, as in ONNX), on every input set at once, and never the
    whole table; its outputs are the widened table's rows exactly."""
    from onnx_lnfold.verify.oracle import reference

    table = RNG.standard_normal((50, 8)).astype(dtype)
    g = Graph()
    ids = g.input("ids", ["b", "s"], TensorProto.INT64)
    rows = g.node("Gather", [g.const("wte", value=table, dtype=dtype), ids], name="embed")
    g.output(g.node("Cast", [rows], to=F))
    onnx.save(g.model(), tmp_path / "m.onnx", save_as_external_data=True, size_threshold=0)
    widened = []
    read_whole = reference.Float64Model._weight
    monkeypatch.setattr(
        reference.Float64Model, "_weight", lambda self, name, reading: widened.append(name) or read_whole(self, name, reading)
    )
    sets = [{"ids": np.array([[0, 3, -1]], np.int64)}, {"ids": np.array([[49, 7, 7]], np.int64)}]
    got = Float64Model(str(tmp_path / "m.onnx")).run_many(sets)
    for feeds, out in zip(sets, got):
        [value] = out.values()
        assert value.dtype == np.float64
        np.testing.assert_array_equal(value, table.astype(np.float64)[feeds["ids"]])
    assert "wte" not in widened


def test_a_centered_table_s_exact_reading_is_taken_only_at_the_gathered_rows(tmp_path, monkeypatch):
    """The fold's exact reading of an embedding table it centered computes the exact values of the
    rows gathered, never the whole table in float64; they are the whole table's values there. Read
    as written, the same table (in memory, not yet written) gives its rounded values."""
    table = RNG.standard_normal((50, 8)).astype(np.float32)
    g = Graph()
    ids = g.input("ids", ["b", "s"], TensorProto.INT64)
    g.output(g.node("Gather", [g.const("wte", value=table), ids], name="embed"))
    onnx.save(g.model(), tmp_path / "m.onnx", save_as_external_data=True, size_threshold=0)
    model = ir.load(tmp_path / "m.onnx")
    exact = centering.CenteredTensor(model.graph.initializers["wte"].const_value, 1, "wte")
    whole, rounded = exact.exact_float64(), np.asarray(exact.numpy()).astype(np.float64)
    assert not np.array_equal(whole, rounded)
    model.graph.initializers["wte"].const_value = exact  # the fold in memory: the table as it will be written
    computed = centering.CenteredTensor.exact_float64
    monkeypatch.setattr(
        centering.CenteredTensor, "exact_float64", lambda self: pytest.fail("the whole table") if self is exact else computed(self)
    )
    sets = [{"ids": np.array([[0, 3, -1]], np.int64)}, {"ids": np.array([[49, 7, 7]], np.int64)}]
    written, exactly = Float64Model(model, {"wte": exact}).run_as_written_and_exact(sets)
    for feeds, as_written, as_exact in zip(sets, written, exactly):
        np.testing.assert_array_equal(*as_written.values(), rounded[feeds["ids"]])
        np.testing.assert_array_equal(*as_exact.values(), whole[feeds["ids"]])


class _Exact:
    """A constant the fold computed: its float64 value, as `apply.centering`'s tensors give it."""

    def __init__(self, value: np.ndarray):
        self.value = value

    def exact_float64(self) -> np.ndarray:
        return self.value


def test_the_folds_two_readings_share_one_pass_and_each_weight_read_once(tmp_path, monkeypatch):
    """The fold's twin as written and with its computed constants exact, in one pass: each reading's
    outputs are what it computes alone (numpy in float64), and every weight but the exact one is read
    from the file once for both readings, on every input set."""
    from onnx_lnfold.verify.oracle import reference

    w1, bias, w2 = (RNG.standard_normal(shape).astype(np.float32) for shape in ((16, 32), (32,), (32, 8)))
    exact_bias = bias.astype(np.float64) + 1e-9  # what the fold computed before rounding
    g = Graph()
    x = g.input("x", ["b", 16])
    h = g.node("Add", [g.node("MatMul", [x, g.const("w1", value=w1)]), g.const("bias", value=bias)])
    g.output(g.node("MatMul", [g.node("Relu", [h]), g.const("w2", value=w2)]))
    onnx.save(g.model(), tmp_path / "m.onnx", save_as_external_data=True, size_threshold=0)
    from onnx_lnfold.io import tensor_io

    reads = []
    read_rows = tensor_io.row_blocks
    counted = lambda tensor, *a: reads.append(tensor.name) or read_rows(tensor, *a)  # noqa: E731
    monkeypatch.setattr(reference, "row_blocks", counted)  # a weight read whole
    monkeypatch.setattr(tensor_io, "row_blocks", counted)  # a weight streamed through a product (`float64_row_blocks`)
    sets = [{"x": RNG.standard_normal((3, 16)).astype(np.float32)} for _ in range(2)]
    written, exact = Float64Model(str(tmp_path / "m.onnx"), {"bias": _Exact(exact_bias)}).run_as_written_and_exact(sets)
    assert sorted(reads) == ["bias", "w1", "w2"]
    for feeds, as_written, as_exact in zip(sets, written, exact):
        x64 = feeds["x"].astype(np.float64)
        for out, b in ((as_written, bias.astype(np.float64)), (as_exact, exact_bias)):
            [value] = out.values()
            expected = np.maximum(x64 @ w1.astype(np.float64) + b, 0) @ w2.astype(np.float64)
            np.testing.assert_allclose(value, expected, rtol=1e-13, atol=1e-13)
        assert not np.array_equal(*as_written.values(), *as_exact.values())


def test_the_two_readings_compute_what_precedes_the_exact_constants_once(monkeypatch):
    """Upstream of the constants the exact reading replaces, both readings hold the same values:
    each node there runs once per input set, not once per set and reading; past them, once each."""
    from onnx_lnfold.verify.oracle import reference

    w1, bias, w2 = (RNG.standard_normal(shape).astype(np.float32) for shape in ((16, 32), (32,), (32, 8)))
    exact_bias = bias.astype(np.float64) + 1e-9
    g = Graph()
    x = g.input("x", ["b", 16])
    r = g.node("Relu", [g.node("MatMul", [x, g.const("w1", value=w1)], name="mm1")], name="relu1")
    h = g.node("Add", [r, g.const("bias", value=bias)], name="add")
    g.output(g.node("MatMul", [g.node("Relu", [h], name="relu2"), g.const("w2", value=w2)], name="mm2"))
    ran: dict[str, int] = {}
    run_node = reference.Float64Model._run_node

    def counted(self, node, names, sets, reading, *rest):
        ran[node.onnx_node.name] = ran.get(node.onnx_node.name, 0) + len(sets)
        return run_node(self, node, names, sets, reading, *rest)

    monkeypatch.setattr(reference.Float64Model, "_run_node", counted)
    sets = [{"x": RNG.standard_normal((3, 16)).astype(np.float32)} for _ in range(2)]
    written, exact = Float64Model(g.model(), {"bias": _Exact(exact_bias)}).run_as_written_and_exact(sets)
    assert ran == {"mm1": 2, "relu1": 2, "add": 4, "relu2": 4, "mm2": 4}
    for feeds, as_written, as_exact in zip(sets, written, exact):
        x64 = feeds["x"].astype(np.float64)
        for out, b in ((as_written, bias.astype(np.float64)), (as_exact, exact_bias)):
            expected = np.maximum(np.maximum(x64 @ w1.astype(np.float64), 0) + b, 0) @ w2.astype(np.float64)
            np.testing.assert_allclose(*out.values(), expected, rtol=1e-13, atol=1e-13)


def test_an_op_the_evaluator_lacks_is_named():
    model = _one_node("FusedMatMul", {"a": X, "b": RNG.standard_normal((16, 4)).astype(np.float32)}, domain=MS)
    with pytest.raises(Float64Unavailable, match="onnx.reference cannot evaluate com.microsoft::FusedMatMul"):
        Float64Model(model)


# --------------------------------------------------------------------------- the judgment
def _stream_with_a_large_mean(mean: float = 3e4, layers: int = 2, seed: int = 0) -> onnx.ModelProto:
    """A pre-LN stack whose residual stream sits at `mean` with a spread of a few units, as
    Whisper's does: in float32 the spread keeps only the digits the mean leaves it (ulp(3e4) is
    0.002), so the original is about 2e-4 off in ONNX Runtime. The fold centers the stream, so it
    loses none of them: it is the more accurate of the two."""
    g = Graph(seed)
    d = 64
    h = g.node("MatMul", [g.input("x", ["b", "s", 16]), g.const("embed.weight", (16, d))], name="embed/matmul")
    h = g.node("Add", [h, g.const("embed.bias", value=mean + g.rng.normal(0, 1, d))], name="embed/bias")
    for i in range(layers):
        f = g.node("Relu", [g.linear(g.ln(h, d, f"block{i}.ln"), d, d, f"block{i}.fc1")], name=f"block{i}/relu")
        h = g.node("Add", [h, g.linear(f, d, d, f"block{i}.fc2")], name=f"block{i}/residual")
    g.output(g.linear(g.ln(h, d, "final.ln"), d, 8, "head"))
    return g.model()


def test_an_exact_fold_passes_where_the_originals_own_float32_error_exceeds_the_tolerance():
    """The fold and the original differ by 2e-4 in ONNX Runtime, over rtol 1e-4: the old check
    refused the fold. In float64 the fold is exact (its twin with unrounded weights is float64
    rounding away from the original's) and, as written, 1e-7 from the truth; in ONNX Runtime it is
    nearer the truth than the original is."""
    result = onnx_lnfold.fold(_stream_with_a_large_mean())
    verification = result.report.verification
    assert len(result.plan.folded) == 3 and verification.status == "passed" and verification.judgment == FLOAT64
    (out,) = verification.outputs
    assert out.rel_diff > 1e-4  # what the old check compared with rtol 1e-4
    assert out.original_error > 1e-4 > out.written and out.fold_error < out.original_error / 10
    assert out.exact < EXACT_RTOL and out.written < 1e-6
    assert verification.max_rel_diff == out.rel_diff and verification.decisive_rel_diff == out.written


def _off_by_a_small_constant(monkeypatch, relative: float = 1e-6) -> None:
    """Center every weight wrongly: off by `relative` of its largest entry along the centered axis
    (a mean not quite removed), in the written and in the exact values alike."""
    blocks = centering.CenteredTensor._float64_blocks

    def wrong(self, block_bytes):
        for rows, wide in blocks(self, block_bytes):
            yield rows, wide - relative * (np.abs(wide).max() if wide.size else 0.0)

    monkeypatch.setattr(centering.CenteredTensor, "_float64_blocks", wrong)
    # The float64 judgment on its own: the read-back (verify.readback) refuses these folds first.
    monkeypatch.setattr(passes, "read_back", lambda *args: ReadBack())


def test_a_centering_off_by_a_small_constant_is_refused_where_the_old_check_passed_it(monkeypatch):
    """On GPT-2 the wrong fold is 1e-6 from the original in ONNX Runtime, well within rtol 1e-4:
    the old check wrote it. The exact twin shows it is not exact."""
    _off_by_a_small_constant(monkeypatch)
    with pytest.raises(onnx_lnfold.VerificationFailed) as info:
        onnx_lnfold.fold(MODELS / "gpt2.onnx")
    verification = info.value.report.verification
    assert verification.status == "failed" and verification.judgment == FLOAT64
    assert str(info.value).startswith("verification failed: the fold is not exact: in float64, output 'logits' differs")
    assert str(info.value).endswith(f"relative (tolerance {EXACT_RTOL:g})")
    (out,) = verification.outputs
    assert out.rel_diff < 1e-4  # the old check: passed
    assert 1e-7 < out.exact < 1e-4 and out.written < 1e-4  # wrong, by less than rtol
    assert "verification FAILED (not exact: " in info.value.report.format_summary()


def test_a_wrong_fold_smaller_than_the_originals_float32_error_is_refused(monkeypatch):
    """On the stream with a large mean, the wrong fold's own error is a tenth of the original's
    float32 error: no float32 comparison can see it; the exact twin does."""
    _off_by_a_small_constant(monkeypatch, 1e-7)
    with pytest.raises(onnx_lnfold.VerificationFailed, match="the fold is not exact") as info:
        onnx_lnfold.fold(_stream_with_a_large_mean())
    (out,) = info.value.report.verification.outputs
    assert EXACT_RTOL < out.exact < out.original_error / 10


def test_the_refusal_names_the_written_weights_rounding_when_that_is_what_exceeds_rtol():
    with pytest.raises(onnx_lnfold.VerificationFailed) as info:
        onnx_lnfold.fold(MODELS / "gpt2.onnx", rtol=1e-12)
    message = str(info.value)
    assert "in float64, the fold as written (its weights rounded to their type) is " in message
    assert message.endswith("relative from the original > rtol 1e-12")


def test_the_report_and_the_json_give_every_figure(tmp_path):
    code, out, err = run_cli(MODELS / "gpt2.onnx", "-o", tmp_path / "o.onnx", "--json", tmp_path / "r.json")
    assert code == 0, err
    text = " ".join(out.split())
    assert "Verification (passed, judged in float64; onnxruntime" in text
    assert f"tolerance: exact {EXACT_RTOL:g}, as written rtol 0.0001" in text
    assert "logits: float64: exact " in text and ", as written " in text
    assert "onnxruntime: fold vs original " in text and ", vs float64: original " in text
    assert "verified (in float64, worst relative diff " in out.splitlines()[0]
    verification = json.loads((tmp_path / "r.json").read_text())["verification"]
    assert verification["judgment"] == FLOAT64 and verification["exact_rtol"] == EXACT_RTOL
    (logits,) = verification["outputs"]
    assert logits["float64_exact"] < 1e-13 and logits["float64_written"] < 1e-6
    assert {"original_vs_float64", "fold_vs_float64", "rel_diff", "sensitivity"} <= set(logits)


def test_external_data_models_keep_their_exact_values(tmp_path):
    """The CLI writes the fold before checking it, and writing rebinds the centered weights to the
    file, rounded: the exact twin takes them from before."""
    from helpers import make_large_model

    src = make_large_model.make_model(tmp_path / "m.onnx", dtype="float16", hidden=32, layers=2, vocab=64, positions=32)
    code, out, err = run_cli(src, "-o", tmp_path / "o.onnx", "--json", tmp_path / "r.json")
    assert code == 0, err
    (logits,) = json.loads((tmp_path / "r.json").read_text())["verification"]["outputs"]
    assert logits["float64_exact"] < 1e-12 < logits["float64_written"] < 1e-2


# --------------------------------------------------------------------------- the fallback
def _with_an_op_the_reference_lacks() -> onnx.ModelProto:
    g = Graph()
    h = g.linear(g.input("x", ["b", "s", 8]), 8, 16, "proj")
    h = g.node("Add", [h, g.linear(g.ln(h, 16, "ln1"), 16, 16, "fc")], name="residual")
    y = g.ln(h, 16, "ln2")
    g.output(g.node("FusedMatMul", [y, g.const("head.weight", (16, 4))], domain=MS, alpha=0.5))
    return g.model(ms_domain=True)


def test_without_a_float64_reference_the_originals_sensitivity_decides_and_the_report_says_why():
    result = onnx_lnfold.fold(_with_an_op_the_reference_lacks())
    verification = result.report.verification
    assert len(result.plan.folded) == 2 and verification.status == "passed"
    assert verification.judgment == SENSITIVITY
    assert verification.judgment_reason == "onnx.reference cannot evaluate com.microsoft::FusedMatMul"
    (out,) = verification.outputs
    assert out.written is None and out.exact is None and 0 < out.sensitivity < 1e-5
    text = " ".join(result.report.format_text().split())
    assert "Verification (passed, judged without float64; onnxruntime" in text
    assert "no float64 reference: onnx.reference cannot evaluate com.microsoft::FusedMatMul" in text
    assert "tolerance: rtol 0.0001 + 10 x the original's sensitivity" in text
    # 2 centered weights, 2 rewritten LNs, 2 biases that took a beta: every planned change read back
    assert "verified (without float64, 6 edits read back, worst relative diff " in result.report.format_summary()


def test_a_wrong_fold_is_still_refused_without_a_float64_reference(monkeypatch):
    fold_with_a_wrong_epsilon(monkeypatch)
    # The sensitivity judgment on its own: the read-back refuses this fold first (test_readback.py).
    monkeypatch.setattr(passes, "read_back", lambda *args: ReadBack())
    with pytest.raises(onnx_lnfold.VerificationFailed) as info:
        onnx_lnfold.fold(_with_an_op_the_reference_lacks())
    assert "> rtol 0.0001 + 10 x the original's sensitivity " in str(info.value)
    assert str(info.value).endswith("(no float64 reference: onnx.reference cannot evaluate com.microsoft::FusedMatMul)")


def test_a_float64_budget_of_zero_asks_for_none(tmp_path):
    verification = onnx_lnfold.fold(MODELS / "gpt2.onnx", float64_budget=0).report.verification
    assert verification.status == "passed" and verification.judgment == SENSITIVITY
    assert verification.judgment_reason == "none asked for (a float64 budget of 0 s)"
    code, out, _ = run_cli(MODELS / "gpt2.onnx", "-o", tmp_path / "o.onnx", "--float64-budget", "0")
    assert code == 0 and "judged without float64" in out
    code, _, err = run_cli(MODELS / "gpt2.onnx", "-o", tmp_path / "o.onnx", "--float64-budget", "-1")
    assert code == 2 and "--float64-budget must be a number of seconds, 0 or more" in err


def test_an_evaluation_estimated_over_the_budget_asked_for_is_not_started(monkeypatch):
    monkeypatch.setattr("onnx_lnfold.verify.judges.allowance.FLOAT64_COST", 1e9)
    verification = onnx_lnfold.fold(MODELS / "gpt2.onnx", float64_budget=60).report.verification
    assert verification.judgment == SENSITIVITY and verification.status == "passed"
    assert verification.judgment_reason.startswith("a float64 evaluation would take about ")
    assert verification.judgment_reason.endswith(" s, over its allowance of 60 s")  # the first set: the budget


def test_by_default_the_first_set_is_judged_in_float64_whatever_onnxruntime_s_time_suggests(monkeypatch):
    """Without a budget asked for, the estimate from ONNX Runtime's time (mostly weights being read
    when a large model runs block by block) does not decide: the float64 run is timed as it goes."""
    monkeypatch.setattr("onnx_lnfold.verify.judges.allowance.FLOAT64_COST", 1e9)
    verification = onnx_lnfold.fold(MODELS / "gpt2.onnx").report.verification
    assert verification.judgment == FLOAT64 and verification.status == "passed"


def test_a_float64_run_past_its_allowance_is_abandoned_and_said_so(monkeypatch):
    monkeypatch.setattr("onnx_lnfold.verify.judges.allowance.FLOAT64_FIRST_S", 0.0)
    monkeypatch.setattr("onnx_lnfold.verify.judges.allowance.FLOAT64_FIRST_SHARE", 0.0)
    verification = onnx_lnfold.fold(MODELS / "gpt2.onnx").report.verification
    assert verification.judgment == SENSITIVITY and verification.status == "passed"
    assert verification.judgment_reason.startswith("a float64 evaluation would take about ")
    assert "over its allowance of 0 s (stopped at " in verification.judgment_reason


def test_the_float64_allowance_follows_the_folds_own_time_within_the_budget():
    from onnx_lnfold.verify.judges.allowance import (
        FLOAT64_FIRST_S,
        FLOAT64_FIRST_SHARE,
        FLOAT64_FLOOR_S,
        FLOAT64_SHARE,
        first_allowance,
        float64_allowance,
    )

    assert float64_allowance(60.0, None) == 60.0  # nothing known of the fold: the budget
    assert float64_allowance(60.0, 0.1) == FLOAT64_FLOOR_S  # a small model still gets the floor
    assert float64_allowance(60.0, 20.0) == 40.0 == FLOAT64_SHARE * 20.0
    assert float64_allowance(60.0, 100.0) == 60.0  # never past the budget asked for
    assert float64_allowance(5.0, 0.1) == 5.0
    # Without a budget asked for, it grows with the fold's time: a 10 GB fold's 90 s give 270 s for
    # the first set, 180 s for all.
    assert first_allowance(None, 90.0) == 270.0 == FLOAT64_FIRST_SHARE * 90.0
    assert float64_allowance(None, 90.0) == 180.0 == FLOAT64_SHARE * 90.0
    assert first_allowance(None, 1.0) == FLOAT64_FIRST_S  # the first set: at least FLOAT64_FIRST_S
    assert first_allowance(None, None) == FLOAT64_FIRST_S
    assert first_allowance(7.0, 90.0) == 7.0  # a budget asked for replaces it


def test_only_the_input_sets_that_fit_are_judged_in_float64_and_the_others_in_onnxruntime(monkeypatch):
    """With an allowance for one set, the first is judged in float64 and the rest against the
    original in ONNX Runtime, held to the original's own error; the report says which and why."""
    from onnx_lnfold.verify.judges import float64

    original = float64.within
    monkeypatch.setattr(float64, "within", lambda *args: original(*args)[:1])
    verification = onnx_lnfold.fold(MODELS / "gpt2.onnx").report.verification
    assert verification.status == "passed" and verification.judgment == FLOAT64
    assert any(n.startswith("judged in float64 on the first 1 of 3 input sets") for n in verification.notes)


def test_a_fold_far_from_the_original_on_a_set_judged_without_float64_is_refused():
    """A set left out of the float64 evaluation is still judged: the fold within rtol plus the
    original's own error (measured on the float64 sets) of the original, in ONNX Runtime."""
    from onnx_lnfold.verify.judges.float64 import float64_failure
    from onnx_lnfold.verify.verdict import OutputDiff

    fine = OutputDiff("y", (2,), 1e-7, 1.0, rtol=1e-4, exact=1e-15, written=1e-8, original_error=1e-6, fold_error=1e-6)
    far = OutputDiff("y", (2,), 5e-4, 1.0, rtol=1e-4, exact=1e-15, written=1e-8, original_error=1e-6, fold_error=1e-6)
    assert float64_failure([fine], partial=True) == ""
    assert float64_failure([far], partial=False) == ""  # every set judged in float64
    assert "in onnxruntime, the fold is 0.0005 relative from the original" in float64_failure([far], partial=True)


# --------------------------------------------------------------------------- realistic inputs
def test_a_realistic_scale_set_spreads_ids_over_the_whole_vocabulary():
    sets = verification_input_sets(ir.load(MODELS / "gpt2.onnx"))
    realistic = sets[-1]
    assert realistic.label == "input_ids(1, 64) [realistic scale]" and not realistic.required
    ids = realistic.feeds["input_ids"]
    assert ids.min() == 0 and ids.max() == 511 and len(np.unique(ids)) == 64  # the first set's 16 ids touch 16 rows
    assert np.abs(np.diff(np.sort(ids.ravel()))).max() <= 9  # evenly over the table


def test_a_realistic_scale_set_normalizes_images_as_preprocessors_do():
    realistic = verification_input_sets(ir.load(MODELS / "vit.onnx"))[-1]
    pixels = realistic.feeds["pixel_values"]
    assert realistic.label == "pixel_values(1, 3, 32, 32) [realistic scale]"
    mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
    np.testing.assert_allclose(pixels.min(axis=(0, 2, 3)), -mean / std, atol=0.05)
    np.testing.assert_allclose(pixels.max(axis=(0, 2, 3)), (1 - mean) / std, atol=0.05)


def test_the_realistic_set_falls_back_to_a_length_the_graph_accepts():
    """GPT-2 with its position table cut to 40 rows: 64 tokens do not run, 32 do."""
    result = onnx_lnfold.fold(MODELS / "opt_pre_ln.onnx")
    assert result.report.verification.input_sets[-1].startswith("input_ids(1, 64)")
    model = onnx.load(MODELS / "gpt2.onnx")
    table = next(t for t in model.graph.initializer if t.name == "model.transformer.wpe.weight")
    table.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(table)[:40], table.name))
    verification = onnx_lnfold.fold(model).report.verification
    assert verification.status == "passed" and verification.input_sets[-1] == "input_ids(1, 32) [realistic scale]"


# --------------------------------------------------------------------------- vision towers
def _dynamic_pixels(model: onnx.ModelProto) -> onnx.ModelProto:
    for value in model.graph.input:
        if value.name == "pixel_values":
            for dim, name in zip(value.type.tensor_type.shape.dim, ["image_batch", "num_channels", "height", "width"]):
                dim.ClearField("dim_value")
                dim.dim_param = name
    return model


@pytest.mark.parametrize(("name", "side"), [("clip", 32), ("clip_fp16", 24), ("clip_ort", 24)])
def test_clip_with_dynamic_image_size_gets_the_grid_of_its_vision_position_table(name, side):
    """CLIPModel with every pixel dim dynamic: the text tower's token table (256 x 64) has as many
    columns as the patch conv has channels and a square row count; it was taken for the patch
    grid (16 x 16, 128-pixel images the vision table of 4 x 4 + 1 cannot take). The grid comes from
    the table the patches are added to: a constant (clip) or a Gather by constant position ids."""
    model = _dynamic_pixels(onnx.load(MODELS / f"{name}.onnx"))
    sets = verification_input_sets(ir.from_proto(model))
    assert {s.feeds["pixel_values"].shape[2:] for s in sets} == {(side, side)}
    if name == "clip":
        verification = onnx_lnfold.fold(model).report.verification
        assert verification.status == "passed" and f"pixel_values(2, 3, {side}, {side})" in verification.input_sets[0]


def test_patch_grid_from_a_gather_of_constant_position_ids_in_a_graph_built_in_code():
    """A text table of 256 x 16 (16 x 16 would pass for a grid) listed first; the vision tower
    adds Gather(positions [10, 16], ids [1, 10]) to 3 x 3 patches and a class token."""
    g = Graph()
    text = g.node("Gather", [g.const("text.token_table", (256, 16)), g.input("input_ids", ["b", "s"], TensorProto.INT64)])
    g.output(g.linear(g.ln(text, 16, "text.ln"), 16, 4, "text.head"))
    patches = g.node("Conv", [g.input("pixel_values", ["n", "c", "h", "w"]), g.const("patch.weight", (16, 3, 4, 4))], strides=[4, 4])
    patches = g.node("Transpose", [g.node("Flatten", [g.node("Transpose", [patches], perm=[0, 2, 3, 1])], axis=1)], perm=[0, 1])
    patches = g.node("Reshape", [patches, g.ints("rows", [0, -1, 16])])
    cls = g.node("Expand", [g.const("cls", (1, 1, 16)), g.node("Concat", [g.node("Slice", [g.node("Shape", [patches]), g.ints("s0", [0]), g.ints("s1", [1])]), g.ints("one_one", [1, 16])], axis=0)])
    tokens = g.node("Concat", [cls, patches], axis=1)
    positions = g.node("Gather", [g.const("vision.positions", (10, 16)), g.ints("position_ids", [list(range(10))])])
    h = g.node("Add", [tokens, positions])
    g.output(g.linear(g.ln(g.linear(h, 16, 16, "vision.fc"), 16, "vision.ln"), 16, 4, "vision.head"))
    model = g.model()
    sets = verification_input_sets(ir.from_proto(model))
    assert {s.feeds["pixel_values"].shape[1:] for s in sets} == {(3, 12, 12)}
    assert onnx_lnfold.fold(model).report.verification.status == "passed"


@pytest.mark.slow
def test_clip_exported_by_dynamo_with_dynamic_height_and_width(tmp_path):
    """transformers' CLIPModel (small config, perturbed weights) exported by dynamo with dynamic
    height and width (interpolate_pos_encoding, which that export needs): before, its 32-pixel
    images were synthesized at 128 pixels from the text token table, and the fold was refused."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    text = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=16)
    vision = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, image_size=32, patch_size=8)
    config = transformers.CLIPConfig(text_config=text, vision_config=vision, projection_dim=32)
    clip = transformers.CLIPModel(config).eval()
    with torch.no_grad():
        for p in clip.parameters():
            p.add_(0.02 * torch.randn_like(p))

    class Wrapper(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids, pixel_values):
            out = self.model(input_ids=input_ids, pixel_values=pixel_values, interpolate_pos_encoding=True)
            return out.logits_per_image, out.text_embeds, out.image_embeds

    args = (torch.randint(0, 256, (2, 8)), torch.randn(2, 3, 32, 32))
    with torch.no_grad():
        program = torch.onnx.export(
            Wrapper(clip), args, dynamo=True, opset_version=18, input_names=["input_ids", "pixel_values"],
            dynamic_shapes=({0: "batch", 1: "seq"}, {0: "batch", 2: "height", 3: "width"}),
        )  # fmt: skip
    program.save(tmp_path / "clip.onnx")
    model = onnx.load(tmp_path / "clip.onnx")
    dims = [d.dim_param or d.dim_value for d in model.graph.input[1].type.tensor_type.shape.dim]
    assert isinstance(dims[2], str) and isinstance(dims[3], str), dims
    result = onnx_lnfold.fold(model)
    verification = result.report.verification
    assert verification.status == "passed" and len(result.plan.folded) >= 4
    assert "pixel_values(2, 3, 32, 32)" in verification.input_sets[0]


def test_batch_normalization_at_opset_11_is_evaluated_in_inference_mode():
    """onnx.reference's opset 9-13 BatchNormalization takes the batch's statistics when the node has
    a momentum; a one-output node is in inference mode (ONNX Runtime uses the running ones)."""
    import onnxruntime as ort

    from onnx_lnfold.verify.oracle.float64_ops import FLOAT64_OPS

    rng = np.random.default_rng(0)
    c = 4
    inits = [helper.make_tensor(n, TensorProto.FLOAT, [c], v) for n, v in (
        ("s", rng.uniform(0.5, 2, c)), ("b", rng.normal(size=c)), ("m", rng.normal(size=c)), ("v", rng.uniform(0.5, 2, c)))]
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], epsilon=1e-5, momentum=0.9)
    graph = helper.make_graph([node], "bn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, c, 3, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, c, 3, 3])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)], ir_version=7)
    x = rng.normal(size=(2, c, 3, 3)).astype(np.float32)
    ours = onnx.reference.ReferenceEvaluator(model, new_ops=FLOAT64_OPS).run(None, {"x": x})[0]
    stock = onnx.reference.ReferenceEvaluator(model).run(None, {"x": x})[0]
    runtime = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert np.abs(ours - runtime).max() < 1e-5 < np.abs(stock - runtime).max()


def test_no_verdict_rests_on_a_float64_evaluation_that_disagrees_with_onnx_runtime(monkeypatch):
    """Where the float64 evaluation of the original is far from ONNX Runtime's run of it (an op
    evaluated otherwise), the fold is judged without it, and the report says why."""
    from onnx_lnfold.verify.oracle import float64_ops as ops

    erf = ops._erf
    monkeypatch.setattr(ops, "_erf", lambda x: erf(x) * 1.5)
    result = onnx_lnfold.fold(MODELS / "vit.onnx")
    verification = result.report.verification
    assert verification.passed and verification.judgment == SENSITIVITY
    assert "relative from ONNX Runtime's run of the original on" in verification.judgment_reason
    assert verification.edits_checked > 0


def _time_shift_model():
    """An RWKV-style time shift after a folded LN: Pad one step in at the start of the sequence
    axis and crop one at its end (a negative pad)."""
    g = Graph(seed=11)
    n = g.ln(g.linear(g.input("x", [2, 8, 16]), 16, 16, "embed"), 16, "ln")
    h = g.linear(n, 16, 16, "head")
    g.output(g.node("Pad", [h, g.ints("shift", [0, 1, 0, 0, -1, 0])], name="time_shift"), [2, 8, 16])
    return g.model()


@pytest.mark.parametrize(
    ("opset", "pads", "axes", "mode"),
    [(18, [0, 1, 0, 0, -1, 0], None, "constant"), (18, [-2, 3], [-1], "constant"),
     (11, [1, -1, 0, -1, 2, 1], None, "edge"), (18, [0, -1, 2, 0, 1, -3], None, "reflect"),
     (2, [0, 2, -1, 0, -1, 1], None, "constant")],
)  # fmt: skip
def test_pad_with_negative_pads_crops_as_onnx_runtime_does(opset, pads, axes, mode):
    """onnx.reference's Pad refuses negative pads; ONNX crops there: the float64 evaluation's Pad
    matches ONNX Runtime's kernel, pads as an attribute (opset 2) or inputs (11, with axes 18)."""
    x = RNG.standard_normal((2, 5, 6)).astype(np.float32)
    if opset == 2:
        model = _one_node("Pad", {"x": x}, opset=2, pads=pads, mode=mode, value=0.5)
    else:
        model = _one_node("Pad", {"x": x}, opset=opset, mode=mode)
        extra = [("pads", np.array(pads, np.int64))] + ([("axes", np.array(axes, np.int64))] if axes else [])
        model.graph.node[0].input.extend(["pads", *(["value"] if axes else []), *(["axes"] if axes else [])])
        model.graph.initializer.extend(onnx.numpy_helper.from_array(a, n) for n, a in extra)
        if axes:
            model.graph.initializer.append(onnx.numpy_helper.from_array(np.array(0.25, np.float32), "value"))
    expected = run_model(model.SerializeToString(), {"x": x})["y0"]
    got = Float64Model(model).run({"x": x})["y0"]
    assert got.dtype == np.float64 and got.shape == expected.shape
    np.testing.assert_array_equal(got.astype(np.float32), expected)


def test_a_time_shift_is_judged_in_float64():
    """A model with a time shift (negative pads) is judged in float64, not by the fallback."""
    verification = onnx_lnfold.fold(_time_shift_model()).report.verification
    assert verification.passed and verification.judgment == FLOAT64, verification.judgment_reason


def test_a_float64_evaluation_that_fails_names_the_op(monkeypatch):
    """onnx.reference's own messages name no op ("index can't contain negative values", from np.pad):
    where an op's float64 evaluation raises, the fallback's reason names the node."""
    from onnx_lnfold.verify.oracle import float64_ops as ops

    def refuse(self, *args, **kwargs):
        raise ValueError("index can't contain negative values")

    monkeypatch.setattr(ops.Pad, "_run", refuse)
    verification = onnx_lnfold.fold(_time_shift_model()).report.verification
    assert verification.passed and verification.judgment != FLOAT64
    assert "the float64 evaluation failed at Pad 'time_shift': index can't contain negative values" in verification.judgment_reason


def test_an_identity_chain_passes_its_values_on_as_new_arrays():
    """Identities of an activation and of a weight, in a chain: what onnx.reference computes, each
    output its own array (a later in-place write cannot reach another's values)."""
    g = Graph()
    x = g.input("x", [2, 3])
    chained = g.node("Identity", [g.node("Identity", [x])])
    weight = g.node("Identity", [g.const("w", value=np.arange(3, dtype=np.float32))])
    total = g.node("Add", [chained, weight])
    g.output(chained)
    g.output(total)
    model = g.model()
    feeds = {"x": RNG.standard_normal((2, 3)).astype(np.float32)}
    got = Float64Model(model).run(feeds)
    expected = onnx.reference.ReferenceEvaluator(float64_twin(model)).run(None, {"x": feeds["x"].astype(np.float64)})
    np.testing.assert_array_equal(got[chained], expected[0])
    np.testing.assert_array_equal(got[total], expected[1])
    assert got[chained].dtype == np.float64 and not np.shares_memory(got[chained], got[total])
