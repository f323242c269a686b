#!/usr/bin/env python
"""Build small randomly initialised transformers models and export them to ONNX.

The models are test fixtures for ``onnx_lnfold`` (LayerNorm -> RMSNorm folding).
Every model is built from a config (no hub access), every floating parameter and
buffer is perturbed away from its init (so no two initializers are identical and
no bias is zero), and the model is exported with ``torch.onnx.export(dynamo=True,
opset_version=18)`` with dynamic batch / sequence dims.  The result is one
self-contained ``.onnx`` file per model with all local functions inlined, plus
``<name>.inputs.npz`` / ``<name>.outputs.npz`` (reference inputs and torch
outputs, keyed by ONNX input / output names) and ``manifest.json``.

Usage::

    python models/make/export_models.py [--only NAME ...] [--out-dir models]
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import traceback
import warnings
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
import onnx.inliner
import onnxruntime as ort
import torch
import transformers

HIDDEN = 64
LAYERS = 2
HEADS = 4
VOCAB = 512
MAX_POS = 128
INTER = 4 * HIDDEN
IMAGE = 32
PATCH = 8
CHANNELS = 3
NUM_LABELS = 10

REF_BATCH, REF_SEQ = 2, 8
ALT_BATCH, ALT_SEQ = 3, 5  # second check: different batch and sequence length

OPSET_DYNAMO = 18
OPSET_TORCHSCRIPT = 17


# --------------------------------------------------------------------------- #
# Model definitions
# --------------------------------------------------------------------------- #
@dataclass
class Spec:
    name: str
    build: Callable[[str], torch.nn.Module]  # attn_implementation -> model
    kind: str  # "text" or "vision"
    input_names: list[str]
    # names for the flattened outputs; "hidden_states" expands to hidden_states_0..N
    outputs: list[str]
    note: str = ""
    extra: dict = field(default_factory=dict)


def _gpt2_config(**kw):
    return transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=MAX_POS, n_embd=HIDDEN, n_layer=LAYERS,
        n_head=HEADS, n_inner=INTER, use_cache=False,
        bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1, **kw)


def build_gpt2(attn):
    return transformers.GPT2LMHeadModel(_gpt2_config(attn_implementation=attn))


def build_bert(attn):
    cfg = transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, intermediate_size=INTER,
        max_position_embeddings=MAX_POS, attn_implementation=attn)
    return transformers.BertModel(cfg)


def _opt(pre_ln: bool, attn):
    cfg = transformers.OPTConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, ffn_dim=INTER, max_position_embeddings=MAX_POS,
        word_embed_proj_dim=HIDDEN, do_layer_norm_before=pre_ln, use_cache=False,
        attn_implementation=attn)
    return transformers.OPTForCausalLM(cfg)


def build_gpt_neox(attn):
    cfg = transformers.GPTNeoXConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, intermediate_size=INTER,
        max_position_embeddings=MAX_POS, use_cache=False, attn_implementation=attn)
    return transformers.GPTNeoXForCausalLM(cfg)


def build_bloom(attn):
    cfg = transformers.BloomConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, n_layer=LAYERS, n_head=HEADS,
        use_cache=False, attn_implementation=attn)
    return transformers.BloomForCausalLM(cfg)


def build_vit(attn):
    cfg = transformers.ViTConfig(
        image_size=IMAGE, patch_size=PATCH, num_channels=CHANNELS,
        hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
        intermediate_size=INTER, num_labels=NUM_LABELS, attn_implementation=attn)
    return transformers.ViTForImageClassification(cfg)


TEXT_IN = ["input_ids", "attention_mask"]

SPECS: dict[str, Spec] = {s.name: s for s in [
    Spec("gpt2", build_gpt2, "text", ["input_ids"], ["logits"],
         note="GPT2LMHeadModel, tied LM head, pre-LN"),
    Spec("gpt2_hidden_states", build_gpt2, "text", ["input_ids"],
         ["logits", "hidden_states"],
         note="GPT2LMHeadModel with output_hidden_states=True (residual stream is a graph output)"),
    Spec("bert", build_bert, "text", TEXT_IN, ["last_hidden_state", "pooler_output"],
         note="BertModel, post-LN"),
    Spec("opt_pre_ln", lambda a: _opt(True, a), "text", TEXT_IN, ["logits"],
         note="OPTForCausalLM do_layer_norm_before=True"),
    Spec("opt_post_ln", lambda a: _opt(False, a), "text", TEXT_IN, ["logits"],
         note="OPTForCausalLM do_layer_norm_before=False (post-LN, no final LN)"),
    Spec("gpt_neox", build_gpt_neox, "text", TEXT_IN, ["logits"],
         note="GPTNeoXForCausalLM, parallel residual, untied LM head"),
    Spec("bloom", build_bloom, "text", TEXT_IN, ["logits"],
         note="BloomForCausalLM, LN directly after the embedding"),
    Spec("vit", build_vit, "vision", ["pixel_values"], ["logits"],
         note="ViTForImageClassification, num_labels=10"),
]}


class Wrapper(torch.nn.Module):
    """Calls the HF model with keyword inputs and returns a flat tuple of tensors."""

    def __init__(self, model, input_names, outputs):
        super().__init__()
        self.model = model
        self.input_names = list(input_names)
        self.outputs = list(outputs)

    def _run(self, args):
        kw = dict(zip(self.input_names, args))
        want_hs = "hidden_states" in self.outputs
        if "input_ids" in kw:
            kw["use_cache"] = False
        out = self.model(**kw, return_dict=True, output_hidden_states=want_hs)
        res = []
        for o in self.outputs:
            if o == "hidden_states":
                res.extend(out.hidden_states)
            else:
                res.append(out[o])
        return tuple(res)


# torch.export matches dynamic_shapes to forward() parameters by position; a
# *args signature would be seen as one tuple input, hence explicit arities.
class Wrapper1(Wrapper):
    def forward(self, x0):
        return self._run((x0,))


class Wrapper2(Wrapper):
    def forward(self, x0, x1):
        return self._run((x0, x1))


def make_wrapper(model, spec):
    cls = {1: Wrapper1, 2: Wrapper2}[len(spec.input_names)]
    return cls(model, spec.input_names, spec.outputs).eval()


def output_names_for(spec: Spec, n_outputs: int) -> list[str]:
    names = []
    for o in spec.outputs:
        if o == "hidden_states":
            n_hs = n_outputs - (len(spec.outputs) - 1)
            names.extend(f"hidden_states_{i}" for i in range(n_hs))
        else:
            names.append(o)
    return names


# --------------------------------------------------------------------------- #
# Perturbation
# --------------------------------------------------------------------------- #
def seed_for(name: str) -> int:
    return zlib.crc32(name.encode()) & 0x7FFFFFFF


@torch.no_grad()
def perturb(model: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed + 1)

    def rn(t):
        return torch.randn(t.shape, generator=g, dtype=torch.float32).to(t.dtype)

    ln_params = set()
    for m in model.modules():
        if isinstance(m, torch.nn.LayerNorm):
            if m.weight is not None:
                m.weight.copy_(1.0 + 0.1 * rn(m.weight))
                ln_params.add(id(m.weight))
            if m.bias is not None:
                m.bias.copy_(0.05 * rn(m.bias))
                ln_params.add(id(m.bias))
    # named_parameters() de-duplicates tied weights, so a tied embedding/LM head
    # is perturbed once and stays tied.
    for n, p in model.named_parameters():
        if id(p) in ln_params or not p.is_floating_point():
            continue
        if n.endswith("bias"):
            p.add_(0.05 * rn(p))
        else:
            p.add_(0.02 * rn(p))
    for n, b in model.named_buffers():
        if b.is_floating_point():
            # relative noise: keeps e.g. rotary inv_freq / mask constants sane
            b.mul_(1.0 + 0.01 * rn(b)).add_(1e-3 * rn(b))


# --------------------------------------------------------------------------- #
# Inputs
# --------------------------------------------------------------------------- #
def make_inputs(spec: Spec, batch: int, seq: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    if spec.kind == "vision":
        return {"pixel_values": rng.standard_normal((batch, CHANNELS, IMAGE, IMAGE)).astype(np.float32)}
    res = {"input_ids": rng.integers(0, VOCAB, size=(batch, seq), dtype=np.int64)}
    if "attention_mask" in spec.input_names:
        res["attention_mask"] = np.ones((batch, seq), dtype=np.int64)
    return res


def dynamic_shapes_for(spec: Spec):
    # Matched to forward(*args) by POSITION.
    batch = torch.export.Dim("batch", min=1, max=1024)
    if spec.kind == "vision":
        return ({0: batch},)
    seq = torch.export.Dim("seq", min=1, max=MAX_POS)
    return tuple({0: batch, 1: seq} for _ in spec.input_names)


def dynamic_axes_for(spec: Spec, out_names):
    axes = {}
    for n in spec.input_names:
        axes[n] = {0: "batch"} if spec.kind == "vision" else {0: "batch", 1: "seq"}
    for n in out_names:
        axes[n] = {0: "batch"} if spec.kind == "vision" or n == "pooler_output" else {0: "batch", 1: "seq"}
    return axes


# --------------------------------------------------------------------------- #
# Graph analysis
# --------------------------------------------------------------------------- #
def count_op(model: onnx.ModelProto, op: str) -> dict:
    def walk(graph):
        n = 0
        for node in graph.node:
            if node.op_type == op and node.domain in ("", "ai.onnx"):
                n += 1
            for a in node.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    n += walk(a.g)
                elif a.type == onnx.AttributeProto.GRAPHS:
                    n += sum(walk(g) for g in a.graphs)
        return n

    fn = sum(1 for f in model.functions for nd in f.node if nd.op_type == op)
    return {"main_graph": walk(model.graph), "functions": fn}


def tied_info(model: onnx.ModelProto) -> dict:
    """Is one initializer consumed by a Gather (data input) and by a MatMul/Gemm
    (directly or through a Transpose)?"""
    g = model.graph
    inits = {i.name: i for i in g.initializer}
    consumers = collections.defaultdict(list)
    for nd in g.node:
        for idx, x in enumerate(nd.input):
            consumers[x].append((nd, idx))

    def feeds_matmul(name, depth=0):
        for nd, _ in consumers.get(name, []):
            if nd.op_type in ("MatMul", "Gemm"):
                return [nd.op_type]
            if nd.op_type == "Transpose" and depth == 0:
                for o in nd.output:
                    r = feeds_matmul(o, 1)
                    if r:
                        return ["Transpose"] + r
        return None

    for name in inits:
        gathers = [nd for nd, idx in consumers.get(name, []) if nd.op_type == "Gather" and idx == 0]
        path = feeds_matmul(name)
        if gathers and path:
            shape = list(inits[name].dims)
            return {"tied": True, "initializer": name, "shape": shape, "matmul_path": "->".join(path)}
    return {"tied": False}


def describe_graph(model: onnx.ModelProto) -> dict:
    g = model.graph
    ops = collections.Counter(n.op_type for n in g.node)
    init_names = {i.name for i in g.initializer}
    producers = {o: n for n in g.node for o in n.output}
    first_ln = next((n for n in g.node if n.op_type == "LayerNormalization"), None)
    first_ln_feed = None
    if first_ln is not None:
        x = first_ln.input[0]
        p = producers.get(x)
        first_ln_feed = f"{p.op_type}({x})" if p else f"graph input/initializer {x}"
    # Linear layers: Gemm (original weight name; transB=1 for nn.Linear, 0 for
    # GPT-2 Conv1D) vs MatMul on an initializer (for 3-D nn.Linear inputs the
    # optimizer constant-folds Transpose(W) into a new initializer "val_N").
    mm_init = [n.input[1] for n in g.node if n.op_type == "MatMul" and n.input[1] in init_names]
    linear = {
        "gemm": ops.get("Gemm", 0),
        "matmul_with_initializer_weight": len(mm_init),
        "matmul_weight_initializers_renamed": sum(1 for x in mm_init if x.startswith("val_")),
    }
    return {
        "linear_layers": linear,
        "op_counts": dict(sorted(ops.items())),
        "n_initializers": len(g.initializer),
        "initializers_as_inputs": sorted(i.name for i in g.input if i.name in init_names),
        "n_functions": len(model.functions),
        "first_layernorm_input_producer": first_ln_feed,
    }


def shape_of(vi: onnx.ValueInfoProto):
    dims = []
    for d in vi.type.tensor_type.shape.dim:
        dims.append(d.dim_param if d.HasField("dim_param") else d.dim_value)
    return dims


# --------------------------------------------------------------------------- #
# Export
# --------------------------------------------------------------------------- #
def load_inlined(path: Path) -> onnx.ModelProto:
    """Load (with external data) and inline local functions."""
    m = onnx.load(str(path), load_external_data=True)
    if len(m.functions):
        m = onnx.inliner.inline_local_functions(m)
        # drop any functions that are no longer referenced
        used = {(n.domain, n.op_type) for n in m.graph.node}
        keep = [f for f in m.functions if (f.domain, f.name) in used]
        del m.functions[:]
        m.functions.extend(keep)
    return m


def finalize_onnx(path: Path) -> onnx.ModelProto:
    """Load (with external data), inline local functions, save as one file."""
    m = load_inlined(path)
    for t in m.graph.initializer:  # make sure nothing points to external data
        if t.data_location == onnx.TensorProto.EXTERNAL:
            raise RuntimeError(f"initializer {t.name} still external")
    for stray in path.parent.glob(path.name + "*.data"):
        stray.unlink()
    for stray in [path.with_suffix(".onnx.data"), Path(str(path) + ".data")]:
        if stray.exists():
            stray.unlink()
    onnx.save(m, str(path), save_as_external_data=False)
    onnx.checker.check_model(m, full_check=True)
    return m


def try_export(spec, wrapper, args, path, out_names, dynamo: bool):
    if dynamo:
        prog = torch.onnx.export(
            wrapper, args, str(path), dynamo=True, opset_version=OPSET_DYNAMO,
            input_names=spec.input_names, output_names=out_names,
            dynamic_shapes=dynamic_shapes_for(spec), external_data=False,
            optimize=True, verbose=False)
        del prog
    else:
        torch.onnx.export(
            wrapper, args, str(path), dynamo=False, opset_version=OPSET_TORCHSCRIPT,
            input_names=spec.input_names, output_names=out_names,
            dynamic_axes=dynamic_axes_for(spec, out_names), do_constant_folding=True)
    return finalize_onnx(path)


def run_ort(path: Path, feeds: dict[str, np.ndarray]):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, feeds)))


def torch_run(wrapper, spec, feeds):
    with torch.no_grad():
        outs = wrapper(*[torch.from_numpy(feeds[n]) for n in spec.input_names])
    return [o.detach().numpy() for o in outs]


def max_diff(a: dict, b: dict) -> float:
    return float(max(np.abs(a[k].astype(np.float64) - b[k].astype(np.float64)).max() for k in a))


def export_one(spec: Spec, out_dir: Path, tol: float = 1e-3) -> dict:
    seed = seed_for(spec.name)
    onnx_path = out_dir / f"{spec.name}.onnx"
    ref_in = make_inputs(spec, REF_BATCH, REF_SEQ, seed + 10)
    alt_in = make_inputs(spec, ALT_BATCH, ALT_SEQ, seed + 20)

    attempts = [("dynamo", "sdpa"), ("dynamo", "eager"), ("torchscript", "eager")]
    errors = []
    for exporter, attn in attempts:
        try:
            torch.manual_seed(seed)
            model = spec.build(attn).eval()
            perturb(model, seed)
            model.eval()
            wrapper = make_wrapper(model, spec)
            torch_ref = torch_run(wrapper, spec, ref_in)
            out_names = output_names_for(spec, len(torch_ref))
            args = tuple(torch.from_numpy(ref_in[n]) for n in spec.input_names)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                m = try_export(spec, wrapper, args, onnx_path, out_names, exporter == "dynamo")
            ort_ref = run_ort(onnx_path, ref_in)
            torch_ref_d = dict(zip(out_names, torch_ref))
            d_ref = max_diff(torch_ref_d, ort_ref)
            torch_alt_d = dict(zip(out_names, torch_run(wrapper, spec, alt_in)))
            ort_alt = run_ort(onnx_path, alt_in)
            d_alt = max_diff(torch_alt_d, ort_alt)
            shapes_ok = all(ort_alt[k].shape == torch_alt_d[k].shape for k in out_names)
            if not (d_ref < tol and d_alt < tol and shapes_ok):
                raise RuntimeError(f"ORT mismatch: ref {d_ref:.3g} alt {d_alt:.3g} shapes_ok={shapes_ok}")
            break
        except Exception as e:  # noqa: BLE001
            msg = f"{exporter}/{attn}: {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
            print(f"  [{spec.name}] attempt failed: {msg}", file=sys.stderr)
            if os.environ.get("EXPORT_DEBUG"):
                traceback.print_exc()
            errors.append(msg)
            for p in out_dir.glob(f"{spec.name}.onnx*"):
                p.unlink()
    else:
        raise RuntimeError(f"all export attempts failed for {spec.name}: {errors}")

    np.savez(out_dir / f"{spec.name}.inputs.npz", **ref_in)
    np.savez(out_dir / f"{spec.name}.outputs.npz", **dict(zip(out_names, torch_ref)))

    cfg = model.config
    summary = {
        "model_type": cfg.model_type,
        "architecture": type(model).__name__,
        "hidden": cfg.hidden_size,
        "layers": cfg.num_hidden_layers,
        "heads": cfg.num_attention_heads,
        "vocab": getattr(cfg, "vocab_size", None),
    }
    for k in ("intermediate_size", "n_inner", "ffn_dim", "max_position_embeddings", "n_positions",
              "do_layer_norm_before", "use_parallel_residual", "image_size", "patch_size",
              "num_channels", "num_labels", "tie_word_embeddings", "layer_norm_eps",
              "layer_norm_epsilon"):
        if hasattr(cfg, k) and getattr(cfg, k) is not None:
            v = getattr(cfg, k)
            if isinstance(v, (int, float, bool, str)):
                summary[k] = v
    if spec.kind == "vision":
        summary["vocab"] = None

    ln = count_op(m, "LayerNormalization")
    tied = tied_info(m)
    desc = describe_graph(m)
    init_names = {i.name for i in m.graph.initializer}
    entry = {
        "file": onnx_path.name,
        "inputs_file": f"{spec.name}.inputs.npz",
        "outputs_file": f"{spec.name}.outputs.npz",
        "note": spec.note,
        "exporter": exporter,
        "attn_implementation": attn,
        "failed_attempts": errors,
        "opset": next(o.version for o in m.opset_import if o.domain in ("", "ai.onnx")),
        "ir_version": m.ir_version,
        "config": summary,
        "inputs": [{"name": i.name, "shape": shape_of(i),
                    "dtype": onnx.helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type).name,
                    "reference_shape": list(ref_in[i.name].shape)}
                   for i in m.graph.input if i.name not in init_names],
        "outputs": [o.name for o in m.graph.output],
        "output_shapes": {o.name: shape_of(o) for o in m.graph.output},
        "layernorm_count": ln["main_graph"],
        "layernorm_count_in_functions": ln["functions"],
        "file_size_bytes": onnx_path.stat().st_size,
        "tied_lm_head": tied["tied"],
        "tied_detail": tied,
        "ort_max_abs_diff": {f"batch{REF_BATCH}_seq{REF_SEQ}": d_ref,
                             f"batch{ALT_BATCH}_seq{ALT_SEQ}": d_alt},
        "graph": desc,
    }
    if spec.kind == "vision":
        entry["ort_max_abs_diff"] = {f"batch{REF_BATCH}": d_ref, f"batch{ALT_BATCH}": d_alt}
    return entry


def exporter_args(doc: str, names, argv=None) -> tuple[argparse.Namespace, Path]:
    """The command line of the exporters that write into models/ (`--only NAME ...` of `names`, and
    `--out-dir`, default models/) parsed, torch set to two threads and the folder made: the arguments
    and the folder."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="+", choices=sorted(names))
    ap.add_argument("--out-dir", default=str(Path(__file__).resolve().parents[1]))
    args = ap.parse_args(argv)
    torch.set_num_threads(2)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    return args, out_dir


def manifest_entry(model: onnx.ModelProto, path: Path, name: str, producer: str, feeds: list[dict], diffs: list[float],
                   **extra) -> dict:
    """Save the two input sets beside the model (`NAME.inputs.npz`, `NAME.inputs_alt.npz`) and give
    its manifest entry: file, producer, size, input shapes, ORT-vs-torch figures, op counts (a
    domain's ops named `domain::op`), and `extra`."""
    np.savez(path.parent / f"{name}.inputs.npz", **feeds[0])
    np.savez(path.parent / f"{name}.inputs_alt.npz", **feeds[1])
    ops = collections.Counter(f"{n.domain}::{n.op_type}" if n.domain not in ("", "ai.onnx") else n.op_type
                              for n in model.graph.node)
    return {
        "file": path.name,
        "producer": producer,
        "file_size_bytes": path.stat().st_size,
        "inputs": {k: list(v.shape) for k, v in feeds[0].items()},
        "inputs_alt": {k: list(v.shape) for k, v in feeds[1].items()},
        "ort_vs_torch_max_rel_diff": diffs,
        **extra,
        "op_counts": dict(sorted(ops.items())),
    }


def export_with_manifest(doc: str, names, manifest_name: str, generator: str, export: Callable[[str, Path], dict],
                         argv=None) -> None:
    """The main of an exporter into models/: `export(name, out_dir)` of each model asked for (all of
    `names` by default) gives its manifest entry; the entries of the models not asked for are kept."""
    args, out_dir = exporter_args(doc, names, argv)
    manifest_path = out_dir / manifest_name
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    models = manifest.get("models", {})
    for name in args.only or list(names):
        print(f"== {name}", flush=True)
        models[name] = export(name, out_dir)
        print(f"   {models[name]['file_size_bytes']} bytes, ORT vs torch {models[name]['ort_vs_torch_max_rel_diff']}", flush=True)
    manifest = {
        "generator": generator,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "onnx": onnx.__version__, "onnxruntime": ort.__version__},
        "models": {k: models[k] for k in names if k in models},
    }
    manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="+", choices=sorted(SPECS), help="export only these models")
    ap.add_argument("--out-dir", default=str(Path(__file__).resolve().parents[1]))
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest_path = out_dir / "manifest.json"
    manifest = {}
    previous = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    if args.only:
        manifest = previous.get("models", {})

    names = args.only or list(SPECS)
    for name in names:
        print(f"== {name}", flush=True)
        e = export_one(SPECS[name], out_dir)
        manifest[name] = e
        d = ", ".join(f"{k}={v:.2e}" for k, v in e["ort_max_abs_diff"].items())
        print(f"  exporter={e['exporter']}({e['attn_implementation']}) opset={e['opset']} "
              f"size={e['file_size_bytes']} LN={e['layernorm_count']} "
              f"(in functions: {e['layernorm_count_in_functions']}) tied={e['tied_lm_head']} "
              f"inputs={[i['name'] for i in e['inputs']]} outputs={e['outputs']}\n"
              f"  ORT vs torch max abs diff: {d}", flush=True)

    ordered = {k: manifest[k] for k in SPECS if k in manifest}
    # Entries written by other scripts (export_coverage_models.py) are kept as they are.
    others = {k: v for k, v in previous.get("models", {}).items() if k not in SPECS}
    total = sum(v["file_size_bytes"] for v in ordered.values())
    doc = {
        "generator": "models/make/export_models.py",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "onnx": onnx.__version__, "onnxruntime": ort.__version__},
        "reference_inputs": {"batch": REF_BATCH, "seq": REF_SEQ},
        "dynamic_check_inputs": {"batch": ALT_BATCH, "seq": ALT_SEQ},
        "total_onnx_bytes": total,
        "models": {**ordered, **others},
    }
    doc.update({k: v for k, v in previous.items() if k.startswith("coverage_")})
    manifest_path.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {manifest_path} ({len(ordered)} models, {total} bytes of .onnx)")
    for k, v in ordered.items():
        assert v["file_size_bytes"] < 2 * 1024 * 1024, k
    assert total < 10 * 1024 * 1024


if __name__ == "__main__":
    main()
