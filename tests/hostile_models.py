"""Hostile and malformed models, generated in code: each kind a user may download and hand the tool.

Every case writes a small model into a folder and says what the tool must do with it:

- `refuse`: exit 2 and one line naming the problem (the API raises an `InvalidInput` with the same
  sentence), nothing written, the input untouched;
- `fold`: exit 0 and a correct model (a fold or an unchanged copy of a valid model);
- `not-verified`: exit 1 and one line saying why the check could not run (ONNX Runtime cannot run
  an op of the model, say), nothing written.

`expect` is a phrase the one line must hold (lower case), so the words stay the tool's own.
`tests/surface/test_hostile.py` runs every case through the command line and the API;
`python -m benchmarks.hostile` prints the table of outcomes, time and peak memory.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HIDDEN = 16
OPSET = 17


@dataclass(frozen=True)
class Case:
    """One hostile model: `build(folder)` writes it and returns the model's path."""

    name: str
    kind: str
    build: Callable[[Path], Path]
    outcome: str  # "refuse", "fold" or "not-verified"
    expect: str = ""  # a phrase the one line must hold (lower case)
    args: tuple[str, ...] = ()  # extra command-line arguments
    api_save_to: str | None = None  # the API's save() destination, relative to the model's folder
    cli_output: str | None = None  # the command line's -o, relative to the model's folder
    tags: frozenset[str] = field(default_factory=frozenset)


def _rng():
    return np.random.default_rng(0)


def _ln_graph(
    x_shape=("batch", "seq", HIDDEN),
    *,
    extra_initializers=(),
    gamma=None,
    ln_attrs=None,
    chain: int = 0,
    opset: int = OPSET,
) -> onnx.ModelProto:
    """x -> MatMul(W) + b -> [Identity x chain] -> LayerNormalization(gamma, beta)
    -> MatMul(W_out) + b_out -> y: one LN that folds (its input a centerable MatMul, its beta folded
    into b_out)."""
    rng = _rng()
    inits = [
        numpy_helper.from_array(rng.standard_normal((HIDDEN, HIDDEN)).astype(np.float32), "W"),
        numpy_helper.from_array(rng.standard_normal(HIDDEN).astype(np.float32), "b"),
        gamma if gamma is not None else numpy_helper.from_array(1 + 0.1 * rng.standard_normal(HIDDEN).astype(np.float32), "gamma"),
        numpy_helper.from_array(0.1 * rng.standard_normal(HIDDEN).astype(np.float32), "beta"),
        numpy_helper.from_array(rng.standard_normal((HIDDEN, HIDDEN)).astype(np.float32), "W_out"),
        numpy_helper.from_array(rng.standard_normal(HIDDEN).astype(np.float32), "b_out"),
        *extra_initializers,
    ]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"), helper.make_node("Add", ["h", "b"], ["t0"], name="bias")]
    for i in range(chain):
        nodes.append(helper.make_node("Identity", [f"t{i}"], [f"t{i + 1}"], name=f"id{i}"))
    nodes.append(
        helper.make_node("LayerNormalization", [f"t{chain}", "gamma", "beta"], ["n"], name="ln", **(ln_attrs or {"axis": -1}))
    )
    nodes.append(helper.make_node("MatMul", ["n", "W_out"], ["o"], name="mm_out"))
    nodes.append(helper.make_node("Add", ["o", "b_out"], ["y"], name="bias_out"))
    graph = helper.make_graph(
        nodes,
        "hostile",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _split_at_ln(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """Remove the LN and the nodes after it from `graph`, and return them (to insert nodes before)."""
    at = next(i for i, n in enumerate(graph.node) if n.name == "ln")
    tail = [onnx.NodeProto() for _ in graph.node[at:]]
    for copy, node in zip(tail, graph.node[at:]):
        copy.CopyFrom(node)
    del graph.node[at:]
    return tail


def _save(proto: onnx.ModelProto, folder: Path, name: str = "m.onnx") -> Path:
    path = folder / name
    path.write_bytes(proto.SerializeToString())
    return path


def _external(proto: onnx.ModelProto, folder: Path, location: str = "m.onnx.data", name: str = "m.onnx") -> Path:
    """Save with every initializer of 64 bytes or more in `location`."""
    path = folder / name
    onnx.save(proto, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location=location, size_threshold=64)
    return path


def _set_external(path: Path, tensor: str, **entries: str) -> None:
    """Rewrite the external-data entries (location, offset, length) of one tensor of a saved model."""
    proto = onnx.load(str(path), load_external_data=False)
    for init in proto.graph.initializer:
        if init.name == tensor:
            kept = {e.key: e.value for e in init.external_data}
            kept.update(entries)
            del init.external_data[:]
            for key, value in kept.items():
                init.external_data.add(key=key, value=value)
    path.write_bytes(proto.SerializeToString())


def _declared(name: str, dims, raw: bytes | None = None, dtype=TensorProto.FLOAT) -> TensorProto:
    """A tensor with the dims given and whatever data given (none, or too little)."""
    t = TensorProto(name=name, data_type=dtype)
    t.dims.extend(dims)
    if raw is not None:
        t.raw_data = raw
    return t


# --- builders -------------------------------------------------------------------------------------


def data_clash(folder: Path) -> Path:
    """x.onnx keeps its weights in y.onnx.data: an output y.onnx beside it would write over them."""
    return _external(_ln_graph(), folder, location="y.onnx.data", name="x.onnx")


def raw_short_small(folder: Path) -> Path:
    return _save(_ln_graph(gamma=_declared("gamma", [HIDDEN], b"\0" * 8)), folder)


def raw_short_large(folder: Path) -> Path:
    big = _declared("unused_big", [256, 1024], b"\0" * (1 << 17))  # 1 MB declared, 128 KB held
    return _save(_ln_graph(extra_initializers=[big]), folder)


def negative_dims(folder: Path) -> Path:
    return _save(_ln_graph(extra_initializers=[_declared("neg", [-4, 4], b"\0" * 64)]), folder)


def huge_dims_unused(folder: Path) -> Path:
    return _save(_ln_graph(extra_initializers=[_declared("huge", [1 << 20, 1 << 20], b"\0" * 256)]), folder)


def dims_overflow_int64(folder: Path) -> Path:
    return _save(_ln_graph(extra_initializers=[_declared("overflow", [1 << 40, 1 << 40, 1 << 40], b"\0" * 16)]), folder)


def gamma_huge_declared(folder: Path) -> Path:
    return _save(_ln_graph(gamma=_declared("gamma", [1 << 31], b"\0" * 64)), folder)


def no_data_8gb(folder: Path) -> Path:
    return _save(_ln_graph(extra_initializers=[_declared("empty8g", [1 << 31])]), folder)


def no_data_4tb(folder: Path) -> Path:
    return _save(_ln_graph(extra_initializers=[_declared("empty4t", [1 << 40])]), folder)


def input_huge_dims(folder: Path) -> Path:
    return _save(_ln_graph(x_shape=(1, 1 << 31, HIDDEN)), folder)


def _external_then(**entries: str) -> Callable[[Path], Path]:
    def build(folder: Path) -> Path:
        path = _external(_ln_graph(), folder)
        _set_external(path, "W", **entries)
        return path

    return build


def _external_at(make: Callable[[Path], None], location: str) -> Callable[[Path], Path]:
    """The model's W read from `location`, which `make(path)` creates in the folder."""

    def build(folder: Path) -> Path:
        path = _external(_ln_graph(), folder)
        make(folder / location)
        _set_external(path, "W", location=location)
        return path

    return build


def model_fifo(folder: Path) -> Path:
    path = folder / "m.onnx"
    os.mkfifo(path)
    return path


def duplicate_output(folder: Path) -> Path:
    proto = _ln_graph()
    proto.graph.node.insert(1, helper.make_node("Identity", ["x"], ["h"], name="twice"))
    return _save(proto, folder)


def cycle(folder: Path) -> Path:
    proto = _ln_graph()
    proto.graph.node[0].input[0] = "n"  # the first MatMul reads the LN's output
    return _save(proto, folder)


def dangling_input(folder: Path) -> Path:
    proto = _ln_graph()
    proto.graph.node[1].input[1] = "nobody_makes_this"
    return _save(proto, folder)


def ln_without_scale(folder: Path) -> Path:
    proto = _ln_graph()
    del next(n for n in proto.graph.node if n.name == "ln").input[1:]
    return _save(proto, folder)


def axis_out_of_range(folder: Path) -> Path:
    return _save(_ln_graph(ln_attrs={"axis": 5}), folder)


def int32_ln_input(folder: Path) -> Path:
    rng = _rng()
    gamma = numpy_helper.from_array(rng.integers(1, 3, HIDDEN).astype(np.int32), "gamma")
    beta = numpy_helper.from_array(np.zeros(HIDDEN, np.int32), "beta")
    ln = helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["y"], name="ln", axis=-1)
    graph = helper.make_graph(
        [ln],
        "hostile",
        [helper.make_tensor_value_info("x", TensorProto.INT32, ["batch", "seq", HIDDEN])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, None)],
        [gamma, beta],
    )
    return _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=8), folder)


def no_default_opset(folder: Path) -> Path:
    proto = _ln_graph()
    del proto.opset_import[:]
    proto.opset_import.append(helper.make_opsetid("com.example", 1))
    return _save(proto, folder)


def identity_chain(nodes: int) -> Callable[[Path], Path]:
    return lambda folder: _save(_ln_graph(chain=nodes), folder)


def baked_batch(folder: Path) -> Path:
    """The graph input says [batch, seq, 16] but a Reshape bakes in batch 1 (as some exports do):
    the model runs at batch 1 only."""
    proto = _ln_graph()
    shape = numpy_helper.from_array(np.array([1, -1, HIDDEN], np.int64), "shape1")
    residual = numpy_helper.from_array(_rng().standard_normal((HIDDEN, HIDDEN)).astype(np.float32), "W_res")
    proto.graph.initializer.extend([shape, residual])
    tail = _split_at_ln(proto.graph)
    proto.graph.node.extend(
        [
            helper.make_node("Reshape", ["t0", "shape1"], ["r"], name="bake"),
            helper.make_node("MatMul", ["x", "W_res"], ["side"], name="side"),
            helper.make_node("Add", ["r", "side"], ["s"], name="residual"),
        ]
    )
    tail[0].input[0] = "s"
    proto.graph.node.extend(tail)
    return _save(proto, folder)


def scalar_speed(folder: Path) -> Path:
    """A TTS-like graph: a scalar `speed` sets the output's length (Tile by ceil(4 * speed)), a style
    vector is added to the stream. N(0, 1) values make speed <= 0, which the original cannot run."""
    proto = _ln_graph(x_shape=(1, "seq", HIDDEN))
    graph = proto.graph
    graph.input.extend(
        [
            helper.make_tensor_value_info("speed", TensorProto.FLOAT, []),
            helper.make_tensor_value_info("style", TensorProto.FLOAT, [1, HIDDEN]),
        ]
    )
    graph.initializer.extend(
        [
            numpy_helper.from_array(np.array(4.0, np.float32), "four"),
            numpy_helper.from_array(np.array([1], np.int64), "one1"),
            numpy_helper.from_array(_rng().standard_normal((HIDDEN, HIDDEN)).astype(np.float32), "W_style"),
        ]
    )
    tail = _split_at_ln(graph)
    graph.node.append(helper.make_node("MatMul", ["style", "W_style"], ["style_h"], name="style_proj"))
    graph.node.append(helper.make_node("Add", ["t0", "style_h"], ["styled"], name="style_add"))
    tail[0].input[0] = "styled"
    graph.node.extend(tail)
    graph.node.extend(
        [
            helper.make_node("Mul", ["speed", "four"], ["s4"], name="s4"),
            helper.make_node("Ceil", ["s4"], ["s4c"], name="ceil"),
            helper.make_node("Cast", ["s4c"], ["reps0"], name="cast", to=TensorProto.INT64),
            helper.make_node("Reshape", ["reps0", "one1"], ["reps"], name="reps"),
            helper.make_node("Concat", ["one1", "reps", "one1"], ["tiles"], name="tiles", axis=0),
            helper.make_node("Tile", ["y", "tiles"], ["audio"], name="tile"),
        ]
    )
    del graph.output[:]
    graph.output.append(helper.make_tensor_value_info("audio", TensorProto.FLOAT, None))
    return _save(proto, folder)


def _field(number: int, payload: bytes) -> bytes:
    """One length-delimited protobuf field."""
    from onnx_lnfold.io.wire import LENGTH_DELIMITED

    key, size, out = (number << 3) | LENGTH_DELIMITED, len(payload), bytearray()
    for value in (key, size):
        while True:
            byte, value = value & 0x7F, value >> 7
            out.append(byte | (0x80 if value else 0))
            if not value:
                break
    return bytes(out) + payload


def nested_ifs(depth: int) -> Callable[[Path], Path]:
    """`depth` If nodes, each the then-branch of the one above: written as wire bytes, since
    protobuf's Python messages refuse to nest that deep."""

    def build(folder: Path) -> Path:
        leaf = helper.make_graph(
            [helper.make_node("Identity", ["y"], ["inner"])], "leaf", [], [helper.make_tensor_value_info("inner", TensorProto.FLOAT, None)]
        )
        body = leaf.SerializeToString()
        for level in range(depth):
            out = f"o{level}"
            node = helper.make_node("If", ["cond"], [out], else_branch=leaf, name=f"if{level}").SerializeToString()
            attr = onnx.AttributeProto(name="then_branch", type=onnx.AttributeProto.GRAPH).SerializeToString()
            node += _field(5, attr + _field(6, body))  # NodeProto.attribute, AttributeProto.g
            if level == depth - 1:
                break
            graph = helper.make_graph([], f"b{level}", [], [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)])
            body = graph.SerializeToString() + _field(1, node)  # GraphProto.node
        proto = _ln_graph()
        proto.graph.input.append(helper.make_tensor_value_info("cond", TensorProto.BOOL, []))
        del proto.graph.output[:]
        proto.graph.output.append(helper.make_tensor_value_info(f"o{depth - 1}", TensorProto.FLOAT, None))
        graph = proto.graph.SerializeToString() + _field(1, node)
        proto.ClearField("graph")
        path = folder / "m.onnx"
        path.write_bytes(proto.SerializeToString() + _field(7, graph))  # ModelProto.graph
        return path

    return build


def opset(version: int) -> Callable[[Path], Path]:
    return lambda folder: _save(_ln_graph(opset=version), folder)


def custom_domain_op(folder: Path) -> Path:
    proto = _ln_graph()
    proto.opset_import.append(helper.make_opsetid("com.example", 1))
    proto.graph.node.append(helper.make_node("Frobnicate", ["y"], ["z"], domain="com.example", name="custom"))
    proto.graph.output.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, None))
    return _save(proto, folder)


def overlapping_ranges(folder: Path) -> Path:
    """Two tensors read the same bytes of the data file (W's range also read as W2)."""
    proto = _ln_graph()
    proto.graph.initializer.append(numpy_helper.from_array(proto_array(proto, "W"), "W2"))
    proto.graph.node.append(helper.make_node("MatMul", ["y", "W2"], ["z"], name="mm2"))
    proto.graph.output.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, None))
    path = _external(proto, folder)
    loaded = onnx.load(str(path), load_external_data=False)
    w = {e.key: e.value for i in loaded.graph.initializer if i.name == "W" for e in i.external_data}
    _set_external(path, "W2", offset=w.get("offset", "0"), length=w["length"])
    return path


def proto_array(proto: onnx.ModelProto, name: str) -> np.ndarray:
    return next(numpy_helper.to_array(i) for i in proto.graph.initializer if i.name == name)


# --- the cases ------------------------------------------------------------------------------------

CASES: tuple[Case, ...] = (
    # writing over what the input reads
    Case("data-file-clash", "data loss", data_clash, "refuse", "overwrite the input", api_save_to="y.onnx", cli_output="y.onnx"),
    # malformed tensors
    Case("raw-data-short-small", "malformed tensor", raw_short_small, "refuse", "gamma"),
    Case("raw-data-short-large", "malformed tensor", raw_short_large, "refuse", "unused_big"),
    Case("negative-dims", "malformed tensor", negative_dims, "refuse", "neg"),
    Case("huge-dims-unused", "malformed tensor", huge_dims_unused, "refuse", "huge"),
    Case("dims-overflow-int64", "malformed tensor", dims_overflow_int64, "refuse", "overflow"),
    Case("gamma-declared-2^31", "malformed tensor", gamma_huge_declared, "refuse", "gamma"),
    Case("gamma-declared-2^31-no-verify", "malformed tensor", gamma_huge_declared, "refuse", "gamma", args=("--no-verify",)),
    Case("no-data-2^33-bytes", "malformed tensor", no_data_8gb, "refuse", "empty8g"),
    Case("no-data-2^42-bytes", "malformed tensor", no_data_4tb, "refuse", "empty4t"),
    # external data
    Case("location-nul", "external data", _external_then(location="w\0.data"), "refuse", "location"),
    Case("location-5000-chars", "external data", _external_then(location="a" * 5000), "refuse", "location"),
    Case("offset-negative", "external data", _external_then(offset="-64"), "refuse", "offset"),
    Case("offset-not-a-number", "external data", _external_then(offset="hostile"), "refuse", "offset"),
    Case("length-past-file", "external data", _external_then(length=str(1 << 30)), "refuse", "truncated"),
    Case("data-file-fifo", "external data", _external_at(lambda p: os.mkfifo(p), "fifo.data"), "refuse", "not a regular file"),
    Case("data-file-directory", "external data", _external_at(lambda p: p.mkdir(), "dir.data"), "refuse", "directory"),
    Case("overlapping-ranges", "external data", overlapping_ranges, "fold"),
    # the file itself
    Case("model-fifo", "file", model_fifo, "refuse", "not a regular file"),
    # invalid graphs
    Case("duplicate-output", "invalid graph", duplicate_output, "refuse", "'h'"),
    Case("cycle", "invalid graph", cycle, "refuse", "cycle"),
    Case("dangling-input", "invalid graph", dangling_input, "refuse", "nobody_makes_this"),
    Case("ln-without-scale", "invalid graph", ln_without_scale, "refuse", "layernormalization"),
    Case("axis-out-of-range", "invalid graph", axis_out_of_range, "refuse", "axis"),
    Case("int32-ln-input", "invalid graph", int32_ln_input, "refuse", "int32"),
    Case("no-default-opset", "invalid graph", no_default_opset, "refuse", "opset"),
    # declared sizes
    Case("input-declared-2^31-tokens", "huge input", input_huge_dims, "refuse", "--input-shape"),
    # size and depth
    Case("identity-chain-5000", "scale", identity_chain(5000), "fold"),
    Case("if-nested-200", "scale", nested_ifs(200), "refuse", "nest"),
    # what valid models do
    Case("opset-7", "invalid graph", opset(7), "refuse", "layernormalization"),
    Case("custom-domain-op", "valid", custom_domain_op, "not-verified", "frobnicate"),
    Case("baked-batch-1", "real-model pattern", baked_batch, "fold"),
    Case("scalar-speed-input", "real-model pattern", scalar_speed, "fold"),
)


def case(name: str) -> Case:
    return next(c for c in CASES if c.name == name)
