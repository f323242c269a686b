"""Write a model safely: to a temporary file in the destination folder, renamed into place.

A crash or a refused verification never leaves a half-written model, and the input file is never
the destination unless the caller asked for that explicitly.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import onnx_ir as ir

from onnx_lnfold._errors import LnFoldError

# Protobuf cannot hold a message over 2 GiB: above this the weights go to external data.
_PROTO_LIMIT = 2**31 - 2**26


def weight_bytes(model: ir.Model) -> int:
    total = 0
    for value in model.graph.initializers.values():
        if value.const_value is not None:
            total += value.const_value.nbytes
    return total


def uses_external_data(model: ir.Model) -> bool:
    return any(isinstance(v.const_value, ir.ExternalTensor) for v in model.graph.initializers.values())


class StagedModel:
    """A model written next to its destination, not yet in place: `commit()` or `discard()`."""

    def __init__(self, model: ir.Model, destination: Path):
        self.destination = destination
        folder = destination.parent
        if not folder.is_dir():
            raise LnFoldError(f"{folder}: output folder does not exist")
        if not os.access(folder, os.W_OK):
            raise LnFoldError(f"{folder}: output folder is not writable")
        self._dir = Path(tempfile.mkdtemp(prefix=".lnfold-", dir=folder))
        self.path = self._dir / destination.name
        self.data_name: str | None = None
        try:
            if uses_external_data(model) or weight_bytes(model) > _PROTO_LIMIT:
                self.data_name = destination.name + ".data"
                ir.save(model, self.path, external_data=self.data_name)
            else:
                ir.save(model, self.path)
        except BaseException:
            self.discard()
            raise

    def commit(self) -> Path:
        if self.data_name:
            os.replace(self._dir / self.data_name, self.destination.parent / self.data_name)
        os.replace(self.path, self.destination)
        shutil.rmtree(self._dir, ignore_errors=True)
        return self.destination

    def discard(self) -> None:
        shutil.rmtree(self._dir, ignore_errors=True)


def default_output(path: Path) -> Path:
    """`model.onnx` -> `model.lnfold.onnx`, beside the input."""
    return path.with_name(f"{path.stem}.lnfold{path.suffix or '.onnx'}")


def check_destination(source: Path | None, destination: Path, in_place: bool) -> None:
    if source is not None and not in_place and destination.resolve() == source.resolve():
        raise LnFoldError(f"{destination}: output would overwrite the input; pass --in-place to allow it")
    if destination.is_dir():
        raise LnFoldError(f"{destination}: output path is a directory")
