#!/usr/bin/env python
"""Build benchmark-size transformers models from public configs and export them to ONNX.

Benchmark models for ``benchmarks/`` (onnx_lnfold latency and fold cost).  Like
``models/make/export_models.py``: every model is built from a config (no hub access),
every floating parameter and buffer is perturbed off its init (no identical
initializers, no zero biases, LN gamma != 1), and the model is exported with
``torch.onnx.export(dynamo=True, opset_version=18)`` with dynamic batch and
sequence dims, local functions inlined, one self-contained ``.onnx`` file
(external data only above 2 GB, which none of these reach).

Models (``NAME`` = size as in the public config; ``NAME_small`` = hidden 256,
4 layers, 4 heads, FFN 1024, vocab 8192, for quick runs):

    gpt2        GPT2LMHeadModel, GPT-2 124M config (n_embd 768, 12 layers), pre-LN, tied LM head
    bert        BertModel, bert-base config (768, 12 layers), post-LN
    opt         OPTForCausalLM, opt-125m config (768, 12 layers), pre-LN, tied LM head
    vit         ViTForImageClassification, ViT-B/16 224px (768, 12 layers), pre-LN, 1000 labels

The files are not committed: they are generated on demand into a cache folder
(``benchmarks/cache/`` by default, git-ignored) together with ``NAME.json``
(config summary, input names, max sequence length, export check).  An existing
file is reused unless ``--force``.

Usage::

    python models/make/export_bench_models.py [--only NAME ...] [--out-dir benchmarks/cache] [--force]
    python models/make/export_bench_models.py --list
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

OPSET = 18
PROTO_LIMIT = 2**31 - 2**26  # above this the weights go to one external data file
DEFAULT_OUT = Path(__file__).resolve().parents[2] / "benchmarks" / "cache"

SMALL = dict(hidden=256, layers=4, heads=4, inter=1024, vocab=8192)
SMALL_POSITIONS = 4096  # small text models accept the whole 128..4096 sequence range


@dataclass
class Spec:
    name: str
    arch: str  # gpt2 / bert / opt / vit
    size: str  # "base" (public config) or "small"
    kind: str  # "text" or "vision"
    input_names: list[str]
    output_names: list[str]
    pre_ln: bool
    note: str
    build: Callable[[], object]  # -> torch.nn.Module


def _gpt2(small: bool):
    import transformers

    kw = dict(use_cache=False, attn_implementation="sdpa")
    if small:
        kw.update(n_embd=SMALL["hidden"], n_layer=SMALL["layers"], n_head=SMALL["heads"],
                  n_inner=SMALL["inter"], vocab_size=SMALL["vocab"], n_positions=SMALL_POSITIONS,
                  bos_token_id=SMALL["vocab"] - 1, eos_token_id=SMALL["vocab"] - 1)
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(**kw))  # defaults = gpt2 (124M)


def _bert(small: bool):
    import transformers

    kw = dict(attn_implementation="sdpa")
    if small:
        kw.update(hidden_size=SMALL["hidden"], num_hidden_layers=SMALL["layers"],
                  num_attention_heads=SMALL["heads"], intermediate_size=SMALL["inter"],
                  vocab_size=SMALL["vocab"], max_position_embeddings=SMALL_POSITIONS)
    return transformers.BertModel(transformers.BertConfig(**kw), add_pooling_layer=True)  # defaults = bert-base


def _opt(small: bool):
    import transformers

    kw = dict(use_cache=False, attn_implementation="sdpa", do_layer_norm_before=True)
    if small:
        kw.update(hidden_size=SMALL["hidden"], num_hidden_layers=SMALL["layers"],
                  num_attention_heads=SMALL["heads"], ffn_dim=SMALL["inter"],
                  word_embed_proj_dim=SMALL["hidden"], vocab_size=SMALL["vocab"],
                  max_position_embeddings=SMALL_POSITIONS)
    return transformers.OPTForCausalLM(transformers.OPTConfig(**kw))  # defaults = opt-125m


def _vit(small: bool):
    import transformers

    kw = dict(attn_implementation="sdpa", num_labels=1000, image_size=224, patch_size=16)
    if small:
        kw.update(hidden_size=SMALL["hidden"], num_hidden_layers=SMALL["layers"],
                  num_attention_heads=SMALL["heads"], intermediate_size=SMALL["inter"])
    return transformers.ViTForImageClassification(transformers.ViTConfig(**kw))  # defaults = ViT-B/16


_ARCH = {
    "gpt2": ("text", ["input_ids"], ["logits"], True, _gpt2, "GPT2LMHeadModel, pre-LN, tied LM head"),
    "bert": ("text", ["input_ids", "attention_mask"], ["last_hidden_state", "pooler_output"], False, _bert,
             "BertModel, post-LN"),
    "opt": ("text", ["input_ids", "attention_mask"], ["logits"], True, _opt,
            "OPTForCausalLM, pre-LN, tied LM head"),
    "vit": ("vision", ["pixel_values"], ["logits"], True, _vit, "ViTForImageClassification 224px/16, pre-LN"),
}


def _make_specs() -> dict[str, Spec]:
    specs = {}
    for size in ("small", "base"):
        for arch, (kind, ins, outs, pre, fn, note) in _ARCH.items():
            name = arch if size == "base" else f"{arch}_small"
            small = size == "small"
            specs[name] = Spec(name, arch, size, kind, ins, outs, pre,
                               note + (" (hidden 256, 4 layers, vocab 8192)" if small else " (public config size)"),
                               (lambda fn=fn, small=small: fn(small)))
    return specs


SPECS = _make_specs()
SMALL_MODELS = [n for n, s in SPECS.items() if s.size == "small"]
BASE_MODELS = [n for n, s in SPECS.items() if s.size == "base"]


# --------------------------------------------------------------------------- #
def seed_for(name: str) -> int:
    return zlib.crc32(name.encode()) & 0x7FFFFFFF


def perturb(model, seed: int) -> None:
    """Move every float parameter and buffer off its init: export_models.py's recipe, shared."""
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from export_models import perturb as perturb_like_the_test_models

    with torch.no_grad():
        perturb_like_the_test_models(model, seed)


def max_seq_of(model, spec: Spec) -> int:
    cfg = model.config
    if spec.kind == "vision":
        return (cfg.image_size // cfg.patch_size) ** 2 + 1
    for k in ("n_positions", "max_position_embeddings"):
        if getattr(cfg, k, None):
            return int(getattr(cfg, k))
    raise ValueError("no position count in config")


def make_inputs(spec: Spec, meta: dict, batch: int, seq: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs for a benchmark model (`meta` = the NAME.json written beside it)."""
    rng = np.random.default_rng(seed)
    if spec.kind == "vision":
        s = meta["config"]["image_size"]
        return {"pixel_values": rng.standard_normal((batch, 3, s, s)).astype(np.float32)}
    feeds = {"input_ids": rng.integers(0, meta["config"]["vocab"], size=(batch, seq), dtype=np.int64)}
    if "attention_mask" in spec.input_names:
        feeds["attention_mask"] = np.ones((batch, seq), dtype=np.int64)
    return feeds


def _wrapper(model, spec: Spec):
    import torch

    class W(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def _run(self, *args):
            kw = dict(zip(spec.input_names, args))
            if spec.arch in ("gpt2", "opt"):
                kw["use_cache"] = False
            out = self.model(**kw, return_dict=True)
            return tuple(out[o] for o in spec.output_names)

    class W1(W):
        def forward(self, x0):
            return self._run(x0)

    class W2(W):
        def forward(self, x0, x1):
            return self._run(x0, x1)

    return {1: W1, 2: W2}[len(spec.input_names)]().eval()


def _finalize(path: Path) -> int:
    """Inline as export_models.py does; one file unless the weights need external data."""
    import onnx

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from export_models import load_inlined

    m = load_inlined(path)
    for stray in list(path.parent.glob(path.name + "*.data")) + [Path(str(path) + ".data")]:
        if stray.exists():
            stray.unlink()
    if sum(t.ByteSize() for t in m.graph.initializer) > PROTO_LIMIT:
        onnx.save(m, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                  location=path.name + ".data", size_threshold=1024)
    else:
        onnx.save(m, str(path))
    onnx.checker.check_model(str(path))
    return len(m.graph.node)


def _ort_run(path: Path, feeds):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def export_one(name: str, out_dir: Path, force: bool = False) -> dict:
    import onnx
    import onnxruntime as ort
    import torch
    import transformers

    spec = SPECS[name]
    path = out_dir / f"{name}.onnx"
    meta_path = out_dir / f"{name}.json"
    if path.exists() and meta_path.exists() and not force:
        meta = json.loads(meta_path.read_text())
        if meta.get("file_size_bytes") == path.stat().st_size:
            print(f"  {name}: cached ({path})", flush=True)
            return meta

    t0 = time.perf_counter()
    seed = seed_for(name)
    torch.manual_seed(seed)
    model = spec.build().eval()
    perturb(model, seed)
    cfg = model.config
    max_seq = max_seq_of(model, spec)
    n_params = sum(p.numel() for p in model.parameters())
    config = {
        "model_type": cfg.model_type, "architecture": type(model).__name__,
        "hidden": cfg.hidden_size, "layers": cfg.num_hidden_layers, "heads": cfg.num_attention_heads,
        "vocab": getattr(cfg, "vocab_size", None) if spec.kind == "text" else None,
        "image_size": getattr(cfg, "image_size", None), "patch_size": getattr(cfg, "patch_size", None),
        "max_seq": max_seq, "params": n_params,
    }
    meta_partial = {"config": config}
    wrapper = _wrapper(model, spec)
    ref = make_inputs(spec, meta_partial, 2, 16 if spec.kind == "text" else 0, seed + 10)
    alt = make_inputs(spec, meta_partial, 1, 37 if spec.kind == "text" else 0, seed + 20)
    args = tuple(torch.from_numpy(ref[n]) for n in spec.input_names)
    batch = torch.export.Dim("batch", min=1, max=1024)
    if spec.kind == "vision":
        dyn = ({0: batch},)
    else:
        seq = torch.export.Dim("seq", min=2, max=max_seq)
        dyn = tuple({0: batch, 1: seq} for _ in spec.input_names)
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / f".{name}.export.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(wrapper, args, str(tmp), dynamo=True, opset_version=OPSET,
                          input_names=spec.input_names, output_names=spec.output_names,
                          dynamic_shapes=dyn, external_data=True, optimize=True, verbose=False)
    n_nodes = _finalize(tmp)

    # ORT (no optimizations) vs torch at the export shape and at another batch/sequence.
    diffs = {}
    for label, feeds in (("export_shape", ref), ("other_shape", alt)):
        with torch.no_grad():
            want = [o.numpy() for o in wrapper(*[torch.from_numpy(feeds[n]) for n in spec.input_names])]
        got = _ort_run(tmp, feeds)
        rel = max(float(np.abs(g.astype(np.float64) - w).max() / max(np.abs(w).max(), 1e-30))
                  for g, w in zip(got, want))
        if not rel < 1e-4 or any(g.shape != w.shape for g, w in zip(got, want)):
            raise RuntimeError(f"{name}: ORT differs from torch at {label}: relative {rel:.3g}")
        diffs[label] = rel
    for p in out_dir.glob(f"{name}.onnx*"):
        p.unlink()
    tmp.rename(path)
    if Path(str(tmp) + ".data").exists():
        Path(str(tmp) + ".data").rename(Path(str(path) + ".data"))
    m = onnx.load(str(path), load_external_data=False)
    meta = {
        "name": name, "file": path.name, "arch": spec.arch, "size": spec.size, "kind": spec.kind,
        "pre_ln": spec.pre_ln, "note": spec.note, "input_names": spec.input_names,
        "output_names": spec.output_names, "config": config,
        "layernorm_count": sum(1 for n in m.graph.node if n.op_type == "LayerNormalization"),
        "nodes": n_nodes, "opset": OPSET, "exporter": "torch.onnx dynamo", "attn_implementation": "sdpa",
        "ort_vs_torch_rel_diff": diffs, "file_size_bytes": path.stat().st_size,
        "external_data": Path(str(path) + ".data").exists(),
        "export_seconds": round(time.perf_counter() - t0, 1),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "onnx": onnx.__version__, "onnxruntime": ort.__version__},
    }
    meta_path.write_text(json.dumps(meta, indent=2) + "\n")
    print(f"  {name}: exported in {meta['export_seconds']} s, {meta['file_size_bytes'] / 1e6:.1f} MB, "
          f"LN={meta['layernorm_count']}, ORT vs torch rel diff {max(diffs.values()):.2g}", flush=True)
    return meta


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="+", choices=sorted(SPECS), help="models to build (default: all)")
    ap.add_argument("--out-dir", default=str(DEFAULT_OUT))
    ap.add_argument("--force", action="store_true", help="re-export even when a cached file exists")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    ap.add_argument("--list", action="store_true", help="list the models and exit")
    args = ap.parse_args(argv)
    if args.list:
        for n, s in SPECS.items():
            print(f"{n:12s} {s.note}")
        return 0
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.out_dir)
    for name in args.only or list(SPECS):
        print(f"== {name}", flush=True)
        export_one(name, out, force=args.force)
    return 0


if __name__ == "__main__":
    sys.exit(main())
