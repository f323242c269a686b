"""Load a model from a path, an `onnx.ModelProto` or an `onnx_ir.Model`, never touching the caller's copy."""

from __future__ import annotations

import os
from pathlib import Path

import onnx
import onnx_ir as ir
from google.protobuf.message import DecodeError

from onnx_lnfold._errors import LnFoldError

ModelSource = "str | os.PathLike | onnx.ModelProto | ir.Model"


def _check_external_data(model: ir.Model, base: Path) -> None:
    """Every external tensor must lie, and exist, inside the model's folder."""
    root = base.resolve()
    for value in model.graph.initializers.values():
        tensor = value.const_value
        if not isinstance(tensor, ir.ExternalTensor):
            continue
        location = Path(tensor.location)
        target = (base / location).resolve()
        if location.is_absolute() or root not in target.parents:
            raise LnFoldError(
                f"external data '{tensor.location}' of tensor '{value.name}' lies outside the model's folder; refusing to read it"
            )
        if not target.is_file():
            raise LnFoldError(f"external data file '{tensor.location}' of tensor '{value.name}' is missing")


def load_path(path: str | os.PathLike) -> ir.Model:
    p = Path(path)
    if not p.exists():
        raise LnFoldError(f"{p}: no such file")
    if p.is_dir():
        raise LnFoldError(f"{p}: is a directory, not an ONNX model")
    if p.stat().st_size == 0:
        raise LnFoldError(f"{p}: file is empty")
    try:
        proto = onnx.load(str(p), load_external_data=False)
    except (DecodeError, ValueError, RuntimeError) as e:
        raise LnFoldError(f"{p}: not a readable ONNX model ({type(e).__name__})") from None
    if not proto.HasField("graph") or proto.ir_version == 0:
        raise LnFoldError(f"{p}: not an ONNX model (no graph or IR version)")
    try:
        model = ir.serde.deserialize_model(proto)
    except Exception as e:  # the IR rejects structurally broken graphs
        raise LnFoldError(f"{p}: malformed ONNX model: {e}".splitlines()[0]) from None
    ir.external_data.set_base_dir(model.graph, str(p.parent))
    _check_external_data(model, p.parent)
    return model


def load_model(source: ModelSource) -> tuple[ir.Model, Path | None]:
    """An IR model the caller does not share, and the path it came from (if any)."""
    if isinstance(source, ir.Model):
        return source.clone(), None
    if isinstance(source, onnx.ModelProto):
        # deserialize_model reads the proto without changing it; the IR tensors we edit are new objects.
        try:
            return ir.serde.deserialize_model(source), None
        except Exception as e:
            raise LnFoldError(f"malformed ONNX model: {e}".splitlines()[0]) from None
    if isinstance(source, (str, os.PathLike)):
        return load_path(source), Path(source)
    raise LnFoldError(f"expected a path, an onnx.ModelProto or an onnx_ir.Model, got {type(source).__name__}")
