#!/usr/bin/env python
"""Build extra ONNX fixtures for ``onnx_lnfold``: other producers and other architectures.

``models/make/export_models.py`` makes eight transformers models, all exported by the
dynamo exporter with plain ``LayerNormalization`` nodes.  This script adds graphs
that other producers write, and two non-text architectures:

    gpt2_ort_opt0 / gpt2_ort_opt1   models/gpt2.onnx run through the ONNX Runtime
                                    transformers optimizer (model_type gpt2, opt level 0 / 1):
                                    com.microsoft::SkipLayerNormalization, FastGelu
    bert_ort_opt0 / bert_ort_opt1   models/bert.onnx through the same optimizer (model_type bert)
    bert_torchscript_ort_opt1       the same BERT weights exported by the TorchScript exporter
                                    (opset 17, eager attention) and optimized at opt level 1: the
                                    optimizer's full BERT path (EmbedLayerNormalization, Attention)
    gpt2_torchscript_opset14        the gpt2 weights exported by the TorchScript exporter at opset
                                    14: every LayerNorm decomposed into
                                    ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div/Mul/Add
    convnext_block                  ConvNextForImageClassification (hidden_sizes [32, 64], depths
                                    [1, 1], 32x32 images): channels-last LNs between permutes,
                                    layer-scale gamma; dynamo, opset 18, dynamic batch
    whisper_encoder                 WhisperModel(...).get_encoder() (d_model 64, 2 layers, 16 mel
                                    bins, 32 positions): Conv1d stem + positions, pre-LN;
                                    dynamo, opset 18, dynamic batch, static time (64 frames)

The models derived from ``gpt2`` / ``bert`` use the same weights as those files: the
torch model is rebuilt with ``export_models``' seed and perturbation, and the script
checks that it reproduces ``<source>.outputs.npz`` before writing anything.  Each
model gets ``<name>.onnx`` (one self-contained file), ``<name>.inputs.npz``,
``<name>.outputs.npz`` (torch outputs) and an entry in ``manifest.json`` (entries of
the other models are kept).  Every model is run in onnxruntime (CPU) on the reference
inputs and on a second batch size (text: also a second sequence length) and compared
with torch.

Run ``models/make/export_models.py`` first (it rewrites manifest.json with its own models
only, so run this script again after it).

Usage::

    python models/make/export_coverage_models.py [--only NAME ...] [--out-dir models]
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import json
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parent))
import export_models as em  # noqa: E402
from export_models import (  # noqa: E402
    ALT_BATCH,
    ALT_SEQ,
    HEADS,
    HIDDEN,
    REF_BATCH,
    count_op,
    describe_graph,
    finalize_onnx,
    make_inputs,
    make_wrapper,
    max_diff,
    perturb,
    run_ort,
    seed_for,
    shape_of,
    tied_info,
    torch_run,
)

OPSET_DYNAMO = em.OPSET_DYNAMO  # 18
TOL = 1e-3
MAX_BYTES = 2 * 1024 * 1024

LN_LIKE = {
    ("", "LayerNormalization"): "LayerNormalization",
    ("", "SimplifiedLayerNormalization"): "SimplifiedLayerNormalization",
    ("com.microsoft", "SkipLayerNormalization"): "com.microsoft::SkipLayerNormalization",
    ("com.microsoft", "SkipSimplifiedLayerNormalization"): "com.microsoft::SkipSimplifiedLayerNormalization",
    ("com.microsoft", "EmbedLayerNormalization"): "com.microsoft::EmbedLayerNormalization",
}


# --------------------------------------------------------------------------- #
# Graph helpers
# --------------------------------------------------------------------------- #
def _dom(node) -> str:
    return "" if node.domain in ("", "ai.onnx") else node.domain


def _opname(node) -> str:
    return f"{_dom(node)}::{node.op_type}" if _dom(node) else node.op_type


class GraphIndex:
    def __init__(self, model: onnx.ModelProto):
        g = model.graph
        self.model = model
        self.inits = {t.name: t for t in g.initializer}
        self.inputs = {i.name for i in g.input}
        self.outputs = {o.name for o in g.output}
        self.producer = {o: n for n in g.node for o in n.output if o}
        self.consumers = collections.defaultdict(list)
        for n in g.node:
            for idx, x in enumerate(n.input):
                if x:
                    self.consumers[x].append((n, idx))

    def const(self, name):
        """numpy value of an initializer or Constant output, else None."""
        if name in self.inits:
            return onnx.numpy_helper.to_array(self.inits[name])
        p = self.producer.get(name)
        if p is not None and p.op_type == "Constant":
            for a in p.attribute:
                if a.name == "value":
                    return onnx.numpy_helper.to_array(a.t)
                if a.name == "value_float":
                    return np.array(a.f, dtype=np.float32)
                if a.name == "value_floats":
                    return np.array(list(a.floats), dtype=np.float32)
                if a.name == "value_int":
                    return np.array(a.i, dtype=np.int64)
                if a.name == "value_ints":
                    return np.array(list(a.ints), dtype=np.int64)
        return None

    def describe(self, name, depth=2) -> str:
        """What produces `name`, `depth` producers deep, e.g. Add(Gather(init wte), Gather(...))."""
        if name in self.inits:
            return f"initializer {name} {list(self.inits[name].dims)}"
        if name in self.inputs:
            return f"graph input {name}"
        p = self.producer.get(name)
        if p is None:
            return f"? {name}"
        if p.op_type == "Constant":
            v = self.const(name)
            return f"Constant {v.tolist() if v is not None and v.size <= 4 else list(v.shape)}"
        if depth == 0:
            return _opname(p)
        return f"{_opname(p)}({', '.join(self.describe(x, depth - 1) for x in p.input if x)})"


def ln_like_nodes(model: onnx.ModelProto):
    return [n for n in model.graph.node if (_dom(n), n.op_type) in LN_LIKE]


def find_decomposed_ln(gi: GraphIndex) -> list[dict]:
    """LayerNorms written as ReduceMean(x) -> Sub(x, mean) -> Pow(d, 2) -> ReduceMean -> Add(eps)
    -> Sqrt -> Div(d, .) [-> Mul(gamma) -> Add(beta)]; returns one dict per match."""
    found = []
    for r1 in gi.model.graph.node:
        if r1.op_type != "ReduceMean":
            continue
        x = r1.input[0]
        subs = [n for n, i in gi.consumers[r1.output[0]]
                if n.op_type == "Sub" and i == 1 and n.input[0] == x]
        for sub in subs:
            d = sub.output[0]
            pows = [n for n, i in gi.consumers[d] if n.op_type == "Pow" and i == 0]
            divs = [n for n, i in gi.consumers[d] if n.op_type == "Div" and i == 0]
            if not pows or not divs:
                continue
            pw = pows[0]
            seq = [r1, sub, pw]
            info = {"pow_exponent": _scalar(gi.const(pw.input[1]))}
            chain = [("ReduceMean", None), ("Add", "epsilon"), ("Sqrt", None)]
            cur = pw.output[0]
            ok = True
            for op, key in chain:
                nxt = [n for n, _ in gi.consumers[cur] if n.op_type == op]
                if not nxt:
                    ok = False
                    break
                nd = nxt[0]
                seq.append(nd)
                if key:
                    other = nd.input[1] if nd.input[0] == cur else nd.input[0]
                    info[key] = _scalar(gi.const(other))
                cur = nd.output[0]
            div = next((n for n in divs if n.input[1] == cur), None)
            if not ok or div is None:
                continue
            seq.append(div)
            cur = div.output[0]
            for op, key in (("Mul", "gamma"), ("Add", "beta")):
                nxt = [n for n, _ in gi.consumers[cur] if n.op_type == op]
                if len(gi.consumers[cur]) != 1 or not nxt:
                    break
                nd = nxt[0]
                other = nd.input[1] if nd.input[0] == cur else nd.input[0]
                info[key] = gi.describe(other, 0)
                seq.append(nd)
                cur = nd.output[0]
            info["reduce_axes"] = [_axes(gi, n) for n in (seq[0], seq[3])]
            info["ops"] = [n.op_type for n in seq]
            info["nodes"] = [n.name for n in seq]
            info["input"] = x
            info["input_producer"] = gi.describe(x, 1)
            info["output"] = cur
            found.append(info)
    return found


def _scalar(v):
    if v is None:
        return None
    v = np.asarray(v)
    return v.item() if v.size == 1 else v.tolist()


def _axes(gi: GraphIndex, node):
    for a in node.attribute:
        if a.name == "axes":
            return list(a.ints)
    if len(node.input) > 1 and node.input[1]:
        return _scalar(gi.const(node.input[1]))
    return None


def ln_like_detail(gi: GraphIndex) -> list[dict]:
    """For every LN-like node: what feeds each input, which outputs are used, attributes."""
    res = []
    slots = {
        "LayerNormalization": ["X", "scale", "B"],
        "SkipLayerNormalization": ["input", "skip", "gamma", "beta", "bias"],
        "EmbedLayerNormalization": ["input_ids", "segment_ids", "word_embedding", "position_embedding",
                                    "segment_embedding", "gamma", "beta", "mask", "position_ids"],
    }
    out_slots = {
        "LayerNormalization": ["Y", "Mean", "InvStdDev"],
        "SkipLayerNormalization": ["output", "mean", "inv_std_var", "input_skip_bias_sum"],
        "EmbedLayerNormalization": ["output", "mask_index", "embedding_sum"],
    }
    for n in ln_like_nodes(gi.model):
        names = slots.get(n.op_type, [f"in{i}" for i in range(len(n.input))])
        onames = out_slots.get(n.op_type, [f"out{i}" for i in range(len(n.output))])
        ins = {}
        for i, x in enumerate(n.input):
            key = names[i] if i < len(names) else f"in{i}"
            ins[key] = None if not x else gi.describe(x, 1 if i < 2 or n.op_type == "LayerNormalization" and i == 0 else 0)
        outs = {}
        for i, y in enumerate(n.output):
            key = onames[i] if i < len(onames) else f"out{i}"
            if not y:
                outs[key] = "absent"
                continue
            users = [_opname(c) for c, _ in gi.consumers.get(y, [])]
            if y in gi.outputs:
                users.append("graph output")
            outs[key] = users or "unused"
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
        attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in attrs.items()}
        res.append({"node": n.name, "op": _opname(n), "inputs": ins, "outputs": outs, "attributes": attrs})
    return res


def ln_counts(model: onnx.ModelProto, decomposed: list[dict]) -> dict:
    c = collections.Counter(LN_LIKE[(_dom(n), n.op_type)] for n in ln_like_nodes(model))
    res = {v: c.get(v, 0) for v in LN_LIKE.values() if c.get(v, 0)}
    if decomposed:
        res["decomposed (ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div/Mul/Add)"] = len(decomposed)
    return res


def first_ln_feed(gi: GraphIndex, decomposed: list[dict]) -> str | None:
    nodes = ln_like_nodes(gi.model)
    if nodes:
        n = nodes[0]
        return f"{_opname(n)} {n.name}: input 0 = {gi.describe(n.input[0], 3)}"
    if decomposed:
        d = decomposed[0]
        return f"decomposed LN starting at {d['nodes'][0]}: x = {gi.describe(d['input'], 3)}"
    return None


# --------------------------------------------------------------------------- #
# Torch models
# --------------------------------------------------------------------------- #
@dataclass
class Source:
    """A torch model with fixed weights and the inputs/outputs it is checked on."""
    wrapper: torch.nn.Module
    spec: em.Spec
    ref_in: dict
    alt_in: dict
    config: dict


def _config_summary(model) -> dict:
    cfg = model.config
    keys = ("model_type", "hidden_size", "d_model", "hidden_sizes", "depths", "num_hidden_layers",
            "encoder_layers", "num_attention_heads", "encoder_attention_heads", "intermediate_size",
            "n_inner", "encoder_ffn_dim", "vocab_size", "n_positions", "max_position_embeddings",
            "max_source_positions", "num_mel_bins", "image_size", "patch_size", "num_channels",
            "num_labels", "layer_scale_init_value", "hidden_act", "activation_function",
            "layer_norm_eps", "layer_norm_epsilon", "tie_word_embeddings")
    res = {"architecture": type(model).__name__}
    for k in keys:
        v = getattr(cfg, k, None)
        if isinstance(v, (int, float, bool, str)) or (isinstance(v, list) and all(isinstance(i, int) for i in v)):
            res[k] = v
    if "vision" in res.get("model_type", "") or res.get("model_type") in ("convnext", "whisper"):
        res.pop("vocab_size", None)
    return res


def existing_source(name: str, models_dir: Path, attn: str | None = None) -> Source:
    """Rebuild the torch model behind models/<name>.onnx (export_models' seed and perturbation) and
    check that it reproduces <name>.outputs.npz."""
    spec = em.SPECS[name]
    manifest = json.loads((models_dir / "manifest.json").read_text())["models"]
    src_attn = manifest[name]["attn_implementation"]
    seed = seed_for(name)
    with np.load(models_dir / f"{name}.inputs.npz") as f:
        ref_in = {k: f[k] for k in f.files}
    with np.load(models_dir / f"{name}.outputs.npz") as f:
        ref_out = {k: f[k] for k in f.files}

    def build(a):
        torch.manual_seed(seed)
        m = spec.build(a).eval()
        perturb(m, seed)
        return m.eval()

    # always check against the attention the committed file was exported with
    model = build(src_attn)
    wrapper = make_wrapper(model, spec)
    got = dict(zip(ref_out, torch_run(wrapper, spec, ref_in)))
    d = max_diff(ref_out, got)
    if d > 1e-5:
        raise RuntimeError(f"rebuilt {name} does not reproduce {name}.outputs.npz (max diff {d:.3g}); "
                           f"regenerate it with export_models.py")
    if attn and attn != src_attn:
        model = build(attn)
        wrapper = make_wrapper(model, spec)
    alt_in = make_inputs(spec, ALT_BATCH, ALT_SEQ, seed + 20)
    return Source(wrapper, spec, ref_in, alt_in, _config_summary(model))


@contextlib.contextmanager
def no_packed_sequence_check():
    """transformers' mask code calls torch.diff on position_ids to detect packed sequences when no
    attention_mask is given; the TorchScript exporter has no aten::diff.  The positions here are
    always arange(seq) (one sequence per row), for which the check returns None anyway."""
    import transformers.masking_utils as mu
    orig = mu.find_packed_sequence_indices
    mu.find_packed_sequence_indices = lambda position_ids: None
    try:
        yield
    finally:
        mu.find_packed_sequence_indices = orig


def build_convnext(_attn=None):
    cfg = transformers.ConvNextConfig(
        num_channels=em.CHANNELS, patch_size=4, num_stages=2, hidden_sizes=[32, 64], depths=[1, 1],
        image_size=em.IMAGE, num_labels=em.NUM_LABELS, hidden_act="gelu",
        layer_scale_init_value=0.5, drop_path_rate=0.0)
    return transformers.ConvNextForImageClassification(cfg)


WHISPER_MEL, WHISPER_POS = 16, 32
WHISPER_FRAMES = 2 * WHISPER_POS  # conv2 has stride 2


def build_whisper_encoder(attn="sdpa"):
    cfg = transformers.WhisperConfig(
        vocab_size=em.VOCAB, num_mel_bins=WHISPER_MEL, d_model=HIDDEN, encoder_layers=em.LAYERS,
        encoder_attention_heads=HEADS, decoder_layers=em.LAYERS, decoder_attention_heads=HEADS,
        encoder_ffn_dim=em.INTER, decoder_ffn_dim=em.INTER, max_source_positions=WHISPER_POS,
        max_target_positions=em.MAX_POS, use_cache=False, attn_implementation=attn,
        pad_token_id=em.VOCAB - 1, bos_token_id=em.VOCAB - 2, eos_token_id=em.VOCAB - 1,
        decoder_start_token_id=em.VOCAB - 2)
    return transformers.WhisperModel(cfg).get_encoder()


def new_source(name: str, build: Callable, spec: em.Spec, make: Callable, attn: str) -> Source:
    seed = seed_for(name)
    torch.manual_seed(seed)
    model = build(attn).eval()
    perturb(model, seed)
    model.eval()
    ref_in = make(REF_BATCH, seed + 10)
    alt_in = make(ALT_BATCH, seed + 20)
    return Source(make_wrapper(model, spec), spec, ref_in, alt_in, _config_summary(model))


def _images(batch, seed):
    rng = np.random.default_rng(seed)
    return {"pixel_values": rng.standard_normal((batch, em.CHANNELS, em.IMAGE, em.IMAGE)).astype(np.float32)}


def _mel(batch, seed):
    rng = np.random.default_rng(seed)
    return {"input_features": rng.standard_normal((batch, WHISPER_MEL, WHISPER_FRAMES)).astype(np.float32)}


# --------------------------------------------------------------------------- #
# Producers
# --------------------------------------------------------------------------- #
def ort_optimize(src_path: Path, out_path: Path, model_type: str, opt_level: int) -> onnx.ModelProto:
    from onnxruntime.transformers import optimizer
    with contextlib.redirect_stdout(sys.stderr):
        opt = optimizer.optimize_model(str(src_path), model_type=model_type, num_heads=HEADS,
                                       hidden_size=HIDDEN, opt_level=opt_level, use_gpu=False)
    opt.save_model_to_file(str(out_path), use_external_data_format=False)
    for stray in out_path.parent.glob(out_path.name + "*.data"):
        stray.unlink()
    m = onnx.load(str(out_path))
    onnx.checker.check_model(m)  # contrib ops are not checked; full_check would reject them
    return m


def torchscript_export(src: Source, path: Path, opset: int) -> onnx.ModelProto:
    spec = src.spec
    args = tuple(torch.from_numpy(src.ref_in[n]) for n in spec.input_names)
    with warnings.catch_warnings(), no_packed_sequence_check():
        warnings.simplefilter("ignore")
        torch.onnx.export(src.wrapper, args, str(path), dynamo=False, opset_version=opset,
                          input_names=spec.input_names, output_names=spec.outputs,
                          dynamic_axes=em.dynamic_axes_for(spec, spec.outputs), do_constant_folding=True)
    return finalize_onnx(path)


def dynamo_export(src: Source, path: Path) -> onnx.ModelProto:
    spec = src.spec
    args = tuple(torch.from_numpy(src.ref_in[n]) for n in spec.input_names)
    batch = torch.export.Dim("batch", min=1, max=1024)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(src.wrapper, args, str(path), dynamo=True, opset_version=OPSET_DYNAMO,
                          input_names=spec.input_names, output_names=spec.outputs,
                          dynamic_shapes=tuple({0: batch} for _ in spec.input_names),
                          external_data=False, optimize=True, verbose=False)
    return finalize_onnx(path)


# --------------------------------------------------------------------------- #
# Checks and manifest entries
# --------------------------------------------------------------------------- #
def check_and_describe(name: str, m: onnx.ModelProto, path: Path, src: Source, producer: dict,
                       note: str, out_dir: Path) -> dict:
    spec = src.spec
    ref_t = dict(zip(spec.outputs, torch_run(src.wrapper, spec, src.ref_in)))
    alt_t = dict(zip(spec.outputs, torch_run(src.wrapper, spec, src.alt_in)))
    ref_o = run_ort(path, src.ref_in)
    alt_o = run_ort(path, src.alt_in)
    d_ref, d_alt = max_diff(ref_t, ref_o), max_diff(alt_t, alt_o)
    shapes_ok = all(alt_o[k].shape == alt_t[k].shape for k in alt_t)
    if not (d_ref < TOL and d_alt < TOL and shapes_ok):
        raise RuntimeError(f"{name}: ORT mismatch: ref {d_ref:.3g} alt {d_alt:.3g} shapes_ok={shapes_ok}")
    size = path.stat().st_size
    if size >= MAX_BYTES:
        raise RuntimeError(f"{name}: {size} bytes, over the 2 MB limit")

    np.savez(out_dir / f"{name}.inputs.npz", **src.ref_in)
    np.savez(out_dir / f"{name}.outputs.npz", **ref_t)

    gi = GraphIndex(m)
    decomposed = find_decomposed_ln(gi)
    init_names = set(gi.inits)

    def key(feeds):
        a = next(iter(feeds.values()))
        return f"batch{a.shape[0]}_seq{a.shape[1]}" if a.dtype == np.int64 else f"batch{a.shape[0]}"

    ops = collections.Counter(_opname(n) for n in m.graph.node)
    desc = describe_graph(m)
    desc["op_counts"] = dict(sorted(ops.items()))
    desc.pop("first_layernorm_input_producer", None)
    entry = {
        "file": path.name,
        "inputs_file": f"{name}.inputs.npz",
        "outputs_file": f"{name}.outputs.npz",
        "generator": "models/make/export_coverage_models.py",
        "note": note,
        "producer": producer,
        "exporter": producer.get("exporter"),
        "opset": next(o.version for o in m.opset_import if o.domain in ("", "ai.onnx")),
        "opset_imports": {(o.domain or "ai.onnx"): o.version for o in m.opset_import},
        "ir_version": m.ir_version,
        "config": src.config,
        "inputs": [{"name": i.name, "shape": shape_of(i),
                    "dtype": onnx.helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type).name,
                    "reference_shape": list(src.ref_in[i.name].shape)}
                   for i in m.graph.input if i.name not in init_names],
        "outputs": [o.name for o in m.graph.output],
        "output_shapes": {o.name: shape_of(o) for o in m.graph.output},
        "layernorm_count": count_op(m, "LayerNormalization")["main_graph"],
        "ln_like_counts": ln_counts(m, decomposed),
        "first_ln_input": first_ln_feed(gi, decomposed),
        "file_size_bytes": size,
        "tied_lm_head": tied_info(m)["tied"],
        "tied_detail": tied_info(m),
        "ort_max_abs_diff": {key(src.ref_in): d_ref, key(src.alt_in): d_alt},
        "ln_like_nodes": ln_like_detail(gi),
        "graph": desc,
    }
    if decomposed:
        entry["decomposed_layernorms"] = decomposed
    return entry


@dataclass
class Job:
    name: str
    run: Callable[[Path, Path], dict]  # (models_dir, out_dir) -> manifest entry


def _ort_job(name, source, model_type, level):
    def run(models_dir, out_dir):
        src = existing_source(source, models_dir)
        path = out_dir / f"{name}.onnx"
        m = ort_optimize(models_dir / f"{source}.onnx", path, model_type, level)
        producer = {"exporter": f"ORT transformers optimizer on models/{source}.onnx "
                                f"({json.loads((models_dir / 'manifest.json').read_text())['models'][source]['exporter']})",
                    "optimizer": "onnxruntime.transformers.optimizer.optimize_model",
                    "model_type": model_type, "opt_level": level, "num_heads": HEADS,
                    "hidden_size": HIDDEN, "use_gpu": False, "source": f"{source}.onnx"}
        note = (f"models/{source}.onnx optimized by the ORT transformers optimizer "
                f"(model_type={model_type}, opt_level={level}); same weights and reference inputs as {source}")
        return check_and_describe(name, m, path, src, producer, note, out_dir)
    return Job(name, run)


def _bert_ts_ort(models_dir, out_dir):
    name = "bert_torchscript_ort_opt1"
    src = existing_source("bert", models_dir, attn="eager")
    path = out_dir / f"{name}.onnx"
    tmp = out_dir / f".{name}.torchscript.onnx"
    try:
        torchscript_export(src, tmp, 17)
        m = ort_optimize(tmp, path, "bert", 1)
    finally:
        for p in out_dir.glob(tmp.name + "*"):
            p.unlink()
    producer = {"exporter": "torchscript (dynamo=False, opset 17, eager attention), then ORT transformers optimizer",
                "optimizer": "onnxruntime.transformers.optimizer.optimize_model", "model_type": "bert",
                "opt_level": 1, "num_heads": HEADS, "hidden_size": HIDDEN, "use_gpu": False,
                "attn_implementation": "eager"}
    note = ("BertModel with the weights of models/bert.onnx, exported by the TorchScript exporter and "
            "optimized at opt_level 1: EmbedLayerNormalization + Attention + SkipLayerNormalization")
    return check_and_describe(name, m, path, src, producer, note, out_dir)


def _gpt2_ts(models_dir, out_dir):
    name = "gpt2_torchscript_opset14"
    src = existing_source("gpt2", models_dir, attn="eager")
    path = out_dir / f"{name}.onnx"
    m = torchscript_export(src, path, 14)
    producer = {"exporter": "torchscript (dynamo=False, opset 14, do_constant_folding=True)",
                "attn_implementation": "eager",
                "workaround": "transformers.masking_utils.find_packed_sequence_indices patched to return None "
                              "during export (it calls torch.diff, which has no TorchScript ONNX symbolic; "
                              "positions are arange(seq), for which it returns None anyway)"}
    note = ("GPT2LMHeadModel with the weights of models/gpt2.onnx, TorchScript exporter at opset 14: every "
            "LayerNorm decomposed; the LM head reads the embedding table through a constant-folded copy")
    return check_and_describe(name, m, path, src, producer, note, out_dir)


CONVNEXT_SPEC = em.Spec("convnext_block", build_convnext, "vision", ["pixel_values"], ["logits"])
WHISPER_SPEC = em.Spec("whisper_encoder", build_whisper_encoder, "audio", ["input_features"],
                       ["last_hidden_state"])


def _dynamo_job(name, spec, make, note, attn="sdpa"):
    def run(models_dir, out_dir):
        src = new_source(name, spec.build, spec, make, attn)
        path = out_dir / f"{name}.onnx"
        m = dynamo_export(src, path)
        producer = {"exporter": "dynamo", "opset": OPSET_DYNAMO, "attn_implementation": attn,
                    "dynamic_dims": {n: {0: "batch"} for n in spec.input_names}}
        return check_and_describe(name, m, path, src, producer, note, out_dir)
    return Job(name, run)


JOBS: dict[str, Job] = {j.name: j for j in [
    _ort_job("gpt2_ort_opt0", "gpt2", "gpt2", 0),
    _ort_job("gpt2_ort_opt1", "gpt2", "gpt2", 1),
    _ort_job("bert_ort_opt0", "bert", "bert", 0),
    _ort_job("bert_ort_opt1", "bert", "bert", 1),
    Job("bert_torchscript_ort_opt1", _bert_ts_ort),
    Job("gpt2_torchscript_opset14", _gpt2_ts),
    _dynamo_job("convnext_block", CONVNEXT_SPEC, _images,
                "ConvNextForImageClassification (hidden_sizes [32,64], depths [1,1], 32x32x3, 10 labels, "
                "layer_scale_init_value 0.5): stem Conv4x4/4 + channels-first LN, blocks dwconv7x7 -> "
                "permute -> LN -> Linear -> GELU -> Linear -> gamma -> permute -> residual, downsample "
                "LN + Conv2x2/2, mean pool + LN + classifier"),
    _dynamo_job("whisper_encoder", WHISPER_SPEC, _mel,
                "WhisperModel(config).get_encoder() (d_model 64, 2 layers, 4 heads, 16 mel bins, 32 "
                "positions): Conv1d -> GELU -> Conv1d/2 -> GELU -> permute + positions -> pre-LN blocks "
                "-> final LN; input [batch, 16, 64], time static"),
]}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="+", choices=sorted(JOBS), help="export only these models")
    ap.add_argument("--models-dir", default=str(Path(__file__).resolve().parents[1]),
                    help="where gpt2/bert (from export_models.py) and manifest.json are read")
    ap.add_argument("--out-dir", default=None, help="where to write (default: --models-dir)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    models_dir = Path(args.models_dir)
    out_dir = Path(args.out_dir) if args.out_dir else models_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    src_manifest = models_dir / "manifest.json"
    manifest_path = out_dir / "manifest.json"
    doc = json.loads((manifest_path if manifest_path.exists() else src_manifest).read_text())
    models = doc.setdefault("models", {})

    for name in args.only or list(JOBS):
        print(f"== {name}", flush=True)
        e = JOBS[name].run(models_dir, out_dir)
        models[name] = e
        d = ", ".join(f"{k}={v:.2e}" for k, v in e["ort_max_abs_diff"].items())
        print(f"  size={e['file_size_bytes']} LN-like={e['ln_like_counts']} tied={e['tied_lm_head']}\n"
              f"  first LN: {e['first_ln_input']}\n  ORT vs torch max abs diff: {d}", flush=True)

    # existing models first (export_models.py order), then ours in JOBS order
    ordered = {k: v for k, v in models.items() if k not in JOBS}
    ordered.update({k: models[k] for k in JOBS if k in models})
    doc["models"] = ordered
    doc["coverage_generator"] = "models/make/export_coverage_models.py"
    doc["coverage_total_onnx_bytes"] = sum(models[k]["file_size_bytes"] for k in JOBS if k in models)
    manifest_path.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {manifest_path}")


if __name__ == "__main__":
    main()
