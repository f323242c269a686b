"""The docs' facts that a run can check: the folders and modules they name, the JSON keys, the
pipeline models' fold counts, the subcommands' help."""

import re
from pathlib import Path

import pytest

import onnx_lnfold

from conftest import MODELS, ROOT

DOCS = {path.relative_to(ROOT).as_posix(): path.read_text() for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]}


# Folders the docs name that a command makes rather than the checkout holds.
_MADE_FOLDERS = {"models/trained/"}


@pytest.mark.parametrize("name", sorted(DOCS))
def test_the_folders_and_modules_the_docs_name_exist(name):
    """A `folder/` or `package.module` in backticks names something in the checkout (a renamed
    folder left `_forms/` in two docs)."""
    package = Path(onnx_lnfold.__file__).parent  # the installed package where CI tests the wheel
    steps = {p.name for p in package.iterdir() if (p / "__init__.py").is_file()} | {p.stem for p in package.glob("_*.py")}
    text = DOCS[name]
    missing = [
        folder
        for folder in set(re.findall(r"`([A-Za-z_][\w./-]*/)`", text)) - _MADE_FOLDERS
        if not ((ROOT / folder).is_dir() or (package / folder).is_dir() or (package.parent / folder).is_dir())
    ]
    for dotted in set(re.findall(r"`([a-z_]+(?:\.[a-z_]+)+)`", text)):
        parts = dotted.removeprefix("onnx_lnfold.").split(".")
        if parts[0] not in steps:
            continue  # not one of the package's modules (numpy.float64, onnx.reference, ...)
        # The module itself, or a name in the module its prefix names.
        if not any(package.joinpath(*parts[:n]).with_suffix(".py").is_file() or package.joinpath(*parts[:n]).is_dir() for n in (len(parts), len(parts) - 1) if n):
            missing.append(dotted)
    assert not missing, f"{name} names what the checkout does not hold: {sorted(missing)}"


def test_the_json_keys_are_all_in_report_md(tmp_path):
    """docs/REPORT.md lists every key `--json` writes (it missed `costs`, `cost_note`, `priced_at`)."""
    result = onnx_lnfold.fold(MODELS / "bert.onnx")  # priced at the default: explicit centerings too
    data = result.report.to_dict()
    keys = set(data) | set(data["verification"]) | set(data["verification"]["outputs"][0])
    for part in ("decisions", "edits", "centerings"):
        assert data[part], part  # the model has some of each, so each one's keys are checked
        keys |= set(data[part][0])
    doc = DOCS["docs/REPORT.md"].split("## The JSON report", 1)[1]
    assert not [key for key in sorted(keys) if not re.search(rf"\b{key}\b", doc)]


def test_the_optimizer_first_keys_are_in_report_md():
    """The keys of `optimizer_first`, which `bert.onnx` above leaves null."""
    facts = onnx_lnfold.analyze(MODELS / "gpt_neo.onnx").to_dict()["optimizer_first"]
    doc = DOCS["docs/REPORT.md"].split("## The JSON report", 1)[1]
    assert facts and not [key for key in sorted(facts) if not re.search(rf"\b{key}\b", doc)]


def test_the_float_first_keys_are_in_report_md():
    """The keys of `float_first`, which a float model leaves null."""
    facts = onnx_lnfold.analyze(MODELS / "bert_qdq_int8.onnx").to_dict()["float_first"]
    doc = DOCS["docs/REPORT.md"].split("## The JSON report", 1)[1]
    assert facts and not [key for key in sorted(facts) if not re.search(rf"\b{key}\b", doc)]


def _pipeline_rows() -> dict[str, tuple[str, str]]:
    """PIPELINES.md's fold-count table: committed model -> (foldable, default) counts `N/M`."""
    rows = {}
    for line in DOCS["docs/PIPELINES.md"].splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        name = re.search(r"\(`(\w+)`\)", cells[0]) if len(cells) == 3 else None
        if name:
            rows[name.group(1)] = tuple(re.match(r"\d+/\d+", cell).group(0) for cell in cells[1:])
    return rows


PIPELINE_ROWS = _pipeline_rows()


def test_pipelines_md_lists_the_pipeline_models():
    assert len(PIPELINE_ROWS) >= 12 and {"swin_torchscript", "wav2vec2_stable"} <= set(PIPELINE_ROWS)


@pytest.mark.parametrize("name", sorted(PIPELINE_ROWS))
def test_pipelines_md_fold_counts_are_measured(name):
    """Each row's `foldable` (`--fold-costly`) and `default` counts are today's plans, no inputs given
    (Swin's and Wav2Vec2's had gone stale)."""
    measured = []
    for costly in (True, False):
        plan = onnx_lnfold.analyze(MODELS / f"{name}.onnx", fold_costly=costly)
        measured.append(f"{len(plan.folded)}/{len(plan.decisions)}")
    assert tuple(measured) == PIPELINE_ROWS[name]


def test_subcommand_help_prints_no_doubled_percent(capsys):
    """argparse formats `%` in help strings, never in a raw description: `95%%` printed as is."""
    from onnx_lnfold.bench.cli import main

    for sub in ("bench", "calibrate"):
        with pytest.raises(SystemExit):
            main([sub, "--help"], prog="onnx-lnfold")
        printed = capsys.readouterr().out
        assert printed and "%%" not in printed, sub


def test_pyproject_says_how_to_get_the_cpu_torch():
    """PyPI's torch for Linux is the CUDA build, whatever the pin: the comments name PyTorch's CPU
    index instead of claiming the pin takes the CPU build."""
    text = (ROOT / "pyproject.toml").read_text()
    pins = set(re.findall(r'"torch==([\d.]+)"', text))
    assert len(pins) == 1, pins  # one version everywhere, so one install line serves every extra
    assert f"pip install torch=={pins.pop()} --index-url https://download.pytorch.org/whl/cpu" in text
    assert "pin takes the CPU build" not in text
