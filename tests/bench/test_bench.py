"""`onnx-lnfold bench` (onnx_lnfold/bench/compare.py), rehearsed on the CPU provider: both controls,
intervals, a verdict in words, the normalizations' kernel time; a provider the session did not get is
refused, never timed elsewhere; a model file named `bench` is still a model to fold."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import onnxruntime as ort
import pytest

from onnx_lnfold.bench import compare, stats
from onnx_lnfold.bench.placement import PlacementError

from conftest import MODELS, ROOT

CPU_ONLY = "CUDAExecutionProvider" not in ort.get_available_providers()
_ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def _cli(cwd, *args):
    proc = subprocess.run([sys.executable, "-m", "onnx_lnfold", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=_ENV)
    return proc.returncode, proc.stdout, proc.stderr


@pytest.fixture(scope="module")
def gpt2_pair(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pair")
    folded = folder / "gpt2.lnfold.onnx"
    code, _, err = _cli(folder, MODELS / "gpt2.onnx", "-o", folded, "-q", "--no-verify")
    assert code == 0, err
    return MODELS / "gpt2.onnx", folded


def test_bench_on_gpt2_reports_both_controls_a_verdict_and_the_norms_kernel_time(gpt2_pair, tmp_path):
    original, folded = gpt2_pair
    np.savez(tmp_path / "feeds.npz", input_ids=np.arange(32, dtype=np.int64).reshape(1, 32) % 100)
    code, out, err = _cli(tmp_path, "bench", original, folded, "--inputs", tmp_path / "feeds.npz", "--processes", 2,
                          "--rounds", 3, "--warmup", 1, "--threads", 1, "--json", tmp_path / "b.json")
    assert code == 0, err
    assert "on CPUExecutionProvider, 1 intra-op thread(s)" in out
    assert f"inputs: input_ids(1, 32) (from {tmp_path / 'feeds.npz'})" in out
    for line in ("original / folded    x", "re-saved / folded    x", "original / re-saved  x"):
        assert line in out
    verdict = next(line for line in out.splitlines() if line.startswith("verdict: "))
    assert verdict.split(":")[1].strip() in (compare.FASTER, compare.SLOWER, compare.UNRESOLVED)
    assert "LayerNormalization" in out and "SimplifiedLayerNormalization" in out and "normalizations" in out
    result = json.loads((tmp_path / "b.json").read_text())
    assert result["processes"] == 2 and set(result["timing"]["times_s"]) == {"original", "resaved", "folded"}
    assert all(len(t) == 3 for ts in result["timing"]["times_s"].values() for t in ts)  # 2 processes x 3 rounds
    assert result["profile"]["folded"].get("LayerNormalization", 0.0) == 0.0  # every LN folded
    assert result["profile"]["folded"]["SimplifiedLayerNormalization"] > 0
    # the graphs ONNX Runtime runs: outside the normalizations, the fold runs the original's nodes
    split = result["split"]
    assert split["only_original"] == split["only_folded"] == {} and split["shared_nodes"] > 0
    assert all(us > 0 for us in split["changed_us"] + split["shared_us"])
    assert f"the graphs ONNX Runtime runs: {split['shared_nodes']} nodes in both" in out


def test_synthesized_inputs_say_so_and_how_to_give_real_ones(gpt2_pair, tmp_path):
    original, folded = gpt2_pair
    result = compare.bench(str(original), str(folded), processes=2, rounds=2, warmup=1, threads=1, profile=False)
    assert result.inputs == {"input_ids": [1, 64]} and "give --inputs FILE.npz" in result.inputs_from
    assert "profile" not in result.format_text()


def test_the_verdict_needs_both_controls():
    def r(lo, hi):
        return {"ratio": (lo + hi) / 2, "lo": lo, "hi": hi}

    assert compare.verdict({"original/folded": r(1.02, 1.05), "resaved/folded": r(1.01, 1.04)})[0] == compare.FASTER
    assert compare.verdict({"original/folded": r(0.9, 0.95), "resaved/folded": r(0.92, 0.99)})[0] == compare.SLOWER
    word, why = compare.verdict({"original/folded": r(1.02, 1.05), "resaved/folded": r(0.99, 1.03)})
    assert word == compare.UNRESOLVED and "what differs is the re-save, not the fold" in why
    word, why = compare.verdict({"original/folded": r(0.98, 1.02), "resaved/folded": r(0.97, 1.01)})
    assert word == compare.UNRESOLVED and "resolve changes beyond about +-2.0%" in why and "both intervals contain 1" in why
    word, why = compare.verdict({"original/folded": r(0.98, 1.005), "resaved/folded": r(0.98, 0.999)})
    assert word == compare.UNRESOLVED and why.startswith("the folded model is slower than its re-saved copy, but not")
    # two processes of three rounds: a bootstrap interval of the median is the samples' own range
    word, why = compare.verdict({"original/folded": r(1.02, 1.05), "resaved/folded": r(1.01, 1.04)}, 2, 3)
    assert word == compare.UNRESOLVED and "too few for a verdict" in why


def test_the_interval_holds_the_rounds_spread_not_only_the_processes():
    """Two processes whose medians agree but whose rounds scatter: an interval over the processes
    alone would be as narrow as their two medians."""
    rng = np.random.default_rng(0)
    a = 1 + 0.2 * rng.standard_normal((2, 20))
    b = 1 + 0.2 * rng.standard_normal((2, 20))
    nested = stats.nested_ratio(a, b)
    alone = stats.across_processes(list(np.median(a, axis=1) / np.median(b, axis=1)))
    assert nested["ratio"] == pytest.approx(alone["ratio"])
    assert nested["hi"] - nested["lo"] > 2 * (alone["hi"] - alone["lo"])


@pytest.mark.skipif(not CPU_ONLY, reason="needs an onnxruntime without the CUDA provider")
def test_a_provider_the_session_does_not_get_is_refused_in_one_line(gpt2_pair, tmp_path):
    original, folded = gpt2_pair
    code, out, err = _cli(tmp_path, "bench", original, folded, "--provider", "cuda", "--processes", 2, "--rounds", 2)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "has no CUDAExecutionProvider" in err and "nothing is timed on another" in err


@pytest.mark.skipif(not CPU_ONLY, reason="needs an onnxruntime without the CUDA provider")
def test_a_timing_process_refuses_a_session_on_another_provider(gpt2_pair, tmp_path):
    """Past the parent's own check (asked of the child directly): the child's session reports the
    CPU EP, and the parent raises that, naming the session; nothing was timed."""
    original, folded = gpt2_pair
    np.savez(tmp_path / "f.npz", input_ids=np.ones((1, 8), np.int64))
    files = {"original": str(original), "resaved": str(original), "folded": str(folded)}
    with pytest.raises(PlacementError) as err:
        sessions = compare.Sessions(files, str(tmp_path / "f.npz"), tmp_path, 2, 1, 1, "CUDAExecutionProvider")
        compare.time_variants(sessions, "t", 2)
    assert "the session runs on CPUExecutionProvider, not CUDAExecutionProvider" in str(err.value)


def test_a_model_file_named_bench_is_folded_as_any_model_file(tmp_path):
    """`bench` names the subcommand only where no file of that name is there."""
    shutil.copy(MODELS / "gpt2.onnx", tmp_path / "bench")
    code, out, err = _cli(tmp_path, "bench", "--dry-run", "-q", "--json", "-")
    assert code == 0, err
    assert json.loads(out)["folded"] == 5
    code, out, err = _cli(tmp_path, "./bench", "--dry-run", "-q", "--json", "-")
    assert code == 0 and json.loads(out)["folded"] == 5
    (tmp_path / "sub").mkdir()
    code, out, err = _cli(tmp_path / "sub", "bench", "--dry-run")  # no such file here: the subcommand
    assert code == 2 and "onnx_lnfold bench: error:" in err and "the following arguments are required" in err


def test_bench_needs_two_processes(gpt2_pair, tmp_path):
    original, folded = gpt2_pair
    code, _, err = _cli(tmp_path, "bench", original, folded, "--processes", 1)
    assert code == 2 and "at least 2" in err


def test_a_folded_model_of_another_model_is_refused(tmp_path):
    code, _, err = _cli(tmp_path, "bench", MODELS / "gpt2.onnx", MODELS / "vit.onnx", "--processes", 2)
    assert code == 2 and "not a fold of that model" in err


@pytest.mark.parametrize("raised, code, line", [(KeyboardInterrupt, 130, "interrupted"), (None, 143, "terminated")])
def test_a_ctrl_c_or_a_sigterm_ends_the_subcommand_in_one_line(monkeypatch, capsys, raised, code, line):
    from onnx_lnfold.bench import cli
    from onnx_lnfold.core.errors import Terminated

    def stopped(args):
        raise raised or Terminated  # what the command line's SIGTERM handler raises

    monkeypatch.setattr(cli, "_bench", stopped)
    assert cli.main(["bench", "a.onnx", "b.onnx"]) == code
    assert capsys.readouterr().err == f"onnx_lnfold: {line}\n"
