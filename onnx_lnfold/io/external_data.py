"""External data: which tensors of a model live outside its file, which files they read, and
writing a model with every initializer in one data file beside it."""

from __future__ import annotations

import os
from pathlib import Path

import onnx_ir as ir

from onnx_lnfold.core.ir import graphs_of, release_tensor

# Writers of external data: one thread copies untouched tensors in the kernel while another
# computes and writes a centered one. The bytes are the same as a serial write's.
_WRITERS = min(2, os.cpu_count() or 1)


def _initializers(model: ir.Model):
    """Initializers of the main graph and of every If/Loop/Scan body."""
    for graph in graphs_of(model):
        yield from graph.initializers.values()


def uses_external_data(model: ir.Model) -> bool:
    """Whether any initializer, a body's included, lives in external data: the output then keeps
    its weights in external data too (a body's external tensor would otherwise point at a file
    the output's folder does not have)."""
    return any(isinstance(v.const_value, ir.ExternalTensor) for v in _initializers(model))


def release_mapped(model: ir.Model) -> None:
    """`release_tensor` for every initializer of `model`."""
    for graph in graphs_of(model):
        for value in graph.initializers.values():
            release_tensor(value.const_value)


def save_with_external_data(model: ir.Model, path: Path | str, data_name: str, callback=None) -> None:
    """`ir.save` with every initializer in `data_name` beside `path`: untouched external tensors
    are copied by the kernel, edited ones computed and written by a second thread meanwhile."""
    ir.save(model, path, external_data=data_name, callback=callback, max_workers=_WRITERS)


def external_tensors(model: ir.Model):
    """(owner name, tensor) for every external tensor of the model: initializers of every graph
    and tensor attributes (Constant nodes), subgraphs included."""
    for graph in graphs_of(model):
        for value in graph.initializers.values():
            if isinstance(value.const_value, ir.ExternalTensor):
                yield value.name, value.const_value
        for node in graph:
            for attr in node.attributes.values():
                if attr.is_ref() or attr.value is None:
                    continue
                if attr.type == ir.AttributeType.TENSOR:
                    tensors = [attr.value]
                elif attr.type == ir.AttributeType.TENSORS:
                    tensors = list(attr.value)
                else:
                    continue
                for tensor in tensors:
                    if isinstance(tensor, ir.ExternalTensor):
                        yield tensor.name or node.name, tensor


def external_data_files(model: ir.Model, base: Path | None = None) -> set[Path]:
    """The resolved paths of the external data files the model reads: each location in `base`,
    or (no `base`) where each tensor reads it now."""
    return {(base / t.location if base is not None else Path(t.path)).resolve() for _, t in external_tensors(model)}
