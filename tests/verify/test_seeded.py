"""A model that draws random numbers is checked with its random ops seeded alike in both models
(`verify.seeded`): a correct fold passes, a wrong one fails, and the float64 twin declines it with
that reason."""

import numpy as np
import onnx
import onnx_ir as ir
from onnx import TensorProto, helper, numpy_helper

import onnx_lnfold
from onnx_lnfold.verify.seeded import seeded, unseeded_random_ops

D = 16


def _noisy_model(seed: float | None = None) -> onnx.ModelProto:
    """x @ W + b -> LayerNormalization -> @ W2, plus RandomNormalLike noise of the same shape (a
    voice model's noise, drawn after the LN)."""
    rng = np.random.default_rng(0)
    noise_attrs = {"scale": 0.5} | ({"seed": seed} if seed is not None else {})
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"], name="proj"),
        helper.make_node("Add", ["h", "b"], ["hb"], name="bias"),
        helper.make_node("LayerNormalization", ["hb", "gamma", "beta"], ["n"], name="ln", axis=-1),
        helper.make_node("MatMul", ["n", "W2"], ["m"], name="out_proj"),
        helper.make_node("RandomNormalLike", ["m"], ["noise"], name="noise", **noise_attrs),
        helper.make_node("Add", ["m", "noise"], ["y"], name="noisy"),
    ]
    weights = {
        "W": rng.normal(size=(D, D)),
        "b": rng.normal(size=D),
        "gamma": 1 + 0.1 * rng.normal(size=D),
        "beta": 0.1 * rng.normal(size=D),
        "W2": rng.normal(size=(D, D)),
    }
    graph = helper.make_graph(
        nodes,
        "noisy",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", D])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", D])],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_random_ops_are_seeded_alike_from_their_output_names():
    model = _noisy_model()
    assert unseeded_random_ops(ir.from_proto(model)) == {"RandomNormalLike": 1}
    assert not unseeded_random_ops(ir.from_proto(_noisy_model(seed=3.0)))
    copy, note = seeded(model.SerializeToString())
    seeds = [a.f for n in onnx.load_from_string(copy).graph.node for a in n.attribute if a.name == "seed"]
    assert len(seeds) == 1 and "1 RandomNormalLike without a seed" in note
    assert seeded(model.SerializeToString())[0] == copy  # the same seed for the same output, every time
    assert seeded(_noisy_model(seed=3.0).SerializeToString()) == (_noisy_model(seed=3.0).SerializeToString(), "")


def test_a_model_drawing_random_numbers_is_verified_with_its_draws_alike():
    result = onnx_lnfold.fold(_noisy_model(), fold_costly=True)  # at d=16 the fold costs more
    verification = result.report.verification
    assert [d.node for d in result.plan.folded] == ["ln"]
    assert verification.status == "passed", verification.reason
    assert any("seeded alike" in note for note in verification.notes)
    assert "draws the random numbers of RandomNormalLike" in verification.judgment_reason


def test_the_seeded_copies_draw_the_same_numbers():
    """What the check compares: the original and the fold, each seeded, in ONNX Runtime, agree to
    float noise; the same original with another seed is far off (the noise is no small part)."""
    import onnxruntime as ort

    model = _noisy_model()
    folded = onnx_lnfold.fold(model, verify=False, fold_costly=True).model_proto.SerializeToString()
    x = {"x": np.random.default_rng(1).normal(size=(2, 5, D)).astype(np.float32)}

    def run(source: bytes) -> np.ndarray:
        return ort.InferenceSession(source, providers=["CPUExecutionProvider"]).run(None, x)[0]

    original = run(seeded(model.SerializeToString())[0])
    scale = np.abs(original).max()
    assert np.abs(run(seeded(folded)[0]) - original).max() / scale < 1e-5
    assert np.abs(run(_noisy_model(seed=3.0).SerializeToString()) - original).max() / scale > 0.1
