"""The constants a fold leaves without a reader are not written (apply.orphans): a decomposed LN's
Pow exponent, epsilon and axes go with its nodes, in the graph that holds them (an If body's LN
reading the main graph's constant included); a constant anything else reads stays, and so does one
the original already left unread. ONNX Runtime then removes nothing when it loads the fold."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper

from graphs import Graph, decomposed_ln, fold_checked

# ONNX Runtime's message for each initializer no node reads, as it loads a model.
_REMOVING = "Removing initializer"


def _graphs(graph: onnx.GraphProto):
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                yield from _graphs(sub)


def _read_names(proto: onnx.ModelProto) -> set[str]:
    """Every name a node of any graph reads, and the graph outputs."""
    read = {o.name for g in _graphs(proto.graph) for o in g.output}
    return read | {name for g in _graphs(proto.graph) for node in g.node for name in node.input if name}


def _unread(proto: onnx.ModelProto) -> list[str]:
    """The initializers and Constant node outputs of every graph that nothing reads."""
    read = _read_names(proto)
    stored = [t.name for g in _graphs(proto.graph) for t in g.initializer]
    stored += [n.output[0] for g in _graphs(proto.graph) for n in g.node if n.op_type == "Constant"]
    return sorted(name for name in stored if name not in read)


def _ort_log(proto: onnx.ModelProto, tmp_path) -> str:
    """What ONNX Runtime logs, at its most verbose, as it loads `proto` (in a child process: its
    log goes to the process's stderr)."""
    path = tmp_path / "model.onnx"
    onnx.save(proto, path)
    script = (
        "import sys, onnxruntime as ort\n"
        "options = ort.SessionOptions()\n"
        "options.log_severity_level = 0\n"
        "ort.InferenceSession(sys.argv[1], options, providers=['CPUExecutionProvider'])\n"
    )
    run = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout + run.stderr


def _decomposed(opset: int = 18, *, unused: bool = False) -> Graph:
    """x -> Linear -> decomposed LN -> Linear; with `unused` an initializer and a Constant node
    the original reads nowhere."""
    g = Graph()
    h = decomposed_ln(g, g.linear(g.input("x", [2, "s", 8]), 8, 8, "p"), 8, "dec", opset=opset)
    g.output(g.linear(h, 8, 4, "q"))
    if unused:
        g.const("unused.table", (3,))
        g.node("Constant", [], name="unused_const", value=onnx.numpy_helper.from_array(np.ones(2, np.float32)))
    return g


def test_a_decomposed_ln_leaves_no_constant_unread(tmp_path):
    model = _decomposed().model()
    assert _unread(model) == []
    folded = fold_checked(model, folded=1).model_proto
    assert _unread(folded) == []
    stored = {t.name for t in folded.graph.initializer} | {n.output[0] for n in folded.graph.node}
    assert not stored & {"dec.two", "dec.axes", "dec.axes2", "dec/eps_const_out", "dec.beta"}
    assert _REMOVING not in _ort_log(folded, tmp_path)


def test_onnx_runtime_names_an_unread_initializer(tmp_path):
    """The log the test above reads does name an initializer no node reads."""
    model = _decomposed(unused=True).model()
    assert f"{_REMOVING} 'unused.table'" in _ort_log(model, tmp_path)


def test_a_constant_the_original_left_unread_stays():
    """Before opset 18 the builder's axes initializer is read by nothing; with the two unused ones
    added, the fold removes none of them (they are the model's own)."""
    model = _decomposed(opset=12, unused=True).model(opset=12)
    before = _unread(model)
    assert before == ["dec.axes", "unused.table", "unused_const_out"]
    assert _unread(fold_checked(model, folded=1).model_proto) == before


def test_a_constant_another_node_reads_stays():
    """Two decomposed LNs share the exponent (an initializer) and epsilon (a Constant node's
    output); the one on a graph input does not fold (no centering without `auxiliary_centering`),
    so both stay; the folded LN's own first axes and beta go. A Neg outside any LN reads the folded
    LN's second axes, which stays too."""
    g = Graph()
    a = decomposed_ln(g, g.linear(g.input("x", [2, "s", 8]), 8, 8, "p"), 8, "a")
    b = decomposed_ln(g, g.input("y", [2, "s", 8]), 8, "b")
    for node in g.nodes:
        if node.name == "b/pow":
            node.input[1] = "a.two"
        if node.name == "b/add_eps":
            node.input[1] = "a/eps_const_out"
    g.output(g.linear(a, 8, 4, "q"))
    g.output(b)
    g.output(g.node("Neg", ["a.axes2"], name="other"), elem_type=TensorProto.INT64)
    model = g.model()
    result = fold_checked(model, folded=1, kept=1)
    assert result.plan.folded[0].node == "a/mean"
    folded = result.model_proto
    assert _unread(folded) == ["b.two", "b/eps_const_out"]  # left unread by the original already
    stored = {t.name for t in folded.graph.initializer} | {n.output[0] for n in folded.graph.node}
    assert {"a.two", "a/eps_const_out", "a.axes2"} <= stored
    assert not stored & {"a.axes", "a.beta"}


def test_an_if_body_ln_reading_an_outer_constant():
    """An If body's decomposed LN reads its exponent from the main graph and its epsilon from a
    Constant node of its own: both go, each from the graph that holds it."""
    body = Graph(seed=1)
    h = body.node("MatMul", ["x", "W"], name="then/mm")
    y = decomposed_ln(body, h, 8, "then")
    for node in body.nodes:
        if node.name == "then/pow":
            node.input[1] = "two"
    then_branch = helper.make_graph(
        body.nodes,
        "then",
        [],
        [helper.make_tensor_value_info(y, TensorProto.FLOAT, None)],
        [t for t in body.inits if t.name != "then.two"],
    )
    else_branch = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["else_y"], name="else/mm")],
        "else",
        [],
        [helper.make_tensor_value_info("else_y", TensorProto.FLOAT, None)],
    )
    g = Graph()
    g.input("x", [2, "s", 4])
    g.input("cond", [], TensorProto.BOOL)
    g.const("W", (4, 8))
    g.const("two", value=np.float32(2.0))
    g.nodes.append(helper.make_node("If", ["cond"], ["y"], name="if", then_branch=then_branch, else_branch=else_branch))
    g.output("y")
    model = g.model()
    assert _unread(model) == []
    folded = fold_checked(model, folded=1).model_proto
    assert _unread(folded) == []
    names = {t.name for sub in _graphs(folded.graph) for t in sub.initializer}
    names |= {n.output[0] for sub in _graphs(folded.graph) for n in sub.node}
    assert not names & {"two", "then/eps_const_out", "then.axes", "then.axes2"}
