#!/usr/bin/env python
"""Quantize committed float models with ONNX Runtime's own tools, as deployments ship them:

- ``<source>_qdq_int8``: static QDQ int8, per-tensor (``quantize_static``, ``QuantFormat.QDQ``,
  MinMax calibration on the committed inputs and seeded random batches of the same shape);
- ``<source>_qdq_int8_per_channel``: the same with ``per_channel=True``;
- ``<source>_dynamic_int8``: ``quantize_dynamic`` (``DynamicQuantizeLinear`` + ``MatMulInteger``);
- ``<source>_matmul_nbits_int4``: ``MatMulNBitsQuantizer`` (4 bits, block size 32);
- ``<source>_int8_cast_mul``: written here, no ONNX Runtime tool: every constant weight of a
  ``MatMul`` / ``Gemm`` stored as int8 ``round(W / scale)`` with one scale per output channel, and
  dequantized in the graph by ``Cast(to=FLOAT) -> Mul(scale)`` before its consumer.

Each model is checked to run in ONNX Runtime on the source's committed inputs, whose copy it gets
as ``<name>.inputs.npz``. Nothing here is random but the seeded calibration batches, so a run with
the same onnx / onnxruntime versions writes the same bytes.

Usage::

    python models/make/export_quantized_models.py [--only NAME ...] [--out-dir DIR]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_dynamic, quantize_static
from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

MODELS = Path(__file__).resolve().parent.parent
SOURCES = ("bert", "gpt2")
CALIBRATION_BATCHES = 8
SEED = 47
MAX_BYTES = 1 << 20


def committed_inputs(source: str, models: Path = MODELS) -> dict[str, np.ndarray]:
    with np.load(models / f"{source}.inputs.npz") as f:
        return {k: f[k] for k in f.files}


class NpzCalibration(CalibrationDataReader):
    """The committed inputs, then seeded random token batches of the same shape (ids below the
    largest committed id, masks copied): MinMax calibration on realistic ranges, deterministic."""

    def __init__(self, source: str):
        feeds = committed_inputs(source)
        rng = np.random.default_rng(SEED)
        batches = [feeds]
        for _ in range(CALIBRATION_BATCHES - 1):
            batches.append(
                {
                    k: rng.integers(0, int(v.max()) + 1, size=v.shape, dtype=v.dtype) if k == "input_ids" else v
                    for k, v in feeds.items()
                }
            )
        self._batches = iter(batches)

    def get_next(self):
        return next(self._batches, None)


def qdq_int8(
    source: Path, out: Path, *, per_channel: bool = False, calibration: CalibrationDataReader | None = None
) -> None:
    """Static QDQ int8; `calibration` defaults to the committed inputs of `source` (`NpzCalibration`)."""
    quantize_static(
        str(source),
        str(out),
        calibration if calibration is not None else NpzCalibration(source.stem),
        quant_format=QuantFormat.QDQ,
        per_channel=per_channel,
        activation_type=QuantType.QInt8,
        weight_type=QuantType.QInt8,
    )


def dynamic_int8(source: Path, out: Path) -> None:
    quantize_dynamic(str(source), str(out), weight_type=QuantType.QInt8)


def matmul_nbits_int4(source: Path, out: Path) -> None:
    quantizer = MatMulNBitsQuantizer(onnx.load(str(source)), bits=4, block_size=32)
    quantizer.process()
    quantizer.model.save_model_to_file(str(out), use_external_data_format=False)


def _weight_channel_axis(node: onnx.NodeProto, rank: int) -> int | None:
    """The axis of a 2-D constant weight (input B) that indexes the node's output channels."""
    if rank != 2:
        return None
    if node.op_type == "MatMul":
        return 1
    trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
    return 0 if trans_b else 1


def int8_cast_mul(source: Path, out: Path) -> None:
    """Every constant 2-D weight of a MatMul / Gemm stored as int8 with per-output-channel scales,
    read through Cast(int8 -> float) -> Mul(scale). A weight read by several nodes is converted once."""
    model = onnx.load(str(source))
    graph = model.graph
    initializers = {t.name: t for t in graph.initializer}
    dequantized: dict[str, str] = {}
    new_nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        if node.op_type in ("MatMul", "Gemm") and node.input[1] in initializers:
            name = node.input[1]
            weight = numpy_helper.to_array(initializers[name])
            axis = _weight_channel_axis(node, weight.ndim)
            if axis is not None and weight.dtype == np.float32:
                if name not in dequantized:
                    reduce_axis = 1 - axis
                    scale = np.abs(weight).max(axis=reduce_axis, keepdims=True) / 127.0
                    scale = np.where(scale == 0, 1.0, scale).astype(np.float32)
                    q = np.clip(np.round(weight / scale), -127, 127).astype(np.int8)
                    graph.initializer.remove(initializers[name])
                    graph.initializer.extend(
                        [numpy_helper.from_array(q, f"{name}_int8"), numpy_helper.from_array(scale, f"{name}_scale")]
                    )
                    new_nodes += [
                        helper.make_node(
                            "Cast", [f"{name}_int8"], [f"{name}_cast"], name=f"{name}_Cast", to=TensorProto.FLOAT
                        ),
                        helper.make_node(
                            "Mul", [f"{name}_cast", f"{name}_scale"], [f"{name}_dequantized"], name=f"{name}_Mul"
                        ),
                    ]
                    dequantized[name] = f"{name}_dequantized"
                node.input[1] = dequantized[name]
        new_nodes.append(node)
    del graph.node[:]
    graph.node.extend(new_nodes)
    onnx.checker.check_model(model)
    onnx.save(model, str(out))


QUANTIZERS: dict[str, Callable[[Path, Path], None]] = {
    "qdq_int8": qdq_int8,
    "qdq_int8_per_channel": lambda s, o: qdq_int8(s, o, per_channel=True),
    "dynamic_int8": dynamic_int8,
    "matmul_nbits_int4": matmul_nbits_int4,
    "int8_cast_mul": int8_cast_mul,
}
# GPT-2's weights are Gemm's or the tied head's Transpose: MatMulNBits finds no MatMul to quantize.
SKIPPED = {("gpt2", "matmul_nbits_int4")}
FIXTURES = {
    f"{source}_{kind}": (source, kind) for source in SOURCES for kind in QUANTIZERS if (source, kind) not in SKIPPED
}


def _strip(path: Path) -> None:
    """Drops what the tools record of the run itself (the producer's version stays)."""
    model = onnx.load(str(path))
    del model.metadata_props[:]
    onnx.save(model, str(path))


def export_one(name: str, out_dir: Path) -> None:
    source, kind = FIXTURES[name]
    path = out_dir / f"{name}.onnx"
    with tempfile.TemporaryDirectory(prefix="quantize-") as tmp:
        staged = Path(tmp) / f"{source}.onnx"  # the calibrator writes beside its input
        shutil.copyfile(MODELS / f"{source}.onnx", staged)
        QUANTIZERS[kind](staged, path)
    _strip(path)
    size = path.stat().st_size
    if size >= MAX_BYTES:
        raise RuntimeError(f"{name}: {size} bytes, over {MAX_BYTES}")
    shutil.copyfile(MODELS / f"{source}.inputs.npz", out_dir / f"{name}.inputs.npz")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    outputs = session.run(None, committed_inputs(source))
    if not all(np.isfinite(o).all() for o in outputs):
        raise RuntimeError(f"{name}: outputs not finite")
    print(f"{name}: {size:,} bytes")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=sorted(FIXTURES), metavar="NAME")
    parser.add_argument("--out-dir", type=Path, default=MODELS)
    args = parser.parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for name in args.only or FIXTURES:
        export_one(name, args.out_dir)


if __name__ == "__main__":
    main()
