"""Shapes inferred from the graph itself, on a light copy of it; the model is never touched.

Two inferences, both run on a copy from which every declared intermediate shape is removed
(`value_info`, and the shapes of graph outputs): deployment tools write `value_info` whose dims
are unknown (`unk__N` from the fp16 converter or `onnx.shape_inference`), and an inference that
starts from those keeps them, while the graph's own `Shape -> Gather/Slice -> Concat -> Reshape`
arithmetic says exactly which dim is which.

- ONNX shape inference with data propagation: standard ops, shape subgraphs folded.
- ONNX Runtime's symbolic shape inference (`onnxruntime.tools.symbolic_shape_infer`), run when
  ONNX's leaves some tensor without a rank: it knows ONNX Runtime's contrib ops
  (`SkipLayerNormalization`, `FastGelu`, `Attention`...), where ONNX inference stops, and names
  dims by expressions of the input dims.

Each inference names the dims it cannot resolve with symbols of its own. Those are only
comparable with symbols from the same run, so every symbol that is not a dim name of a graph
input is tagged with its source (`GENERATED_PREFIX`): two sources can then never agree by accident.
"""

from __future__ import annotations

import logging
from typing import Union

import onnx
import onnx_ir as ir

logger = logging.getLogger(__name__)

# A dim is an int, a symbol name, or None when nothing is known about it.
Dim = Union[int, str, None]
Shape = tuple[Dim, ...]
# (graph path, value name) -> (shape, elem type). A path locates an If/Loop/Scan body as a chain of
# (node index, attribute name, graph index): sibling If branches reuse value names.
Inferred = dict[tuple[tuple, str], tuple[Union[Shape, None], int]]

# Symbols an inference made up (not a graph input's dim name) start with this, then the source.
GENERATED_PREFIX = "?"

# Initializers above this many elements are declared as typed inputs for inference: their values
# never matter to shapes, and copying them would cost memory on multi-GB models.
_INLINE_LIMIT = 4096


def proto_dims(type_proto: onnx.TypeProto) -> Shape | None:
    if not type_proto.HasField("tensor_type") or not type_proto.tensor_type.HasField("shape"):
        return None
    out: list[Dim] = []
    for d in type_proto.tensor_type.shape.dim:
        if d.HasField("dim_value"):
            out.append(d.dim_value)
        elif d.HasField("dim_param") and d.dim_param:
            out.append(d.dim_param)
        else:
            out.append(None)
    return tuple(out)


def input_symbols(model: ir.Model) -> set[str]:
    """The dim names of the main graph's inputs: the only symbols every source shares."""
    names = set()
    for value in model.graph.inputs:
        for d in value.shape or ():
            if isinstance(d, ir.SymbolicDim) and d.value:
                names.add(d.value)
    return names


def factors(symbol: str) -> list[str]:
    """The factors of a dim written as a product (`batch*seq`, as symbolic inference writes it)."""
    return [f.strip() for f in symbol.split("*")]


def _is_shared(symbol: str, shared: set[str]) -> bool:
    return all(f in shared or f.isdigit() for f in factors(symbol))


def tag(shape: Shape | None, source: str, shared: set[str]) -> Shape | None:
    """`shape` with every symbol that is not (a product of) `shared` names tagged with `source`."""
    if shape is None:
        return None
    return tuple(
        d if not isinstance(d, str) or _is_shared(d, shared) else f"{GENERATED_PREFIX}{source}:{d}" for d in shape
    )


def light_proto(model: ir.Model) -> onnx.ModelProto:
    """The graph with small constants only, and the shapes it declares (see `stripped`).

    Large initializers become typed graph inputs. Built node by node so that no large tensor is
    ever copied into protobuf (serializing the whole model would hold every weight in memory
    once more). Subgraphs of If/Loop/Scan keep their own declarations (their outputs need types).
    """
    g = model.graph
    graph = onnx.GraphProto(name=g.name or "graph")
    declared = set()
    for value in g.inputs:
        graph.input.append(ir.serde.serialize_value(value))
        declared.add(value.name)
    for name, value in g.initializers.items():
        tensor = value.const_value
        if tensor is None:
            continue
        if tensor.size <= _INLINE_LIMIT and not isinstance(tensor, ir.ExternalTensor):
            graph.initializer.append(ir.serde.serialize_tensor(tensor))
        elif name not in declared:
            graph.input.append(onnx.helper.make_tensor_value_info(name, int(tensor.dtype), list(tensor.shape.dims)))
    outputs = {v.name for v in g.outputs}
    for node in g:
        graph.node.append(ir.serde.serialize_node(node))
        for out in node.outputs:
            if out.name and out.name not in outputs and (out.type is not None or out.shape is not None):
                graph.value_info.append(ir.serde.serialize_value(out))
    for value in g.outputs:
        graph.output.append(ir.serde.serialize_value(value))
    proto = onnx.helper.make_model(
        graph, opset_imports=[onnx.helper.make_opsetid(d, v) for d, v in model.opset_imports.items()]
    )
    used_domains = {n.domain for n in graph.node if n.domain not in ("", "ai.onnx")}
    for domain in sorted(used_domains - set(model.opset_imports)):
        # ONNX Runtime's optimizer writes contrib ops without always importing their domain
        proto.opset_import.append(onnx.helper.make_opsetid(domain, 1))
    proto.ir_version = model.ir_version
    for function in model.functions.values():
        proto.functions.append(ir.serde.serialize_function(function))
    return proto


def stripped(proto: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of a light proto without the main graph's declared intermediate and output shapes
    (element types stay)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    del copy.graph.value_info[:]
    for out in copy.graph.output:
        if out.type.HasField("tensor_type"):
            out.type.tensor_type.ClearField("shape")  # a declared output shape is a hint too
    return copy


def _collect(model: onnx.ModelProto, with_subgraphs: bool = True) -> Inferred:
    shapes: Inferred = {}
    graphs: list[tuple[tuple, onnx.GraphProto]] = [((), model.graph)]
    while graphs:  # If/Loop/Scan bodies carry their own value_info
        path, g = graphs.pop()
        for vi in list(g.value_info) + list(g.output) + list(g.input):
            if vi.type.HasField("tensor_type"):
                shapes[(path, vi.name)] = (proto_dims(vi.type), vi.type.tensor_type.elem_type)
        if not with_subgraphs:
            continue
        for index, node in enumerate(g.node):
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    graphs.append(((*path, (index, attr.name, 0)), attr.g))
                graphs.extend(((*path, (index, attr.name, k)), sub) for k, sub in enumerate(attr.graphs))
    return shapes


def onnx_inference(proto: onnx.ModelProto) -> Inferred:
    """ONNX shape inference with data propagation; {} when it fails (custom ops, bad graphs)."""
    try:
        return _collect(onnx.shape_inference.infer_shapes(proto, data_prop=True))
    except Exception as e:
        logger.debug("ONNX shape inference failed: %s", e)
        return {}


def session_view(model: ir.Model) -> Inferred:
    """The shapes ONNX Runtime's own session optimizer sees: ONNX inference on the model as given
    (its declared shapes kept), without data propagation, dims it cannot name unnamed (None).
    ORT fuses `Add + LayerNormalization` only where these name every dim (a
    value, or one dim name shared by both addends: onnxruntime/core/optimizer/skip_layer_norm_fusion.cc),
    and ONNX's `unk__N` names exist only in Python's output: in the session they are unnamed."""
    try:
        inferred = _collect(onnx.shape_inference.infer_shapes(light_proto(model), data_prop=False))
    except Exception as e:
        logger.debug("ONNX shape inference failed: %s", e)
        return {}
    named = input_symbols(model)
    return {
        key: (None if s is None else tuple(None if isinstance(d, str) and d.startswith("unk__") and d not in named else d for d in s), t)
        for key, (s, t) in inferred.items()
    }


# Constant's scalar and list forms; ONNX Runtime's symbolic inference reads only `value`.
_CONSTANT_FORMS = {
    "value_float": onnx.TensorProto.FLOAT,
    "value_floats": onnx.TensorProto.FLOAT,
    "value_int": onnx.TensorProto.INT64,
    "value_ints": onnx.TensorProto.INT64,
}


def _constants_as_tensors(proto: onnx.ModelProto) -> onnx.ModelProto:
    """A copy whose Constant nodes (main graph) hold their value as a `value` tensor: exporters
    write `value_float`/`value_int(s)`, on which ONNX Runtime's symbolic inference stops."""
    nodes = [n for n in proto.graph.node if n.op_type == "Constant" and n.domain in ("", "ai.onnx")]
    if not any(a.name in _CONSTANT_FORMS for n in nodes for a in n.attribute):
        return proto
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)  # the proto is a light copy, without large initializers
    proto = copy
    for node in proto.graph.node:
        if node.op_type != "Constant" or node.domain not in ("", "ai.onnx"):
            continue
        for attr in list(node.attribute):
            if attr.name in _CONSTANT_FORMS:
                value = onnx.helper.get_attribute_value(attr)
                dims = [len(value)] if isinstance(value, list) else []
                flat = value if isinstance(value, list) else [value]
                tensor = onnx.helper.make_tensor("value", _CONSTANT_FORMS[attr.name], dims, flat)
                node.attribute.remove(attr)
                node.attribute.append(onnx.helper.make_attribute("value", tensor))
    return proto


def _run_symbolic(proto: onnx.ModelProto, auto_merge: bool) -> tuple[Inferred, bool]:
    """One run of ONNX Runtime's symbolic inference: (what it found, whether it ran to the end).

    Driven step by step rather than through `infer_shapes`, which writes a file into the current
    folder when some shape stays unknown; partial results are what we want here.
    """
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    inference = SymbolicShapeInference(2**31 - 1, auto_merge, False, 0)
    inference._preprocess(_constants_as_tensors(proto))
    complete = False
    try:
        while inference.run_:
            complete = inference._infer_impl()  # False: it stopped at a node it could not infer
    except Exception as e:  # a conflict between dims ends the run; keep what it found
        logger.debug("symbolic shape inference stopped (auto_merge=%s): %s", auto_merge, e)
        complete = False
    # Main graph only: it rewrites subgraph node lists in its own order, so node-index paths into
    # them would not name the same bodies.
    return _collect(inference.out_mp_, with_subgraphs=False), complete


def ort_symbolic_inference(proto: onnx.ModelProto) -> tuple[Inferred, bool]:
    """ONNX Runtime's symbolic shape inference: (shapes, whether its symbols may be compared
    with the graph inputs' dim names); ({}, False) when onnxruntime is missing or it fails.

    First without merging dims. Where that stops at two symbolic dims the graph broadcasts
    together (`Min(128, seq)` against `seq` in a TorchScript BERT's position ids), it is run
    again merging them, as ONNX Runtime's own optimizer runs it: then its symbols rest on that
    assumption and stay its own (tagged), so only its ranks and integer dims are used elsewhere.
    """
    try:
        import onnxruntime.tools.symbolic_shape_infer  # noqa: F401
    except Exception as e:  # onnxruntime is optional
        logger.debug("symbolic shape inference unavailable: %s", e)
        return {}, False
    sym_logger = logging.getLogger("onnxruntime.tools.symbolic_shape_infer")
    level = sym_logger.level
    sym_logger.setLevel(logging.CRITICAL)  # it warns about every op it skips
    try:
        found, complete = _run_symbolic(proto, auto_merge=False)
        if complete:
            return found, True
        merged, _ = _run_symbolic(proto, auto_merge=True)
        return merged, False
    except Exception as e:
        logger.debug("symbolic shape inference failed: %s", e)
        return {}, False
    finally:
        sym_logger.setLevel(level)


def _lacks_rank(proto: onnx.ModelProto, inferred: Inferred) -> bool:
    for node in proto.graph.node:
        for out in node.output:
            if out and inferred.get(((), out), (None, 0))[0] is None:
                return True
    return False


def infer(model: ir.Model) -> tuple[Inferred, Inferred, Inferred]:
    """(ONNX inference, ONNX Runtime symbolic inference, ONNX inference seeded with the declared
    shapes) of `model`, generated symbols tagged.

    The first two are what the graph computes. The symbolic one is run only where ONNX inference
    leaves some node output without a rank. The third is a hint like the declared shapes it
    starts from: it carries an exporter's dim names (`batch`, `seq`) to tensors it did not
    annotate, where the first may know them only by symbols of its own.
    """
    try:
        seeded = light_proto(model)
        proto = stripped(seeded)
    except Exception as e:  # a model the IR cannot write back cannot be inferred either
        logger.debug("shape inference skipped: %s", e)
        return {}, {}, {}
    shared = input_symbols(model)
    by_onnx = onnx_inference(proto)
    by_ort: Inferred = {}
    ort_shared: set[str] = set()
    if _lacks_rank(proto, by_onnx):
        by_ort, comparable = ort_symbolic_inference(proto)
        ort_shared = shared if comparable else set()
    by_hint = onnx_inference(seeded) if len(seeded.graph.value_info) else {}
    return (
        {k: (tag(s, "onnx", shared), t) for k, (s, t) in by_onnx.items()},
        {k: (tag(s, "ort", ort_shared), t) for k, (s, t) in by_ort.items()},
        {k: (tag(s, "hint", shared), t) for k, (s, t) in by_hint.items()},
    )

