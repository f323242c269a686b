"""Refuse a model that is not valid ONNX, in ONNX's own words (`onnx.checker`, full check with shape
inference), before anything is folded: a fold of an invalid graph would be written back as valid.

The checker reads the graph without its weights: the model's proto with every large initializer an
external-data placeholder (`load.opset.placeholder_proto`; the checker looks up no location that
begins with '#'). No weight is read, embedded or external, at any model size; the external data
files themselves are checked by `load.model` (inside the folder, present, long enough).

What ONNX Runtime runs and the checker alone refuses is not refused (ORT-optimized, fp16-converted
and onnxruntime-genai models do all of this): the copy checked is changed first, never the model:

- ONNX Runtime's own ops in the default domain (the fold's SimplifiedLayerNormalization) are
  checked as its `com.microsoft` ops are: not at all;
- a node of a domain the model does not import (the transformers optimizer's `com.microsoft` ops)
  gets that domain's import at version 1, as in `load.opset`;
- the declared types of intermediate values (`value_info`) are dropped: ONNX Runtime infers them
  itself and keeps going where a declared shape differs (onnxruntime-genai's models declare scalar
  shapes for 1-element constants); a declared type it refuses is refused when it loads the model;
- a graph output declared without a shape is left out of the copy's outputs (the node that makes it
  is still checked), an input without one made a value of unknown type: the checker wants a shape
  on the main graph's inputs and outputs, ONNX Runtime does not;
- nodes out of topological order are sorted (`onnx_ir`'s sort), as ONNX Runtime sorts them.

A graph that cannot be sorted (a cycle) and a node input that nothing makes are said in our words:
the checker names both "not topologically sorted". Custom-domain ops are not checked (the checker's
default): ONNX knows no `com.microsoft` schema.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import onnx
import onnx_ir as ir

from onnx_lnfold.core.errors import InvalidInput
from onnx_lnfold.core.ir import STANDARD_DOMAINS, node_label
from onnx_lnfold.core.ops import LAYER_NORM, MS_DOMAIN, ORT_DEFAULT_DOMAIN_OPS
from onnx_lnfold.io.proto_graphs import nodes_within
from onnx_lnfold.load.opset import PLACEHOLDER, placeholder_proto, used_domains

# The checker's reason is its first line, cut to this many characters.
REASON_CHARS = 300
# How the checker says the nodes are out of order (then sorted and checked again).
_UNSORTED = "must be topologically sorted"
# What protobuf's parser says when messages nest past its depth limit (upb: 100 levels; an
# If/Loop body is 4 levels: graph, node, attribute, graph).
_TOO_DEEP = "MaxDepth"
# onnx_ir warns of a node input it cannot resolve, then makes one up; `check_model` refuses the
# model in one line of its own, so that warning is kept off the user's screen while loading.
_IR_LOGGER = "onnx_ir.serde"
_UNRESOLVED = "cannot be found in any scope"
# The domain of the copy's stand-ins for graph inputs without a shape (no schema: not checked).
_INPUT_DOMAIN = "onnx_lnfold.unshaped_input"


class _Unresolved(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return _UNRESOLVED not in record.getMessage()


@contextmanager
def _quiet_unresolved() -> Iterator[None]:
    logger, quiet = logging.getLogger(_IR_LOGGER), _Unresolved()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


def _reason(error: BaseException) -> str:
    text = (str(error).strip().splitlines() or [type(error).__name__])[0].strip()
    text = text.removeprefix("[ShapeInferenceError] Inference error(s): ").strip()
    return text if len(text) <= REASON_CHARS else text[: REASON_CHARS - 3] + "..."


def _unmade_input(graph: ir.Graph) -> str | None:
    """The first node input of `graph` that no node, graph input or initializer makes."""
    for node in graph:
        for value in node.inputs:
            if (
                value is not None
                and value.producer() is None
                and not value.is_graph_input()
                and not value.is_initializer()
            ):
                return f"input '{value.name}' of node {node_label(node)} is made by no node, graph input or initializer"
    return None


def _as_onnx_runtime_reads(proto: onnx.ModelProto, domains: set[str]) -> onnx.ModelProto:
    """`proto` (a copy of the model's) changed as ONNX Runtime reads it (module docstring); `domains`
    the non-standard domains its nodes use."""
    for node in nodes_within(proto.graph):  # ONNX Runtime's ops in the default domain, checked as its others
        if node.domain in STANDARD_DOMAINS and node.op_type in ORT_DEFAULT_DOMAIN_OPS:
            node.domain = MS_DOMAIN
            domains = domains | {MS_DOMAIN}
    # A graph input declared without a shape (ONNX Runtime takes any): the checker wants one on the
    # main graph, so the copy makes it a value of unknown type, the output of an unchecked node.
    shapeless = [
        i for i in proto.graph.input if i.type.HasField("tensor_type") and not i.type.tensor_type.HasField("shape")
    ]
    if shapeless:
        names = {i.name for i in shapeless}
        kept = [i for i in proto.graph.input if i.name not in names]
        del proto.graph.input[:]
        proto.graph.input.extend(kept)
        nodes = [onnx.helper.make_node("Input", [], [name], domain=_INPUT_DOMAIN) for name in sorted(names)]
        nodes.extend(proto.graph.node)
        del proto.graph.node[:]
        proto.graph.node.extend(nodes)
        domains = domains | {_INPUT_DOMAIN}
    # External data is load.model's to check (inside the model's folder, present, long enough): the
    # checker, reading bytes, would look for it beside the working directory.
    for tensor in proto.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = PLACEHOLDER
    present = {o.domain for o in proto.opset_import}
    for domain in sorted(domains - present):
        proto.opset_import.append(onnx.helper.make_opsetid(domain, 1))
    del proto.graph.value_info[:]
    typed = [
        o
        for o in proto.graph.output
        if not (o.type.HasField("tensor_type") and not o.type.tensor_type.HasField("shape"))
    ]
    if len(typed) < len(proto.graph.output):
        del proto.graph.output[:]
        proto.graph.output.extend(typed)
    return proto


def _sorted(proto: onnx.ModelProto) -> onnx.ModelProto:
    graph = ir.serde.deserialize_model(proto)
    graph.graph.sort()  # ValueError: a cycle
    return ir.to_proto(graph)


# ONNX's shape inference, where a declared shape and the one it infers disagree.
_OUTPUT_MERGE = "Inferred shape and existing shape differ"
# ONNX's shape inference, asked for the values of a tensor the copy holds as a placeholder.
_NEEDS_WEIGHTS = "Cannot parse data from external tensors"


def _check(proto: onnx.ModelProto) -> onnx.ModelProto | None:
    """ONNX's checker on `proto`, its full check done as `check_model(full_check=True)` does it (the
    checker, then strict shape inference with type checks), so that the shapes it inferred can be
    read: the copy with them, or None where no check could run. Raises `ValidationError` /
    `InferenceError` with the checker's words."""
    data = proto.SerializeToString()
    if len(data) > onnx.checker.MAXIMUM_PROTOBUF:
        return None  # a graph over 2 GB without its weights: neither protobuf nor ONNX Runtime reads it
    onnx.checker.check_model(data)  # custom domains not checked: ONNX knows no com.microsoft schema
    try:
        return onnx.shape_inference.infer_shapes(data, check_type=True, strict_mode=True)
    except onnx.shape_inference.InferenceError as e:
        if _NEEDS_WEIGHTS in str(e):  # a large weight read as a constant input: no full check without it
            return None
        raise


def _ranks(proto: onnx.ModelProto, names: set[str]) -> dict[str, int]:
    """The ranks the graph declares or ONNX inferred, of the tensors `names`."""
    infos = (*proto.graph.input, *proto.graph.value_info, *proto.graph.output)
    ranks = {
        i.name: len(i.type.tensor_type.shape.dim)
        for i in infos
        if i.name in names and i.type.tensor_type.HasField("shape")
    }
    ranks.update((t.name, len(t.dims)) for t in proto.graph.initializer if t.name in names)
    return ranks


def _bad_ln_axis(proto: onnx.ModelProto) -> str | None:
    """A LayerNormalization whose axis is outside its input's rank: ONNX's shape inference lets it
    pass (its schema does not check the axis), ONNX Runtime fails when it runs."""
    norms = [
        (position, node)
        for position, node in enumerate(proto.graph.node)
        if node.op_type == LAYER_NORM.op_type and node.domain in STANDARD_DOMAINS and node.input
    ]
    ranks = _ranks(proto, {node.input[0] for _, node in norms}) if norms else {}
    for position, node in norms:
        rank = ranks.get(node.input[0])
        axis = next((a.i for a in node.attribute if a.name == "axis"), -1)
        if rank is not None and not -rank <= axis < rank:
            label = f"'{node.name}'" if node.name else f"#{position}"
            return f"{LAYER_NORM.op_type} {label} has axis {axis}, outside [-{rank}, {rank}) for its rank-{rank} input '{node.input[0]}'"
    return None


def _checked(proto: onnx.ModelProto, head: str) -> onnx.ModelProto | None:
    """`_check`, with the nodes sorted first where the checker says they are out of order (ONNX
    Runtime sorts them); its refusal an `InvalidInput` headed `head`."""
    try:
        return _check(proto)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
        if _UNSORTED not in str(e):
            raise InvalidInput(f"{head}: {_reason(e)}") from None
    try:
        proto = _sorted(proto)
    except ValueError:
        raise InvalidInput(f"{head}: the graph has a cycle (a node reads, through other nodes, what it writes)") from None
    try:
        return _check(proto)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
        raise InvalidInput(f"{head}: {_reason(e)}") from None


def check_model(model: ir.Model, path: Path | None = None) -> None:
    """Refuse `model` (`InvalidInput`, one line, `path` named) where it is not valid ONNX: ONNX's
    checker's first line, or our words for a cycle, a node input nothing makes and a
    LayerNormalization axis past its input's rank."""
    head = f"{path}: invalid ONNX model" if path is not None else "invalid ONNX model"
    unmade = _unmade_input(model.graph)
    if unmade:
        raise InvalidInput(f"{head}: {unmade}")
    proto = _as_onnx_runtime_reads(placeholder_proto(model, read_small=True)[0], used_domains(model))
    try:
        inferred = _checked(proto, head)
    except InvalidInput as refused:
        if _OUTPUT_MERGE not in str(refused) or not proto.graph.output:
            raise
        # ONNX Runtime merges a graph output's declared shape leniently with what it infers (its
        # MergeShapeInfo warns "Falling back to lenient merge" and loads the model): so does the check.
        del proto.graph.output[:]
        inferred = _checked(proto, head)
    bad_axis = _bad_ln_axis(inferred) if inferred is not None else None
    if bad_axis:
        raise InvalidInput(f"{head}: {bad_axis}")


def _unreadable(path: Path | None, error: InvalidInput) -> InvalidInput:
    """A refusal of the loader's, in better words where its cause says more: a file nested past
    protobuf's depth limit, or a graph onnx_ir cannot build (the checker then names the problem)."""
    cause = error.__context__  # the loader raises its refusal `from None` while handling the cause
    if cause is None or path is None:
        return error
    if type(cause).__name__ == "DecodeError" and _TOO_DEEP in str(cause):
        return InvalidInput(
            f"{path}: not a readable ONNX model: its graphs (If/Loop/Scan bodies) nest deeper than protobuf parses"
        )
    if isinstance(cause, ir.serde.SerdeError):
        # The model is refused either way: its file is read whole here (as the loader's fallback does).
        try:
            proto = onnx.load(str(path), load_external_data=False)
            domains = {node.domain for node in proto.graph.node if node.domain not in STANDARD_DOMAINS}
            onnx.checker.check_model(_as_onnx_runtime_reads(proto, domains))
        except onnx.checker.ValidationError as e:
            return InvalidInput(f"{path}: invalid ONNX model: {_reason(e)}")
        except Exception:  # noqa: BLE001 - no better words than the loader's
            return error
    return error


@contextmanager
def checked_load(source: str | os.PathLike | None) -> Iterator[None]:
    """Around a load: onnx_ir's warning about an unresolved input kept quiet (`check_model` says
    it), and the loader's refusal of a file in better words where its cause says more."""
    path = Path(source) if source is not None else None
    with _quiet_unresolved():
        try:
            yield
        except InvalidInput as e:
            better = _unreadable(path, e)
            if better is e:
                raise
            raise better from None


__all__ = ["REASON_CHARS", "check_model", "checked_load"]
