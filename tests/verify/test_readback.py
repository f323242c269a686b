"""The read-back (verify.readback): every difference between the folded model as written and the
model it came from is one the plan made, and checked; anything else refuses the fold and is named.
Faults go in after the apply step (`run_pipeline(after_apply=...)`), with `float64_budget=0`: the
path of every model past the float64 budget, where the read-back is what catches them."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

from onnx_lnfold import _pipeline
from onnx_lnfold.apply.apply_plan import apply_plan
from onnx_lnfold.core.fold_request import FoldRequest
from onnx_lnfold.core.options import CheckSettings, FoldOptions
from onnx_lnfold.load.model import load_model
from onnx_lnfold.verify import tensor_checks
from onnx_lnfold.verify.readback import planned_changes, read_back

from conftest import MODELS


def _fold(name: str, fault=None, options: FoldOptions | None = None, budget: float = 0.0):
    path = MODELS / name
    model, _ = load_model(path)
    request = FoldRequest(options=options or FoldOptions(), check=CheckSettings(float64_budget=budget))
    run = _pipeline.run_pipeline(model, path, request, after_apply=fault)
    return run.report.verification


def _scale_entry(name: str, factor: float):
    def fault(model: ir.Model, plan) -> None:
        value = model.graph.initializers[name]
        values = np.array(value.const_value.numpy())
        values.reshape(-1)[0] *= factor
        value.const_value = ir.Tensor(values, name=name)

    return fault


def _rms_nodes(model: ir.Model) -> list[ir.Node]:
    return [n for n in model.graph if "epsilon" in n.attributes and n.op_type != "LayerNormalization"]


@pytest.mark.parametrize("name", ["gpt2.onnx", "bert.onnx"])
@pytest.mark.parametrize("options", [FoldOptions(), FoldOptions(target="onnx"), FoldOptions(target="primitive")])
def test_a_correct_fold_reads_back_on_every_target(name, options):
    verification = _fold(name, options=options)
    assert verification.passed, verification.reason
    assert verification.edits_checked > 0


def test_one_gamma_entry_off_by_1e_5_is_refused_and_named():
    """The hole measured: gamma x(1+1e-5) in one entry passed the sensitivity judgment."""
    verification = _fold("gpt2.onnx", _scale_entry("model.transformer.h.0.ln_1.weight", 1 + 1e-5))
    assert verification.status == "failed"
    assert "the tensor 'model.transformer.h.0.ln_1.weight' differs from the original" in verification.reason


def test_an_epsilon_off_is_refused_and_named():
    def fault(model, plan):
        node = _rms_nodes(model)[0]
        node.attributes["epsilon"] = ir.AttrFloat32("epsilon", node.attributes.get_float("epsilon") * 10)

    verification = _fold("gpt2.onnx", fault)
    assert verification.status == "failed" and "has epsilon 0.0001, where the plan writes 1e-05" in verification.reason


def test_a_gamma_swapped_for_another_tensor_is_refused():
    def fault(model, plan):
        node = _rms_nodes(model)[0]
        other = _rms_nodes(model)[1].inputs[1]
        node.replace_input_with(1, other)

    verification = _fold("gpt2.onnx", fault)
    assert verification.status == "failed"
    assert "ln_2.weight'], not the planned [" in verification.reason and verification.reason.endswith("ln_1.weight']")


def test_a_node_the_plan_does_not_insert_is_refused():
    def fault(model, plan):
        node = _rms_nodes(model)[0]
        x = node.inputs[0]
        copy = ir.Value(name="inserted", shape=x.shape, type=x.type)
        identity = ir.Node("", "Identity", [x], outputs=[copy], name="inserted")
        model.graph.insert_before(node, [identity])
        node.replace_input_with(0, copy)

    verification = _fold("gpt2.onnx", fault)
    assert verification.status == "failed" and "reads ['inserted', " in verification.reason and "not the planned" in verification.reason


def test_a_dropped_explicit_centering_is_refused():
    def fault(model, plan):
        centering = plan.centerings[0]
        sub = next(n for n in model.graph if n.outputs[0].name == centering.new_name)
        sub.outputs[0].replace_all_uses_with(sub.inputs[0])
        model.graph.remove([sub, sub.inputs[1].producer()], safe=True)

    verification = _fold("bert.onnx", fault)
    assert verification.status == "failed"
    assert "the explicit centering of " in verification.reason and "nothing in the folded model computes" in verification.reason


def test_a_centering_over_another_axis_is_refused():
    def fault(model, plan):
        centering = plan.centerings[0]
        sub = next(n for n in model.graph if n.outputs[0].name == centering.new_name)
        mean = sub.inputs[1].producer()
        axes = ir.Value(name="wrong_axes", const_value=ir.Tensor(np.array([1], np.int64)))
        model.graph.register_initializer(axes)
        if "axes" in mean.attributes:
            mean.attributes["axes"] = ir.AttrInt64s("axes", [1])
        else:
            mean.replace_input_with(1, axes)

    verification = _fold("bert.onnx", fault)
    assert verification.status == "failed" and "the mean is over axes [1], not the planned axis" in verification.reason


def test_a_bias_without_its_share_of_beta_is_refused():
    def fault(model, plan):
        for value in model.graph.initializers.values():
            tensor = value.const_value
            if type(tensor).__name__ == "BiasPlusBeta" and tensor._bias is not None:
                value.const_value = ir.Tensor(np.array(tensor._bias.numpy()), name=value.name)
                return
        raise AssertionError("no bias took a beta")

    verification = _fold("gpt2.onnx", fault)
    assert verification.status == "failed" and "is off the original bias plus beta @ W by" in verification.reason


def test_row_means_of_a_table_derived_at_load_off_are_refused():
    def fault(model, plan):
        (edit,) = [e for e in plan.edits if e.means_name]
        value = model.graph.initializers[edit.means_name]
        values = np.array(value.const_value.numpy()) + 1e-3
        value.const_value = ir.Tensor(values, name=value.name)

    verification = _fold("gpt2.onnx", fault)
    assert verification.status == "failed" and "is off the row means by" in verification.reason


def _initializer_read_by(model: ir.Model, node_name_end: str, index: int) -> ir.Value:
    node = next(n for n in model.graph if n.name.endswith(node_name_end))
    return node.inputs[index]


def _times(name_end: str, index: int, factor: float):
    """A fault: the constant input `index` of the first node named `...name_end`, times `factor`."""

    def fault(model: ir.Model, plan) -> None:
        value = _initializer_read_by(model, name_end, index)
        values = np.array(value.const_value.numpy())
        value.const_value = ir.Tensor(values * np.array(factor, values.dtype), name=value.name)

    return fault


@pytest.mark.parametrize(
    "fault, words",
    [
        (_times("/rms_add_eps", 1, 10.0), "holds [0.0001] of shape [], not the planned 1e-05 of shape []"),
        (_times("/rms_square", 1, 1.5), "holds [3.] of shape [], not the planned 2 of shape []"),
        (_times("/rms_mean", 1, 2), "ReduceMean is over axes [-2], not the planned axes [-1]"),
    ],
)
def test_a_constant_of_the_primitive_form_off_is_refused(fault, words):
    verification = _fold("gpt2.onnx", fault, FoldOptions(target="primitive"))
    assert verification.status == "failed"
    assert "the RMSNorm of 'node_layer_norm': " in verification.reason and words in verification.reason, verification.reason


def test_an_attribute_the_plan_does_not_write_is_refused():
    def fault(model, plan):
        _rms_nodes(model)[0].attributes["stash_type"] = ir.AttrInt64("stash_type", 0)

    verification = _fold("gpt2.onnx", fault)
    assert verification.status == "failed" and "has stash_type 0, where the plan writes 1" in verification.reason


def test_a_skip_op_without_its_bias_is_refused():
    """bert_ort_opt1's SkipLayerNormalization nodes read a bias: the Skip op written in their place
    reads it (an input slot of the original, read when the rewrite runs)."""

    def fault(model, plan):
        skip = next(n for n in _rms_nodes(model) if len(n.inputs) == 4)
        skip.resize_inputs(3)

    verification = _fold("bert_ort_opt1.onnx", fault)
    assert verification.status == "failed" and "SkipSimplifiedLayerNormalization reads [" in verification.reason


def _without_gamma() -> ir.Model:
    """A decomposed LN written without gamma or beta: its RMSNorm gets a scale of ones it creates."""
    from graphs import Graph, decomposed_ln

    g = Graph()
    g.output(decomposed_ln(g, g.linear(g.input("x", [2, "s", 4]), 4, 8, "p"), 8, "dec", affine=False))
    return ir.from_proto(g.model())


def test_a_scale_of_ones_the_fold_creates_is_read_back_by_value():
    request = FoldRequest(options=FoldOptions(fold_costly=True), check=CheckSettings(float64_budget=0.0))
    run = _pipeline.run_pipeline(_without_gamma(), None, request)
    assert run.report.verification.passed, run.report.verification.reason

    def fault(model, plan):
        value = model.graph.initializers["dec/mean.scale"]
        value.const_value = ir.Tensor(np.full(8, 1.0 + 1e-6, np.float32), name="dec/mean.scale")

    run = _pipeline.run_pipeline(_without_gamma(), None, request, after_apply=fault)
    verification = run.report.verification
    assert verification.status == "failed" and "'dec/mean.scale' holds [1.000001 " in verification.reason, verification.reason
    assert "not the planned 1 of shape [8]" in verification.reason


def test_doc_strings_are_no_difference():
    """The fold notes on each node it writes what it stands for; any node's doc_string, the fold's
    notes or the original's, is no difference the read-back counts."""

    def fault(model, plan):
        for node in model.graph:
            node.doc_string = "edited"

    verification = _fold("bert.onnx", fault)
    assert verification.passed, verification.reason
    assert verification.edits_checked > 0


def test_the_read_back_runs_on_the_float64_judgment_too():
    verification = _fold("gpt2.onnx", _scale_entry("model.transformer.h.0.ln_1.weight", 1 + 1e-5), budget=60)
    assert verification.status == "failed" and verification.reason.startswith("the folded model is not what the plan wrote")


# --------------------------------------------------------------------------- the tensor checks
def _tensor(values: np.ndarray) -> ir.Tensor:
    return ir.Tensor(values.astype(np.float32))


def _blocked(values: np.ndarray, size: int, chosen: list[int], weights: np.ndarray | None = None) -> np.ndarray:
    """`values` centered along axis 1 in blocks of `size`, the `chosen` ones, of values * weights."""
    out = values.astype(np.float64).copy()
    w = np.ones(values.shape[1]) if weights is None else weights
    for b in chosen:
        part = slice(b * size, (b + 1) * size)
        out[:, part] -= (out[:, part] * w[part]).mean(axis=1, keepdims=True) / w[part]
    return out


@pytest.mark.parametrize("weighted", [False, True])
def test_blocks_and_affine_weights_are_read_back_and_a_wrong_block_is_found(weighted):
    rng = np.random.default_rng(0)
    original = (rng.normal(size=(8, 12)) + 3.0).astype(np.float32)
    weights = rng.uniform(0.5, 2.0, 12) if weighted else None
    centered = _blocked(original, 4, [0, 2], weights)
    args = (1, tuple(weights) if weighted else None, 4, (0, 2))
    assert tensor_checks.check_centered(_tensor(original), _tensor(centered), *args) == ""
    off = centered.copy()
    off[:, 0:4] += 1e-4  # block 0 not quite centered
    assert "times what one rounding allows" in tensor_checks.check_centered(_tensor(original), _tensor(off), *args)
    untouched = centered.copy()
    untouched[3, 5] += 1e-4  # block 1, which the plan leaves as it is, changed
    assert "times what one rounding allows" in tensor_checks.check_centered(_tensor(original), _tensor(untouched), *args)


@pytest.mark.parametrize("blocked", [False, True])
def test_a_weight_centered_along_its_last_axis_is_read_back_from_its_files_by_rows(tmp_path, monkeypatch, blocked):
    """Along the last axis (as weights are centered) both tensors are read from their files a group
    of rows at a time, never mapped: the same figure as the whole arrays give (the same rows taken
    along axis 0 of the transposes)."""
    rng = np.random.default_rng(1)
    original = (rng.normal(size=(3, 700, 1000)) + 1.0).astype(np.float32)  # 2100 rows: groups of 1048
    rows = original.reshape(-1, 1000)
    args = (None, 250, (1, 3)) if blocked else ()
    centered = _blocked(rows, 250, [1, 3]) if blocked else rows - rows.astype(np.float64).mean(axis=1, keepdims=True)
    wrong = centered.copy()
    wrong[1500, 260] += 1e-3  # in the second group, in a block each case centers
    for written, passes in ((centered, True), (wrong, False)):
        stored = written.astype(np.float32)
        files = []
        for name, values in (("original", original), ("written", stored.reshape(original.shape))):
            (tmp_path / f"{name}.data").write_bytes(values.tobytes())
            files.append(
                ir.ExternalTensor(f"{name}.data", 0, values.nbytes, ir.DataType.FLOAT, shape=ir.Shape(values.shape),
                                  name=name, base_dir=str(tmp_path))
            )
        with monkeypatch.context() as m:
            m.setattr(ir.ExternalTensor, "numpy", lambda self: pytest.fail(f"{self.name} mapped"))
            found = tensor_checks.check_centered(*files, -1, *args)
        whole = tensor_checks.check_centered(_tensor(rows.T.copy()), _tensor(stored.T.copy()), 0, *args)
        assert found == whole and (found == "") == passes, (found, whole)


def test_an_unchanged_tensor_must_be_byte_for_byte_the_original():
    values = np.arange(6, dtype=np.float32)
    assert tensor_checks.check_unchanged(_tensor(values), _tensor(values.copy())) == ""
    moved = values.copy()
    moved[2] = np.nextafter(moved[2], np.float32(10))
    assert tensor_checks.check_unchanged(_tensor(values), _tensor(moved)) == "differs from the original"
    assert "where the original is" in tensor_checks.check_unchanged(_tensor(values), _tensor(values[:5]))



def _skip_takes_a_bias_with_beta():
    """ln1's beta goes into mlp's bias; fused with the residual Add, that bias becomes ln2's Skip
    op's bias input (its Add is folded away)."""
    from graphs import Graph

    g = Graph()
    h0 = g.linear(g.input("x", ["b", "s", 8]), 8, 16, "embed")
    h1 = g.node("Add", [h0, g.linear(g.ln(h0, 16, "ln1"), 16, 16, "mlp")], name="residual")
    g.output(g.ln(h1, 16, "ln2"))
    return ir.from_proto(g.model())


def _run(model: ir.Model, fault=None):
    options = FoldOptions(fuse_residual="always")
    request = FoldRequest(options=options, check=CheckSettings(float64_budget=0.0))
    run = _pipeline.run_pipeline(model, None, request, after_apply=fault)
    return run


def test_a_skip_bias_that_took_a_beta_is_read_back():
    run = _run(_skip_takes_a_bias_with_beta())
    assert [d.rewrite for d in run.report.plan.folded][-1].startswith("com.microsoft")
    assert run.report.verification.passed, run.report.verification.reason

    def fault(model, plan):
        bias = model.graph.initializers["mlp.bias"]
        values = np.array(bias.const_value.numpy())
        values.reshape(-1)[3] += 1e-3
        bias.const_value = ir.Tensor(values, name="mlp.bias")

    verification = _run(_skip_takes_a_bias_with_beta(), fault).report.verification
    assert verification.status == "failed" and "'mlp.bias'" in verification.reason, verification.reason


def _constant_node_bias_centered_and_given_a_beta():
    """mlp's bias is a Constant node (as TorchScript writes some): centered for ln2's stream and
    given ln1's beta, it is written as a copy, and its Constant node goes."""
    from onnx import numpy_helper

    from graphs import Graph

    g = Graph()
    h0 = g.linear(g.input("x", ["b", "s", 8]), 8, 16, "embed")
    bias = np.random.default_rng(1).standard_normal(16).astype(np.float32)
    g.node("Constant", [], name="mlp_bias", value=numpy_helper.from_array(bias, "mlp_bias"))
    mlp = g.node("Add", [g.linear(g.ln(h0, 16, "ln1"), 16, 16, "mlp", bias=False), "mlp_bias_out"], name="mlp/bias")
    g.output(g.ln(g.node("Add", [h0, mlp], name="residual"), 16, "ln2"))
    return ir.from_proto(g.model())


def test_a_constant_node_bias_centered_and_given_a_beta_is_read_back():
    model = _constant_node_bias_centered_and_given_a_beta()
    request = FoldRequest(options=FoldOptions(fold_costly=True), check=CheckSettings(float64_budget=0.0))
    run = _pipeline.run_pipeline(model, None, request)
    assert "mlp_bias_out" in {e.tensor for e in run.report.plan.edits}
    assert run.report.verification.passed, run.report.verification.reason

    def fault(model, plan):
        (copy,) = [v for name, v in model.graph.initializers.items() if name.startswith("mlp_bias_out")]
        values = np.array(copy.const_value.numpy())
        values.reshape(-1)[5] += 1e-3
        copy.const_value = ir.Tensor(values, name=copy.name)

    model = _constant_node_bias_centered_and_given_a_beta()
    verification = _pipeline.run_pipeline(model, None, request, after_apply=fault).report.verification
    assert verification.status == "failed" and "is off the original bias plus beta @ W" in verification.reason, verification.reason


# --------------------------------------------------------------------------- removed constants
def _decomposed_with_unused() -> ir.Model:
    """x -> Linear -> decomposed LN -> Linear; x * a scale of its own; an initializer the original
    reads nowhere."""
    from graphs import Graph, decomposed_ln

    g = Graph()
    x = g.input("x", [2, "s", 8])
    g.output(g.linear(decomposed_ln(g, g.linear(x, 8, 8, "p"), 8, "dec"), 8, 4, "q"))
    g.output(g.node("Mul", [x, g.const("other.scale", (8,))], name="other"))
    g.const("unused.table", (3,))
    return ir.from_proto(g.model())


def _fold_built(fault=None):
    request = FoldRequest(options=FoldOptions(fold_costly=True), check=CheckSettings(float64_budget=0.0))
    return _pipeline.run_pipeline(_decomposed_with_unused(), None, request, after_apply=fault)


def test_the_constants_only_a_folded_ln_read_are_removed_and_read_back():
    run = _fold_built()
    assert run.report.verification.passed, run.report.verification.reason
    stored = set(run.model.graph.initializers) | {n.outputs[0].name for n in run.model.graph if n.op_type == "Constant"}
    assert "unused.table" in stored
    assert not stored & {"dec.two", "dec.axes", "dec.axes2", "dec.beta", "dec/eps_const_out"}


@pytest.mark.parametrize("name", ["other.scale", "unused.table"])
def test_a_constant_the_plan_does_not_remove_gone_is_refused(name):
    """A constant another node reads, or one the original left unread, is no constant the fold
    removes: the read-back refuses either gone (ONNX Runtime, which loads the fold first, refuses
    the one still read too)."""
    model, bound = _pipeline.analyze_for_target(_decomposed_with_unused(), FoldOptions(fold_costly=True))
    changes = planned_changes(model, bound)
    assert {"0:dec.two", "0:dec.beta", "0:dec/eps_const_out"} <= changes.orphans
    apply_plan(model, bound)
    model.graph.initializers.pop(name)
    problem = read_back(ir.to_proto(model).SerializeToString(), changes).problem
    assert problem == f"the constant '{name}' is gone, and the plan does not remove it"


def test_a_constant_the_original_left_unread_gone_is_refused_by_the_check():
    def fault(model, plan):
        model.graph.initializers.pop("unused.table")

    verification = _fold_built(fault).report.verification
    assert verification.status == "failed"
    assert "the constant 'unused.table' is gone, and the plan does not remove it" in verification.reason


def test_a_decomposed_ln_model_reads_back_without_its_exponents_and_epsilons():
    """gpt2_torchscript_opset14 writes each LN's exponent and epsilon as Constant nodes: they go
    with the LN, and a Constant node anything else reads may not."""
    assert _fold("gpt2_torchscript_opset14.onnx").passed

    def fault(model, plan):
        node = next(n for n in model.graph if n.op_type == "Constant" and "/attn/" in (n.name or ""))
        node.outputs[0].replace_all_uses_with(ir.Value(name=node.outputs[0].name))
        model.graph.remove(node, safe=True)

    verification = _fold("gpt2_torchscript_opset14.onnx", fault)
    assert verification.status == "failed" and "/attn/c_attn/Constant_output_0' is not" in verification.reason
