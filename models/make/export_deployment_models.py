#!/usr/bin/env python
"""Models for the deployment-pipeline tests: what users hand the fold before ONNX Runtime's
transformers optimizer, fp16 conversion and int8 quantization run.

    bert_torchscript   the weights of models/bert.onnx exported by the TorchScript exporter
                       (opset 17, eager attention), not optimized: the graph on which
                       `optimize_model(model_type="bert")` fuses EmbedLayerNormalization
    clip               a CLIPModel (text and vision towers, hidden 64, MLP 128, 2 layers each, 32x32
                       images, patch 8), dynamo exporter, opset 18: the vision tower's
                       `pre_layrnorm` reads the patch embeddings, its stream starts at that LN

Same seeds, perturbation and checks as export_models.py / export_coverage_models.py (ONNX
Runtime against torch at two batch sizes). Run after export_models.py; writes the models,
their reference inputs/outputs and `deployment_manifest.json` (manifest.json stays as the other
scripts write it):

    python models/make/export_deployment_models.py [--only bert_torchscript clip]
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

import numpy as np
import onnx
import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parent))
import export_coverage_models as ecm  # noqa: E402
import export_models as em  # noqa: E402

HERE = Path(__file__).resolve().parent
CLIP_SEQ = 8
CLIP_VOCAB = 256
CLIP_INTER = 2 * em.HIDDEN


def _bert_torchscript(models_dir: Path, out_dir: Path) -> dict:
    name = "bert_torchscript"
    src = ecm.existing_source("bert", models_dir, attn="eager")
    path = out_dir / f"{name}.onnx"
    m = ecm.torchscript_export(src, path, em.OPSET_TORCHSCRIPT)
    producer = {"exporter": "torchscript (dynamo=False, opset 17, do_constant_folding=True)", "attn_implementation": "eager"}
    note = ("BertModel with the weights of models/bert.onnx, TorchScript exporter, not optimized: "
            "optimize_model(model_type='bert') fuses its embeddings into EmbedLayerNormalization")
    return ecm.check_and_describe(name, m, path, src, producer, note, out_dir)


def build_clip(attn="sdpa"):
    # Smaller MLPs and vocabulary than export_models' text models: two towers stay under 1 MB.
    text = dict(vocab_size=CLIP_VOCAB, hidden_size=em.HIDDEN, intermediate_size=CLIP_INTER,
                num_hidden_layers=em.LAYERS, num_attention_heads=em.HEADS, max_position_embeddings=32,
                projection_dim=32)
    vision = dict(hidden_size=em.HIDDEN, intermediate_size=CLIP_INTER, num_hidden_layers=em.LAYERS,
                  num_attention_heads=em.HEADS, image_size=em.IMAGE, patch_size=em.PATCH, projection_dim=32)
    cfg = transformers.CLIPConfig(text_config=text, vision_config=vision, projection_dim=32)
    cfg._attn_implementation = attn
    return transformers.CLIPModel(cfg)


CLIP_SPEC = em.Spec("clip", build_clip, "text+vision", ["input_ids", "pixel_values"],
                    ["logits_per_image", "text_embeds", "image_embeds"])


def clip_inputs(batch: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "input_ids": rng.integers(0, CLIP_VOCAB, size=(batch, CLIP_SEQ), dtype=np.int64),
        "pixel_values": rng.standard_normal((batch, em.CHANNELS, em.IMAGE, em.IMAGE)).astype(np.float32),
    }


def _strip_node_metadata(m: onnx.ModelProto, path: Path) -> onnx.ModelProto:
    """Drop the exporter's per-node stack traces (40% of the file here); the graph is unchanged."""
    for node in m.graph.node:
        del node.metadata_props[:]
        node.doc_string = ""
    onnx.save(m, str(path))
    return m


def _clip(models_dir: Path, out_dir: Path) -> dict:
    name = "clip"
    src = ecm.new_source(name, build_clip, CLIP_SPEC, clip_inputs, "sdpa")
    path = out_dir / f"{name}.onnx"
    args = tuple(torch.from_numpy(src.ref_in[n]) for n in CLIP_SPEC.input_names)
    batch = torch.export.Dim("batch", min=1, max=1024)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(src.wrapper, args, str(path), dynamo=True, opset_version=em.OPSET_DYNAMO,
                          input_names=CLIP_SPEC.input_names, output_names=CLIP_SPEC.outputs,
                          dynamic_shapes=({0: batch}, {0: batch}), external_data=False, optimize=True)
    m = _strip_node_metadata(em.finalize_onnx(path), path)
    producer = {"exporter": "dynamo", "opset": em.OPSET_DYNAMO, "attn_implementation": "sdpa",
                "dynamic_dims": {"input_ids": {0: "batch"}, "pixel_values": {0: "batch"}}}
    note = ("CLIPModel (text and vision, hidden 64, MLP 128, vocab 256, 2 layers, 4 heads, 32x32 images, patch 8, text seq 8, "
            "projection 32): the vision stream starts at pre_layrnorm's output")
    return ecm.check_and_describe(name, m, path, src, producer, note, out_dir)


JOBS = {"bert_torchscript": _bert_torchscript, "clip": _clip}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="+", choices=sorted(JOBS))
    ap.add_argument("--models-dir", default=str(HERE.parent), help="where bert.onnx and manifest.json are read")
    ap.add_argument("--out-dir", default=None, help="where to write (default: --models-dir)")
    args = ap.parse_args(argv)
    torch.set_num_threads(2)
    torch.use_deterministic_algorithms(True)
    models_dir = Path(args.models_dir)
    out_dir = Path(args.out_dir) if args.out_dir else models_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest_path = out_dir / "deployment_manifest.json"
    doc = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    models = doc.setdefault("models", {})
    for name in args.only or list(JOBS):
        print(f"== {name}", flush=True)
        entry = JOBS[name](models_dir, out_dir)
        entry["generator"] = "models/make/export_deployment_models.py"
        models[name] = entry
        print(f"  size={entry['file_size_bytes']} LN-like={entry['ln_like_counts']} "
              f"ORT vs torch={entry['ort_max_abs_diff']}", flush=True)
    doc["generator"] = "models/make/export_deployment_models.py"
    doc["models"] = {k: models[k] for k in JOBS if k in models}
    manifest_path.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {manifest_path}")


if __name__ == "__main__":
    main()
