"""A model converted to another default-domain opset by ONNX's own version converter
(`onnx.version_converter`), its weights left where they are (docs/DESIGN.md section 4).

The converter works on a whole `ModelProto` in memory, which protobuf caps at 2 GB, and it
reads no weight: its adapters rewrite nodes (an attribute made an input, a renamed op) and keep
every initializer as it was. So it is handed the graph with every initializer over
`KEEP_BYTES` as an external-data reference to a placeholder (the tensor's index as its offset;
nothing is read, nothing is copied), and the converted graph gets the caller's tensor objects
back by that index. A model of any size converts in the memory of its graph; a graph whose
proto alone (small constants and Constant nodes included) is over 2 GB is refused in one line.

What the converter cannot convert is refused with the op that blocks it: the converter's own
messages name an adapter's assertion, not a node, so each distinct node of the main graph is
converted alone until one fails the same way. A node of a domain the model does not import
(an ONNX Runtime transformers-optimizer graph that names `com.microsoft` ops without its opset
import, which ONNX Runtime accepts) gets that domain's import at version 1 first: the
converter's shape inference refuses such a model, and version 1 is the only one those domains have.

The result is a new model; the caller's is not changed (its initializers are swapped for
placeholders while the proto is written and put back before this returns). The fold's own check
(docs/DESIGN.md section 6) runs the converted and folded model against the original as given,
so the conversion is verified with the rest of the rewrite.
"""

from __future__ import annotations

import onnx
import onnx_ir as ir

from onnx_lnfold.core.ir import STANDARD_DOMAINS, graphs_of
from onnx_lnfold.core.options import SettingMismatch

# Initializers up to this size are handed to the converter by value (an adapter may read a
# small constant input: Upsample's scales); larger ones travel as placeholders.
KEEP_BYTES = 1024
# ONNX's checker looks up no external-data location that begins with '#' (checker.cc), so a
# placeholder proto can also be checked (`load.validate`) without a file behind it.
PLACEHOLDER = "#onnx_lnfold-placeholder"
# At most this many single-node conversions to find the node that blocks a conversion.
MAX_PROBES = 500


def default_opset(model: ir.Model) -> int:
    imports = model.opset_imports
    return imports.get("", imports.get("ai.onnx", 0))


def _graphs(model: ir.Model) -> list[ir.Graph]:
    return [g for g in graphs_of(model) if isinstance(g, ir.Graph)]


def used_domains(model: ir.Model) -> set[str]:
    domains = {node.domain for graph in _graphs(model) for node in graph}
    domains |= {node.domain for function in model.functions.values() for node in function}
    return {d for d in domains if d not in STANDARD_DOMAINS}


def placeholder_proto(model: ir.Model, *, read_small: bool = False) -> tuple[onnx.ModelProto, list[ir.TensorProtocol]]:
    """The model as a proto whose large initializers are placeholders, and the tensors they stand
    for (by index: a placeholder's offset): the graph without its weights, none read. With
    `read_small`, a small external tensor is read and goes by value too (shape inference reads a
    small constant input, Unsqueeze's axes, and an export may keep every tensor external)."""
    swapped: list[tuple[ir.Value, ir.TensorProtocol]] = []
    read: list[tuple[ir.Value, ir.TensorProtocol]] = []
    try:
        for graph in _graphs(model):
            for value in graph.initializers.values():
                tensor = value.const_value
                if tensor is None or tensor.dtype == ir.DataType.STRING:
                    continue
                if tensor.nbytes <= KEEP_BYTES and read_small and isinstance(tensor, ir.ExternalTensor):
                    try:
                        value.const_value = ir.Tensor(tensor.numpy(), name=value.name)
                        read.append((value, tensor))
                        continue
                    except (OSError, ValueError):  # its file unreadable from here: a placeholder, as before
                        pass
                if tensor.nbytes <= KEEP_BYTES and not isinstance(tensor, ir.ExternalTensor):
                    continue  # by value; an external one has none in the proto, and a file relative to elsewhere
                stand_in = ir.ExternalTensor(
                    PLACEHOLDER,
                    len(swapped),
                    tensor.nbytes,
                    tensor.dtype,
                    shape=ir.Shape(list(tensor.shape)),
                    name=value.name,
                    base_dir="",
                )
                swapped.append((value, tensor))
                value.const_value = stand_in
        proto = ir.to_proto(model)
    finally:
        for value, tensor in swapped + read:
            value.const_value = tensor
    return proto, [tensor for _, tensor in swapped]


def _message(error: Exception) -> str:
    """The converter's reason, without the C++ source location and assertion text around it."""
    text = str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__
    return text.split(" failed: ", 1)[-1].strip()


def _blocking_node(proto: onnx.ModelProto, opset: int, error: Exception) -> tuple[onnx.NodeProto, int, str] | None:
    """The first node of the main graph that fails to convert alone: (node, its position, the
    converter's reason); None when none does on its own (a node inside a body, say)."""
    try:
        typed = onnx.shape_inference.infer_shapes(proto)
    except Exception:  # noqa: BLE001 - the types only help the probes
        typed = proto
    types = {v.name: v.type for v in (*typed.graph.input, *typed.graph.value_info, *typed.graph.output)}
    for tensor in proto.graph.initializer:
        types.setdefault(tensor.name, onnx.helper.make_tensor_type_proto(tensor.data_type, list(tensor.dims)))
    small = {t.name: t for t in proto.graph.initializer if t.data_location != onnx.TensorProto.EXTERNAL}
    seen: set[bytes] = set()
    for position, node in enumerate(proto.graph.node):
        if len(seen) >= MAX_PROBES:
            break
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
            continue  # a body reads the outer graph's values: not convertible alone
        signature = onnx.NodeProto()
        signature.CopyFrom(node)
        signature.name = ""
        signature.ClearField("doc_string")
        key = signature.SerializeToString(deterministic=True)
        if key in seen:
            continue
        seen.add(key)
        names = [n for n in node.input if n]
        inputs = [
            onnx.helper.make_value_info(n, types[n]) if n in types else onnx.helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None)
            for n in names
            if n not in small
        ]
        outputs = [onnx.helper.make_empty_tensor_value_info(n) for n in node.output if n]
        graph = onnx.helper.make_graph([node], "probe", inputs, outputs, [small[n] for n in names if n in small])
        single = onnx.helper.make_model(graph, opset_imports=list(proto.opset_import), ir_version=proto.ir_version)
        try:
            onnx.version_converter.convert_version(single, opset)
        except Exception as e:  # noqa: BLE001 - whatever the converter raises is its refusal
            return node, position, _message(e)
    return None


def convert_opset(model: ir.Model, opset: int, why: str) -> ir.Model:
    """`model` at default-domain `opset`, converted by `onnx.version_converter`: a new model whose
    initializers are the caller's tensor objects. `why` begins the refusal ("{target=onnx} writes
    RMSNormalization (opset 23)", naming the option as each surface spells it): `SettingMismatch`,
    one line, naming the op that blocks."""
    source = default_opset(model)
    proto, tensors = placeholder_proto(model)
    present = {o.domain for o in proto.opset_import}
    for domain in sorted(used_domains(model) - present):
        proto.opset_import.append(onnx.helper.make_opsetid(domain, 1))
    head = f"{why}; this model's default opset is {source}"
    try:
        converted = onnx.version_converter.convert_version(proto, opset)
    except ValueError as e:
        if "2GB" in str(e) or "2 GB" in str(e) or "exceeds" in str(e):
            raise SettingMismatch(
                f"{head}, and ONNX's version converter needs the graph in one protobuf message, which this one "
                f"exceeds without its large initializers (over 2 GB): convert it yourself, or use another target"
            ) from None
        raise SettingMismatch(f"{head}, and ONNX's version converter failed: {_message(e)}") from None
    except Exception as e:  # noqa: BLE001 - the converter raises RuntimeError, InferenceError, ...
        blocker = _blocking_node(proto, opset, e)
        if blocker is None:
            what = f"failed: {_message(e)}"
        else:
            node, position, reason = blocker
            label = f"'{node.name}'" if node.name else f"#{position} of the graph"
            domain = f"{node.domain}::" if node.domain not in STANDARD_DOMAINS else ""
            what = f"cannot convert node {label} ({domain}{node.op_type}): {reason}"
        raise SettingMismatch(
            f"{head}, and ONNX's version converter {what}; use another target, or change that node first"
        ) from None
    result = ir.serde.deserialize_model(converted)
    for graph in _graphs(result):
        for value in graph.initializers.values():
            tensor = value.const_value
            if isinstance(tensor, ir.ExternalTensor) and tensor.location == PLACEHOLDER:
                value.const_value = tensors[tensor.offset]
    # The IR version the new opset needs (of the default domain: ONNX's table knows no other).
    standard = [o for o in converted.opset_import if o.domain in STANDARD_DOMAINS]
    result.ir_version = max(model.ir_version or 0, onnx.helper.find_min_ir_version_for(standard))
    _restore_metadata(model, result)
    return result


def _restore_metadata(model: ir.Model, result: ir.Model) -> None:
    """What the converter drops and the fold keeps: the doc strings and metadata of nodes and
    values (an exporter's stack traces and names: 0.27 MB of models/gpt2.onnx's 0.86), found by
    name, and the model's own."""
    nodes: dict[str, ir.Node] = {}
    values: dict[str, ir.Value] = {}
    for graph in _graphs(model):
        for node in graph:
            if node.name:
                nodes.setdefault(node.name, node)
            for value in node.outputs:
                if value.name:
                    values.setdefault(value.name, value)
        for value in (*graph.inputs, *graph.initializers.values()):
            if value.name:
                values.setdefault(value.name, value)
    for graph in _graphs(result):
        for node in graph:
            old = nodes.get(node.name or "")
            if old is not None and old.op_type == node.op_type:
                if not node.metadata_props:
                    node.metadata_props.update(old.metadata_props)
                node.doc_string = node.doc_string or old.doc_string
            for value in node.outputs:
                _restore_value(values.get(value.name or ""), value)
        for value in (*graph.inputs, *graph.initializers.values()):
            _restore_value(values.get(value.name or ""), value)
    if not result.metadata_props:
        result.metadata_props.update(model.metadata_props)
    result.doc_string = result.doc_string or model.doc_string


def _restore_value(old: ir.Value | None, value: ir.Value) -> None:
    if old is not None and not value.metadata_props:
        value.metadata_props.update(old.metadata_props)


__all__ = ["KEEP_BYTES", "PLACEHOLDER", "convert_opset", "default_opset", "placeholder_proto", "used_domains"]
