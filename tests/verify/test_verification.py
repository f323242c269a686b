"""Verification is never skipped silently: a fold is written only when ONNX Runtime showed it
equivalent, on inputs that fit the export (dims solved from their expressions, KV caches with a
past, bools at both values, two sizes, conv geometry), with bf16 checked through float32 shadows.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

import onnx_lnfold
from onnx_lnfold.feeds.dims import DimExpr
from onnx_lnfold.feeds.sets import verification_input_sets
from onnx_lnfold.feeds.synthesize import synthesize_inputs
from onnx_lnfold.verify import passes
from onnx_lnfold.verify.oracle.shadow import float32_shadow
from onnx_lnfold.verify.readback import ReadBack
from onnx_lnfold.verify.sessions import run_model

from conftest import MODELS
from graphs import Graph, ops
from helpers import make_large_model, run_cli

# name: (LNs folded, LNs in the model)
# gpt2_merged_decoder: ORT fuses neither branch's ln_f with its residual Add (its shape inference
# cannot name their dims), and their beta would stay an Add before the bias-free LM head: kept.
DECODERS = {"gpt2_kv_cache": (5, 5), "gpt2_merged_decoder": (8, 10)}


def _pre_ln(x_shape=("b", "s", 8)) -> onnx.ModelProto:
    g = Graph()
    h = g.linear(g.input("x", list(x_shape)), 8, 16, "proj")
    g.output(g.linear(g.ln(h, 16, "ln"), 16, 4, "head"))
    return g.model()


def _original_fails_model() -> onnx.ModelProto:
    """Foldable, but its declared input shape is a lie: the graph reshapes `x` to 8 features
    while it declares [b, s] dynamic, so synthesized [2, 8] inputs do not fit the Reshape."""
    g = Graph()
    x = g.node("Reshape", [g.input("x", ["b", "s"]), g.ints("shape", [-1, 3, 8])])
    h = g.linear(x, 8, 16, "proj")
    g.output(g.linear(g.ln(h, 16, "ln"), 16, 4, "head"))
    return g.model()


# --------------------------------------------------------------------------- refusals
def test_original_that_does_not_run_refuses_the_fold_in_the_api():
    with pytest.raises(onnx_lnfold.NotVerified) as info:
        onnx_lnfold.fold(_original_fails_model())
    message = str(info.value)
    assert message.startswith("not verified: the original model does not run in onnxruntime on input set 1 of 3 (x(2, 8))")
    assert "pass inputs={name: array} or input_shapes={name: shape}, or verify=False" in message
    assert info.value.report.verification.status == "unverified"
    assert isinstance(info.value, onnx_lnfold.VerificationFailed)  # callers catching the old error still do
    # The way out works: a shape that fits, or declining verification.
    result = onnx_lnfold.fold(_original_fails_model(), input_shapes={"x": (2, 48)})
    assert result.report.verification.status == "passed" and len(result.plan.folded) == 1
    assert onnx_lnfold.fold(_original_fails_model(), verify=False).report.verification.status == "skipped"


@pytest.mark.parametrize("quiet", [False, True])
def test_original_that_does_not_run_exits_1_with_one_line_and_writes_nothing(tmp_path, quiet):
    src, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(_original_fails_model(), src)
    code, stdout, stderr = run_cli(src, "-o", out, *(["-q"] if quiet else []))
    assert code == 1 and not out.exists() and not list(tmp_path.glob("*.tmp*"))
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("onnx_lnfold: not verified: the original model does not run in onnxruntime")
    assert lines[0].endswith(
        "give inputs with --inputs FILE.npz or shapes with --input-shape NAME:D1,D2,..., or accept an unverified model with --no-verify"
    )
    assert (stdout == "") if quiet else ("Refused to write" in stdout)
    code, _, stderr = run_cli(src, "-o", out, "--input-shape", "x:2,48", "-q")
    assert code == 0 and stderr == "" and out.is_file()
    code, stdout, _ = run_cli(src, "-o", tmp_path / "u.onnx", "--no-verify")
    assert code == 0 and "Verification: skipped (disabled by --no-verify)" in stdout


def test_missing_onnxruntime_names_the_install_in_the_cli(tmp_path):
    """`python -m onnx_lnfold` without onnxruntime: exit 1, the pip command, nothing written."""
    src, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(_pre_ln(), src)
    blocker = tmp_path / "site"
    (blocker / "onnxruntime").mkdir(parents=True)
    (blocker / "onnxruntime" / "__init__.py").write_text("raise ImportError('no onnxruntime here')\n")
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": f"{blocker}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run([sys.executable, "-m", "onnx_lnfold", str(src), "-o", str(out), "-q"], capture_output=True, text=True, env=env)
    assert proc.returncode == 1 and not out.exists()
    assert proc.stderr.strip() == (
        "onnx_lnfold: not verified: onnxruntime is not installed; "
        "pip install 'onnx_lnfold[ort]', or accept an unverified model with --no-verify"
    )


def test_input_without_a_numpy_type_refuses_with_the_way_out():
    g = Graph()
    h = g.linear(g.input("x", ["b", "s", 8]), 8, 16, "proj")
    g.output(g.linear(g.ln(h, 16, "ln"), 16, 4, "head"))
    g.output(g.node("Cast", [g.input("s", [1], TensorProto.STRING)], to=TensorProto.FLOAT), [1])
    with pytest.raises(onnx_lnfold.NotVerified, match=r"cannot synthesize verification inputs: graph input 's' is STRING; pass inputs="):
        onnx_lnfold.fold(g.model())


def test_nothing_folded_needs_no_verification():
    g = Graph()
    x = g.input("x", ["b", "s", 16])
    g.output(g.ln(x, 16, "ln"))  # a graph input: not centerable
    result = onnx_lnfold.fold(g.model())
    assert not result.plan.folded and result.report.verification.status == "skipped"


# --------------------------------------------------------------------------- inputs that fit
def test_dims_are_solved_from_their_expressions():
    g = Graph()
    g.input("ids", ["batch", 1], TensorProto.INT64)
    g.input("mask", ["batch", "past_sequence_length + 1"], TensorProto.INT64)
    g.input("total", ["batch", "past_sequence_length + sequence_length"], TensorProto.FLOAT)
    g.input("past", ["batch", 4, "past_sequence_length", 16])
    g.input("twice", ["2*S"])
    g.input("odd", ["batch", "seq-len"])  # a dash inside a name is not a subtraction
    g.output(g.node("Identity", ["past"]))
    feeds = synthesize_inputs(ir.serde.deserialize_model(g.model()), batch_size=3, sequence_length=5)
    assert {k: v.shape for k, v in feeds.items()} == {
        "ids": (3, 1), "mask": (3, 6), "total": (3, 10), "past": (3, 4, 5, 16), "twice": (10,), "odd": (3, 5),
    }  # fmt: skip
    # A user shape fixes the symbols it names: a mask 9 long means a past of 8, for a batch of 3.
    feeds = synthesize_inputs(ir.serde.deserialize_model(g.model()), {"mask": (3, 9)})
    assert feeds["past"].shape == (3, 4, 8, 16) and feeds["total"].shape == (3, 16)


def test_dim_expression_solves_linear_unknowns():
    assert DimExpr("p + 1").solve(9, {}) == ("p", 8)
    assert DimExpr("p + s").solve(9, {"s": 2}) == ("p", 7)
    assert DimExpr("2*p").solve(9, {}) is None
    assert DimExpr("unk__3").is_symbol and DimExpr("a-b").symbols == {"a-b"}


def test_vit_with_every_input_dim_dynamic_gets_its_channels_and_patch_grid():
    """optimum declares pixel_values [batch_size, num_channels, height, width]: the sizes come from
    the patch conv (3 channels, 8x8 patches) and the position table (4x4 patches + class token)."""
    model = onnx.load(MODELS / "vit.onnx")
    dims = model.graph.input[0].type.tensor_type.shape.dim
    for dim, name in zip(dims, ["batch_size", "num_channels", "height", "width"]):
        dim.ClearField("dim_value")
        dim.dim_param = name
    result = onnx_lnfold.fold(model)
    verification = result.report.verification
    assert verification.status == "passed" and len(result.plan.folded) == 5
    assert verification.input_sets == [
        "pixel_values(2, 3, 32, 32)", "pixel_values(3, 3, 32, 32)", "pixel_values(1, 3, 32, 32) [realistic scale]"
    ]


def _audio_model() -> onnx.ModelProto:
    """A feature extractor as Wav2Vec2 has it: samples -> Unsqueeze -> strided Conv1d stack (with a
    group norm) -> frames."""
    g = Graph()
    x = g.node("Unsqueeze", [g.input("input_values", ["batch_size", "sequence_length"]), g.ints("axis1", [1])])
    x = g.node("Conv", [x, g.const("conv0.w", (16, 1, 10))], strides=[5])
    # GroupNorm(4 groups) as the exporter writes it: Reshape, InstanceNormalization, Reshape back.
    x = g.node("Reshape", [x, g.ints("groups", [0, 4, -1])])
    x = g.node("InstanceNormalization", [x, g.const("gn.scale", (4,)), g.const("gn.bias", (4,))])
    x = g.node("Relu", [g.node("Reshape", [x, g.ints("channels", [0, 16, -1])])])
    x = g.node("Conv", [x, g.const("conv1.w", (16, 16, 3))], strides=[2])
    x = g.node("Relu", [g.node("Mul", [x, g.const("scale", (16, 1))])])
    x = g.node("Conv", [x, g.const("conv2.w", (16, 16, 2)), g.const("conv2.b", (16,))], strides=[2], pads=[0, 0])
    frames = g.node("Transpose", [x], perm=[0, 2, 1])
    h = g.linear(g.ln(frames, 16, "feature_ln"), 16, 16, "projection")
    g.output(g.linear(g.ln(h, 16, "ln"), 16, 8, "head"))
    return g.model()


def test_audio_is_long_enough_for_the_feature_extractor():
    """8 frames out of the conv stack (kernels 10, 3, 2; strides 5, 2, 2) need 170 samples; 5 need
    110; the realistic set's 64 need 1290."""
    model = _audio_model()
    sets = verification_input_sets(ir.serde.deserialize_model(model))
    assert [s.label for s in sets] == ["input_values(2, 170)", "input_values(3, 110)", "input_values(1, 1290) [realistic scale]"]
    frames = [run_model(model.SerializeToString(), s.feeds)[model.graph.output[0].name].shape[1] for s in sets]
    assert frames == [8, 5, 64]
    result = onnx_lnfold.fold(model)
    assert len(result.plan.folded) == 2 and result.report.verification.status == "passed"


def _if_on_a_bool_input() -> onnx.ModelProto:
    """A graph input `flag` chooses between two branches, each with an LN of the projection."""
    g = Graph()
    h = g.linear(g.input("x", ["b", "s", 8]), 8, 16, "proj")
    branches = {}
    for branch in ("then", "else"):
        gamma, beta = g.const(f"{branch}_ln.gamma", (16,)), g.const(f"{branch}_ln.beta", (16,))
        ln = helper.make_node("LayerNormalization", [h, gamma, beta], [f"{branch}_n"], name=f"{branch}_ln", axis=-1)
        out = helper.make_node("Mul" if branch == "then" else "Sub", [f"{branch}_n", gamma], [f"{branch}_y"])
        branches[f"{branch}_branch"] = helper.make_graph(
            [ln, out], branch, [], [helper.make_tensor_value_info(f"{branch}_y", TensorProto.FLOAT, None)]
        )
    g.output(g.node("If", [g.input("flag", [], TensorProto.BOOL)], **branches))
    return g.model()


def test_every_bool_input_is_run_at_both_values_and_two_sizes():
    model = _if_on_a_bool_input()
    sets = verification_input_sets(ir.serde.deserialize_model(model))
    assert [s.label for s in sets] == [
        "x(2, 8, 8), flag=True", "x(2, 8, 8), flag=False", "x(3, 5, 8), flag=True", "x(3, 5, 8), flag=False",
        "x(1, 64, 8), flag=True [realistic scale]",
    ]  # fmt: skip
    result = onnx_lnfold.fold(model, fold_costly=True)  # the branches' betas stay Adds
    assert len(result.plan.folded) == 2 and result.report.verification.status == "passed"
    assert result.report.verification.input_sets == [s.label for s in sets]


def test_a_wrong_fold_in_the_branch_a_true_flag_skips_is_caught(monkeypatch):
    """Break the fold of the else branch only: the check at flag=False must see it."""
    original = onnx_lnfold._pipeline.apply_plan

    def broken(model, plan):
        original(model, plan)
        for node in ir.traversal.RecursiveGraphIterator(model.graph):
            if node.op_type == "SimplifiedLayerNormalization" and node.graph is not model.graph and node.graph.name == "else":
                node.attributes["epsilon"] = ir.AttrFloat32("epsilon", 1.0)

    monkeypatch.setattr("onnx_lnfold._pipeline.apply_plan", broken)
    # The comparison on its own: the read-back refuses this fold first (test_readback.py).
    monkeypatch.setattr(passes, "read_back", lambda *args: ReadBack())
    with pytest.raises(onnx_lnfold.VerificationFailed, match="output 'if_"):
        onnx_lnfold.fold(_if_on_a_bool_input(), fold_costly=True)


# --------------------------------------------------------------------------- tolerance and bf16
def test_fp32_output_is_held_to_fp32_tolerance_with_fp16_weights():
    """A float16 weight inside an fp32 model does not loosen the check of its fp32 output."""
    g = Graph()
    w16 = g.const("proj16.weight", (8, 16), dtype=np.float16)
    h = g.node("Cast", [g.node("MatMul", [g.node("Cast", [g.input("x", ["b", "s", 8])], to=TensorProto.FLOAT16), w16])], to=TensorProto.FLOAT)
    h = g.node("Add", [h, g.const("proj.bias", (16,))])
    g.output(g.linear(g.ln(h, 16, "ln"), 16, 4, "head"))
    try:
        result = onnx_lnfold.fold(g.model())
    except onnx_lnfold.VerificationFailed as e:  # the fp16 rounding of the centered weight shows
        assert "> rtol 0.0001" in str(e)
        assert [o.rtol for o in e.report.verification.outputs] == [1e-4]
    else:  # or the fold is exact, at the fp32 tolerance
        verification = result.report.verification
        assert verification.status == "passed" and verification.max_rel_diff <= 1e-4
        assert [o.rtol for o in verification.outputs] == [1e-4] and verification.rtol == 1e-4


def test_bfloat16_model_is_verified_through_float32_shadows(tmp_path):
    src = make_large_model.make_model(tmp_path / "mbf16.onnx", dtype="bfloat16", hidden=32, layers=2, vocab=64, positions=32)
    result = onnx_lnfold.fold(src, fold_costly=True)  # ln_f's beta stays an Add before the LM head
    verification = result.report.verification
    assert len(result.plan.folded) == 3
    assert verification.status == "passed" and verification.shadow == "float32 shadows (bfloat16 widened)"
    assert verification.outputs[0].rtol == 1e-2 and verification.max_rel_diff < 1e-2
    (note,) = verification.notes
    assert note.startswith("bfloat16 rounding of the centered weights: mean left along the centered axis up to ")
    text = " ".join(result.report.format_text().split())  # the report wraps long lines
    assert "float32 shadows (bfloat16 widened)" in text and note in text
    # The shadow widens everything: no bf16 left, and it runs on CPU.
    result.save(tmp_path / "folded.onnx")
    shadow = onnx.load_from_string(float32_shadow(tmp_path / "folded.onnx"))
    assert TensorProto.BFLOAT16 not in {t.data_type for t in shadow.graph.initializer}
    assert TensorProto.BFLOAT16 not in {n.attribute[0].i for n in shadow.graph.node if n.op_type == "Cast"}


def test_bfloat16_wrong_fold_is_caught_by_the_shadow(tmp_path, monkeypatch):
    """The shadow is a real check: a fold that drops a beta fails it."""
    from onnx_lnfold.apply import apply_plan as apply_plan_module

    src = make_large_model.make_model(tmp_path / "mbf16.onnx", dtype="bfloat16", hidden=32, layers=2, vocab=64, positions=32)
    original = apply_plan_module.apply_plan

    def broken(model, plan):
        original(model, plan)
        for value in model.graph.initializers.values():
            if value.name.startswith("ln_f") and value.name.endswith("bias"):
                value.const_value = ir.Tensor(np.zeros(value.const_value.shape.dims, dtype=value.const_value.numpy().dtype), name=value.name)

    monkeypatch.setattr("onnx_lnfold._pipeline.apply_plan", broken)
    # The shadow on its own: the read-back refuses this fold first (test_readback.py).
    monkeypatch.setattr(passes, "read_back", lambda *args: ReadBack())
    with pytest.raises(onnx_lnfold.VerificationFailed, match="output 'logits' differs"):
        onnx_lnfold.fold(src)


# --------------------------------------------------------------------------- KV-cache decoders
@pytest.mark.parametrize("name", sorted(DECODERS))
def test_kv_cache_decoder_folds_with_verification_passed(name):
    folded, total = DECODERS[name]
    result = onnx_lnfold.fold(MODELS / f"{name}.onnx")
    plan, verification = result.plan, result.report.verification
    assert (len(plan.folded), len(plan.decisions)) == (folded, total), [(d.node, d.reason) for d in plan.kept]
    assert verification.status == "passed", verification.reason
    assert verification.max_rel_diff < 1e-5
    assert {o.name for o in verification.outputs} == {"logits", *(f"present.{i}.{kv}" for i in range(2) for kv in ("key", "value"))}
    with np.load(MODELS / f"{name}.inputs.npz") as f:
        feeds = {k: f[k] for k in f.files}
    with np.load(MODELS / f"{name}.outputs.npz") as f:
        expected = {k: f[k] for k in f.files}
    got = run_model(result.model_proto.SerializeToString(), feeds)  # against torch, on the export's own inputs
    for key, ref in expected.items():
        np.testing.assert_allclose(got[key], ref, rtol=0, atol=2e-5 * np.abs(ref).max())


def test_dynamo_kv_cache_mask_is_past_plus_one():
    verification = onnx_lnfold.fold(MODELS / "gpt2_kv_cache.onnx").report.verification
    first, second, realistic = verification.input_sets
    assert first.startswith("input_ids(2, 1), attention_mask(2, 9), past_key_values.0.key(2, 4, 8, 16)")
    assert second.startswith("input_ids(3, 1), attention_mask(3, 6), past_key_values.0.key(3, 4, 5, 16)")
    assert realistic.startswith("input_ids(1, 1), attention_mask(1, 65), past_key_values.0.key(1, 4, 64, 16)")


def test_merged_decoder_is_verified_on_both_branches():
    result = onnx_lnfold.fold(MODELS / "gpt2_merged_decoder.onnx")
    assert ops(result.model_proto) == {"If": 1}
    sets = result.report.verification.input_sets
    assert [s.rsplit("use_cache_branch=", 1)[1] for s in sets] == ["True", "False", "True", "False", "True [realistic scale]"]
    # The cached branch reads a mask of past + new tokens (what `present` declares), the other one
    # a mask of the new tokens: both read from the graph, not from the input's declared dims.
    assert "attention_mask(2, 16)" in sets[0] and "attention_mask(2, 8)" in sets[1]


def test_merged_decoder_fold_matches_torch_on_the_branch_without_cache():
    result = onnx_lnfold.fold(MODELS / "gpt2_merged_decoder.onnx")
    original = MODELS / "gpt2_merged_decoder.onnx"
    rng = np.random.default_rng(3)
    feeds = {
        "input_ids": rng.integers(0, 512, (2, 6)),
        "attention_mask": np.ones((2, 6), np.int64),
        "position_ids": np.tile(np.arange(6), (2, 1)),
        **{f"past_key_values.{i}.{kv}": np.zeros((2, 4, 1, 16), np.float32) for i in range(2) for kv in ("key", "value")},
        "use_cache_branch": np.array([False]),
    }
    ref, got = run_model(original, feeds), run_model(result.model_proto.SerializeToString(), feeds)
    for key in ref:
        np.testing.assert_allclose(got[key], ref[key], rtol=0, atol=1e-5 * np.abs(ref[key]).max())


def test_second_size_changes_only_what_the_graph_leaves_free():
    """A Split of the batch into [1, 1] fixes the batch at 2: the second size keeps it and
    changes the sequence length only."""
    g = Graph()
    h = g.linear(g.input("x", ["b", "s", 8]), 8, 16, "proj")
    a, b = g.node("Split", [h, g.ints("sizes", [1, 1])], n_out=2, axis=0)
    g.output(g.linear(g.ln(g.node("Add", [a, b]), 16, "ln"), 16, 4, "head"))
    verification = onnx_lnfold.fold(g.model()).report.verification
    assert verification.status == "passed" and verification.input_sets == ["x(2, 8, 8)", "x(2, 5, 8)"]


def test_a_graph_that_runs_at_one_size_only_says_so():
    g = Graph()
    x = g.node("Reshape", [g.input("x", ["b", "s", 8]), g.ints("shape", [2, 8, 8])])
    g.output(g.linear(g.ln(g.linear(x, 8, 16, "proj"), 16, "ln"), 16, 4, "head"))
    verification = onnx_lnfold.fold(g.model()).report.verification
    # The realistic set's last fallback, one sequence of 16, holds the 2 x 8 x 8 values the Reshape wants.
    assert verification.status == "passed" and verification.input_sets == ["x(2, 8, 8)", "x(1, 16, 8) [realistic scale]"]
    (note,) = verification.notes
    assert note.startswith("left out: the original model does not run in onnxruntime on input set 2 of 3 (x(3, 5, 8))")


def test_original_that_onnxruntime_cannot_load_refuses_with_no_verify_as_the_way_out(tmp_path):
    g = Graph()
    x = g.input("x", ["b", "s", 8])
    g.output(g.linear(g.ln(g.linear(x, 8, 16, "proj"), 16, "ln"), 16, 4, "head"))
    g.output(g.node("Frobnicate", [x], domain="com.example"))
    model = g.model()
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    with pytest.raises(onnx_lnfold.NotVerified, match=r"the original model does not load in onnxruntime: .*; pass verify=False to accept"):
        onnx_lnfold.fold(model)
    src = tmp_path / "m.onnx"
    onnx.save(model, src)
    code, _, stderr = run_cli(src, "-o", tmp_path / "o.onnx", "-q")
    assert code == 1 and stderr.strip().endswith("; accept an unverified model with --no-verify")
    assert len(stderr.strip().splitlines()) == 1 and not (tmp_path / "o.onnx").exists()


def test_index_inputs_stay_inside_the_table_after_an_offset():
    """OPT-style learned positions: `position_ids + 2` indexes a table of 10 rows: ids are drawn
    from 0..7 (not all ones, as an integer input that indexes nothing gets)."""
    g = Graph()
    ids = g.node("Add", [g.input("position_ids", ["b", "s"], TensorProto.INT64), g.ints("offset", 2)])
    h = g.node("Gather", [g.const("positions", (10, 16)), ids])
    g.output(g.linear(g.ln(h, 16, "ln"), 16, 4, "head"))
    model = g.model()
    for input_set in verification_input_sets(ir.serde.deserialize_model(model)):
        drawn = input_set.feeds["position_ids"]
        assert drawn.max() <= 7 and len(np.unique(drawn)) > 2
    assert onnx_lnfold.fold(model).report.verification.status == "passed"


def test_user_inputs_are_also_checked_with_their_bools_flipped():
    model = _if_on_a_bool_input()
    feeds = {"x": np.ones((2, 3, 8), np.float32), "flag": np.array(True)}
    verification = onnx_lnfold.fold(model, inputs=feeds, fold_costly=True).report.verification
    assert verification.status == "passed" and verification.input_sets == ["x(2, 3, 8), flag=True", "x(2, 3, 8), flag=False"]


def test_an_output_widened_from_fp16_gets_the_fp16_tolerance():
    """keep_io_types fp16 models end in Cast(fp16 -> fp32): that output carries fp16 rounding."""
    from onnx import TensorProto as T
    from onnx import helper as h

    from onnx_lnfold.verify.check import output_types
    from onnx_lnfold.verify.verdict import rtol_for

    w = onnx.numpy_helper.from_array(np.ones((4, 4), np.float16), "w")
    g = h.make_graph(
        [
            h.make_node("Cast", ["x"], ["x16"], to=T.FLOAT16),
            h.make_node("MatMul", ["x16", "w"], ["y16"]),
            h.make_node("Cast", ["y16"], ["y"], to=T.FLOAT),
            h.make_node("Cast", ["w"], ["w32"], to=T.FLOAT),
            h.make_node("MatMul", ["x", "w32"], ["z"]),
        ],
        "g",
        [h.make_tensor_value_info("x", T.FLOAT, [2, 4])],
        [h.make_tensor_value_info("y", T.FLOAT, [2, 4]), h.make_tensor_value_info("z", T.FLOAT, [2, 4])],
        [w],
    )
    types = output_types(ir.from_proto(h.make_model(g, opset_imports=[h.make_opsetid("", 17)])))
    assert types == {"y": T.FLOAT16, "z": T.FLOAT}
    assert (rtol_for(types["y"]), rtol_for(types["z"])) == (1e-2, 1e-4)
