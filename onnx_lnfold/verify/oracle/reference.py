"""The float64 evaluation verification judges a fold against (docs/DESIGN.md section 6).

A model's float64 twin (`verify.oracle.shadow.float64_twin`: every float tensor, type and dtype attribute widened
to double) runs in `onnx.reference`, which evaluates any standard op in the dtype of its inputs.
ONNX Runtime's CPU provider would be faster but has no double Conv or Erf. What `onnx.reference`
lacks or gets wrong for this purpose is implemented as `OpRun`s (`verify.oracle.float64_ops`).

A twin of the fold can carry its centered weights and beta-folded biases unrounded (`exact_tensors`:
the float64 values `apply.centering` computed before rounding): then an exact fold differs from the
original by float64 rounding only. An op that no implementation covers (ONNX Runtime's `Attention`,
`EmbedLayerNormalization`, ...) is named by `Float64Unavailable`, and verification falls back.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
from onnx.reference.ops.op_identity import Identity

from onnx_lnfold.core.ir import STANDARD_DOMAINS, graphs_of, nodes_within
from onnx_lnfold.core.ops import MS_DOMAIN
from onnx_lnfold.io.proto_read import read_proto
from onnx_lnfold.io.tensor_io import row_blocks
from onnx_lnfold.verify.oracle.blockwise import available_memory, load_structure
from onnx_lnfold.verify.oracle.cut import body_reads, in_running_order
from onnx_lnfold.verify.oracle.float64_ops import FLOAT64_OPS, KNOWN_DOMAINS, Evaluator
from onnx_lnfold.verify.oracle.paced import Progress, drain, telling
from onnx_lnfold.verify.oracle.part_reads import PART_READERS, stacked_matmul, widened
from onnx_lnfold.verify.oracle.shadow import float64_feeds, widen_to_float64
from onnx_lnfold.verify.seeded import RANDOM_OPS

logger = logging.getLogger(__name__)


class Float64Unavailable(Exception):
    """The model cannot be evaluated in float64 here; the message says why (an op named)."""


# --------------------------------------------------------------------------- the twins
def exact_tensors(model: ir.Model) -> dict[str, Any]:
    """Name -> tensor of every constant the fold computed (`apply.centering`'s tensors, which hand out
    their float64 values before rounding: `exact_float64()`), initializers and Constant nodes,
    bodies included. Taken before the model is written: writing it rebinds its tensors to the
    file, rounded."""
    found: dict[str, Any] = {}
    for node in nodes_within(model.graph):
        if node.op_type == "Constant" and node.outputs[0].name:
            attr = node.attributes.get("value")
            tensor = attr.as_tensor() if attr is not None and attr.type == ir.AttributeType.TENSOR else None
            if hasattr(tensor, "exact_float64"):
                found[node.outputs[0].name] = tensor
    for graph in graphs_of(model):
        for name, value in graph.initializers.items():
            if hasattr(value.const_value, "exact_float64"):
                found[name] = value.const_value
    return found


_FLOAT_DTYPES = frozenset({ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16, ir.DataType.DOUBLE})
# A Constant node holding more than this is served like an initializer (read when its node runs)
# rather than written into the structure the evaluator loads.
_INLINE_CONSTANT_BYTES = 1 << 16
# The float64 evaluation may hold this share of the memory available when it starts.
MEMORY_SHARE = 0.5


def _substitute(graph: onnx.GraphProto, values: dict[str, np.ndarray], done: set[str]) -> None:
    for i, tensor in enumerate(graph.initializer):
        if tensor.name in values:
            graph.initializer[i].CopyFrom(onnx.numpy_helper.from_array(values[tensor.name], tensor.name))
            done.add(tensor.name)
    for node in graph.node:
        if node.op_type == "Constant" and node.output and node.output[0] in values:
            for attr in node.attribute:
                if attr.name == "value" and attr.type == onnx.AttributeProto.TENSOR:
                    attr.t.CopyFrom(onnx.numpy_helper.from_array(values[node.output[0]], attr.t.name))
                    done.add(node.output[0])
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                _substitute(attr.g, values, done)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    _substitute(g, values, done)


def _ops(proto: onnx.ModelProto) -> set[tuple[str, str]]:
    found: set[tuple[str, str]] = set()

    def walk(nodes) -> None:
        for node in nodes:
            found.add((node.domain, node.op_type))
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    walk(attr.g.node)
                elif attr.type == onnx.AttributeProto.GRAPHS:
                    for g in attr.graphs:
                        walk(g.node)

    walk(proto.graph.node)
    for function in proto.functions:
        walk(function.node)
    return found


class Float64Model:
    """A model's float64 twin, evaluated node by node in `onnx.reference`: every float tensor,
    type, Cast target and dtype attribute widened to double (`verify.oracle.shadow`), the weights read
    from the model as their node runs and dropped after it (a memory-mapped external tensor is
    not copied until then), each intermediate dropped after its last reader. Its memory is the
    live activations plus one node's weights in float64, not the model in float64, so a twin of
    a 10 GB model runs in a few GB; `memory_budget` bounds it (default: a share of the memory
    available), and a run that would exceed it raises `Float64Unavailable`.

    `exact` names constants that have a second reading, tensors that give their float64 values
    (`exact_float64()`: the fold's unrounded centered weights, `exact_tensors`):
    `run_as_written_and_exact` evaluates both readings in one pass, `run_many` the model as
    written. Raises `Float64Unavailable` when the evaluator cannot take the model (an op it does
    not know, named). What share of the weights a run has read is logged and said to `progress`,
    where given."""

    def __init__(
        self,
        model: ir.Model | onnx.ModelProto | bytes | str | Path,
        exact: dict[str, Any] | None = None,
        memory_budget: int | None = None,
        progress: Progress | None = None,
    ):
        self._exact = dict(exact or {})
        self._weights: dict[str, Any] = {}  # name -> tensor, read when its node runs
        # A file or bytes are read as a proto, not as IR: the structure is the proto less its
        # weights, with no graph of IR objects made and serialized again.
        if isinstance(model, ir.Model):
            proto, exact_proto = self._structure(model)
        else:
            proto, exact_proto = self._proto_structure(*_proto_of(model))
        self._evaluator = self._evaluator_of(proto)
        # Exact constants inside If/Loop bodies are part of the structure: that reading has its own.
        self._exact_evaluator = self._evaluator_of(exact_proto) if exact_proto is not None else None
        self.output_names = [o.name for o in proto.graph.output]
        # Per node, read once here rather than from its proto at every run: the names it reads,
        # those it writes, whether it reads a weight, and the names none reads after it (dropped
        # once it ran; an output is kept).
        nodes = self._evaluator.nodes_
        self._reads = [list(node.input) + sorted(body_reads(node)) if node.attribute else list(node.input) for node in nodes]
        self._writes = [list(node.output) for node in nodes]
        self._weighted = [any(name in self._weights for name in names) for names in self._reads]
        last: dict[str, int] = {}
        for index, names in enumerate(self._reads):
            for name in names:
                last[name] = index
        kept = set(self.output_names)
        self._frees: list[list[str]] = [[] for _ in nodes]
        for name, index in last.items():
            if name not in kept:
                self._frees[index].append(name)
        available = available_memory()
        self.memory_budget = (
            memory_budget
            if memory_budget is not None
            else (int(MEMORY_SHARE * available) if available is not None else None)
        )
        self.peak_bytes = 0  # the most the last run held, activations and weights together
        self.label = "the model"  # what progress calls it
        self._say = telling(progress, logger)

    @staticmethod
    def _evaluator_of(proto: onnx.ModelProto) -> Evaluator:
        widen_to_float64(proto)
        ops = _ops(proto)
        imported = {o.domain for o in proto.opset_import}
        if any(domain == MS_DOMAIN for domain, _ in ops) and MS_DOMAIN not in imported:
            proto.opset_import.append(onnx.helper.make_opsetid(MS_DOMAIN, 1))  # ONNX Runtime does not insist
        ours = {(cls.op_domain, cls.__name__) for cls in FLOAT64_OPS}
        functions = {(f.domain, f.name) for f in proto.functions}
        unknown = sorted(
            f"{domain}::{op}"
            for domain, op in ops
            if (domain, op) not in ours | functions and domain not in KNOWN_DOMAINS
        )
        if unknown:
            raise Float64Unavailable(f"onnx.reference cannot evaluate {', '.join(unknown)}")
        drawn = sorted({op for domain, op in ops if op in RANDOM_OPS and domain in STANDARD_DOMAINS})
        if drawn:  # whatever the seed: its generator is not ONNX Runtime's
            raise Float64Unavailable(
                f"onnx.reference draws the random numbers of {', '.join(drawn)} otherwise than onnxruntime"
            )
        try:
            return Evaluator(proto)
        except NotImplementedError as e:  # a standard op the reference lacks
            found = re.search(r"Node type '([^']+)' from domain '([^']*)'", str(e))
            what = f"{found[2] + '::' if found and found[2] else ''}{found[1]}" if found else str(e).splitlines()[0]
            raise Float64Unavailable(f"onnx.reference cannot evaluate {what}") from None

    def _structure(self, model: ir.Model) -> tuple[onnx.ModelProto, onnx.ModelProto | None]:
        """The model without its weights: main-graph initializers and large Constant nodes become
        graph inputs served by `_weight`; everything else (bodies included) as serialized. Second,
        where a body holds an exact constant, the same with those constants exact; else None."""
        graph = model.graph
        inputs = [ir.serde.serialize_value(v) for v in graph.inputs]
        given = {v.name for v in graph.inputs}
        for name, value in graph.initializers.items():
            self._weights[name] = value.const_value
            if name not in given:
                inputs.append(ir.serde.serialize_value(value))
        nodes = []
        for node in graph:
            tensor = _large_constant(node)
            if tensor is not None:
                out = node.outputs[0]
                self._weights[out.name] = tensor
                inputs.append(onnx.helper.make_tensor_value_info(out.name, int(tensor.dtype), list(tensor.shape)))
                continue
            nodes.append(ir.serde.serialize_node(node))
        known = {i.name for i in inputs}
        outputs = [ir.serde.serialize_value(v) for v in graph.outputs]
        ordered = [nodes[i] for i in in_running_order(nodes, known)]
        g = onnx.helper.make_graph(ordered, graph.name or "graph", inputs, outputs)
        opsets = [onnx.helper.make_opsetid(domain, version) for domain, version in model.opset_imports.items()]
        proto = onnx.helper.make_model(g, opset_imports=opsets, ir_version=model.ir_version)
        proto.functions.extend(ir.serde.serialize_function(f) for f in model.functions.values())
        return proto, self._exact_structure(proto)

    def _proto_structure(
        self, proto: onnx.ModelProto, initializer: Callable[[onnx.TensorProto], ir.TensorProtocol], folder: str
    ) -> tuple[onnx.ModelProto, onnx.ModelProto | None]:
        """`_structure` of a proto this twin owns, changed in place: `initializer` gives a main-graph
        initializer as a tensor read when used, `folder` is where external data lies."""
        graph = proto.graph
        given = {v.name for v in graph.input}
        for tensor in graph.initializer:
            self._weights[tensor.name] = initializer(tensor)
            if tensor.name not in given:
                graph.input.append(onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims)))
        del graph.initializer[:]
        del graph.value_info[:]  # the evaluator infers nothing from them; widened, they would only cost
        nodes = []
        for node in graph.node:
            constant = _large_constant_proto(node, folder)
            if constant is not None:
                self._weights[node.output[0]] = constant
                graph.input.append(
                    onnx.helper.make_tensor_value_info(node.output[0], int(constant.dtype), list(constant.shape))
                )
                continue
            nodes.append(node)
        order = in_running_order(nodes, {i.name for i in graph.input})
        if len(nodes) < len(graph.node) or order != list(range(len(nodes))):
            ordered = [onnx.NodeProto() for _ in order]
            for copy, i in zip(ordered, order):
                copy.CopyFrom(nodes[i])
            del graph.node[:]
            graph.node.extend(ordered)
        graph.name = graph.name or "graph"
        return proto, self._exact_structure(proto)

    def _exact_structure(self, proto: onnx.ModelProto) -> onnx.ModelProto | None:
        """`proto` with the exact constants held in bodies exact; None where there are none."""
        body_exact = {k: v for k, v in self._exact.items() if k not in self._weights}
        if not body_exact:
            return None
        exact_proto = onnx.ModelProto()
        exact_proto.CopyFrom(proto)
        _substitute(exact_proto.graph, {k: t.exact_float64() for k, t in body_exact.items()}, set())
        return exact_proto

    def _weight(self, name: str, reading: dict[str, Any]) -> np.ndarray:
        exact = reading.get(name)
        if exact is not None:
            return exact.exact_float64()
        tensor = self._weights[name]
        if tensor.dtype not in _FLOAT_DTYPES or not tuple(tensor.shape):
            return widened(np.asarray(tensor.numpy()))
        # Read by blocks of rows from the file, not mapped: a mapping's pages would stay in this
        # process's memory until the tensor is released, every weight of the model by the end.
        out = np.empty(tuple(tensor.shape), dtype=np.float64)
        for rows, block in row_blocks(tensor):
            out[rows] = block
        return out

    def _read_in_part(self, node: onnx.NodeProto, names: list[str], reading: dict[str, Any]) -> str | None:
        """The weight of a node that needs only part of it (`PART_READERS`), read once: never held
        whole in float64. An exact value in this `reading` is computed whole, unless the reader can
        ask for its part (`PartReader.read_exact`)."""
        reader = PART_READERS.get(node.op_type) if node.domain in ("", "ai.onnx") and len(node.input) == 2 else None
        if reader is None:
            return None
        name, other = node.input[reader.weight], node.input[1 - reader.weight]
        tensor = self._weights.get(name)
        if tensor is None or names.count(name) != 1 or other == name:
            return None
        if name in reading and reader.read_exact is None:
            return None
        if tensor.dtype not in _FLOAT_DTYPES or not reader.takes_rank(len(tuple(tensor.shape))):
            return None
        return name

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.run_many([feeds])[0]

    def run_many(
        self, feeds_list: list[dict[str, np.ndarray]], deadline: Deadline | None = None
    ) -> list[dict[str, np.ndarray]]:
        """The outputs on each input set, the model as written, the sets evaluated together node by
        node: each weight is read once for all of them. `deadline`: its pace is checked as the nodes
        run; where all the sets would not fit, the first goes on alone (fewer outputs are returned),
        and where it would not either, `Float64Unavailable` is raised."""
        return drain(self.steps(feeds_list, deadline))

    def steps(
        self, feeds_list: list[dict[str, np.ndarray]], deadline: Deadline | None = None
    ) -> Generator[float, None, list[dict[str, np.ndarray]]]:
        """`run_many` a node at a time: yields the share of the weights read after each node (the
        check advances its passes over a file together, `verify.oracle.paced`)."""
        outputs = yield from self._steps(feeds_list, [{}], self._evaluator, deadline)
        return outputs[0]

    def run_as_written_and_exact(
        self, feeds_list: list[dict[str, np.ndarray]]
    ) -> tuple[list[dict[str, np.ndarray]], list[dict[str, np.ndarray]]]:
        """The outputs on each input set with the constants as written and with the `exact` ones at
        their exact values: both readings in one pass node by node, each weight they share (all but
        the exact ones) read once for both."""
        return drain(self.written_and_exact_steps(feeds_list))

    def written_and_exact_steps(
        self, feeds_list: list[dict[str, np.ndarray]], keep: Callable[[], int] | None = None
    ) -> Generator[float, None, tuple[list[dict[str, np.ndarray]], list[dict[str, np.ndarray]]]]:
        """`run_as_written_and_exact` a node at a time, as `steps`; `keep`: how many of the input sets
        to go on with, asked after each node (the original's twin's deadline, where they run side by
        side)."""
        if self._exact_evaluator is None:
            written, exact = yield from self._steps(feeds_list, [{}, self._exact], self._evaluator, keep=keep)
        else:
            (written,) = yield from self._steps(feeds_list, [{}], self._evaluator, keep=keep)
            (exact,) = yield from self._steps(feeds_list, [self._exact], self._exact_evaluator, keep=keep)
        return written, exact

    def _steps(
        self,
        feeds_list: list[dict[str, np.ndarray]],
        readings: list[dict[str, Any]],
        evaluator: Evaluator,
        deadline: Deadline | None = None,
        keep: Callable[[], int] | None = None,
    ) -> Generator[float, None, list[list[dict[str, np.ndarray]]]]:
        """Each reading's outputs on each input set (a reading: the tensors that replace constants
        by name), every set of every reading evaluated together node by node. A node reading none
        of the replaced constants runs once on all the sets, its weights read once. Yields the
        share of the weights read after each node."""
        # Each input set's arrays are the same objects in every reading: see `_once_per_values`.
        widened = [float64_feeds(feeds) for feeds in feeds_list]
        sets: list[dict[str, Any]] = [{"": None, **feeds} for feeds in widened for _ in readings]
        reading_of = [r for _ in feeds_list for r in range(len(readings))]  # each set's reading, by index
        replaced = set().union(*readings)
        weight_total = sum(getattr(t, "nbytes", 0) or 0 for t in self._weights.values())
        weight_done, told, seen = 0, 0, set()
        held = [_bytes(results) for results in sets]  # each set's bytes, kept as it changes (not summed again per node)
        self.peak_bytes = sum(held)
        frees, writes, weighted = self._frees, self._writes, self._weighted
        for index, (node, names) in enumerate(zip(evaluator.rt_nodes_, self._reads)):
            if replaced and not replaced.isdisjoint(names):
                groups = [[i for i, r in enumerate(reading_of) if r == number] for number in range(len(readings))]
            else:
                groups = [list(range(len(sets)))]
            current, read = 0, set()
            made = writes[index]
            for group in groups:
                reading = readings[reading_of[group[0]]]
                members = [sets[i] for i in group]
                if len(readings) > 1 and len(group) > 1:
                    firsts, same_as = _once_per_values(members, names)
                    weights, in_part, outputs = self._run_node(
                        node, names, [members[i] for i in firsts], reading, weighted[index]
                    )
                    outputs = [outputs[j] for j in same_as]
                else:
                    weights, in_part, outputs = self._run_node(node, names, members, reading, weighted[index])
                if weights or in_part:
                    read.update(n for n in (*weights, *([in_part] if in_part else [])) if n not in reading)
                weight_bytes = sum(a.nbytes for a in weights.values()) if weights else 0
                current += weight_bytes
                for i, produced in zip(group, outputs):
                    results = sets[i]
                    if weights:
                        held[i] += _put(results, weights.items())
                    held[i] += _put(results, zip(made, produced))
                    current += held[i] - weight_bytes
                del weights, outputs
            if read:
                read -= seen  # a weight two nodes read counts once
                seen |= read
                weight_done += sum(getattr(self._weights[n], "nbytes", 0) or 0 for n in read)
            self.peak_bytes = max(self.peak_bytes, current)
            done = weight_done / weight_total if weight_total else (index + 1) / len(self._reads)
            if done * 10 >= told + 1:
                told = int(done * 10)
                self._say(f"Verifying in float64: {self.label}, {done:.0%} of the weights")
            kept = len(sets) // len(readings)
            if deadline is not None:
                kept = deadline.keeps(done, kept)
            if keep is not None:
                kept = min(kept, keep())
            if kept * len(readings) < len(sets):
                del sets[kept * len(readings) :], reading_of[kept * len(readings) :], held[kept * len(readings) :]
            if self.memory_budget is not None and current > self.memory_budget:
                label = node.onnx_node.name or node.op_type
                raise Float64Unavailable(
                    f"the float64 evaluation would hold {current / 2**30:.1f} GiB at node '{label}', over its "
                    f"memory budget of {self.memory_budget / 2**30:.1f} GiB"
                )
            for name in frees[index]:
                for i, results in enumerate(sets):
                    held[i] -= _nbytes(results.pop(name, None))
            yield done
        outputs: list[list[dict[str, np.ndarray]]] = [[] for _ in readings]
        for results, number in zip(sets, reading_of):
            for name in self.output_names:  # an output that is a weight no node reads
                if name not in results:
                    results[name] = self._weight(name, readings[number])
            outputs[number].append({name: np.asarray(results[name]) for name in self.output_names})
        return outputs

    def _run_node(
        self, node, names: list[str], sets: list[dict[str, Any]], reading: dict[str, Any], weighted: bool = True
    ):
        """One node on `sets` (all of one reading): the weights it was given whole, the weight it
        read in part (or None), and each set's outputs. `weighted`: whether it reads any weight."""
        if not weighted:
            in_part, weights = None, {}
        else:
            in_part = self._read_in_part(node.onnx_node, names, reading)
            weights = {
                n: self._weight(n, reading) for n in names if n in self._weights and n not in sets[0] and n != in_part
            }
        stacked = None
        if in_part:
            reader = PART_READERS[node.op_type]
            if in_part in reading:  # a computed weight: its exact values, where it gives them in part
                stacked = reader.read_exact(node.onnx_node, reading[in_part], sets)  # type: ignore[misc]
            else:
                stacked = reader.read(node.onnx_node, self._weights[in_part], sets)
        if in_part and stacked is None:  # inputs it does not take: the weight is read whole
            weights[in_part] = self._weight(in_part, reading)
        if stacked is None and weights:  # a product by a weight
            stacked = stacked_matmul(node.onnx_node, weights, sets)
        if stacked is not None:
            return weights, in_part, [[out] for out in stacked]
        if type(node) is Identity and not weights:
            # What `Identity` computes, a copy, without `OpRun.run`'s checks per call: chains of thousands.
            values = [results[names[0]] for results in sets]
            if all(type(v) is np.ndarray for v in values):
                return weights, in_part, [(v.copy(),) for v in values]
        outputs = []
        for results in sets:
            if node.need_context():  # a body reads names of the outer scope: all of them
                scope = {**results, **weights}
                outputs.append(node.run(*[scope[n] for n in node.input], context=scope))
            else:  # the inputs alone, not a copy of every live tensor per node
                outputs.append(node.run(*[weights[n] if n in weights else results[n] for n in node.input]))
        return weights, in_part, outputs


class Deadline:
    """The pace of a float64 evaluation against its allowance: `twins` models to run on the same
    sets, this one first, within `allowance` seconds from `started`. The work done is measured
    in the share of the weights read (what the time follows in a large model); the time, by `clock`
    where given (the seconds of this evaluation's own work, where it runs beside other passes)."""

    def __init__(
        self,
        started: float,
        allowance: float,
        twins: int,
        clock: Callable[[], float] | None = None,
    ):
        self.started, self.allowance, self.twins = started, allowance, twins
        self._clock = clock
        self._dropped: tuple[float, float] | None = None  # (elapsed, done) when the sets were cut to one

    def elapsed(self) -> float:
        return self._clock() if self._clock is not None else time.perf_counter() - self.started

    def projected(self, done: float) -> float:
        elapsed = self.elapsed()
        if self._dropped is None:
            return self.twins * elapsed / max(done, 1e-9)
        at, was = self._dropped
        rate = (elapsed - at) / max(done - was, 1e-9)  # seconds for the whole model, one set
        return elapsed + rate * (1.0 - done) + (self.twins - 1) * rate

    def keeps(self, done: float, sets: int) -> int:
        """How many input sets go on, after `done` of the work on `sets`; raises where none fits."""
        if done < 0.05 and self.elapsed() < 0.1 * self.allowance:
            return sets  # too early to tell
        projected = self.projected(done)
        if projected <= self.allowance:
            return sets
        if sets > 1:
            self._dropped = (self.elapsed(), done)
            return 1
        if self._dropped is not None and done - self._dropped[1] < 0.05:
            return sets  # the pace of one set is not known yet
        raise Float64Unavailable(
            f"a float64 evaluation would take about {projected:.0f} s, over its allowance of {self.allowance:.0f} s "
            f"(stopped at {done:.0%} of the weights)"
        )


def _once_per_values(sets: list[dict[str, Any]], names: list[str]) -> tuple[list[int], list[int]]:
    """The sets a node runs on, once for each distinct set of values it reads (by identity: the
    fold's readings as written and exact share every array upstream of the constants they
    replace), and, for each set, which of those gives its outputs."""
    firsts: list[int] = []
    same_as: list[int] = []
    seen: dict[object, int] = {}
    if len(names) == 1:  # most nodes: one input, its array's identity the key
        name = names[0]
        keys: list[object] = [id(results.get(name)) for results in sets]
    else:
        keys = [tuple(id(results.get(name)) for name in names) for results in sets]
    for i, key in enumerate(keys):
        found = seen.setdefault(key, len(firsts))
        if found == len(firsts):
            firsts.append(i)
        same_as.append(found)
    return firsts, same_as


def _bytes(values: dict[str, Any]) -> int:
    return sum(getattr(v, "nbytes", 0) for v in values.values())


def _nbytes(value: Any) -> int:
    return getattr(value, "nbytes", 0)


def _put(values: dict[str, Any], items) -> int:
    """`values.update(items)`, an item without a name (an output left out) skipped; returns how
    many bytes `_bytes(values)` gained."""
    gained = 0
    for name, value in items:
        if name:
            gained += _nbytes(value) - _nbytes(values.get(name))
            values[name] = value
    return gained


def _large_constant(node: ir.Node) -> ir.TensorProtocol | None:
    if node.op_type != "Constant" or node.domain not in ("", "ai.onnx") or len(node.outputs) != 1:
        return None
    attr = node.attributes.get("value")
    tensor = attr.as_tensor() if attr is not None and attr.type == ir.AttributeType.TENSOR else None
    if tensor is None or tensor.nbytes <= _INLINE_CONSTANT_BYTES or not node.outputs[0].name:
        return None
    return tensor


def _large_constant_proto(node: onnx.NodeProto, folder: str) -> ir.TensorProtocol | None:
    """`_large_constant` of a proto node."""
    if node.op_type != "Constant" or node.domain not in ("", "ai.onnx") or len(node.output) != 1 or not node.output[0]:
        return None
    for attr in node.attribute:
        if attr.name == "value" and attr.type == onnx.AttributeProto.TENSOR:
            tensor = ir.serde.deserialize_tensor(attr.t, folder)
            return tensor if tensor.nbytes > _INLINE_CONSTANT_BYTES else None
    return None


def _proto_of(
    model: onnx.ModelProto | bytes | str | Path,
) -> tuple[onnx.ModelProto, Callable[[onnx.TensorProto], ir.TensorProtocol], str]:
    """`model` as a proto the twin may change, how to read a main-graph initializer of it, and the
    folder of its external data. A file is read with its large initializers left in it
    (`read_proto`), else, where the walker does not read it, parsed whole (`load_structure`)."""
    if isinstance(model, onnx.ModelProto):
        proto, folder = onnx.ModelProto(), ""
        proto.CopyFrom(model)
    else:
        if not isinstance(model, bytes):
            found = read_proto(Path(model), check=False)  # the model the fold read, or the fold it wrote
            if found is not None:
                return found.proto, found.initializer, str(found.path.parent)
        proto, where = load_structure(model)
        folder = where or ""
    return proto, lambda tensor: ir.serde.deserialize_tensor(tensor, folder), folder


def failing_node(error: BaseException) -> str | None:
    """`Pad 'time_shift'`: the node whose evaluation raised `error` inside a `Float64Model` run
    (its loop variable `node`, read from the traceback: onnx.reference's own messages, numpy's
    mostly, name no op); None where the error came from elsewhere."""
    found = None
    tb = error.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code in _RUN_CODE:
            proto = getattr(frame.f_locals.get("node"), "onnx_node", None)
            if proto is not None:
                domain = f"{proto.domain}::" if proto.domain not in ("", "ai.onnx") else ""
                found = f"{domain}{proto.op_type} '{proto.name}'" if proto.name else f"{domain}{proto.op_type}"
        tb = tb.tb_next
    return found


_RUN_CODE = (Float64Model._steps.__code__, Float64Model._run_node.__code__)
