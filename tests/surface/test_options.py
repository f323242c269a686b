"""FoldOptions, the target's precondition, and the one pipeline driver (issue 12, item 6)."""

import dataclasses
import inspect
import re
import shutil
from pathlib import Path

import onnx_ir as ir
import pytest

import onnx_lnfold
from onnx_lnfold import _pipeline
from onnx_lnfold._cli import EXIT_OK, main
from onnx_lnfold.core.fold_request import FoldRequest
from onnx_lnfold.core.options import FUSE_RESIDUAL, TARGETS, TIED_WEIGHTS, CheckSettings, FoldOptions

from conftest import MODELS, ROOT
from graphs import Graph

OPTION_SETS = [
    {},
    {"auxiliary_centering": False},
    {"fuse_residual": "always"},
    {"fuse_residual": "never"},
    {"tied_weights": "center"},
    {"tied_weights": "untie"},
    {"keep_ort_fusions": False},
]


# --------------------------------------------------------------------------- FoldOptions
@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("target", "cuda", "unknown target 'cuda': choose one of ort, onnx, primitive"),
        ("fuse_residual", "sometimes", "unknown fuse_residual 'sometimes': choose one of auto, always, never"),
        ("tied_weights", "share", "unknown tied_weights 'share': choose one of auto, center, untie, derive"),
    ],
)
def test_a_bad_option_is_one_line_naming_the_choices(field, value, message):
    with pytest.raises(onnx_lnfold.LnFoldError) as raised:
        FoldOptions(**{field: value})
    assert str(raised.value) == message
    # The public keywords and the pass raise the same, before any model is read.
    with pytest.raises(onnx_lnfold.LnFoldError, match=f"^{re.escape(message)}$"):
        onnx_lnfold.fold("no-such-file.onnx", **{field: value})
    with pytest.raises(onnx_lnfold.LnFoldError, match=f"^{re.escape(message)}$"):
        onnx_lnfold.LnFoldPass(**{field: value})


def test_options_are_frozen_with_the_documented_defaults_and_choices():
    options = FoldOptions()
    assert dataclasses.astuple(options) == ("ort", True, "auto", "auto", True, False, None)
    assert (TARGETS, FUSE_RESIDUAL, TIED_WEIGHTS) == (("ort", "onnx", "primitive"), ("auto", "always", "never"), ("auto", "center", "untie", "derive"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.target = "onnx"  # type: ignore[misc]
    assert onnx_lnfold.FoldOptions is FoldOptions and "FoldOptions" in onnx_lnfold.__all__


def test_public_signatures_list_every_option_as_a_keyword():
    fields = {f.name: f.default for f in dataclasses.fields(FoldOptions)}
    for entry in (onnx_lnfold.fold, onnx_lnfold.analyze, onnx_lnfold.LnFoldPass):
        params = inspect.signature(entry).parameters
        assert {name: params[name].default for name in fields} == fields, entry
        assert params["options"].default is None
        assert all(params[name].kind is inspect.Parameter.KEYWORD_ONLY for name in [*fields, "options"])


def test_an_unknown_keyword_is_a_type_error():
    with pytest.raises(TypeError, match="fold\\(\\) got an unexpected keyword argument 'taget'"):
        onnx_lnfold.fold(MODELS / "gpt2.onnx", taget="onnx")
    with pytest.raises(TypeError, match="analyze\\(\\) got an unexpected keyword argument 'fuse'"):
        onnx_lnfold.analyze(MODELS / "gpt2.onnx", fuse="always")


@pytest.mark.parametrize("keywords", OPTION_SETS, ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items()) or "default")
def test_keywords_and_options_give_the_same_plan(keywords):
    model = ir.load(str(MODELS / "gpt2.onnx"))
    by_keywords = onnx_lnfold.analyze(model, **keywords).to_dict()
    by_options = onnx_lnfold.analyze(model, options=FoldOptions(**keywords)).to_dict()
    assert by_keywords == by_options
    pass_ = onnx_lnfold.LnFoldPass(options=FoldOptions(**keywords))
    pass_(model.clone())
    assert pass_.plan.to_dict() == by_keywords  # type: ignore[union-attr]


def test_fold_keywords_and_options_give_the_same_plan_and_model():
    by_keywords = onnx_lnfold.fold(MODELS / "gpt2.onnx", verify=False, tied_weights="center", fuse_residual="never")
    by_options = onnx_lnfold.fold(
        MODELS / "gpt2.onnx", verify=False, options=FoldOptions(tied_weights="center", fuse_residual="never")
    )
    assert by_keywords.plan.to_dict() == by_options.plan.to_dict()
    assert by_keywords.plan.centerings  # the options took effect: the tied table is centered, not copied
    assert by_keywords.model_proto.SerializeToString(deterministic=True) == by_options.model_proto.SerializeToString(
        deterministic=True
    )


def test_keywords_beside_options_replace_its_fields():
    model = ir.load(str(MODELS / "gpt2.onnx"))
    mixed = onnx_lnfold.analyze(model, options=FoldOptions(tied_weights="center"), tied_weights="untie")
    assert mixed.to_dict() == onnx_lnfold.analyze(model, tied_weights="untie").to_dict()
    assert not mixed.centerings and any(edit.untie for edit in mixed.edits)


# --------------------------------------------------------------------------- the precondition
def _opset18_model():
    g = Graph()
    g.output(g.ln(g.linear(g.input("x", ["b", "s", 8]), 8, 16, "proj"), 16, "ln"))
    return g.model(opset=18)


def test_the_entry_points_convert_and_the_analysis_refuses_an_unconverted_model():
    """fold(), analyze(), the command line and the pass convert a model below the target's opset
    first (tests/load/test_opset.py: the committed models and the blocked conversions); the
    analysis itself refuses a model handed to it unconverted, in one line, changing nothing."""
    model = ir.serde.deserialize_model(_opset18_model())
    assert onnx_lnfold.analyze(model, target="onnx").converted_from == 18
    message = (
        "target='onnx' emits RMSNormalization (opset 23); the model analyzed is at opset 18: convert it first "
        "(onnx_lnfold.fold and the command line do)"
    )
    with pytest.raises(onnx_lnfold.InvalidInput, match=f"^{re.escape(message)}$"):
        _pipeline._plan(model, FoldOptions(target="onnx"))
    assert model.opset_imports[""] == 18 and [n.op_type for n in model.graph].count("LayerNormalization") == 1
    # The pass converts in place; the default target folds at the model's own opset.
    assert onnx_lnfold.LnFoldPass(target="onnx", fold_costly=True)(model).modified
    assert model.opset_imports[""] == 23


# --------------------------------------------------------------------------- one driver
@pytest.fixture
def count_analyses(monkeypatch):
    calls = []
    plan = _pipeline._plan

    def counted(model, options, *rest):
        calls.append(options)
        return plan(model, options, *rest)

    monkeypatch.setattr(_pipeline, "_plan", counted)
    return calls


@pytest.mark.parametrize("extra", [[], ["--dry-run"], ["--no-verify"]])
def test_verbose_cli_analyzes_once(tmp_path, capsys, count_analyses, extra):
    model = tmp_path / "gpt2.onnx"
    shutil.copy(MODELS / "gpt2.onnx", model)
    assert main([str(model), "-v", "--fuse-residual", "never", *extra]) == EXIT_OK
    assert count_analyses == [FoldOptions(fuse_residual="never")]
    out = capsys.readouterr().out
    assert "Proof per LayerNorm (--verbose):" in out
    assert "node_layer_norm_4 (LayerNormalization, axis 2): folded -> SimplifiedLayerNormalization" in out
    assert f"LayerNorm nodes: 5 {'would fold' if '--dry-run' in extra else 'folded'}, 0 kept (of 5)" in out
    assert (tmp_path / "gpt2.lnfold.onnx").exists() == ("--dry-run" not in extra)


def test_fold_analyzes_once(count_analyses):
    result = onnx_lnfold.fold(MODELS / "gpt2.onnx", tied_weights="untie")
    assert count_analyses == [FoldOptions(tied_weights="untie")]
    assert result.report.verification.status == "passed"


def test_analyze_and_the_pass_analyze_once(count_analyses):
    """analyze() and LnFoldPass run the analysis fold() runs, once each."""
    onnx_lnfold.analyze(MODELS / "gpt2.onnx", fuse_residual="never")
    onnx_lnfold.LnFoldPass(tied_weights="center")(ir.load(str(MODELS / "gpt2.onnx")))
    assert count_analyses == [FoldOptions(fuse_residual="never"), FoldOptions(tied_weights="center")]


def test_the_proof_is_the_same_as_from_a_separate_analysis(tmp_path, capsys):
    """The -v proof comes from the plan the fold applies, on the model before the rewrite."""
    from onnx_lnfold.report.trace import explain

    model = tmp_path / "gpt2.onnx"
    shutil.copy(MODELS / "gpt2.onnx", model)
    loaded = ir.load(str(model))
    expected = explain(loaded, _pipeline.analyze_for_target(loaded, FoldOptions())[1])
    run = _pipeline.run_pipeline(ir.load(str(model)), model, FoldRequest(check=CheckSettings(verify=False), proof=True))
    assert run.report.trace == expected and expected
    assert run.report.verification.reason == "disabled by the caller" and not run.refused and run.staged is None


def test_the_skip_reasons_are_decided_in_one_place():
    nothing = Graph()
    nothing.output(nothing.linear(nothing.input("x", ["b", "s", 8]), 8, 16, "proj"))
    plain = ir.serde.deserialize_model(nothing.model())
    options = FoldOptions()
    run = _pipeline.run_pipeline(plain, None, FoldRequest(options=options))
    assert run.report.verification.reason == "nothing was folded: the model is unchanged"
    no_verify = CheckSettings(verify=False, disabled_because="disabled by --no-verify")
    run = _pipeline.run_pipeline(plain, None, FoldRequest(options=options, check=no_verify))
    assert run.report.verification.reason == "disabled by --no-verify"
    costly = FoldOptions(fold_costly=True)  # the model's one LN keeps its beta as an Add
    dry = _pipeline.run_pipeline(ir.serde.deserialize_model(_opset18_model()), None, FoldRequest(options=costly, dry_run=True))
    assert dry.report.verification.reason == "dry run: nothing was changed" and dry.report.dry_run
    assert len(dry.report.plan.folded) == 1  # the node counts are the fold's: the dry run says what it would write
    assert dry.report.ops_after.get("SimplifiedLayerNormalization") == 1 and "LayerNormalization" not in dry.report.ops_after


def test_help_and_report_say_which_runtimes_run_each_target():
    """Issue 26: what each target writes and which runtimes run it (measured: core.ops.TARGETS);
    the report says it for the target it folded to, in text and JSON."""
    from onnx_lnfold._cli import build_parser
    from onnx_lnfold.core.ops import TARGETS as DESCRIBED

    help_text = " ".join(build_parser("onnx-lnfold").format_help().split())
    for target in DESCRIBED:
        assert f"{target.name} writes" in help_text and " ".join(target.description.split()) in help_text
        assert "OpenVINO" in target.description and "ONNX Runtime" in target.description
    result = onnx_lnfold.fold(MODELS / "gpt2.onnx", target="primitive", verify=False)
    text = " ".join(result.report.format_text().split())
    primitive = next(t for t in DESCRIBED if t.name == "primitive")
    assert f"Target primitive: {primitive.description}" in text
    assert result.report.to_dict()["target_description"] == primitive.description


# --------------------------------------------------------------------------- one table of options
def test_the_options_table_covers_every_field_once():
    """Every field of the fold's options and of the check's settings (but the report's wording) is
    one row, with its default."""
    from onnx_lnfold.core.options import OPTIONS, CheckSettings, RunShapes

    rows = {option.group: sorted(o.name for o in OPTIONS if o.group == option.group) for option in OPTIONS}
    assert rows["fold"] == sorted(f.name for f in dataclasses.fields(FoldOptions))
    assert rows["check"] == sorted(f.name for f in dataclasses.fields(CheckSettings) if f.name != "disabled_because")
    assert rows["shapes"] == sorted(f.name for f in dataclasses.fields(RunShapes))
    assert len({option.flag for option in OPTIONS}) == len({option.name for option in OPTIONS}) == len(OPTIONS)
    defaults = {**vars(FoldOptions()), **vars(CheckSettings()), **vars(RunShapes())}
    assert all(option.default == defaults[option.name] for option in OPTIONS)


def test_the_command_line_reads_the_options_table():
    """Each option's flag, choices, default and help are the table's; each flag sets its field."""
    from onnx_lnfold._cli import build_parser
    from onnx_lnfold.core.options import OPTIONS, CheckSettings, check_from, options_from

    parser = build_parser("onnx-lnfold")
    actions = {action.dest: action for action in parser._actions}
    for option in OPTIONS:
        action = actions[option.name]
        assert action.option_strings == [option.flag]
        assert action.help.replace("%%", "%") == option.help
        assert action.default == ([] if option.repeated else option.default) and action.choices == option.choices
    defaults = parser.parse_args(["m.onnx"])
    assert options_from(defaults) == FoldOptions() and check_from(defaults) == CheckSettings()
    other = {"target": "onnx", "fuse_residual": "always", "tied_weights": "center", "costs": "c.json", "rtol": 0.5,
             "float64_budget": 7.0, "deployed_check": "always", "input_shapes": {"x": (1, 2), "y": (3,)}, "inputs": "in.npz"}  # fmt: skip
    read = {"fold": options_from, "check": check_from, "shapes": vars}
    for option in OPTIONS:
        value = not option.default if option.kind is bool else other[option.name]
        args = parser.parse_args(["m.onnx", *option.cli_args(value)])
        got = read[option.group](args)
        got = got[option.name] if isinstance(got, dict) else getattr(got, option.name)
        assert (dict(got) if option.repeated else got) == value, option.name


def test_the_olive_pass_reads_the_options_table():
    """Its config is the table's options for Olive (name, type, default, help); without Olive
    installed, its source is read for the same (tests/surface/test_olive.py runs it)."""
    import ast
    import importlib.util

    from onnx_lnfold.core.options import OLIVE_OPTIONS as OPTIONS

    if importlib.util.find_spec("olive") is not None:
        from onnx_lnfold.olive import OnnxLnFold

        config = OnnxLnFold._default_config(None)
        assert set(config) == {option.name for option in OPTIONS}
        for option in OPTIONS:
            param = config[option.name]
            assert (param.type_, param.default_value, param.description) == (option.kind, option.default, option.help)
        return
    source = (Path(onnx_lnfold.__file__).parent / "olive.py").read_text()  # the installed package, where CI tests the wheel
    strings = {node.value for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Constant) and isinstance(node.value, str)}
    assert not strings & {option.name for option in OPTIONS}  # no option spelled out: all from the table
    assert "for option in OLIVE_OPTIONS" in source and "fold_keywords(config)" in source


def test_the_docs_options_table_is_the_options_table():
    """docs/COMMAND_LINE.md's table of the fold's options is `options_markdown()` (regenerate it with
    `python -c 'from onnx_lnfold.core.options import options_markdown; print(options_markdown())'`)."""
    from onnx_lnfold.core.options import options_markdown

    doc = (ROOT / "docs" / "COMMAND_LINE.md").read_text()
    begin, end = "<!-- begin options: core.options.OPTIONS -->\n", "\n<!-- end options -->"
    assert doc[doc.index(begin) + len(begin) : doc.index(end)] == options_markdown()


def test_the_api_signatures_are_the_options_table():
    """`fold()` takes every option of the table as a keyword, `analyze()` and `LnFoldPass()` the
    fold's and the shapes' (they run no check), with the table's defaults."""
    from onnx_lnfold.core.options import OPTIONS

    def keywords(func) -> dict:
        params = inspect.signature(func).parameters.values()
        return {p.name: p.default for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}

    table = {option.name: option.default for option in OPTIONS}
    assert {k: v for k, v in keywords(onnx_lnfold.fold).items() if k in table} == table
    assert set(keywords(onnx_lnfold.fold)) - set(table) == {"options", "output"}
    no_check = {name: default for name, default in table.items() if next(o for o in OPTIONS if o.name == name).group != "check"}
    for func in (onnx_lnfold.analyze, onnx_lnfold.LnFoldPass):
        assert {k: v for k, v in keywords(func).items() if k != "options"} == no_check, func
