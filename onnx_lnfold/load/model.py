"""Load a model from a path, an `onnx.ModelProto` or an `onnx_ir.Model`, never touching the caller's copy."""

from __future__ import annotations

import os
import stat as stat_module
from pathlib import Path

import onnx
import onnx_ir as ir
from google.protobuf.message import DecodeError

from onnx_lnfold.core.errors import InvalidInput, LnFoldError
from onnx_lnfold.io.external_data import external_tensors
from onnx_lnfold.io.proto_read import check_representable, read_model
from onnx_lnfold.io.tensor_data import check_external_tensor, check_ir_tensors, check_tensors, quoted
from onnx_lnfold.load.validate import check_model, checked_load

ModelSource = "str | os.PathLike | onnx.ModelProto | ir.Model"


def _check_external_data(external: list[tuple[str, ir.ExternalTensor]], base: Path) -> None:
    """Every external tensor (owner name, tensor) must lie, and exist in full, in a regular file
    inside the model's folder."""
    root = base.resolve()
    sizes: dict[Path, os.stat_result] = {}
    for name, tensor in external:
        shown = quoted(tensor.location)
        location = Path(tensor.location)
        try:
            target = (base / location).resolve()
            outside = location.is_absolute() or root not in target.parents
            stat = None if outside else sizes.get(target) or target.stat()
        except FileNotFoundError:
            raise InvalidInput(f"external data file {shown} of tensor '{name}' is missing") from None
        except OSError as e:  # a name too long, a folder that is a file
            raise InvalidInput(f"external data location {shown} of tensor '{name}' cannot be used: {e.strerror or e}") from None
        if stat is None:
            raise InvalidInput(f"external data {shown} of tensor '{name}' lies outside the model's folder; refusing to read it")
        sizes[target] = stat
        if stat_module.S_ISDIR(stat.st_mode):
            raise InvalidInput(f"external data file {shown} of tensor '{name}' is a directory")
        if not stat_module.S_ISREG(stat.st_mode):  # a FIFO would block the read, a device never end
            raise InvalidInput(f"external data file {shown} of tensor '{name}' is not a regular file")
        if stat.st_nlink > 1:  # onnx_ir refuses these at read time (a hard link can point anywhere)
            raise InvalidInput(
                f"external data file {shown} has {stat.st_nlink} hard links; onnx_ir refuses to read "
                "hard-linked external data: copy the file instead"
            )
        end = (tensor.offset or 0) + (tensor.length if tensor.length is not None else tensor.nbytes)
        if end > stat.st_size:
            raise InvalidInput(
                f"external data file {shown} is truncated: tensor '{name}' ends at byte {end:,}, "
                f"the file has {stat.st_size:,}"
            )
        check_external_tensor(tensor, name)


def _parse_whole(p: Path) -> ir.Model:
    try:
        proto = onnx.load(str(p), load_external_data=False)
    except (DecodeError, ValueError, RuntimeError) as e:
        raise InvalidInput(f"{p}: not a readable ONNX model ({type(e).__name__})") from None
    if not proto.HasField("graph") or proto.ir_version == 0:
        raise InvalidInput(f"{p}: not an ONNX model (no graph or IR version)")
    check_representable(proto)
    check_tensors(proto)
    return ir.serde.deserialize_model(proto)


def load_path(path: str | os.PathLike) -> ir.Model:
    p = Path(path)
    try:
        st = p.stat()
    except (FileNotFoundError, ValueError):  # ValueError: a NUL byte in the path
        raise InvalidInput(f"{p}: no such file") from None
    except OSError as e:
        raise InvalidInput(f"{p}: cannot read ({e.strerror or e})") from None
    if stat_module.S_ISDIR(st.st_mode):
        raise InvalidInput(f"{p}: is a directory, not an ONNX model")
    if not stat_module.S_ISREG(st.st_mode):  # never opened: a FIFO would block the read
        raise InvalidInput(f"{p}: not a regular file; save the model to a file first")
    if st.st_size == 0:
        raise InvalidInput(f"{p}: file is empty")
    try:
        # Large initializers stay in the file (read when used); None: a file to parse whole.
        model = read_model(p)
        if model is None:
            model = _parse_whole(p)
    except OSError as e:
        raise InvalidInput(f"{p}: cannot read ({e.strerror or e})") from None
    except LnFoldError:
        raise
    except Exception as e:  # the IR rejects structurally broken graphs
        raise InvalidInput(f"{p}: malformed ONNX model: {e}".splitlines()[0]) from None
    # Found once, each located beside the model (as `onnx_ir.external_data.set_base_dir` does,
    # which walks every tensor of the graph to find them) and checked there.
    external = list(external_tensors(model))
    for _, tensor in external:
        tensor.base_dir = str(p.parent)
    _check_external_data(external, p.parent)
    return model


def load_model(source: ModelSource) -> tuple[ir.Model, Path | None]:
    """An IR model the caller does not share, and the path it came from (if any), checked by ONNX's
    checker (`load.validate`)."""
    path = Path(source) if isinstance(source, (str, os.PathLike)) else None
    with checked_load(path):
        model, path = _load(source)
    check_model(model, path)
    return model, path


def _load(source: ModelSource) -> tuple[ir.Model, Path | None]:
    if isinstance(source, ir.Model):
        check_ir_tensors(source)
        return source.clone(), None
    if isinstance(source, onnx.ModelProto):
        # deserialize_model reads the proto without changing it; the IR tensors we edit are new objects.
        check_representable(source)
        check_tensors(source)
        try:
            model = ir.serde.deserialize_model(source)
        except Exception as e:
            raise InvalidInput(f"malformed ONNX model: {e}".splitlines()[0]) from None
        for name, tensor in external_tensors(model):
            check_external_tensor(tensor, name)
        return model, None
    if isinstance(source, (str, os.PathLike)):
        return load_path(source), Path(source)
    raise InvalidInput(f"expected a path, an onnx.ModelProto or an onnx_ir.Model, got {type(source).__name__}")
