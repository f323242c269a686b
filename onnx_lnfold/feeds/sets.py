"""The input sets a fold is checked on: the user's (`given`) or synthesized from the graph
(`synthesize`).

`verification_input_sets` gives the sets `fold()` checks on: two small sizes, every bool input at
both values (the `If` of a merged decoder runs both branches), and one set at the scale real use
sees (`realistic=True`): one sequence of 64 positions (32 or 16 where the graph's tables hold
fewer), token ids spread over the whole table (every region of the vocabulary, its first and last
row included, where 16 draws touch a few rows), images as a preprocessor normalizes them (uniform
pixels, ImageNet's mean and std per channel). A set the original runs on in no reading of its
shapes is tried last at batch 1 (`RETRY_BATCH`), the report saying so: some exports declare the
batch dynamic while a Reshape bakes in batch 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx_ir as ir

from onnx_lnfold.feeds.kv_cache import KvCache, kv_cache
from onnx_lnfold.feeds.synthesize import dim_rereadings, graph_inputs, synthesize_inputs

# The two sizes verification runs at, (batch, sequence length): the second falls back to changing
# only one of the two where the graph fixes the other (a Split of the batch into fixed parts).
FIRST_SIZE = (2, 8)
SECOND_SIZES = ((3, 5), (2, 5), (3, 8))


# The realistic-scale set: one long sequence, shorter where a position table holds fewer.
REALISTIC_SIZES = ((1, 64), (1, 32), (1, 16))


# The batch a set is tried at last where the original runs at none of its readings: some exports
# declare the batch dynamic while a Reshape bakes in batch 1 (the batch being the dims synthesized
# at the batch size: a symbol first met at axis 0, an unnamed dim there; `synthesize._dim_sizes`).
RETRY_BATCH = 1


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
    at_retry_batch: list[dict[str, np.ndarray]] = field(default_factory=list)  # alternatives at `RETRY_BATCH`

    @property
    def label(self) -> str:
        return (self.named or feeds_label(self.feeds)) + (f" [{self.kind}]" if self.kind else "")

    def settle(self, feeds: dict[str, np.ndarray]) -> str:
        """Keep `feeds`, the reading the original ran on; the report's note where it is a retry at
        `RETRY_BATCH` (the check then says less about larger batches), else ""."""
        retried = any(feeds is other for other in self.at_retry_batch)
        self.feeds, self.alternatives, self.at_retry_batch = feeds, [], []
        if not retried:
            return ""
        return (
            f"checked at batch {RETRY_BATCH}: the original does not run at a larger batch, though its inputs "
            "declare the batch dynamic"
        )


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
    GroupQueryAttention KV cache (`feeds.kv_cache`; `folder` holds its genai_config.json, if
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

            def readings(tried, seed=seed, flag=flag):
                return [
                    synthesize_inputs(
                        model, shapes, batch_size=batch, sequence_length=seq, seed=seed, bool_value=flag, overrides=overrides
                    )
                    for batch, seq in tried
                    for overrides in [None, *rereadings]
                ]

            candidates, retries = readings(sizes), readings([(RETRY_BATCH, sizes[0][1])])
            if _shapes(retries[0]) == _shapes(candidates[0]):  # no dim takes the batch size
                retries = []
            sets.append(InputSet(candidates[0], candidates[1:] + retries, required=seed == 0, at_retry_batch=retries))
    candidates = [
        synthesize_inputs(
            model, shapes, batch_size=batch, sequence_length=seq, seed=2, overrides=overrides, realistic=True
        )
        for batch, seq in REALISTIC_SIZES
        for overrides in [None, *rereadings]
    ]
    sets.append(InputSet(candidates[0], candidates[1:], required=False, kind="realistic scale"))
    return sets


def _shapes(feeds: dict[str, np.ndarray]) -> dict[str, tuple[int, ...]]:
    return {name: array.shape for name, array in feeds.items()}


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
