"""Every hostile model of hostile_models.py through the command line and the API, each in its own
process: the exit the case is owed, one line in the tool's words, the input untouched, nothing left
behind or written for a refusal, and the run's peak memory under 1 GB. Time is the benchmark's to
judge (`python -m benchmarks.hostile`), not a unit test's; a run past 120 s is killed and fails."""

import pytest

from benchmarks import hostile

import hostile_models


@pytest.mark.parametrize("surface", ["cli", "api"])
@pytest.mark.parametrize("case", hostile_models.CASES, ids=lambda c: c.name)
def test_hostile_model(case, surface, tmp_path):
    run = hostile.run_case(case, surface, tmp_path, timeout=120)
    assert not hostile.shortfalls(case, run, timed=False), run


def test_the_api_and_the_command_line_say_the_same_sentence(tmp_path):
    """The API raises the sentence the command line prints after 'onnx_lnfold: error: '."""
    case = hostile_models.case("negative-dims")
    cli = hostile.run_case(case, "cli", tmp_path / "cli", timeout=120)
    api = hostile.run_case(case, "api", tmp_path / "api", timeout=120)
    assert cli.line.removeprefix("onnx_lnfold: error: ") == api.line.removeprefix("InvalidInput: ")
