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

If/Loop/Scan bodies are inferred inside the whole model first. Where that leaves some value of a
body without a rank (ONNX's data propagation refuses sibling branches that reuse value names, as
optimum's merged decoders do, and ONNX Runtime's symbolic inference covers the main graph only),
the body is inferred again on its own: a model whose graph is the body, whose inputs are the
body's own inputs and the outer-scope values it reads, typed with what the outer graph's inference
found (`subgraph_proto`). Both inferences then run on it as on a main graph.

Each inference names the dims it cannot resolve with symbols of its own. Those are only
comparable with symbols from the same run, so every symbol that is not a dim name of a graph
input is tagged with its source (`GENERATED_PREFIX`): two sources can then never agree by accident.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Union

import onnx
import onnx_ir as ir

from onnx_lnfold.core.ir import const_tensor

logger = logging.getLogger(__name__)

# A dim is an int, a symbol name, or None when nothing is known about it.
Dim = Union[int, str, None]
Shape = tuple[Dim, ...]
# (graph path, value name): a path locates an If/Loop/Scan body as a chain of (node index,
# attribute name, graph index), since sibling If branches reuse value names.
Key = tuple[tuple, str]
# What is known of one value: (shape, elem type).
Found = tuple[Union[Shape, None], int]

# Symbols an inference made up (not a graph input's dim name) start with this, then the source.
GENERATED_PREFIX = "?"

# Initializers above this many elements are declared as typed inputs for inference: their values
# never matter to shapes, and copying them would cost memory on multi-GB models.
_INLINE_LIMIT = 4096


def subgraphs(graph: ir.Graph, path: tuple = (), owner: ir.Node | None = None):
    """(path, graph, owner node) of `graph` and of every If/Loop/Scan body in it, parents first.

    A path is a chain of (node index, attribute name, graph index) from the main graph: sibling If
    branches reuse value names (optimum's merged decoders do), so a name alone does not say which
    value it is. Node indices are the graph's order, which `light_proto` and `subgraph_proto` keep.
    """
    yield path, graph, owner
    for index, node in enumerate(graph):
        for attr in node.attributes.values() if node.attributes else ():
            if attr.type == ir.AttributeType.GRAPH:
                yield from subgraphs(attr.as_graph(), (*path, (index, attr.name, 0)), node)
            elif attr.type == ir.AttributeType.GRAPHS:
                for k, sub in enumerate(attr.as_graphs()):
                    yield from subgraphs(sub, (*path, (index, attr.name, k)), node)


def defining_graph(value: ir.Value) -> ir.Graph | None:
    """The graph whose scope `value` belongs to: its producer's, else the one it is an input or
    initializer of."""
    producer = value.producer()
    return producer.graph if producer is not None else value.graph


def outer_reads(graph: ir.Graph) -> list[ir.Value]:
    """The values of enclosing graphs that `graph`, or a body inside it, reads (first read first)."""
    inner = {id(g) for _, g, _ in subgraphs(graph)}
    found: dict[ir.Value, None] = {}
    for node in graph.all_nodes():
        for value in node.inputs:
            if value is not None and id(defining_graph(value)) not in inner:
                found.setdefault(value, None)
    for value in graph.outputs:  # a branch may return an outer value as it is
        if id(defining_graph(value)) not in inner:
            found.setdefault(value, None)
    return list(found)


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


class Inferred(Mapping):
    """What one inference found, `Key` -> `Found`: read from the types of the proto it wrote as
    each value is asked for, its made-up symbols tagged then (`tagged`). An analysis asks for a
    few values of a large graph; reading all of them up front took seconds at 200,000 nodes.
    What is set (`__setitem__`, `update`) replaces what was read."""

    def __init__(self, types: dict[Key, onnx.TypeProto] | None = None):
        self._types = types if types is not None else {}  # tensor types only
        self._source: str | None = None
        self._shared: set[str] = set()
        self._found: dict[Key, Found] = {}  # read or set

    def tagged(self, source: str, shared: set[str]) -> Inferred:
        """These results with every symbol not (a product of) `shared` names tagged with `source`."""
        out = Inferred(self._types)
        out._source, out._shared = source, shared
        out._found = {key: (tag(shape, source, shared), elem) for key, (shape, elem) in self._found.items()}
        return out

    def __getitem__(self, key: Key) -> Found:
        found = self._found.get(key)
        if found is None:
            type_proto = self._types[key]
            shape = proto_dims(type_proto)
            if self._source is not None:
                shape = tag(shape, self._source, self._shared)
            found = self._found[key] = (shape, type_proto.tensor_type.elem_type)
        return found

    def __setitem__(self, key: Key, found: Found) -> None:
        self._found[key] = found

    def update(self, other: Mapping[Key, Found]) -> None:
        self._found.update(other.items())

    def has_shape(self, key: Key) -> bool:
        """Whether `key`'s shape is known (`self[key][0] is not None`), without reading its dims."""
        found = self._found.get(key)
        if found is not None:
            return found[0] is not None
        type_proto = self._types.get(key)
        return type_proto is not None and type_proto.tensor_type.HasField("shape")

    def __contains__(self, key: object) -> bool:
        return key in self._found or key in self._types

    def __iter__(self) -> Iterator[Key]:
        yield from self._types
        yield from (key for key in self._found if key not in self._types)

    def __len__(self) -> int:
        return len(self._types) + sum(key not in self._types for key in self._found)


def _inlined(tensor: ir.TensorProtocol) -> bool:
    return tensor.size <= _INLINE_LIMIT and not isinstance(tensor, ir.ExternalTensor)


def _typed_input(name: str, tensor: ir.TensorProtocol) -> onnx.ValueInfoProto:
    return onnx.helper.make_tensor_value_info(name, int(tensor.dtype), list(tensor.shape.dims))


def _small_constant(name: str, tensor: ir.TensorProtocol) -> onnx.TensorProto:
    initializer = ir.serde.serialize_tensor(tensor)
    initializer.name = name
    return initializer


def _as_model(model: ir.Model, graph: onnx.GraphProto) -> onnx.ModelProto:
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
        if _inlined(tensor):
            graph.initializer.append(_small_constant(name, tensor))
        elif name not in declared:
            graph.input.append(_typed_input(name, tensor))
    outputs = {v.name for v in g.outputs}
    for node in g:
        ir.serde.serialize_node_into(graph.node.add(), node)  # not serialized, then copied in
        for out in node.outputs:
            if out.name and out.name not in outputs and (out.type is not None or out.shape is not None):
                graph.value_info.append(ir.serde.serialize_value(out))
    for value in g.outputs:
        graph.output.append(ir.serde.serialize_value(value))
    return _as_model(model, graph)


def subgraph_proto(model: ir.Model, body: ir.Graph, typed: dict[str, onnx.ValueInfoProto]) -> onnx.ModelProto:
    """An If/Loop/Scan body as a model of its own, for inference (see `light_proto`).

    Its inputs are the body's own inputs and the outer-scope values it reads: small constants with
    their values (data propagation reads them), the rest typed by `typed` (name -> type, what the
    enclosing graph's inference found). Declared shapes of its values and outputs are left out,
    as `stripped` leaves out the main graph's.
    """
    graph = onnx.GraphProto(name=body.name or "body")
    declared = set()
    for value in body.inputs:
        graph.input.append(typed.get(value.name) or ir.serde.serialize_value(value))
        declared.add(value.name)
    for name, value in body.initializers.items():
        tensor = value.const_value
        if tensor is not None and _inlined(tensor):
            graph.initializer.append(_small_constant(name, tensor))
        elif tensor is not None and name not in declared:
            graph.input.append(_typed_input(name, tensor))
    for value in outer_reads(body):
        tensor = None if value.is_graph_input() else const_tensor(value)
        if tensor is not None and _inlined(tensor):
            graph.initializer.append(_small_constant(value.name, tensor))
        elif tensor is not None:
            graph.input.append(_typed_input(value.name, tensor))
        else:
            graph.input.append(typed.get(value.name) or ir.serde.serialize_value(value))
    for node in body:
        ir.serde.serialize_node_into(graph.node.add(), node)
    for value in body.outputs:
        out = ir.serde.serialize_value(value)
        if out.type.HasField("tensor_type"):
            out.type.tensor_type.ClearField("shape")
        graph.output.append(out)
    return _as_model(model, graph)


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
    types: dict[Key, onnx.TypeProto] = {}
    graphs: list[tuple[tuple, onnx.GraphProto]] = [((), model.graph)]
    while graphs:  # If/Loop/Scan bodies carry their own value_info
        path, g = graphs.pop()
        for infos in (g.value_info, g.output, g.input):
            for vi in infos:
                type_proto = vi.type
                if type_proto.HasField("tensor_type"):
                    types[(path, vi.name)] = type_proto
        if not with_subgraphs:
            continue
        for index, node in enumerate(g.node):
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    graphs.append(((*path, (index, attr.name, 0)), attr.g))
                graphs.extend(((*path, (index, attr.name, k)), sub) for k, sub in enumerate(attr.graphs))
    return Inferred(types)


def onnx_inference(proto: onnx.ModelProto) -> Inferred:
    """ONNX shape inference with data propagation; nothing when it fails (custom ops, bad graphs)."""
    try:
        return _collect(onnx.shape_inference.infer_shapes(proto, data_prop=True))
    except Exception as e:
        logger.debug("ONNX shape inference failed: %s", e)
        return Inferred()


def session_view(model: ir.Model) -> dict[Key, Found]:
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
        key: (
            None
            if s is None
            else tuple(None if isinstance(d, str) and d.startswith("unk__") and d not in named else d for d in s),
            t,
        )
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
    inference._update_output_from_vi()  # graph outputs' shapes, as its `infer_shapes` ends
    # Main graph only: it rewrites subgraph node lists in its own order, so node-index paths into
    # them would not name the same bodies (`_infer_bodies` runs it on each body as a main graph).
    return _collect(inference.out_mp_, with_subgraphs=False), complete


def ort_symbolic_inference(proto: onnx.ModelProto) -> tuple[Inferred, bool]:
    """ONNX Runtime's symbolic shape inference: (shapes, whether its symbols may be compared
    with the graph inputs' dim names); nothing, False when onnxruntime is missing or it fails.

    First without merging dims. Where that stops at two symbolic dims the graph broadcasts
    together (`Min(128, seq)` against `seq` in a TorchScript BERT's position ids), it is run
    again merging them, as ONNX Runtime's own optimizer runs it: then its symbols rest on that
    assumption and stay its own (tagged), so only its ranks and integer dims are used elsewhere.
    """
    try:
        import onnxruntime.tools.symbolic_shape_infer  # noqa: F401
    except Exception as e:  # onnxruntime is optional
        logger.debug("symbolic shape inference unavailable: %s", e)
        return Inferred(), False
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
        return Inferred(), False
    finally:
        sym_logger.setLevel(level)


def _lacks_rank(proto: onnx.ModelProto, inferred: Inferred) -> bool:
    has_shape = inferred.has_shape
    return any(out and not has_shape(((), out)) for node in proto.graph.node for out in node.output)


def _body_lacks_rank(body: ir.Graph, path: tuple, inferred: Inferred) -> bool:
    return any(
        out.name and inferred.get((path, out.name), (None, 0))[0] is None for node in body for out in node.outputs
    )


def _outer_shape(
    model: ir.Model, value: ir.Value, paths: dict[int, tuple], sources: tuple[Inferred, ...], shared: set[str]
) -> tuple[Shape | None, int]:
    """What the enclosing graphs' inferences know of `value` (its dims tagged as they tag them)."""
    graph = defining_graph(value)
    declared = proto_dims(ir.serde.serialize_value(value).type) if value.type is not None else None
    elem = int(value.dtype) if value.dtype is not None else 0
    if value.is_graph_input() and graph is model.graph:
        return declared, elem  # the model's interface: its own names are the shared ones
    key = (paths.get(id(graph), ()), value.name or "")
    for source in sources:
        shape, inferred_elem = source.get(key, (None, 0))
        if shape is not None:
            return shape, elem or inferred_elem
    if declared is None:
        return None, elem
    # A declared symbol that is not an input's dim name is only a hint: not passed on.
    return tuple(d if not isinstance(d, str) or _is_shared(d, shared) else None for d in declared), elem


@dataclass(frozen=True)
class _Carried:
    """A Loop's carried value that its body does not type, given the rank of its initial value."""

    output: str  # the body output that becomes this input on the next iteration
    rank: int
    elem: int


def _body_types(
    model: ir.Model,
    body: ir.Graph,
    owner: ir.Node | None,
    paths: dict[int, tuple],
    sources: tuple[Inferred, ...],
    shared: set[str],
) -> tuple[dict[str, onnx.ValueInfoProto], dict[str, str], dict[str, _Carried]]:
    """Types for a body's run of its own: for the outer values it reads, what the enclosing
    inferences found; for a Loop's carried values the body does not type, the rank of their
    initial values (no dims: those may change from one iteration to the next; the rank is checked
    by the caller). Symbols of the enclosing results that are not input dim names are given plain
    names for the run: (types, plain name -> enclosing symbol, carried values given a rank)."""
    given: dict[str, str] = {}

    def plain(shape: Shape | None) -> list | None:
        if shape is None:
            return None
        out: list = []
        for d in shape:
            if isinstance(d, str) and not _is_shared(d, shared):
                d = given.setdefault(d, f"lnfold_outer_{len(given)}")
            out.append(d)
        return out

    typed: dict[str, onnx.ValueInfoProto] = {}
    for value in outer_reads(body):
        shape, elem = _outer_shape(model, value, paths, sources, shared)
        if elem:
            typed[value.name] = onnx.helper.make_tensor_value_info(value.name, elem, plain(shape))
    carried: dict[str, _Carried] = {}
    if owner is not None and owner.op_type == "Loop" and owner.domain in ("", "ai.onnx"):
        # body inputs: iteration, condition, carried...; outputs: condition, carried..., scans
        for value, initial, output in zip(body.inputs[2:], owner.inputs[2:], body.outputs[1:]):
            if value.shape is not None or initial is None:
                continue
            shape, elem = _outer_shape(model, initial, paths, sources, shared)
            elem = int(value.dtype) if value.dtype is not None else elem
            if elem and shape is not None:
                typed[value.name] = onnx.helper.make_tensor_value_info(value.name, elem, [None] * len(shape))
                carried[value.name] = _Carried(output.name, len(shape), elem)
    return typed, {v: k for k, v in given.items()}, carried


def _rebased(
    found: Inferred, path: tuple, outer: set[str], back: dict[str, str], source: str, shared: set[str]
) -> dict[Key, Found]:
    """A body's own run keyed and tagged as the whole model's: paths under `path`, the symbols
    given to it named back, its own symbols tagged with `source` (unique to the body and run)."""
    out: dict[Key, Found] = {}
    for (sub, name), (shape, elem) in found.items():
        if not sub and name in outer:
            continue  # the outer values, typed for the run: the enclosing results are theirs
        if shape is not None:
            shape = tuple(back.get(d, d) if isinstance(d, str) else d for d in shape)
            shape = tuple(
                d
                if not isinstance(d, str) or d in back.values() or _is_shared(d, shared)
                else f"{GENERATED_PREFIX}{source}:{d}"
                for d in shape
            )
        out[((*path, *sub), name)] = (shape, elem)
    return out


def _run_body(proto: onnx.ModelProto) -> tuple[Inferred, Inferred, bool]:
    """Both inferences on a body's model: (ONNX's, ONNX Runtime's where ONNX's leaves a rank
    unknown, whether the latter's symbols compare with the inputs')."""
    found = onnx_inference(proto)
    if not _lacks_rank(proto, found):
        return found, {}, True
    symbolic, comparable = ort_symbolic_inference(proto)
    return found, symbolic, comparable


def _rank_changes(carried: dict[str, _Carried], found: Inferred, symbolic: Inferred) -> list[str]:
    """The carried values whose rank the body is not shown to keep: the output that feeds them
    back has another rank, or none known. (Where every carried value keeps its rank, the ranks
    hold on every iteration, by induction from the initial values.)"""
    changes = []
    for name, value in carried.items():
        shape = found.get(((), value.output), (None, 0))[0] or symbolic.get(((), value.output), (None, 0))[0]
        if shape is None or len(shape) != value.rank:
            changes.append(name)
    return changes


def _infer_bodies(model: ir.Model, by_onnx: Inferred, by_ort: Inferred, by_hint: Inferred, shared: set[str]) -> None:
    """Infer again, each on its own, the If/Loop/Scan bodies the whole-model inference left some
    value of without a rank (see the module docstring); what that finds replaces what the
    whole-model inference found, except where it finds nothing."""
    paths = {id(g): path for path, g, _ in subgraphs(model.graph)}
    for path, body, owner in subgraphs(model.graph):
        if not path or not _body_lacks_rank(body, path, by_onnx):
            continue
        try:
            typed, back, carried = _body_types(model, body, owner, paths, (by_onnx, by_ort, by_hint), shared)
            while True:
                found, symbolic, comparable = _run_body(subgraph_proto(model, body, typed))
                changes = _rank_changes(carried, found, symbolic)
                if not changes:
                    break
                for name in changes:  # as ONNX's own Loop inference does for every carried value
                    typed[name] = onnx.helper.make_tensor_value_info(name, carried.pop(name).elem, None)
        except Exception as e:  # as for the whole model: a body the IR cannot write back keeps what it has
            logger.debug("body %s not inferred on its own: %s", path, e)
            continue
        outer = {v.name for v in outer_reads(body)}
        label = ".".join(f"{i}.{name}.{k}" for i, name, k in path)
        for key, result in _rebased(found, path, outer, back, f"onnx@{label}", shared).items():
            if result[0] is not None or key not in by_onnx:  # never a known shape for an unknown one
                by_onnx[key] = result
        # Run merging dims, ONNX Runtime's symbols rest on that: none compares with anything else.
        ort_back, ort_shared = (back, shared) if comparable else ({}, set())
        by_ort.update(_rebased(symbolic, path, outer, ort_back, f"ort@{label}", ort_shared))


def with_input_shapes(model: ir.Model, given: dict[str, tuple[int, ...]]) -> Inferred:
    """ONNX inference (with data propagation) of the graph with its inputs' shapes fixed to
    `given` (input name -> shape): the sizes the model runs at, where the graph computes them from
    its inputs' (a convolution's output length, say). Nothing where inference fails."""
    try:
        proto = stripped(light_proto(model))
    except Exception as e:  # a model the IR cannot write back cannot be inferred either
        logger.debug("shape inference skipped: %s", e)
        return Inferred()
    for vi in proto.graph.input:
        shape = given.get(vi.name)
        if shape is None or not vi.type.HasField("tensor_type"):
            continue
        dims = vi.type.tensor_type.shape.dim
        if len(dims) != len(shape):
            continue
        for dim, size in zip(dims, shape):
            dim.Clear()
            dim.dim_value = int(size)
    return onnx_inference(proto)


def infer(model: ir.Model) -> tuple[Inferred, Inferred, Inferred]:
    """(ONNX inference, ONNX Runtime symbolic inference, ONNX inference seeded with the declared
    shapes) of `model`, generated symbols tagged.

    The first two are what the graph computes. The symbolic one is run only where ONNX inference
    leaves some node output without a rank. The third is a hint like the declared shapes it
    starts from: it carries an exporter's dim names (`batch`, `seq`) to tensors it did not
    annotate, where the first may know them only by symbols of its own. Bodies of If/Loop/Scan
    the first left values of without a rank are inferred again on their own (`_infer_bodies`).
    """
    try:
        seeded = light_proto(model)
        proto = stripped(seeded)
    except Exception as e:  # a model the IR cannot write back cannot be inferred either
        logger.debug("shape inference skipped: %s", e)
        return Inferred(), Inferred(), Inferred()
    shared = input_symbols(model)
    by_onnx = onnx_inference(proto)
    by_ort = Inferred()
    ort_shared: set[str] = set()
    if _lacks_rank(proto, by_onnx):
        by_ort, comparable = ort_symbolic_inference(proto)
        ort_shared = shared if comparable else set()
    by_hint = onnx_inference(seeded) if len(seeded.graph.value_info) else Inferred()
    tagged = (by_onnx.tagged("onnx", shared), by_ort.tagged("ort", ort_shared), by_hint.tagged("hint", shared))
    _infer_bodies(model, *tagged, shared)
    return tagged
