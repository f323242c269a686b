"""Inputs for verification: the user's (`--inputs FILE.npz`, checked against the graph inputs;
`--input-shape NAME:D1,D2,...`) or synthesized from the graph (`synthesize`).

`verification_input_sets` gives the sets `fold()` checks on: two small sizes, every bool input at
both values (the `If` of a merged decoder runs both branches), and one set at the scale real use
sees (`realistic=True`): one sequence of 64 positions (32 or 16 where the graph's tables hold
fewer), token ids spread over the whole table (every region of the vocabulary, its first and last
row included, where 16 draws touch a few rows), images as a preprocessor normalizes them (uniform
pixels, ImageNet's mean and std per channel).
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx_ir as ir

from onnx_lnfold.core.errors import InvalidInput
from onnx_lnfold.verify.synthesize import KvCache, dim_rereadings, graph_inputs, kv_cache, synthesize_inputs

# The two sizes verification runs at, (batch, sequence length): the second falls back to changing
# only one of the two where the graph fixes the other (a Split of the batch into fixed parts).
FIRST_SIZE = (2, 8)
SECOND_SIZES = ((3, 5), (2, 5), (3, 8))


# The realistic-scale set: one long sequence, shorter where a position table holds fewer.
REALISTIC_SIZES = ((1, 64), (1, 32), (1, 16))


def parse_input_shape(spec: str) -> tuple[str, tuple[int, ...]]:
    """'NAME:D1,D2,...' -> (NAME, (D1, D2, ...))."""
    name, sep, dims = spec.rpartition(":")
    try:
        if not sep or not name:
            raise ValueError
        shape = tuple(int(d) for d in dims.split(","))
        if any(d < 0 for d in shape):
            raise ValueError
    except ValueError:
        raise InvalidInput(f"bad --input-shape '{spec}': expected NAME:D1,D2,... with non-negative integers") from None
    return name, shape


@dataclass
class InputSet:
    """One set of verification inputs, the other readings of its shapes to try if the original
    model does not run on it, and how the report names it. A set that is not `required` (the
    second size) is left out, with a note, when the original runs on none of its readings."""

    feeds: dict[str, np.ndarray]
    alternatives: list[dict[str, np.ndarray]] = field(default_factory=list)
    required: bool = True
    kind: str = ""  # what sets it apart, for the report ("realistic scale")
    named: str = ""  # how the report names its feeds, where listing every input says less

    @property
    def label(self) -> str:
        return (self.named or feeds_label(self.feeds)) + (f" [{self.kind}]" if self.kind else "")


def feeds_label(feeds: dict[str, np.ndarray]) -> str:
    parts = []
    for name, array in feeds.items():
        if array.dtype == bool and array.size and (array.all() or not array.any()):
            parts.append(f"{name}={bool(array.flat[0])}")
        else:
            parts.append(f"{name}{tuple(array.shape)}")
    return ", ".join(parts)


def verification_input_sets(
    model: ir.Model,
    shapes: dict[str, tuple[int, ...]] | None = None,
    inputs: dict[str, np.ndarray] | None = None,
    folder: Path | None = None,
) -> list[InputSet]:
    """Two sizes, each with every bool input True, then False, then one set at realistic scale
    (bools True); or the user's inputs as given, then with their bools flipped. Every set but the
    first size's is left out, with a note, if the original does not run on it. A decoder with a
    GroupQueryAttention KV cache (`synthesize.kv_cache`; `folder` holds its genai_config.json, if
    any) gets a prompt and a decode step at each size instead (`_decoder_steps`)."""
    has_bool = any(v.dtype == ir.DataType.BOOL for v in graph_inputs(model))
    if inputs is not None:
        given = InputSet(dict(inputs))
        flipped = {k: np.asarray(~v) if v.dtype == bool else v for k, v in inputs.items()}
        return [given, InputSet(flipped, required=False)] if has_bool else [given]
    cache = kv_cache(model, folder)
    if cache is not None and not set(shapes or {}) & {*cache.past, *cache.masks, *cache.tokens}:
        return _decoder_steps(model, cache, dict(shapes or {}), has_bool)
    rereadings = dim_rereadings(model, dict(shapes or {}))
    sets = []
    for seed, sizes in enumerate(((FIRST_SIZE,), SECOND_SIZES)):
        for flag in (True, False) if has_bool else (True,):
            candidates = [
                synthesize_inputs(
                    model, shapes, batch_size=batch, sequence_length=seq, seed=seed, bool_value=flag, overrides=overrides
                )
                for batch, seq in sizes
                for overrides in [None, *rereadings]
            ]
            sets.append(InputSet(candidates[0], candidates[1:], required=seed == 0))
    candidates = [
        synthesize_inputs(
            model, shapes, batch_size=batch, sequence_length=seq, seed=2, overrides=overrides, realistic=True
        )
        for batch, seq in REALISTIC_SIZES
        for overrides in [None, *rereadings]
    ]
    sets.append(InputSet(candidates[0], candidates[1:], required=False, kind="realistic scale"))
    return sets


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
        raise InvalidInput(f"--inputs does not match the graph inputs ({'; '.join(parts)})")
    for name, value in declared.items():
        array = inputs[name]
        if value.dtype is not None:
            try:
                expected = np.dtype(value.dtype.numpy())
            except (TypeError, ValueError, NotImplementedError):  # no numpy counterpart: let ORT judge
                expected = None
            if expected is not None and array.dtype != expected:
                raise InvalidInput(f"--inputs: '{name}' is {array.dtype}, the graph input is {expected}")
        if value.shape is not None and len(value.shape) != array.ndim:
            raise InvalidInput(f"--inputs: '{name}' has rank {array.ndim}, the graph input has rank {len(value.shape)}")


def check_input_shapes(model: ir.Model, shapes: dict[str, tuple[int, ...]]) -> None:
    """`--input-shape` must name graph inputs, each at its declared rank and at the sizes the graph
    fixes: the cost rule prices at these shapes and the check runs at them, so a dry run refuses
    what a real run would (an unknown name, a wrong rank) before any work."""
    declared = {v.name: v for v in graph_inputs(model)}
    unknown = sorted(set(shapes) - set(declared))
    if unknown:
        raise InvalidInput(
            f"--input-shape names no graph input: {', '.join(unknown)} (the graph inputs: {', '.join(declared) or 'none'})"
        )
    for name, dims in shapes.items():
        shape = declared[name].shape
        if shape is None:
            continue
        if len(shape) != len(dims):
            raise InvalidInput(
                f"--input-shape {name}:{','.join(map(str, dims))} has rank {len(dims)}, the graph input has rank "
                f"{len(shape)} ({_declared_words(shape)})"
            )
        for axis, (size, fixed) in enumerate(zip(dims, shape)):
            if isinstance(fixed, int) and size != fixed:
                raise InvalidInput(
                    f"--input-shape {name}:{','.join(map(str, dims))}: dim {axis} is {size}, the graph fixes it at "
                    f"{fixed} ({_declared_words(shape)})"
                )


def _declared_words(shape: ir.Shape) -> str:
    """`[batch, 3, 224, 224]`: a declared shape as the message shows it (`?` for an unnamed dim)."""
    return "[" + ", ".join(str(d) if isinstance(d, int) else (getattr(d, "value", None) or "?") for d in shape) + "]"


def load_inputs(path: str) -> dict[str, np.ndarray]:
    try:
        data = np.load(path, allow_pickle=False)
        if not isinstance(data, np.lib.npyio.NpzFile):
            raise ValueError("an .npy array, not an .npz archive of named arrays")
        with data:
            return {k: data[k] for k in data.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise InvalidInput(f"{path}: cannot read inputs ({e})".splitlines()[0]) from None


# (batch, new tokens, past) of the steps a KV-cache decoder is checked on: a prompt (empty past)
# and a decode step (one token over a past), at two shapes; then a prompt at realistic scale.
DECODER_STEPS = (((2, 8, 0), "prompt"), ((2, 1, 8), "decode step"), ((3, 5, 0), "prompt"), ((3, 1, 5), "decode step"))


def _decoder_steps(model: ir.Model, cache: KvCache, shapes: dict, has_bool: bool) -> list[InputSet]:
    sets = []
    for seed, ((batch, new, past), kind) in enumerate(DECODER_STEPS):
        for flag in (True, False) if has_bool else (True,):
            step = {**cache.shapes(batch, new, past), **shapes}
            feeds = synthesize_inputs(model, step, batch_size=batch, sequence_length=new, seed=seed, bool_value=flag)
            named = f"batch {batch}, {new} new token{'s' * (new > 1)}, past {past}"
            sets.append(InputSet(feeds, required=seed < 2, kind=kind, named=named))
    longest = next((n for _, n in REALISTIC_SIZES if cache.max_total is None or n <= cache.max_total), 16)
    step = {**cache.shapes(1, longest, 0), **shapes}
    feeds = synthesize_inputs(model, step, batch_size=1, sequence_length=longest, seed=len(DECODER_STEPS), realistic=True)
    sets.append(InputSet(feeds, required=False, kind="prompt, realistic scale", named=f"batch 1, {longest} new tokens, past 0"))
    return sets
