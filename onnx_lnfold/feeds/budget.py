"""The most memory one synthesized verification input may take, and the refusal of an input the
check would need more for (a dim declared as a placeholder for "any length", 2^31, say): refused
before anything is allocated, with the sizes to check it at instead."""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir

from onnx_lnfold.core.errors import InvalidInput
from onnx_lnfold.core.ways_out import shape_way_out

# The most bytes one synthesized input may take. The check holds each input several times (drawn
# in float64, as fed, widened for the float64 reference) and the model's activations grow with it;
# the largest inputs real exports take at the sizes verification uses are a few tens of MiB (a
# static KV-cache tensor of a 7B decoder at 4096 positions, 32 MiB in float16; a 1024 x 1024 image,
# 12 MiB), while a placeholder dim makes hundreds of GiB.
MAX_INPUT_BYTES = 256 << 20


class InputTooLarge(InvalidInput):
    """A verification input over `MAX_INPUT_BYTES`: its name, declared shape, the shape the check
    would synthesize, its bytes, and the sizes to check it at instead (each surface says how)."""

    def __init__(self, value: ir.Value, dims: tuple[int, ...], itemsize: int, length: int):
        self.name, self.dims, self.nbytes = value.name or "", tuple(dims), math.prod(dims) * itemsize
        self.declared = declared_words(value.shape)
        fixed = [d if isinstance(d, int) else None for d in value.shape] if value.shape is not None else []
        self.at = "" if list(self.dims) == fixed else f", at {self.dims}"  # where dynamic dims took sizes
        self.dtype = np.dtype(value.dtype.numpy()).name  # type: ignore[union-attr] # as check_size read it
        self.smaller = _smaller(self.dims, itemsize, length)
        # The dims the graph fixes at other sizes: ONNX Runtime runs an input at no other.
        self.fixed_axes = tuple(a for a, d in enumerate(self.smaller) if d != self.dims[a] and fixed and fixed[a] is not None)
        super().__init__(self.said("api"))

    def said(self, surface: str) -> str:
        return (
            f"graph input '{self.name}' is declared {self.declared}{self.at}: {_size_words(self.nbytes)} of "
            f"{self.dtype}, over the {_size_words(MAX_INPUT_BYTES)} a verification input may take; "
            + shape_way_out(surface, self.name, self.smaller, self.fixed_axes)
        )


def check_size(value: ir.Value, dims: tuple[int, ...], length: int) -> None:
    """Raise `InputTooLarge` where input `value` at `dims` takes over `MAX_INPUT_BYTES`; `length`:
    the size to suggest for its largest dims instead."""
    try:
        itemsize = np.dtype(value.dtype.numpy()).itemsize  # type: ignore[union-attr]
    except (AttributeError, TypeError, ValueError, NotImplementedError):  # no numpy type: said elsewhere
        return
    if math.prod(dims) * itemsize > MAX_INPUT_BYTES:  # Python ints: no overflow
        raise InputTooLarge(value, dims, itemsize, length)


def _smaller(dims: tuple[int, ...], itemsize: int, length: int) -> tuple[int, ...]:
    """`dims` with its largest dims at `length`, largest first, until within the budget."""
    smaller = list(dims)
    for axis in sorted(range(len(dims)), key=lambda a: -dims[a]):
        if math.prod(smaller) * itemsize <= MAX_INPUT_BYTES or dims[axis] <= length:
            break
        smaller[axis] = length
    return tuple(smaller)


def declared_words(shape: ir.Shape | None) -> str:
    """`[batch, 3, 224, 224]`: a declared shape as messages show it (`?` for an unnamed dim)."""
    if shape is None:
        return "without a shape"
    return "[" + ", ".join(str(d) if isinstance(d, int) else (getattr(d, "value", None) or "?") for d in shape) + "]"


def _size_words(nbytes: float) -> str:
    """1.5 GiB, 256 MiB, 12 bytes."""
    if nbytes < 1024:
        return f"{int(nbytes)} bytes"
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        nbytes /= 1024
        if nbytes < 1024 or unit == "PiB":
            return f"{nbytes:.3g} {unit}"
    return ""
