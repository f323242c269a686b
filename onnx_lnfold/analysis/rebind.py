"""A plan made on a model, bound to a structural copy of it (`BoundPlan.on_clone`).

The fusion check applies the plan to a weightless clone of the model (`ort_fusions.fusion_cost`).
Binding the plan already made to the clone's IR objects, instead of analysing the clone again,
keeps the decisions identical by construction and costs a walk of the graph rather than a second
analysis. The copy must have the original's structure: the same graphs, bodies and functions, with
their nodes in the same order (`onnx_ir.Model.clone`, `ort_fusions.weightless.clone_model`).
"""

from __future__ import annotations

import copy
import dataclasses
import enum
from typing import TYPE_CHECKING

import numpy as np
import onnx_ir as ir

from onnx_lnfold.forms.base import LnForm

if TYPE_CHECKING:
    from onnx_lnfold.analysis.bound import BoundPlan

IrObject = ir.Node | ir.Value

# What a plan holds that is not bound to a model: carried over as it is.
_UNBOUND = (str, bytes, int, float, bool, type(None), enum.Enum, np.ndarray, np.generic, ir.TensorProtocol)
_UNBOUND += (ir.SymbolicDim,)  # a dim of a new tensor's declared shape (a name, held by value)


def counterparts(original: ir.Model, clone: ir.Model) -> dict[IrObject, IrObject]:
    """Each node and value of `original` (every graph, body and function) -> its counterpart in
    `clone`. Raises `ValueError` where the two differ in structure."""
    pairs: dict[IrObject, IrObject] = {}
    _pair_graphs(original.graph, clone.graph, pairs)
    if original.functions.keys() != clone.functions.keys():
        raise ValueError("the copy has other functions than the model")
    for key, function in original.functions.items():
        _pair_graphs(function, clone.functions[key], pairs)
    pairs.pop(None, None)  # type: ignore[call-overload]
    return pairs


def _pair_graphs(
    original: ir.Graph | ir.Function, clone: ir.Graph | ir.Function, pairs: dict[IrObject, IrObject]
) -> None:
    if len(original) != len(clone) or len(original.inputs) != len(clone.inputs):
        raise ValueError(f"graph '{original.name}' differs from its copy")
    pairs.update(zip(original.inputs, clone.inputs))
    if isinstance(original, ir.Graph) and isinstance(clone, ir.Graph):
        for name, value in original.initializers.items():
            pairs[value] = clone.initializers[name]
    for node, twin in zip(original, clone):
        if node.op_type != twin.op_type or len(node.inputs) != len(twin.inputs):
            raise ValueError(f"node '{node.name}' differs from its copy")
        pairs[node] = twin
        pairs.update(zip(node.inputs, twin.inputs))  # a missing input pairs None: dropped by `counterparts`
        pairs.update(zip(node.outputs, twin.outputs))
        for key, attr in node.attributes.items() if node.attributes else ():
            if attr.is_ref() or attr.type not in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS):
                continue
            other = twin.attributes[key]
            bodies = [attr.value] if attr.type == ir.AttributeType.GRAPH else list(attr.value)
            copies = [other.value] if other.type == ir.AttributeType.GRAPH else list(other.value)
            if len(bodies) != len(copies):
                raise ValueError(f"node '{node.name}' differs from its copy")
            for body, body_copy in zip(bodies, copies):
                _pair_graphs(body, body_copy, pairs)
    pairs.update((value, other) for value, other in zip(original.outputs, clone.outputs))


def rebound(bound: BoundPlan, pairs: dict[IrObject, IrObject]) -> BoundPlan:
    """`bound` with every IR object it holds replaced by its counterpart in `pairs`; every record
    copied, shared records shared in the copy as in `bound`. Raises `KeyError` for an IR object
    without a counterpart and `TypeError` for a kind of object a plan is not made of."""
    return _rebound(bound, pairs, {})


def _rebound(obj: object, pairs: dict[IrObject, IrObject], memo: dict[int, object]) -> object:
    if isinstance(obj, (ir.Node, ir.Value)):
        return pairs[obj]
    if isinstance(obj, _UNBOUND):
        return obj
    done = memo.get(id(obj))
    if done is not None:
        return done
    if isinstance(obj, ir.Attr):
        if obj.is_ref() or obj.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS):
            raise TypeError(f"a plan's attribute '{obj.name}' holds a graph")
        result: object = obj  # a scalar or a list of them: nothing bound
    elif type(obj) in (tuple, list, set, frozenset):
        result = type(obj)(_rebound(item, pairs, memo) for item in obj)  # type: ignore[call-arg, attr-defined]
    elif type(obj) is dict:
        result = {_rebound(k, pairs, memo): _rebound(v, pairs, memo) for k, v in obj.items()}  # type: ignore[attr-defined]
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        result = copy.copy(obj)
        memo[id(obj)] = result  # before its fields: a record may reach itself
        for name, value in vars(obj).items():  # fields and cached properties alike
            object.__setattr__(result, name, _rebound(value, pairs, memo))
    elif isinstance(obj, LnForm) and not vars(obj):
        result = obj  # a form is its class: it holds nothing of a model
    else:
        raise TypeError(f"a plan holds a {type(obj).__name__}, which cannot be bound to a copy")
    memo[id(obj)] = result
    return result


__all__ = ["counterparts", "rebound"]
