"""Build a GPT-2-style pre-LN model of any size with random weights, stored as external data.

    python models/make/make_large_model.py OUT.onnx [--hidden 2048] [--layers 48] [--vocab 50257]

The graph is built with `onnx.helper`; the weights are numpy arrays drawn from a per-tensor seed
when they are written (onnx_ir `LazyTensor`s streamed by `ir.save`), so a model of many GB is made
with a few hundred MB of memory. Same arguments, same bytes.

Graph (pre-LN, no attention: the layer norms and the linear layers around them are what
onnx_lnfold folds):

    h = Gather(wte, input_ids) + Gather(wpe, Range(0, seq))
    N times:  h = h + (Gelu(LN(h) @ W1 + b1) @ W2 + b2)
    logits = LN_f(h) @ lm_head          (or @ Transpose(wte) with --tie-head)

Every weight is perturbed off its init: LN gammas 1 + N(0, 0.1), betas and biases N(0, 0.02..0.1),
matrices N(0, 0.02). Opsets below 17 get the decomposed LayerNorm (ReduceMean, Sub, Pow, ...),
opsets below 20 the Erf form of Gelu.
"""

from __future__ import annotations

import argparse
import os
import sys
import zlib
from pathlib import Path

import numpy as np
import onnx_ir as ir
from onnx import TensorProto, helper

DTYPES = {"float32": ir.DataType.FLOAT, "float16": ir.DataType.FLOAT16, "bfloat16": ir.DataType.BFLOAT16}


def _tensor_fn(name: str, shape: tuple[int, ...], dtype: ir.DataType, seed: int, loc: float, scale: float):
    def make() -> ir.Tensor:
        rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
        data = rng.standard_normal(shape, dtype=np.float32)
        data *= scale
        data += loc
        return ir.Tensor(data.astype(dtype.numpy()), dtype=dtype, name=name)

    return make


def weight_bytes(hidden: int, layers: int, vocab: int, positions: int = 1024, ffn: int = 4, itemsize: int = 4) -> int:
    """Bytes of all initializers the model will hold (to size a model before building it)."""
    per_layer = 2 * hidden * ffn * hidden + ffn * hidden + hidden + 2 * hidden
    return itemsize * (vocab * hidden * 2 + positions * hidden + layers * per_layer + 2 * hidden)


def _layer_norm(nodes: list, inits: dict, x: str, out: str, prefix: str, hidden: int, opset: int) -> None:
    gamma, beta = f"{prefix}.weight", f"{prefix}.bias"
    inits[gamma] = ((hidden,), 1.0, 0.1)
    inits[beta] = ((hidden,), 0.0, 0.1)
    if opset >= 17:
        nodes.append(helper.make_node("LayerNormalization", [x, gamma, beta], [out], name=prefix, axis=-1, epsilon=1e-5))
        return
    p = f"{prefix}/"
    nodes += [
        helper.make_node("ReduceMean", [x], [p + "mean"], name=p + "mean", axes=[-1], keepdims=1),
        helper.make_node("Sub", [x, p + "mean"], [p + "d"], name=p + "sub"),
        helper.make_node("Pow", [p + "d", "const.two"], [p + "sq"], name=p + "pow"),
        helper.make_node("ReduceMean", [p + "sq"], [p + "var"], name=p + "var", axes=[-1], keepdims=1),
        helper.make_node("Add", [p + "var", "const.eps"], [p + "var_eps"], name=p + "add_eps"),
        helper.make_node("Sqrt", [p + "var_eps"], [p + "std"], name=p + "sqrt"),
        helper.make_node("Div", [p + "d", p + "std"], [p + "n"], name=p + "div"),
        helper.make_node("Mul", [p + "n", gamma], [p + "scaled"], name=p + "mul"),
        helper.make_node("Add", [p + "scaled", beta], [out], name=p + "add"),
    ]


def _gelu(nodes: list, x: str, out: str, prefix: str, opset: int) -> None:
    if opset >= 20:
        nodes.append(helper.make_node("Gelu", [x], [out], name=prefix))
        return
    p = f"{prefix}/"
    nodes += [
        helper.make_node("Div", [x, "const.sqrt2"], [p + "s"], name=p + "div"),
        helper.make_node("Erf", [p + "s"], [p + "erf"], name=p + "erf"),
        helper.make_node("Add", [p + "erf", "const.one"], [p + "erf1"], name=p + "add"),
        helper.make_node("Mul", [x, p + "erf1"], [p + "xe"], name=p + "mul"),
        helper.make_node("Mul", [p + "xe", "const.half"], [out], name=p + "half"),
    ]


def build(
    hidden: int = 64,
    layers: int = 2,
    vocab: int = 512,
    *,
    positions: int = 1024,
    ffn: int = 4,
    opset: int = 17,
    dtype: str = "float32",
    tie_head: bool = False,
    seed: int = 0,
) -> ir.Model:
    """The model as onnx_ir, its weights lazy (drawn when saved or read)."""
    ir_dtype = DTYPES[dtype]
    elem = int(ir_dtype)
    nodes: list = []
    inits: dict[str, tuple[tuple[int, ...], float, float]] = {}
    consts: dict[str, float] = {}
    inits["wte"] = ((vocab, hidden), 0.0, 0.02)
    inits["wpe"] = ((positions, hidden), 0.0, 0.01)
    nodes += [
        helper.make_node("Gather", ["wte", "input_ids"], ["tok"], name="embed_tokens"),
        helper.make_node("Shape", ["input_ids"], ["ids_shape"], name="ids_shape"),
        helper.make_node("Gather", ["ids_shape", "const.i1"], ["seq"], name="seq_len", axis=0),
        helper.make_node("Range", ["const.i0", "seq", "const.i1"], ["pos_ids"], name="positions"),
        helper.make_node("Gather", ["wpe", "pos_ids"], ["pos"], name="embed_positions"),
        helper.make_node("Add", ["tok", "pos"], ["h0"], name="embed_add"),
    ]
    if opset < 17:
        consts.update({"const.two": 2.0, "const.eps": 1e-5})
    if opset < 20:
        consts.update({"const.sqrt2": float(np.sqrt(2.0)), "const.one": 1.0, "const.half": 0.5})
    h = "h0"
    for i in range(layers):
        p = f"blocks.{i}"
        _layer_norm(nodes, inits, h, f"{p}.ln_out", f"{p}.ln", hidden, opset)
        inits[f"{p}.fc1.weight"] = ((hidden, ffn * hidden), 0.0, 0.02)
        inits[f"{p}.fc1.bias"] = ((ffn * hidden,), 0.0, 0.02)
        inits[f"{p}.fc2.weight"] = ((ffn * hidden, hidden), 0.0, 0.02)
        inits[f"{p}.fc2.bias"] = ((hidden,), 0.0, 0.02)
        nodes += [
            helper.make_node("MatMul", [f"{p}.ln_out", f"{p}.fc1.weight"], [f"{p}.fc1.mm"], name=f"{p}.fc1"),
            helper.make_node("Add", [f"{p}.fc1.mm", f"{p}.fc1.bias"], [f"{p}.fc1.out"], name=f"{p}.fc1.add"),
        ]
        _gelu(nodes, f"{p}.fc1.out", f"{p}.act", f"{p}.gelu", opset)
        nodes += [
            helper.make_node("MatMul", [f"{p}.act", f"{p}.fc2.weight"], [f"{p}.fc2.mm"], name=f"{p}.fc2"),
            helper.make_node("Add", [f"{p}.fc2.mm", f"{p}.fc2.bias"], [f"{p}.fc2.out"], name=f"{p}.fc2.add"),
            helper.make_node("Add", [h, f"{p}.fc2.out"], [f"h{i + 1}"], name=f"{p}.residual"),
        ]
        h = f"h{i + 1}"
    _layer_norm(nodes, inits, h, "ln_f.out", "ln_f", hidden, opset)
    if tie_head:
        nodes += [
            helper.make_node("Transpose", ["wte"], ["wte.T"], name="lm_head.transpose", perm=[1, 0]),
            helper.make_node("MatMul", ["ln_f.out", "wte.T"], ["logits"], name="lm_head"),
        ]
    else:
        inits["lm_head.weight"] = ((hidden, vocab), 0.0, 0.02)
        nodes.append(helper.make_node("MatMul", ["ln_f.out", "lm_head.weight"], ["logits"], name="lm_head"))

    small = [
        helper.make_tensor("const.i0", TensorProto.INT64, [], [0]),
        helper.make_tensor("const.i1", TensorProto.INT64, [], [1]),
    ]
    # Weights are declared in the proto by name, type and shape only; their data is attached to the
    # IR values below, as lazy tensors (drawn when written) and small in-memory scalars.
    placeholders = [TensorProto(name=n, data_type=elem, dims=shape) for n, (shape, _, _) in inits.items()]
    placeholders += [TensorProto(name=n, data_type=elem, dims=[]) for n in consts]
    graph = helper.make_graph(
        nodes,
        "large_gpt2_pre_ln",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("logits", elem, ["batch", "seq", vocab])],
        initializer=small + placeholders,
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="make_large_model")
    proto.ir_version = 8 if opset < 19 else 9 if opset < 21 else 10
    model = ir.serde.deserialize_model(proto)
    values = model.graph.initializers
    for name, (shape, loc, scale) in inits.items():
        make = _tensor_fn(name, shape, ir_dtype, seed, loc, scale)
        values[name].const_value = ir.LazyTensor(make, dtype=ir_dtype, shape=ir.Shape(shape), name=name)
    for name, v in consts.items():  # scalars of the decomposed LN and Gelu, in the model's float type
        values[name].const_value = ir.Tensor(np.array(v, dtype=np.float32).astype(ir_dtype.numpy()), dtype=ir_dtype, name=name)
    return model


def make_model(path: str | os.PathLike, *, external: bool = True, **kwargs) -> Path:
    """Write the model to `path` (weights in `path.name + '.data'` beside it when `external`)."""
    path = Path(path)
    model = build(**kwargs)
    if external:
        ir.save(model, path, external_data=path.name + ".data")
    else:
        ir.save(model, path)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("output", help="the .onnx file to write (weights go to OUTPUT.data beside it)")
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--layers", type=int, default=48)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--positions", type=int, default=1024)
    p.add_argument("--ffn", type=int, default=4, help="MLP width as a multiple of hidden")
    p.add_argument("--opset", type=int, default=17, help="below 17: decomposed LayerNorm; below 20: Erf Gelu")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    p.add_argument("--tie-head", action="store_true", help="LM head reads the embedding table (transposed)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--inline", action="store_true", help="keep the weights in the .onnx file (models < 2 GB)")
    args = p.parse_args(argv)
    size = weight_bytes(args.hidden, args.layers, args.vocab, args.positions, args.ffn, 2 if args.dtype != "float32" else 4)
    print(f"writing {args.output}: ~{size / 2**30:.2f} GiB of weights", file=sys.stderr)
    shape = ("hidden", "layers", "vocab", "positions", "ffn", "opset", "dtype", "tie_head", "seed")
    make_model(args.output, external=not args.inline, **{name: getattr(args, name) for name in shape})
    return 0


if __name__ == "__main__":
    sys.exit(main())
