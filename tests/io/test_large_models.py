"""Models with external data: streamed, written beside the output, safely, the same bytes every time.

The models come from `models/make/make_large_model.py` (GPT-2-style pre-LN, random weights): a few MB
here; the > 2 GB one is `slow` (run with --runslow).
"""

import hashlib
import io
import os

import numpy as np
import onnx
import onnx_ir as ir
import pytest

import onnx_lnfold
from onnx_lnfold.core.progress import Progress
from onnx_lnfold.save import staged
from onnx_lnfold.verify.sessions import run_model

from helpers import make_large_model, relocate_external_data
from helpers import run_cli as _cli

SMALL = dict(hidden=64, layers=3, vocab=256, positions=64)  # ~1.3 MB of weights


def _digest(*paths):
    return [hashlib.sha256(p.read_bytes()).hexdigest() for p in paths]


def _locations(path):
    proto = onnx.load(path, load_external_data=False)
    return {
        e.value
        for init in proto.graph.initializer
        if init.data_location == onnx.TensorProto.EXTERNAL
        for e in init.external_data
        if e.key == "location"
    }


def _outputs(path, ids):
    return run_model(str(path), {"input_ids": ids})


IDS = np.random.default_rng(0).integers(0, 256, size=(2, 8)).astype(np.int64)


@pytest.fixture
def model(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    return make_large_model.make_model(folder / "m.onnx", **SMALL)


def test_generator_is_deterministic_and_external(tmp_path):
    a = make_large_model.make_model(tmp_path / "a.onnx", **SMALL)
    b = make_large_model.make_model(tmp_path / "b.onnx", **SMALL)
    assert _digest(tmp_path / "a.onnx.data") == _digest(tmp_path / "b.onnx.data")
    assert _locations(a) == {"a.onnx.data"} and _locations(b) == {"b.onnx.data"}
    size = (tmp_path / "a.onnx.data").stat().st_size
    assert 0.98 * make_large_model.weight_bytes(**SMALL) <= size <= make_large_model.weight_bytes(**SMALL)  # tiny ones inline


def test_fold_keeps_untouched_weights_external_and_materializes_only_edits(model):
    result = onnx_lnfold.fold(model)
    assert result.report.verification.status == "passed"
    edited = {e.tensor for e in result.plan.edits} | {e.new_name for e in result.plan.edits if e.new_name}
    assert edited  # wte, wpe, each block's fc2 weight and bias
    for name, value in result.model.graph.initializers.items():
        tensor = value.const_value
        if isinstance(tensor, ir.ExternalTensor):
            assert name not in edited
            assert tensor.path == str(model.with_name("m.onnx.data"))
        elif tensor.nbytes > 4096:  # small tensors (biases with beta folded in) may be rewritten too
            assert name in edited, name


def test_api_save_writes_data_beside_the_output_and_rebinds(model, tmp_path):
    result = onnx_lnfold.fold(model, verify=False)
    out = tmp_path / "out" / "f.onnx"
    out.parent.mkdir()
    result.save(out)
    assert sorted(os.listdir(out.parent)) == ["f.onnx", "f.onnx.data"]
    assert _locations(out) == {"f.onnx.data"}
    # the model now reads its weights from what was written, so it stays valid whatever happens to the input
    externals = [v.const_value for v in result.model.graph.initializers.values() if isinstance(v.const_value, ir.ExternalTensor)]
    assert externals and all(t.path == str(out.with_name("f.onnx.data")) for t in externals)
    ref = _outputs(model, IDS)["logits"]
    np.testing.assert_allclose(_outputs(out, IDS)["logits"], ref, rtol=1e-4, atol=1e-5)


def test_cli_output_is_verified_beside_the_output_and_input_untouched(model, tmp_path):
    before = _digest(model, model.with_name("m.onnx.data"))
    out = tmp_path / "out.onnx"
    code, stdout, err = _cli(model, "-o", out)
    assert code == 0, err
    assert "Verification (passed" in stdout and err == ""  # stderr is not a terminal: no progress bar
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "out.onnx", "out.onnx.data"]
    assert sorted(os.listdir(model.parent)) == ["m.onnx", "m.onnx.data"]
    assert _digest(model, model.with_name("m.onnx.data")) == before
    assert _locations(out) == {"out.onnx.data"}
    np.testing.assert_allclose(_outputs(out, IDS)["logits"], _outputs(model, IDS)["logits"], rtol=1e-4, atol=1e-5)


def test_existing_output_is_replaced_whole_or_not_at_all(model, tmp_path):
    out = tmp_path / "out.onnx"
    out.write_bytes(b"old model")
    out.with_name("out.onnx.data").write_bytes(b"old data")
    code, _, err = _cli(model, "-o", out, "--rtol", "1e-30")  # verification fails: nothing may change
    assert code == 1, err
    assert out.read_bytes() == b"old model" and out.with_name("out.onnx.data").read_bytes() == b"old data"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "out.onnx", "out.onnx.data"]
    code, _, err = _cli(model, "-o", out, "-q")
    assert code == 0, err
    assert _locations(out) == {"out.onnx.data"} and out.with_name("out.onnx.data").stat().st_size > 100_000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "out.onnx", "out.onnx.data"]


def test_relative_paths_and_default_output(model):
    code, _, err = _cli("m.onnx", "-q", cwd=model.parent)
    assert code == 0, err
    assert sorted(os.listdir(model.parent)) == ["m.lnfold.onnx", "m.lnfold.onnx.data", "m.onnx", "m.onnx.data"]
    assert _locations(model.with_name("m.lnfold.onnx")) == {"m.lnfold.onnx.data"}


def test_in_place_with_external_data(model, tmp_path):
    ref = _outputs(model, IDS)["logits"]
    data = model.with_name("m.onnx.data")
    old = data.read_bytes()
    code, out, err = _cli(model, "--in-place", "--fold-costly")  # (ln_f's beta stays an Add)
    assert code == 0, err
    assert sorted(os.listdir(model.parent)) == ["m.onnx", "m.onnx.data"]  # no temp files left
    assert data.read_bytes() != old and _locations(model) == {"m.onnx.data"}
    assert not any(n.op_type == "LayerNormalization" for n in onnx.load(model, load_external_data=False).graph.node)
    np.testing.assert_allclose(_outputs(model, IDS)["logits"], ref, rtol=1e-4, atol=1e-5)


def test_in_place_with_another_data_file_name_leaves_it_and_says_so(model):
    folder = model.parent
    os.replace(folder / "m.onnx.data", folder / "weights.bin")
    relocate_external_data(model, "weights.bin")
    code, out, err = _cli(model, "--in-place")
    assert code == 0, err
    assert sorted(os.listdir(folder)) == ["m.onnx", "m.onnx.data", "weights.bin"]
    assert "weights.bin is no longer used by m.onnx" in out


def test_api_in_place_save_leaves_a_consistent_model(model):
    """Saving over the input while the model still reads it: the data file is replaced only after
    it has been read, and the returned model reads the new file."""
    ref = _outputs(model, IDS)["logits"]
    result = onnx_lnfold.fold(model)
    result.save(model)
    np.testing.assert_allclose(_outputs(model, IDS)["logits"], ref, rtol=1e-4, atol=1e-5)
    again = model.with_name("again.onnx")
    result.save(again)  # from the rebound tensors: same bytes as the first save
    assert model.with_name("again.onnx.data").read_bytes() == model.with_name("m.onnx.data").read_bytes()


def test_api_save_never_writes_over_the_input_s_external_data(model):
    """x.onnx keeps its weights in y.onnx.data: saving the fold as y.onnx would replace them (the
    command line refuses it; so does save(), with the same check and words)."""
    folder = model.parent
    os.replace(folder / "m.onnx.data", folder / "y.onnx.data")
    relocate_external_data(model, "y.onnx.data")
    before = _digest(model, folder / "y.onnx.data")
    result = onnx_lnfold.fold(model, verify=False)
    with pytest.raises(onnx_lnfold.InvalidInput, match="its data file y.onnx.data would overwrite the input's external data file"):
        result.save(folder / "y.onnx")
    with pytest.raises(onnx_lnfold.InvalidInput, match="would overwrite the input's external data file"):
        result.save(folder / "y.onnx.data")
    assert sorted(os.listdir(folder)) == ["m.onnx", "y.onnx.data"] and _digest(model, folder / "y.onnx.data") == before


@pytest.mark.parametrize("tie_head", [False, True])
def test_same_input_same_bytes(tmp_path, tie_head):
    src = make_large_model.make_model(tmp_path / "m.onnx", tie_head=tie_head, **SMALL)
    outs = []
    for name in ("a", "b"):
        out = tmp_path / name / "f.onnx"
        out.parent.mkdir()
        assert _cli(src, "-o", out, "-q")[0] == 0
        outs.append(_digest(out, out.with_name("f.onnx.data")))
    assert outs[0] == outs[1]
    api = tmp_path / "api" / "f.onnx"
    api.parent.mkdir()
    onnx_lnfold.fold(src, verify=False).save(api)
    # The same weights and graph; what the model says of the fold differs (its check did not run).
    assert _digest(api.with_name("f.onnx.data")) == outs[0][1:]
    said = {p.key: p.value for p in onnx.load(api, load_external_data=False).metadata_props}
    assert said["onnx_lnfold.verification"].startswith("skipped: ")
    assert _without_metadata(api) == _without_metadata(tmp_path / "a" / "f.onnx")


def _without_metadata(path) -> bytes:
    proto = onnx.load(path, load_external_data=False)
    proto.ClearField("metadata_props")
    return proto.SerializeToString()


def test_inline_model_over_the_protobuf_limit_goes_to_external_data(tmp_path, monkeypatch):
    src = make_large_model.make_model(tmp_path / "inline.onnx", external=False, **SMALL)
    monkeypatch.setattr(staged, "_PROTO_LIMIT", 100_000)  # stands in for 2 GB
    result = onnx_lnfold.fold(src, verify=False)
    result.save(tmp_path / "o.onnx")
    assert _locations(tmp_path / "o.onnx") == {"o.onnx.data"}
    np.testing.assert_allclose(_outputs(tmp_path / "o.onnx", IDS)["logits"], _outputs(src, IDS)["logits"], rtol=1e-4, atol=1e-5)


def test_progress_bar_draws_only_on_a_terminal():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    tty, pipe = Tty(), io.StringIO()
    for stream in (tty, pipe):
        p = Progress(stream=stream)
        cb = p.save_callback("Writing x.data", 3000)
        for n in (1000, 1000, 1000):
            cb(type("T", (), {"nbytes": n})(), None)
        p.finish()
        p.close()
    assert pipe.getvalue() == ""
    assert "Writing x.data [" in tty.getvalue() and "100%" in tty.getvalue() and "3.0 KB / 3.0 KB" in tty.getvalue()
    assert Progress(enabled=False, stream=tty).enabled is False


# --- > 2 GB ---------------------------------------------------------------------------------------

BIG = dict(hidden=2048, layers=12, vocab=50257, positions=1024)  # 2.4 GB of float32 weights


@pytest.mark.slow
def test_model_over_2gb_folds_verifies_and_is_written_beside_the_output(tmp_path):
    assert make_large_model.weight_bytes(**BIG) > 2**31
    src = make_large_model.make_model(tmp_path / "big.onnx", **BIG)
    out = tmp_path / "out" / "big.lnfold.onnx"
    out.parent.mkdir()
    code, stdout, err = _cli(src, "-o", out, "--json", tmp_path / "r.json")
    assert code == 0, err
    assert "13 folded, 0 kept" in stdout and "Verification (passed" in stdout
    assert sorted(os.listdir(out.parent)) == ["big.lnfold.onnx", "big.lnfold.onnx.data"]
    assert _locations(out) == {"big.lnfold.onnx.data"}
    assert out.with_name("big.lnfold.onnx.data").stat().st_size > 0.99 * make_large_model.weight_bytes(**BIG)


def test_a_sigterm_ends_the_run_as_a_ctrl_c_does_its_staged_output_removed(tmp_path):
    """`timeout`, a job scheduler or `kill` end a run with SIGTERM: it unwinds as from a Ctrl-C (one
    line, exit 143), the staged output removed, not left for the next run to sweep."""
    import signal
    import subprocess
    import sys
    import time

    src = make_large_model.make_model(tmp_path / "m.onnx", hidden=256, layers=6, vocab=4096, positions=256)
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "onnx_lnfold", str(src), "-o", str(out / "f.onnx")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while proc.poll() is None and not list(out.glob(".lnfold-staging-*")):  # the output being staged
        time.sleep(0.002)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, f"ended {proc.returncode} before or despite the signal: {err[-2000:]}"
    assert err.splitlines()[-1] == "onnx_lnfold: terminated; nothing written"
    assert list(out.iterdir()) == []


_SLOW_FUSION_CHECK = """
import sys, time
import onnx_lnfold
from onnx_lnfold.ort_fusions import weightless

written = weightless.WeightlessFolder.write

def write_then_wait(self, model, name):  # as ONNX Runtime's optimizer would, reading the copy
    path = written(self, model, name)
    print(self.path, flush=True)
    time.sleep(120)
    return path

weightless.WeightlessFolder.write = write_then_wait
onnx_lnfold.fold(sys.argv[1])
"""


def test_a_sigterm_during_the_api_call_leaves_no_temporary_folder(tmp_path):
    """A program calling fold() ended by SIGTERM: the call's weightless copies are removed and
    the process still ends by the signal (Python's default would leave them)."""
    import signal
    import subprocess
    import sys

    src = make_large_model.make_model(tmp_path / "m.onnx", **SMALL)
    temp = tmp_path / "temp"
    temp.mkdir()
    env = {**os.environ, "TMPDIR": str(temp)}
    proc = subprocess.Popen([sys.executable, "-c", _SLOW_FUSION_CHECK, str(src)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    folder = proc.stdout.readline().strip()  # the weightless copy is written: the check is on
    assert folder.startswith(str(temp / "lnfold-weightless-")), proc.communicate(timeout=120)[1][-2000:]
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGTERM, err[-2000:]
    assert [p.name for p in temp.iterdir() if "lnfold" in p.name] == []


def test_the_api_sets_no_sigterm_handler_of_its_own_beyond_its_call():
    import signal
    import threading

    from onnx_lnfold.io import scratch

    with scratch.removed_on_sigterm():
        assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    seen = []

    def elsewhere():  # no handler can be set off the main thread: nothing changes
        with scratch.removed_on_sigterm():
            seen.append(signal.getsignal(signal.SIGTERM))

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join()
    assert seen == [signal.SIG_DFL]
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a program's own choice is kept
    try:
        with scratch.removed_on_sigterm():
            assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_what_a_killed_run_left_is_removed_by_the_next_and_said(tmp_path):
    """A run killed by the kernel (SIGKILL) cannot clean up its staged output: the next run in
    that folder removes it (its process is gone), says so, and leaves live runs' folders alone."""
    import signal
    import subprocess
    import sys

    src = make_large_model.make_model(tmp_path / "m.onnx", **SMALL)
    out = tmp_path / "out"
    out.mkdir()
    code = (
        "import os, signal, sys; from pathlib import Path; from onnx_lnfold.io import scratch; "
        "d = scratch.make('staging', sys.argv[1], hidden=True); (d / 'm.onnx.data').write_bytes(b'x' * 4096); "
        "print(d); os.kill(os.getpid(), signal.SIGKILL)"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL
    (left,) = [p for p in out.iterdir()]
    assert left.name.startswith(".lnfold-staging-") and left.is_dir()
    from onnx_lnfold.io import scratch

    live = scratch.make("staging", out, hidden=True)  # this process's own: alive, kept
    code, text, err = _cli(src, "-o", out / "f.onnx", "--no-verify")
    assert code == 0, err
    assert not left.exists() and live.exists()
    assert f"removed {left} " in " ".join(text.split()) and "left by an interrupted run" in text
