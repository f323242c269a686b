"""What the check feeds a model it synthesizes inputs for: the batch retried at 1 where an export
bakes it in, values in a parameter input's domain, and inputs beyond the budget refused before
anything is allocated."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import onnx_lnfold
from onnx_lnfold.feeds.sets import RETRY_BATCH, verification_input_sets

from graphs import Graph
from helpers import run_cli


def _baked_batch(batch_shape=("batch", "seq", 8)) -> onnx.ModelProto:
    """Declares the batch dynamic, but a Reshape bakes in batch 1 (as some exports do)."""
    g = Graph()
    x = g.input("x", list(batch_shape))
    baked = g.node("Reshape", [g.linear(x, 8, 8, "proj"), g.ints("shape1", [1, -1, 8])])
    h = g.node("Add", [baked, g.linear(x, 8, 8, "side", bias=False)])
    g.output(g.linear(g.ln(h, 8, "ln"), 8, 4, "head"))
    return g.model()


def test_a_batch_baked_in_is_found_and_said():
    result = onnx_lnfold.fold(_baked_batch())
    verification = result.report.verification
    assert verification.status == "passed" and len(result.plan.folded) == 1
    assert verification.input_shapes == {"x": [1, 8, 8]}
    assert f"checked at batch {RETRY_BATCH}" in " ".join(verification.notes)
    assert "batch 1" in "\n".join(result.report.format_text().splitlines())


def test_no_retry_where_no_dim_takes_the_batch():
    # the batch fixed at 1 by the graph: the sets are as before, with no retry to try
    sets = verification_input_sets(onnx_lnfold_ir(_baked_batch((1, "seq", 8))))
    assert all(not s.at_retry_batch for s in sets)
    sets = verification_input_sets(onnx_lnfold_ir(_baked_batch()))
    assert [tuple(s.at_retry_batch[0]["x"].shape) for s in sets if s.at_retry_batch] == [(1, 8, 8), (1, 5, 8)]


def onnx_lnfold_ir(proto: onnx.ModelProto):
    import onnx_ir as ir

    return ir.from_proto(proto)


# --------------------------------------------------------------------------- parameters of the run
def _tts_like() -> onnx.ModelProto:
    """A scalar `speed` sets the output's length (Tile by ceil(4 * speed)); a style vector is added
    to the stream: N(0, 1) speeds of 0 or less tile nothing or fail."""
    g = Graph()
    h = g.node("Add", [g.linear(g.input("x", [1, "seq", 8]), 8, 8, "proj"), g.linear(g.input("style", [1, 8]), 8, 8, "style")])
    y = g.linear(g.ln(h, 8, "ln"), 8, 4, "head")
    reps = g.node("Cast", [g.node("Ceil", [g.node("Mul", [g.input("speed", []), g.const("four", value=4.0)])])], to=7)
    one = g.ints("one", [1])
    tiles = g.node("Concat", [one, g.node("Reshape", [reps, one]), one], axis=0)
    g.output(g.node("Tile", [y, tiles]))
    return g.model()


def test_parameters_of_the_run_are_drawn_in_their_domain():
    for s in verification_input_sets(onnx_lnfold_ir(_tts_like())):
        speed, style, x = s.feeds["speed"], s.feeds["style"], s.feeds["x"]
        assert speed.shape == () and speed.dtype == np.float32 and 0.8 <= float(speed) <= 1.25 and float(speed) != 1
        assert style.shape == (1, 8) and 0.2 < np.std(style) < 1.0  # a modest scale, not unit variance
        assert x.shape[1] > 1 and np.std(x) > 0.7  # the data stays N(0, 1)
    result = onnx_lnfold.fold(_tts_like())
    assert result.report.verification.status == "passed" and len(result.plan.folded) == 1


def test_a_sensitivity_probe_the_original_fails_falls_back_to_rtol(monkeypatch):
    """The perturbed original (the probe of its own float32 noise) fails on its last set, or comes
    out another length (a duration it rounds from its weights): rtol alone, said, and no measure
    from the sets it ran on loosens the tolerance."""
    from onnx_lnfold.verify.judges import sensitivity
    from onnx_lnfold.verify.verdict import RTOL_ONLY

    real = sensitivity.run_sets

    def probe(session, feeds_list):
        results = real(session, feeds_list)
        results[-1] = ValueError("Incompatible dimensions for broadcasting")
        return results

    monkeypatch.setattr(sensitivity, "run_sets", probe)
    result = onnx_lnfold.fold(_tts_like(), float64_budget=0)
    verification = result.report.verification
    assert verification.status == "passed" and verification.judgment == RTOL_ONLY
    assert "the original's sensitivity could not be measured: Incompatible dimensions" in verification.judgment_reason
    assert all(o.sensitivity is None for o in verification.outputs)
    assert "no float64 reference and no sensitivity" in result.report.format_text()

    def reshaped(session, feeds_list):
        results = real(session, feeds_list)
        results[1] = {k: np.concatenate([v, v], axis=1) for k, v in results[1].items()}
        return results

    monkeypatch.setattr(sensitivity, "run_sets", reshaped)
    verification = onnx_lnfold.fold(_tts_like(), float64_budget=0).report.verification
    assert verification.judgment == RTOL_ONLY and "with its weights perturbed" in verification.judgment_reason


# --------------------------------------------------------------------------- the budget
def _declared_tokens(tokens) -> onnx.ModelProto:
    g = Graph()
    g.output(g.linear(g.ln(g.linear(g.input("x", [1, tokens, 16]), 16, 16, "proj"), 16, "ln"), 16, 4, "head"))
    return g.model()


def test_an_input_declared_beyond_the_budget_is_refused_with_the_sizes_to_check_it_at(tmp_path):
    from onnx_lnfold.feeds.budget import MAX_INPUT_BYTES, InputTooLarge

    model = _declared_tokens(1 << 31)
    for call in (onnx_lnfold.fold, onnx_lnfold.analyze):
        with pytest.raises(onnx_lnfold.InvalidInput) as info:
            call(model)
        assert str(info.value) == (
            "graph input 'x' is declared [1, 2147483648, 16]: 128 GiB of float32, over the 256 MiB a verification "
            "input may take; declare its dim 1 symbolic and pass input_shapes={'x': (1, 64, 16)} (--input-shape "
            "x:1,64,16 on the command line), or verify=False to accept an unverified model"
        )
    assert MAX_INPUT_BYTES == 256 << 20 and isinstance(info.value, InputTooLarge)
    # Unchecked, nothing is synthesized: nothing to refuse.
    assert len(onnx_lnfold.fold(model, verify=False).plan.folded) == 1
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    code, out, err = run_cli(path, "-o", tmp_path / "o.onnx")
    assert code == 2 and err.strip().splitlines() == [
        "onnx_lnfold: error: graph input 'x' is declared [1, 2147483648, 16]: 128 GiB of float32, over the 256 MiB a "
        "verification input may take; declare its dim 1 symbolic and pass --input-shape x:1,64,16, or accept an "
        "unverified model with --no-verify"
    ]
    # The way out works: the dim symbolic, the sizes given.
    result = onnx_lnfold.fold(_declared_tokens("tokens"), input_shapes={"x": (1, 64, 16)})
    assert result.report.verification.status == "passed"


def test_sizes_given_beyond_the_budget_are_refused_before_any_is_allocated():
    with pytest.raises(onnx_lnfold.InvalidInput) as info:
        onnx_lnfold.fold(_declared_tokens("tokens"), input_shapes={"x": (1, 10**9, 16)})
    assert str(info.value).startswith(
        "graph input 'x' is declared [1, tokens, 16], at (1, 1000000000, 16): 59.6 GiB of float32, over the 256 MiB "
        "a verification input may take; pass input_shapes={'x': (1, 64, 16)}"
    )
