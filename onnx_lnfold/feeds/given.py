"""Inputs the user gives: `--input-shape NAME:D1,D2,...` parsed, `--inputs FILE.npz` read, and
both checked against the graph inputs before any work (a mismatch would fail on the original in
ONNX Runtime, not on the fold)."""

from __future__ import annotations

import zipfile

import numpy as np
import onnx_ir as ir

from onnx_lnfold.core.errors import InvalidInput
from onnx_lnfold.core.options import SettingMismatch
from onnx_lnfold.feeds.budget import check_size, declared_words
from onnx_lnfold.feeds.sets import REALISTIC_SIZES
from onnx_lnfold.feeds.synthesize import InputsUnavailable, graph_inputs, synthesized_shapes


def check_inputs(model: ir.Model, inputs: dict[str, np.ndarray]) -> None:
    """User-given verification inputs must name every graph input, and only those, with its
    element type and rank: else onnxruntime would fail on the original, not on the fold."""
    declared = {v.name: v for v in graph_inputs(model)}
    missing = sorted(set(declared) - set(inputs))
    extra = sorted(set(inputs) - set(declared))
    if missing or extra:
        parts = []
        if missing:
            parts.append("missing " + ", ".join(missing))
        if extra:
            parts.append("not graph inputs: " + ", ".join(extra))
        raise SettingMismatch(f"{{inputs}} does not match the graph inputs ({'; '.join(parts)})")
    for name, value in declared.items():
        array = inputs[name]
        if value.dtype is not None:
            try:
                expected = np.dtype(value.dtype.numpy())
            except (TypeError, ValueError, NotImplementedError):  # no numpy counterpart: let ORT judge
                expected = None
            if expected is not None and array.dtype != expected:
                raise SettingMismatch(f"{{inputs}}: '{name}' is {array.dtype}, the graph input is {expected}")
        if value.shape is not None and len(value.shape) != array.ndim:
            raise SettingMismatch(f"{{inputs}}: '{name}' has rank {array.ndim}, the graph input has rank {len(value.shape)}")


def check_input_shapes(model: ir.Model, shapes: dict[str, tuple[int, ...]]) -> None:
    """`--input-shape` must name graph inputs, each at its declared rank and at the sizes the graph
    fixes: the cost rule prices at these shapes and the check runs at them, so a dry run refuses
    what a real run would (an unknown name, a wrong rank) before any work."""
    declared = {v.name: v for v in graph_inputs(model)}
    unknown = sorted(set(shapes) - set(declared))
    if unknown:
        raise SettingMismatch(
            f"{{input_shapes}} names no graph input: {', '.join(unknown)} (the graph inputs: {', '.join(declared) or 'none'})"
        )
    for name, dims in shapes.items():
        shape = declared[name].shape
        if shape is None:
            continue
        if len(shape) != len(dims):
            raise SettingMismatch(
                f"{{input_shapes}} {name}:{','.join(map(str, dims))} has rank {len(dims)}, the graph input has rank "
                f"{len(shape)} ({declared_words(shape)})"
            )
        for axis, (size, fixed) in enumerate(zip(dims, shape)):
            if isinstance(fixed, int) and size != fixed:
                raise SettingMismatch(
                    f"{{input_shapes}} {name}:{','.join(map(str, dims))}: dim {axis} is {size}, the graph fixes it at "
                    f"{fixed} ({declared_words(shape)})"
                )


def check_input_sizes(model: ir.Model, shapes: dict[str, tuple[int, ...]]) -> None:
    """No input the check would synthesize may take over `budget.MAX_INPUT_BYTES`: checked at the
    realistic-scale set's sizes, the largest it synthesizes, before any work (a dry run and
    `analyze()` refuse what a real run would, and nothing is allocated by a declared size)."""
    batch, length = REALISTIC_SIZES[0]
    try:
        sizes = {**synthesized_shapes(model, shapes, batch, length), **shapes}
    except InputsUnavailable:  # the check says why, as it would anyway
        return
    for value in graph_inputs(model):
        check_size(value, sizes[value.name or ""], length)


def load_inputs(path: str) -> dict[str, np.ndarray]:
    try:
        data = np.load(path, allow_pickle=False)
        if not isinstance(data, np.lib.npyio.NpzFile):
            raise ValueError("an .npy array, not an .npz archive of named arrays")
        with data:
            return {k: data[k] for k in data.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise InvalidInput(f"{path}: cannot read inputs ({e})".splitlines()[0]) from None
