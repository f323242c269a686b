"""`core.ir.graphs_of` and `core.ir.nodes_within` give what onnx-ir's `Model.graphs()` and
`RecursiveGraphIterator` give, in their order: bodies nested in bodies, several bodies on one
node (If's branches, a GRAPHS attribute), a reference attribute, nodes without attributes."""

from __future__ import annotations

import onnx
import onnx_ir as ir
from onnx import TensorProto, helper

from onnx_lnfold.core.ir import bodies, graphs_of, nodes_within


def _branch(name: str, depth: int) -> onnx.GraphProto:
    out = helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, [1])
    nodes = [helper.make_node("Identity", ["x"], [f"{name}_a"], name=f"{name}_id")]
    if depth:
        nodes.append(
            helper.make_node(
                "If",
                ["c"],
                [f"{name}_y"],
                name=f"{name}_if",
                then_branch=_branch(f"{name}t", depth - 1),
                else_branch=_branch(f"{name}e", depth - 1),
            )
        )
    else:
        nodes.append(helper.make_node("Neg", [f"{name}_a"], [f"{name}_y"], name=f"{name}_neg"))
    return helper.make_graph(nodes, name, [], [out])


def _model() -> ir.Model:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    c = helper.make_tensor_value_info("c", TensorProto.BOOL, [])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    many = helper.make_node("Custom", ["x"], ["m"], name="many", domain="custom")
    many.attribute.append(helper.make_attribute("bodies", [_branch("g0", 1), _branch("g1", 0)]))
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Transpose", ["r"], ["t"], name="transpose", perm=[0]),
        helper.make_node("If", ["c"], ["i"], name="top_if", then_branch=_branch("a", 2), else_branch=_branch("b", 0)),
        many,
        helper.make_node("Add", ["i", "m"], ["y"], name="add"),
    ]
    graph = helper.make_graph(nodes, "main", [x, c], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("custom", 1)])
    return ir.from_proto(model)


def test_the_walks_match_onnx_irs_in_order():
    model = _model()
    assert graphs_of(model) == list(model.graphs())
    assert len(graphs_of(model)) == 1 + 7 + 1 + 3 + 1  # main; a's tree (depth 2); b; g0 and its branches; g1
    assert graphs_of(model.graph) == list(model.graphs())
    assert list(nodes_within(model.graph)) == list(ir.traversal.RecursiveGraphIterator(model.graph))
    assert [n.name for n in nodes_within(model.graph)][:4] == [
        "relu",
        "transpose",
        "top_if",
        "b_id",
    ]  # a body right after its node


def test_bodies_skip_reference_and_other_attributes():
    model = _model()
    top_if, many = model.graph.node(2), model.graph.node(3)
    assert [g.name for g in bodies(top_if)] == ["b", "a"]  # attribute order: make_node sorts them
    assert [g.name for g in bodies(many)] == ["g0", "g1"]
    assert bodies(model.graph.node(1)) == []  # an ints attribute
    ref = ir.Node("", "If", [], {"then_branch": ir.RefAttr("then_branch", "outer", ir.AttributeType.GRAPH)})
    assert bodies(ref) == []
