"""The mutation campaign's CI subset (benchmarks.mutation; the whole campaign is
`python -m benchmarks.mutation`): one fault injected after the apply step, through every judgment path (block by block too),
judged independently in float64. No fault that matters passes as verified; controls pass; a fault
a model has no site for is counted as not injectable, not as caught."""

import pytest

from benchmarks import mutation

from conftest import MODELS

SUBSET = {
    "gpt2": ["gamma-1e-5", "epsilon-x10", "beta-left-out", "centering-dropped"],
    "bert": ["offset-1e-6", "centering-dropped", "wrong-axis"],
}


@pytest.mark.parametrize("model", sorted(SUBSET))
def test_no_fault_that_matters_passes_on_any_judgment_path(model):
    mutants = mutation.campaign_for(MODELS / f"{model}.onnx", ["control", *SUBSET[model]], log=lambda line: None)
    table = mutation.tally(mutants)
    assert set(table) == {"default", "float64_budget=0", "default, block by block"}
    for judgment, row in table.items():
        assert row["controls_passed"] == row["controls"] == 1, judgment
        assert row["matter"] > 0 and row["passed"] == 0 and row["caught"] == row["matter"], (judgment, row)
    injected = {m.fault for m in mutants if m.injected is not None}
    if model == "gpt2":  # GPT-2 folds without an explicit centering: nothing to drop
        assert "centering-dropped" not in injected and table["default"]["not_injectable"] == 1
    else:
        assert injected == {"control", *SUBSET[model]}
    for m in mutants:
        if m.fault != "control" and m.injected is not None and m.status == "failed":
            assert m.reason, m  # every refusal says why
