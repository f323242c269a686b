"""The figures of README "Deployment pipelines", measured on the committed models.

    python tools/deployment_figures.py [order] [fp16] [int8] [--sets N] [--controls K] [--models ...]

order  node counts of ONNX Runtime's optimized graph (session level ALL) for the two orders
       of the fold and `onnxruntime.transformers.optimizer.optimize_model` (opt level 1)
fp16   fold counts of fold -> fp16 and fp16 -> fold (`convert_float_to_float16(keep_io_types=True)`)
       and their drift against the fp32 original, mean over N input sets of max|diff|/max|ref|
int8   `quantize_dynamic` error against the fp32 original, before and after the fold, and the
       same for K *controls*: the original with the row means the fold removes re-signed at
       random (exact, like the fold: every LN still removes them), which measures how far the
       error moves when nothing but the weights' rounding draw changes
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
from onnx import numpy_helper

HERE = Path(__file__).resolve().parent
MODELS = HERE.parent / "models"
sys.path.insert(0, str(HERE.parent))  # this checkout's onnx_lnfold, over any installed one

import onnx_lnfold  # noqa: E402
from onnx_lnfold.feeds.synthesize import synthesize_inputs  # noqa: E402

HEADS, HIDDEN = 4, 64


def session(model, level=ort.GraphOptimizationLevel.ORT_DISABLE_ALL, optimized=None):
    options = ort.SessionOptions()
    options.graph_optimization_level = level
    options.log_severity_level = 3
    if optimized:
        options.optimized_model_filepath = str(optimized)
    src = str(model) if isinstance(model, Path) else model.SerializeToString()
    return ort.InferenceSession(src, options, providers=["CPUExecutionProvider"])


def ort_nodes(model: onnx.ModelProto, tmp: Path) -> int:
    session(model, ort.GraphOptimizationLevel.ORT_ENABLE_ALL, tmp / "ort.onnx")
    return len(onnx.load(tmp / "ort.onnx").graph.node)


def optimize(model: onnx.ModelProto, model_type: str, tmp: Path) -> onnx.ModelProto:
    from onnxruntime.transformers.optimizer import optimize_model

    onnx.save(model, tmp / "in.onnx")
    with contextlib.redirect_stdout(io.StringIO()):
        opt = optimize_model(str(tmp / "in.onnx"), model_type=model_type, num_heads=HEADS, hidden_size=HIDDEN, opt_level=1)
    opt.save_model_to_file(str(tmp / "opt.onnx"))
    return onnx.load(tmp / "opt.onnx")


def order(tmp: Path) -> None:
    print("model             ORT nodes: original  optimize  optimize->fold  fold->optimize   folded (opt->fold / fold->opt)")
    for name, model_type in (("gpt2", "gpt2"), ("bert_torchscript", "bert"), ("bert", "bert")):
        original = onnx.load(MODELS / f"{name}.onnx")
        optimized = optimize(original, model_type, tmp)
        first = onnx_lnfold.fold(optimized)
        folded = onnx_lnfold.fold(original)
        after = optimize(folded.model_proto, model_type, tmp)
        counts = [ort_nodes(m, tmp) for m in (original, optimized, first.model_proto, after)]
        print(
            f"{name:17} {counts[0]:>18} {counts[1]:>9} {counts[2]:>15} {counts[3]:>15}   "
            f"{len(first.plan.folded)}/{len(first.plan.decisions)} / {len(folded.plan.folded)}/{len(folded.plan.decisions)}"
        )


def input_sets(name: str, count: int) -> list[dict[str, np.ndarray]]:
    spec = ir.load(MODELS / f"{name}.onnx")
    shapes = {v.name: tuple(d if isinstance(d, int) else (4 if i == 0 else 16) for i, d in enumerate(v.shape)) for v in spec.graph.inputs}
    return [dict(np.load(MODELS / f"{name}.inputs.npz"))] + [synthesize_inputs(spec, shapes, seed=s) for s in range(1, count)]


def references(name: str, sets: int) -> tuple[onnx.ModelProto, list[dict[str, np.ndarray]], list]:
    """The committed model, its input sets and its outputs on them in ONNX Runtime."""
    original = onnx.load(MODELS / f"{name}.onnx")
    feeds_list = input_sets(name, sets)
    return original, feeds_list, [session(original).run(None, f) for f in feeds_list]


def error(model, refs, feeds_list) -> float:
    s = session(model)
    per_set = []
    for feeds, ref in zip(feeds_list, refs):
        got = s.run(None, feeds)
        per_set.append(max(float(np.abs(g.astype(np.float64) - r).max() / np.abs(r).max()) for g, r in zip(got, ref)))
    return float(np.mean(per_set))


def fp16(names: list[str], sets: int) -> None:
    from onnxruntime.transformers.float16 import convert_float_to_float16

    def convert(m):
        with contextlib.redirect_stderr(io.StringIO()):
            return convert_float_to_float16(m, keep_io_types=True)

    print("model             folded fp32  fp16->fold   drift: fp16(original)  fold->fp16  fp16->fold")
    for name in names:
        original, feeds_list, refs = references(name, sets)
        fp32 = onnx_lnfold.fold(original)
        late = onnx_lnfold.fold(convert(original))
        base = error(convert(original), refs, feeds_list)
        a, b = error(convert(fp32.model_proto), refs, feeds_list), error(late.model_proto, refs, feeds_list)
        print(
            f"{name:17} {len(fp32.plan.folded):>5}/{len(fp32.plan.decisions):<5} {len(late.plan.folded):>7}   "
            f"{base:20.2e}  {a:.2e} x{a / base:.2f}  {b:.2e} x{b / base:.2f}"
        )


def recentered(original: onnx.ModelProto, plan, rng) -> onnx.ModelProto:
    """The original with a random half of the means the fold removes flipped in sign: exact (every
    shift is one an LN removes), and the same magnitudes: another rounding draw, nothing more."""
    model = onnx.ModelProto()
    model.CopyFrom(original)
    inits = {i.name: i for i in model.graph.initializer}
    for edit in plan.edits:
        if edit.untie or edit.axis is None or edit.weights is not None or edit.tensor not in inits:
            continue
        a = numpy_helper.to_array(inits[edit.tensor])
        means = a.astype(np.float64).mean(axis=edit.axis, keepdims=True)
        flipped = a - 2 * means * (rng.random(means.shape) < 0.5)
        inits[edit.tensor].CopyFrom(numpy_helper.from_array(flipped.astype(a.dtype), edit.tensor))
    return model


def int8(names: list[str], sets: int, controls: int, tmp: Path) -> None:
    from onnxruntime.quantization import quantize_dynamic

    def quantized(m, per_channel):
        onnx.save(m, tmp / "fp32.onnx")
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            quantize_dynamic(str(tmp / "fp32.onnx"), str(tmp / "int8.onnx"), per_channel=per_channel)
        return onnx.load(tmp / "int8.onnx")

    print("model             weights      int8 error: original  folded         controls (min..max)")
    for name in names:
        original, feeds_list, refs = references(name, sets)
        folded = onnx_lnfold.fold(original)
        for per_channel in (False, True):
            base = error(quantized(original, per_channel), refs, feeds_list)
            after = error(quantized(folded.model_proto, per_channel), refs, feeds_list)
            rng = np.random.default_rng(0)
            ctrl = [error(quantized(recentered(original, folded.plan, rng), per_channel), refs, feeds_list) / base for _ in range(controls)]
            kind = "per-channel" if per_channel else "per-tensor"
            print(f"{name:17} {kind:12} {base:17.2e}  {after:.2e} x{after / base:.2f}   x{min(ctrl):.2f}..x{max(ctrl):.2f}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # checked by hand: argparse (3.11) tests an empty nargs="*" list against `choices` and refuses it
    parser.add_argument("what", nargs="*", help="order, fp16, int8: the parts to run (default: all three)")
    parser.add_argument("--sets", type=int, default=8, help="input sets per model")
    parser.add_argument("--controls", type=int, default=10, help="re-signed originals per model (int8)")
    parser.add_argument("--models", nargs="+", default=None)
    args = parser.parse_args(argv)
    args.what = args.what or ["order", "fp16", "int8"]
    unknown = sorted(set(args.what) - {"order", "fp16", "int8"})
    if unknown:
        parser.error(f"unknown part(s) {', '.join(unknown)}: choose from order, fp16, int8")
    logging.disable(logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        if "order" in args.what:
            order(Path(tmp))
        if "fp16" in args.what:
            fp16(args.models or ["gpt2", "bert", "vit", "opt_pre_ln", "gpt_neox", "bloom", "whisper_encoder", "clip", "gpt2_ort_opt1", "bert_ort_opt1"], args.sets)
        if "int8" in args.what:
            int8(args.models or ["bert", "clip", "vit", "gpt_neox", "opt_pre_ln"], args.sets, args.controls, Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
