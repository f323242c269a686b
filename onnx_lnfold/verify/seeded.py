"""The check's copies of a model that draws random numbers, each random op seeded.

A random op without a `seed` attribute draws what ONNX Runtime's generator for that session gives
(`core/framework/random_seed.cc`): two sessions of two graphs draw differently (a VITS voice's
noise, hence its durations and output length, differ from one model to the other), and the fold
could not be told from the draw. The check runs both models with every such op given the same
seed, taken from its output's name, which the fold never changes: the two then draw the same
numbers, and what differs is the fold's. `onnx.reference` draws otherwise than ONNX Runtime
whatever the seed, so the float64 twin declines such a model (`verify.oracle.reference`).
"""

from __future__ import annotations

import zlib
from collections import Counter
from pathlib import Path

import onnx
import onnx_ir as ir

from onnx_lnfold.core.ir import STANDARD_DOMAINS, graphs_of
from onnx_lnfold.io.proto_graphs import graphs_within, nodes_within

# The standard ops that draw random numbers, each with an optional `seed` attribute.
RANDOM_OPS = frozenset(
    {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial", "Bernoulli"}
)


def _unseeded(op_type: str, domain: str, attributes) -> bool:
    """A standard random op without a seed (`attributes`: its attribute names)."""
    return op_type in RANDOM_OPS and domain in STANDARD_DOMAINS and "seed" not in attributes


def unseeded_random_ops(model: ir.Model) -> Counter[str]:
    """The random ops of `model` (bodies and functions included) without a seed, by op type: read
    from the model in memory, so that a model without any is never parsed again for them."""
    graphs = [*graphs_of(model), *model.functions.values()]
    return Counter(
        node.op_type for graph in graphs for node in graph if _unseeded(node.op_type, node.domain, node.attributes)
    )


def seeded(model: bytes | str | Path) -> tuple[bytes | str | Path, str]:
    """`model` (one with random ops without a seed: `unseeded_random_ops`) as the check runs it in
    ONNX Runtime, with a note: a copy with each such op seeded from its first output's name (the
    note says how many), or, for a model whose weights are in external data (its copy would need
    them beside it), unchanged, and the note says the draws differ."""
    proto = (
        onnx.load_from_string(model) if isinstance(model, bytes) else onnx.load(str(model), load_external_data=False)
    )
    every = [*nodes_within(proto.graph), *(node for function in proto.functions for node in function.node)]
    nodes = [node for node in every if _unseeded(node.op_type, node.domain, {a.name for a in node.attribute})]
    if not nodes:
        return model, ""
    counted = ", ".join(f"{n} {op}" for op, n in sorted(Counter(node.op_type for node in nodes).items()))
    if any(t.data_location == onnx.TensorProto.EXTERNAL for g in graphs_within(proto.graph) for t in g.initializer):
        return model, (
            f"the model draws random numbers ({counted} without a seed) and its weights are in external data, so "
            "the check runs it as it is: each model's session draws its own numbers"
        )
    for node in nodes:
        seed = float(zlib.crc32((node.output[0] if node.output else node.name).encode()) % (1 << 24))
        node.attribute.append(onnx.helper.make_attribute("seed", seed))
    return (
        proto.SerializeToString(),
        f"the model draws random numbers ({counted} without a seed): both models ran with each seeded alike",
    )


__all__ = ["RANDOM_OPS", "seeded", "unseeded_random_ops"]
