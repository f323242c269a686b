"""Every entry point runs the one orchestration (`_pipeline.run_pipeline`, its analysis
`_pipeline.analyze_model`), so on the same model, options and input shapes they make the same plan:
`fold()`, `analyze()`, `LnFoldPass`, the command line's `--dry-run --json`, and the Olive pass's fold
(`fold(path, **fold_keywords(config))`, the call `OnnxLnFold._run_for_config` makes, on a config
holding what an Olive config holds: Olive itself is an optional install, tests/surface/test_olive.py).

`CASES` are the quick models of models/*.onnx that cover what makes entry points differ (input
shapes that set the tokens an LN is priced at, ONNX Runtime fusions kept, fp16, LNs already fused,
post-LN, per-head LNs, 4-D layouts, a model converted to opset 23 for `target="onnx"`); every other
committed model is the same test marked slow (`--runslow`): all of them take minutes per entry
point. Nothing is verified: the plan is decided before the check.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import onnx_ir as ir
import pytest

import onnx_lnfold
from onnx_lnfold._cli import EXIT_OK, main
from onnx_lnfold.core.options import FOLD_OPTIONS, OLIVE_OPTIONS, FoldOptions, fold_keywords

from conftest import MODELS

# (model, options): the committed models whose analysis takes about a second or less.
CASES = [
    ("bert_torchscript_ort_opt1", {}),
    ("bloom", {}),
    ("clip", {}),
    ("convnext_block", {}),
    ("detr_decoder_torchscript", {}),
    ("gpt2_torchscript_opset14", {"target": "onnx"}),
    ("gpt_neox", {"tied_weights": "center"}),
    ("keras_ln_axis1_3d", {}),
    ("keras_ln_last_axis_4d", {"fold_costly": True}),
    ("opt_fp16", {}),
    ("opt_post_ln", {"auxiliary_centering": False}),
    ("segformer_torchscript", {}),
    ("stablelm_qk_dynamo", {"fuse_residual": "always"}),
    ("vit", {"keep_ort_fusions": False}),
    ("whisper_encoder", {}),
]


def _input_shapes(name: str) -> dict[str, tuple[int, ...]]:
    """The shapes of the model's committed inputs, where it has some: the cost rule prices at them."""
    path = MODELS / f"{name}.inputs.npz"
    if not path.exists():
        return {}
    with np.load(path) as arrays:
        return {key: tuple(arrays[key].shape) for key in arrays.files}


def _plain(plan_dict: dict) -> dict:
    return json.loads(json.dumps(plan_dict))


# Every other committed model, at the default options.
OTHERS = sorted({path.stem for path in MODELS.glob("*.onnx")} - {name for name, _ in CASES})


@pytest.mark.parametrize(
    ("name", "keywords"),
    [*CASES, *(pytest.param(name, {}, marks=pytest.mark.slow) for name in OTHERS)],
    ids=[name for name, _ in CASES] + OTHERS,
)
def test_every_entry_point_makes_the_same_plan(name, keywords, capsys):
    path = MODELS / f"{name}.onnx"
    shapes = _input_shapes(name)
    options = FoldOptions(**keywords)

    expected = _plain(onnx_lnfold.analyze(path, input_shapes=shapes, options=options).to_dict())
    assert expected["decisions"] or name in OTHERS, name  # every quick case has LNs to decide on

    folded = onnx_lnfold.fold(path, verify=False, input_shapes=shapes, options=options)
    assert _plain(folded.plan.to_dict()) == expected

    fold_pass = onnx_lnfold.LnFoldPass(input_shapes=shapes, options=options)
    fold_pass(ir.load(str(path)))
    assert _plain(fold_pass.plan.to_dict()) == expected

    argv = [str(path), "--dry-run", "--json", "-", "-q"]
    argv += [f"--input-shape={key}:{','.join(map(str, dims))}" for key, dims in shapes.items()]
    for option in FOLD_OPTIONS:
        argv += option.cli_args(getattr(options, option.name))
    capsys.readouterr()
    assert main(argv) == EXIT_OK
    report = json.loads(capsys.readouterr().out)
    assert {key: report[key] for key in expected} == expected

    values = {option.name: getattr(options, option.name) for option in FOLD_OPTIONS}
    checks = {o.name: o.default for o in OLIVE_OPTIONS if o.group != "fold"}  # what an Olive config holds
    checks.update(verify=False, float64_budget=None, input_shapes={key: list(dims) for key, dims in shapes.items()})
    config = SimpleNamespace(**checks, **values)
    olive = onnx_lnfold.fold(path, **fold_keywords(config))
    assert _plain(olive.plan.to_dict()) == expected


def test_the_pass_prices_at_the_shapes_it_is_given():
    """The pass takes `input_shapes` as fold() does: a plan that depends on the tokens priced
    follows them (bert at 16 tokens keeps LNs it folds at the default count: tests/decide)."""
    path = MODELS / "bert.onnx"
    shapes = {"input_ids": (2, 8), "attention_mask": (2, 8)}
    default, at_16 = onnx_lnfold.LnFoldPass(), onnx_lnfold.LnFoldPass(input_shapes=shapes)
    default(ir.load(str(path)))
    at_16(ir.load(str(path)))
    assert at_16.plan.to_dict() == onnx_lnfold.analyze(path, input_shapes=shapes).to_dict()
    assert at_16.plan.to_dict() != default.plan.to_dict()


def test_the_pass_refuses_inputs_that_do_not_match_the_graph():
    model = ir.load(str(MODELS / "gpt2.onnx"))
    with pytest.raises(ir.passes.PreconditionError, match="no_such_input"):
        onnx_lnfold.LnFoldPass(input_shapes={"no_such_input": (1, 4)})(model)
    assert [n.op_type for n in model.graph].count("LayerNormalization") == 5  # unchanged
