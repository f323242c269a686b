"""LNs in If/Loop bodies: fresh names unique across the whole model (a body's initializers and
inputs included), a beta that is a body's own initializer, external data held only by a body's
initializers. Each folds exactly on both branches."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphs import Graph, fold_checked
from helpers import run_cli


def _run(model: onnx.ModelProto | str, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    source = model if isinstance(model, str) else model.SerializeToString()
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"]).run(None, feeds)


def assert_same_on_both_branches(original, folded, seq: int = 5) -> None:
    """Run both models with the `cond` input at both values (fold()'s own check draws one)."""
    x = np.random.default_rng(7).standard_normal((2, seq, 4)).astype(np.float32)
    for cond in (True, False):
        feeds = {"x": x, "cond": np.array(cond)}
        for ref, got in zip(_run(original, feeds), _run(folded, feeds)):
            np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * float(np.max(np.abs(ref))))


def _arr(rng, *shape) -> np.ndarray:
    return rng.normal(0.3, 1.0, size=shape).astype(np.float32)


def _branch(tag: str, rng, *, extra_init: str | None = None, head: bool = False) -> onnx.GraphProto:
    """An If body: MatMul(x, W) -> LN [-> MatMul + bias] [+ its own initializer `extra_init`].
    `W` is the main graph's weight (read from the outer scope); gamma/beta are the body's."""
    nodes = [
        helper.make_node("MatMul", ["x", "W"], [f"{tag}_mm"], name=f"{tag}_mm"),
        helper.make_node("LayerNormalization", [f"{tag}_mm", f"{tag}_g", f"{tag}_b"], [f"{tag}_ln"], name=f"{tag}_ln", axis=-1),
    ]
    inits = [numpy_helper.from_array(_arr(rng, 8), f"{tag}_g"), numpy_helper.from_array(_arr(rng, 8), f"{tag}_b")]
    y = f"{tag}_ln"
    if head:  # beta folds into this bias: the body's own beta becomes unused and is removed
        nodes += [
            helper.make_node("MatMul", [y, f"{tag}_W2"], [f"{tag}_h"], name=f"{tag}_h"),
            helper.make_node("Add", [f"{tag}_h", f"{tag}_c"], [f"{tag}_head"], name=f"{tag}_bias"),
        ]
        inits += [numpy_helper.from_array(_arr(rng, 8, 3), f"{tag}_W2"), numpy_helper.from_array(_arr(rng, 3), f"{tag}_c")]
        y = f"{tag}_head"
    if extra_init is not None:
        nodes.append(helper.make_node("Add", [y, extra_init], [f"{tag}_y"], name=f"{tag}_add"))
        inits.append(numpy_helper.from_array(_arr(rng, 3 if head else 8), extra_init))
        y = f"{tag}_y"
    out = helper.make_tensor_value_info(y, TensorProto.FLOAT, None)
    return helper.make_graph(nodes, tag, [], [out], inits)


def _if_model(*, then_init: str | None = None, head: bool = False, shared_weight: bool = True) -> onnx.ModelProto:
    """x -> If(cond) over two bodies that each read the main graph's W; W is also read by a
    MatMul in the main graph (so its centered version is a copy with a fresh name)."""
    rng = np.random.default_rng(3)
    g = Graph()
    g.input("x", [2, "s", 4])
    g.input("cond", [], TensorProto.BOOL)
    g.const("W", (4, 8))
    if shared_weight:
        g.output(g.node("MatMul", ["x", "W"], name="other"))
    then_b = _branch("then", rng, extra_init=then_init, head=head)
    else_b = _branch("else", rng, head=head)
    g.nodes.append(helper.make_node("If", ["cond"], ["y"], name="if", then_branch=then_b, else_branch=else_b))
    g.output("y")
    return g.model()


@pytest.mark.parametrize("taken", ["W.centered", "then_ln.rms"])
def test_fresh_names_avoid_a_body_initializer(taken):
    """A body's initializer shares the model's one namespace. Before: the untied copy of W took
    the name 'W.centered' an If body's initializer has (the body then read its own [8] tensor as
    the weight: ONNX Runtime refused the model, VerificationFailed), and the folded body LN's
    output took 'then_ln.rms' ('Duplicate definition of name')."""
    model = _if_model(then_init=taken)
    result = fold_checked(model, folded=2)
    names = _defined_names(result.model_proto)
    assert len(names) == len(set(names)), sorted(n for n in set(names) if names.count(n) > 1)
    assert_same_on_both_branches(model, result.model_proto)


def _defined_names(proto: onnx.ModelProto) -> list[str]:
    """Every name the model defines (graph inputs, initializers, node outputs), bodies included."""

    def walk(graph: onnx.GraphProto):
        yield from (v.name for v in graph.input)
        yield from (i.name for i in graph.initializer)
        for node in graph.node:
            yield from (o for o in node.output if o)
            for attr in node.attribute:
                for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                    yield from walk(sub)

    names = list(walk(proto.graph))
    inputs = {v.name for v in proto.graph.input}
    return [n for n in names if not (n in inputs and names.count(n) == 2 and n in {i.name for i in proto.graph.initializer})]


def test_fresh_names_avoid_a_loop_body_input():
    """A Loop body's inputs (iteration count, condition, carried state) are names too. Before:
    the folded main-graph LN's output took the name 'ln_out.rms', which the body already defines
    as its carried input: one name defined twice in one model (not SSA; a body reading the outer
    tensor by that name would read its own input instead)."""
    g = Graph()
    x = g.input("x", [2, "s", 4])
    h = g.linear(x, 4, 8, "p")
    y = g.ln(h, 8, "ln")  # 'ln_out', whose RMSNorm output is named 'ln_out.rms' unless taken
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Add", ["ln_out.rms", "ln_out"], ["acc_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("ln_out.rms", TensorProto.FLOAT, None),
        ],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, None)],
    )
    trip = g.const("trip", value=np.array(3, dtype=np.int64))
    g.nodes.append(helper.make_node("Loop", [trip, "", y], ["acc"], name="loop", body=body))
    g.output("acc")
    result = fold_checked(g.model(), folded=1)
    names = _defined_names(result.model_proto)
    assert len(names) == len(set(names)), sorted(n for n in set(names) if names.count(n) > 1)


def test_beta_initializer_of_an_if_body():
    """Both bodies fold, their betas go into their own heads' biases and the now unused betas are
    removed from the bodies. Before: KeyError 'else_b' (removed from the main graph, which does
    not hold it): an internal error, exit 3."""
    model = _if_model(head=True, shared_weight=False)
    result = fold_checked(model, folded=2)
    assert {d.beta for d in result.plan.folded} == {"consumers"}
    for node in result.model_proto.graph.node:
        for attr in node.attribute:
            if attr.HasField("g"):
                assert not {i.name for i in attr.g.initializer} & {"then_b", "else_b"}
    assert_same_on_both_branches(model, result.model_proto)


def test_external_data_held_only_by_if_body_initializers(tmp_path):
    """Before: the main graph has no external tensor, so the output was written as one file whose
    body tensors still pointed at the input's data file, relative to the staging folder; ONNX
    Runtime could not load it and the run ended 'verification failed' (exit 1) for a correct
    fold. Now the output keeps its weights in OUT.onnx.data as any external-data model does."""
    model = _if_model(shared_weight=False)
    src = tmp_path / "in.onnx"
    onnx.save(model, src, save_as_external_data=True, all_tensors_to_one_file=True, location="in.data", size_threshold=0)
    proto = onnx.load(src, load_external_data=False)
    for init in proto.graph.initializer:  # main graph: inline
        onnx.external_data_helper.load_external_data_for_tensor(init, str(tmp_path))
        init.data_location = TensorProto.DEFAULT
        del init.external_data[:]
    onnx.save(proto, src)
    assert not any(i.data_location == TensorProto.EXTERNAL for i in proto.graph.initializer)
    out = tmp_path / "out.onnx"
    code, stdout, stderr = run_cli(src, "-o", out, "--fold-costly")  # the bodies' betas stay Adds
    assert code == 0, stderr
    assert "Verification (passed" in stdout
    assert_same_on_both_branches(str(src), str(out))


def test_a_body_ln_does_not_take_in_the_outer_graphs_residual_add():
    """An If body's LN reads a residual sum of the main graph. With fuse_residual='always', the
    body's Skip op once took in the main graph's Add: the rewrite raised (the Add is not the
    body's node), the traceback reaching the user."""
    rng = np.random.default_rng(5)
    g = Graph()
    x = g.input("x", [2, "s", 4])
    g.input("cond", [], TensorProto.BOOL)
    h = g.node("Add", [g.linear(x, 4, 8, "a"), g.linear(x, 4, 8, "b")], name="residual")

    def branch(tag: str) -> onnx.GraphProto:
        ln = helper.make_node("LayerNormalization", [h, f"{tag}_g", f"{tag}_b"], [f"{tag}_ln"], name=f"{tag}_ln", axis=-1)
        inits = [numpy_helper.from_array(_arr(rng, 8), f"{tag}_g"), numpy_helper.from_array(_arr(rng, 8), f"{tag}_b")]
        return helper.make_graph([ln], tag, [], [helper.make_tensor_value_info(f"{tag}_ln", TensorProto.FLOAT, None)], inits)

    g.nodes.append(helper.make_node("If", ["cond"], ["y"], name="if", then_branch=branch("then"), else_branch=branch("else")))
    g.output("y")
    model = g.model()
    result = fold_checked(model, folded=2, fuse_residual="always", fold_costly=True)
    assert not [d.node for d in result.plan.folded if d.residual_add]
    assert_same_on_both_branches(model, result.model_proto)
