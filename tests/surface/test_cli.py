"""The command line: outputs, reports, refusals and exit codes."""

import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import onnx
import pytest

import onnx_lnfold
from onnx_lnfold._cli import main, program_name

from conftest import MODELS, ROOT
from helpers import run_cli as _cli


@pytest.fixture
def gpt2(tmp_path):
    path = tmp_path / "gpt2.onnx"
    shutil.copy(MODELS / "gpt2.onnx", path)
    return path


def test_default_output_beside_the_input_and_report(gpt2):
    code, out, err = _cli(gpt2)
    assert code == 0, err
    target = gpt2.with_name("gpt2.lnfold.onnx")
    assert target.is_file()
    assert "LayerNorm nodes: 5 folded, 0 kept (of 5)" in out
    assert "LayerNormalization 5 -> 0" in out and "SimplifiedLayerNormalization 0 -> 5" in out
    # ln_f's residual Add stays an Add (on ORT's CPU EP it costs less than the fused op)
    assert "SkipSimplifiedLayerNormalization" not in out
    assert "Sub 2 -> 3" in out  # the tied embeddings' Gather reads table - row means
    assert "Verification (passed" in out and f"Wrote {target}" in out
    assert sorted(p.name for p in gpt2.parent.iterdir()) == ["gpt2.lnfold.onnx", "gpt2.onnx"]  # no temp files left


def test_json_report(gpt2, tmp_path):
    out_json = tmp_path / "r.json"
    assert main([str(gpt2), "-o", str(tmp_path / "o.onnx"), "--json", str(out_json), "-q"]) == 0
    report = json.loads(out_json.read_text())
    assert report["folded"] == 5 and report["kept"] == 0
    assert {d["status"] for d in report["decisions"]} == {"folded"}
    assert all(d["op_type"] == "LayerNormalization" and d["reason"] for d in report["decisions"])
    assert report["untied_bytes"] == 2048 and not report["centerings"]
    (derived,) = [e for e in report["edits"] if e["untie"]]
    assert derived["tensor"] == "model.lm_head.weight" and derived["means_name"] == "model.lm_head.weight.row_means"
    assert "a Sub of two constants that ONNX Runtime folds at session start" in derived["note"]
    assert report["verification"]["status"] == "passed"
    assert report["verification"]["outputs"][0]["name"] == "logits"
    assert report["ops_before"]["LayerNormalization"] == 5 and "LayerNormalization" not in report["ops_after"]
    assert report["output"] == str(tmp_path / "o.onnx")


def test_dry_run_prints_the_plan_and_writes_nothing(gpt2, tmp_path):
    code, out, _ = _cli(gpt2, "--dry-run", "--json", tmp_path / "plan.json")
    assert code == 0
    assert "model.lm_head.weight" in out and "untied" in out
    # Nothing was folded: the summary and the detail say what would be.
    assert f"onnx_lnfold: {gpt2} (dry run, nothing written), would fold 5/5 LayerNorms at" in out.splitlines()[0]
    assert out.splitlines()[0].endswith(" s") and "verification skipped (dry run)" in out.splitlines()[0]
    assert "LayerNorm nodes: 5 would fold, 0 kept (of 5)" in out and "LayerNorms folded" not in out
    assert sorted(p.name for p in gpt2.parent.iterdir()) == ["gpt2.onnx", "plan.json"]


def test_kept_lns_are_listed_with_their_reason(tmp_path):
    # Without explicit centering: the first LN's edits would reach the attention, the others read
    # an LN output.
    code, out, _ = _cli(MODELS / "opt_post_ln.onnx", "--dry-run", "--no-aux-centering")
    assert code == 0
    assert "0 would fold, 4 kept" in out
    assert "  1 kept: (mixes-shift) centering would change a tensor that also feeds a layer mixing its channels" in out
    assert "node_layer_norm  'add_88' would change, and it feeds MatMul 'node_MatMul_43'" in out
    assert "  3 kept: (normalization-output) post-LN: each reads the output of another LayerNorm" in out
    assert "node_layer_norm_1  reads 'layer_norm', the output of LayerNormalization 'node_layer_norm'" in out
    # By default the two ORT runs fused with their residual Add as SkipLayerNormalization fold
    # through one explicit centering each (of the first one's residual sum, of the LN output
    # before the second), which costs less than that fused kernel; the other two stay for their beta.
    code, out, _ = _cli(MODELS / "opt_post_ln.onnx", "--dry-run")
    assert code == 0 and "2 would fold, 2 kept" in out
    assert "  2 kept: (costs-more) its fold would cost ONNX Runtime more than the LN saves" in out
    assert "Explicit centering: 'add_166' - ReduceMean over axis 2 (1 ReduceMean + 1 Sub) unlocks 1 LN" in out
    assert "Explicit centering: 'layer_norm_1' - ReduceMean over axis 2 (1 ReduceMean + 1 Sub) unlocks 1 LN" in out


def test_verification_failure_exits_1_and_writes_nothing(gpt2):
    before = gpt2.read_bytes()
    code, out, err = _cli(gpt2, "--rtol", "1e-15")
    assert code == 1
    assert "verification failed" in err and "Refused to write" in out
    assert sorted(p.name for p in gpt2.parent.iterdir()) == ["gpt2.onnx"]
    assert gpt2.read_bytes() == before


def test_no_verify(gpt2, tmp_path):
    code, out, _ = _cli(gpt2, "-o", tmp_path / "x.onnx", "--no-verify")
    assert code == 0 and "Verification: skipped (disabled by --no-verify)" in out


def test_input_shape_and_inputs_file(gpt2, tmp_path):
    code, out, _ = _cli(gpt2, "-o", tmp_path / "a.onnx", "--input-shape", "input_ids:3,11")
    assert code == 0 and "input_ids(3, 11)" in out
    np.savez(tmp_path / "in.npz", input_ids=np.arange(14, dtype=np.int64).reshape(2, 7))
    code, out, _ = _cli(gpt2, "-o", tmp_path / "b.onnx", "--inputs", tmp_path / "in.npz")
    assert code == 0 and "input_ids(2, 7)" in out


def test_in_place_needs_the_flag(gpt2):
    code, _, err = _cli(gpt2, "-o", gpt2)
    assert code == 2 and "would overwrite the input" in err
    code, out, _ = _cli(gpt2, "--in-place")
    assert code == 0
    assert sum(n.op_type.endswith("SimplifiedLayerNormalization") for n in onnx.load(gpt2).graph.node) == 5


def test_nothing_to_fold(tmp_path):
    g = onnx.helper.make_graph(
        [onnx.helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])],
    )
    path = tmp_path / "relu.onnx"
    onnx.save(onnx.helper.make_model(g), path)
    code, out, _ = _cli(path)
    assert code == 0 and "nothing to fold" in out


@pytest.mark.parametrize(
    "make_args,message",
    [
        (lambda d: [d / "missing.onnx"], "no such file"),
        (lambda d: [d], "is a directory"),
        (lambda d: [_write(d / "empty.onnx", b"")], "file is empty"),
        (lambda d: [_write(d / "junk.onnx", b"\xff\xfe not a protobuf \x00" * 7)], "not"),
        (lambda d: [_write(d / "trunc.onnx", (MODELS / "gpt2.onnx").read_bytes()[:5000])], "not"),
        (lambda d: [MODELS / "gpt2.onnx", "--bogus"], "unrecognized arguments: --bogus"),
        (lambda d: [MODELS / "gpt2.onnx", "--input-shape", "input_ids"], "bad --input-shape"),
        (lambda d: [MODELS / "gpt2.onnx", "-o", d / "no" / "such" / "dir.onnx"], "output folder does not exist"),
        # said before the model is read (a large one took minutes to load and fold first)
        (lambda d: [_write(d / "junk.onnx", b"junk"), "-o", d / "no" / "m.onnx"], "output folder does not exist"),
        (lambda d: [MODELS / "gpt2.onnx", "-o", d / "x.onnx", "--input-shape", "nope:1,2"], "names no graph input"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, make_args, message):
    args = make_args(tmp_path)
    before = sorted(tmp_path.iterdir())
    code, out, err = _cli(*args)
    assert code == 2, (out, err)
    assert err.count("\n") == 1 and err.startswith("onnx_lnfold: error:") and message in err
    assert "Traceback" not in err
    assert sorted(tmp_path.iterdir()) == before


@pytest.mark.parametrize("mode", [["--dry-run"], ["--no-verify"], []])
@pytest.mark.parametrize(
    "shape,message",
    [
        ("nope:1,2", "--input-shape names no graph input: nope (the graph inputs: input_ids)"),
        ("input_ids:1,2,8", "--input-shape input_ids:1,2,8 has rank 3, the graph input has rank 2"),
    ],
)
def test_input_shape_is_checked_alike_in_a_dry_run_and_a_real_one(tmp_path, mode, shape, message):
    """An unknown input or a wrong rank is a usage error whatever the run: a dry run prices at
    these shapes, a real one also runs them (the wrong rank used to end as 'not verified')."""
    code, out, err = _cli(MODELS / "gpt2.onnx", "-o", tmp_path / "o.onnx", "--input-shape", shape, *mode)
    assert code == 2 and out == "", (out, err)
    assert err.count("\n") == 1 and message in err
    assert not (tmp_path / "o.onnx").exists()


def test_inputs_are_checked_in_a_dry_run(tmp_path):
    feeds = tmp_path / "in.npz"
    np.savez(feeds, input_ids=np.zeros((1, 2, 8), dtype=np.int64))
    code, out, err = _cli(MODELS / "gpt2.onnx", "--dry-run", "--inputs", feeds)
    assert code == 2 and "--inputs: 'input_ids' has rank 3, the graph input has rank 2" in err


def _write(path, data: bytes):
    path.write_bytes(data)
    return path


def test_report_piped_into_head_ends_quietly():
    cmd = f"{sys.executable} -m onnx_lnfold {MODELS / 'gpt2.onnx'} --dry-run | head -1; exit ${{PIPESTATUS[0]}}"
    proc = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.startswith("onnx_lnfold:")
    assert proc.stderr == ""


# --- issue 11: a new user's first hour ---------------------------------------------------------

# Subprocesses started outside the repository root import this checkout, not an installed copy.
_ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def _run_in(cwd, *args):
    proc = subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, cwd=cwd, env=_ENV)
    return proc.returncode, proc.stdout, proc.stderr


@pytest.mark.parametrize("name", [".", "./", "/", ""])
def test_a_folder_or_an_empty_name_is_bad_input(tmp_path, monkeypatch, capsys, name):
    monkeypatch.chdir(tmp_path)
    assert main([name]) == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and err.startswith("onnx_lnfold: error:") and "is a directory" in err
    assert out == "" and list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc: a folder no one can create files in")
@pytest.mark.parametrize("flag", ["--json", "-o"])
def test_every_destination_is_checked_before_folding(gpt2, flag):
    """/proc refuses new files even to root, where permission bits would not."""
    code, out, err = _cli(gpt2, *(["-o", gpt2.with_name("o.onnx")] if flag == "--json" else []), flag, "/proc/lnfold.x")
    assert code == 2 and err.count("\n") == 1 and "cannot write to the" in err
    assert out == "" and sorted(p.name for p in gpt2.parent.iterdir()) == ["gpt2.onnx"]


def test_unwritable_json_folder_is_refused_before_folding(gpt2):
    folder = gpt2.parent / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        if os.access(folder, os.W_OK):  # root: the bits do not apply; the /proc test covers it
            pytest.skip("running as root")
        code, _, err = _cli(gpt2, "--json", folder / "r.json")
    finally:
        folder.chmod(0o700)
    assert code == 2 and "cannot write to the --json folder" in err
    assert sorted(p.name for p in gpt2.parent.iterdir()) == ["gpt2.onnx", "ro"]


def test_json_dash_writes_the_report_to_stdout_alone(gpt2):
    code, out, err = _cli(gpt2, "--json", "-")
    assert code == 0, err
    report = json.loads(out)  # all of stdout is the JSON document
    assert report["folded"] == 5 and report["verification"]["passed"] is True
    assert report["output"] == str(gpt2.with_name("gpt2.lnfold.onnx"))
    assert err.startswith("onnx_lnfold: ") and "LayerNorm nodes: 5 folded" in err  # the text report moved
    assert not (gpt2.parent / "-").exists()
    code, out, err = _cli(gpt2, "-o", gpt2.with_name("q.onnx"), "--json", "-", "-q")
    assert code == 0 and json.loads(out)["folded"] == 5 and err == ""


def test_help_names_the_program_as_invoked_and_lists_exit_codes():
    code, out, _ = _cli("--help")
    assert code == 0 and out.startswith("usage: python -m onnx_lnfold ")
    assert "exit codes:" in out and "130  interrupted" in out and "examples:" in out
    assert "-v, --verbose" in out and "-V, --version" in out
    # The console script: argv[0] is the command's path.
    script = "import sys; sys.argv[0] = '/venv/bin/onnx-lnfold'; from onnx_lnfold.__main__ import main; sys.exit(main())"
    code, out, _ = _run_in(ROOT, "-c", script, "--help")
    assert code == 0 and out.startswith("usage: onnx-lnfold ")
    assert "  onnx-lnfold model.onnx --dry-run -v" in out
    assert program_name("/usr/lib/python3/site-packages/onnx_lnfold/__main__.py") == "python -m onnx_lnfold"


@pytest.mark.parametrize("flag", ["-V", "--version"])
def test_version(flag, capsys):
    with pytest.raises(SystemExit) as info:
        main([flag])
    assert info.value.code == 0 and capsys.readouterr().out == f"onnx_lnfold {onnx_lnfold.__version__}\n"


def test_verbose_adds_the_proof_per_ln(gpt2):
    code, out, err = _cli(gpt2, "--dry-run", "-v")
    assert code == 0, err
    proof = out[out.index("Proof per LayerNorm (--verbose):") :]
    assert "node_layer_norm_4 (LayerNormalization, axis 2): folded -> SimplifiedLayerNormalization" in proof
    assert "producer: Gemm weight 'model.transformer.h.1.mlp.c_proj.weight' read by node_addmm_7" in proof
    assert "and through 7 op(s) told above, for node_layer_norm_3 and 3 LNs before it" in proof
    code, out, _ = _cli(MODELS / "opt_post_ln.onnx", "--dry-run", "--verbose", "--no-aux-centering")
    assert "  blocked: tensor 'add_88' would change, and it feeds MatMul 'node_MatMul_43'" in out


_INTERRUPT_IMPORT = """
import runpy, sys
class Interrupt:  # Ctrl-C while the CLI imports its dependencies
    def find_spec(self, name, path=None, target=None):
        if name == "onnx_ir":
            raise KeyboardInterrupt
sys.meta_path.insert(0, Interrupt())
sys.argv = [sys.argv[0], *sys.argv[1:]]
"""


@pytest.mark.parametrize(
    "entry",
    [
        "runpy.run_module('onnx_lnfold', run_name='__main__')",  # python -m onnx_lnfold
        "from onnx_lnfold.__main__ import main; sys.exit(main())",  # the onnx-lnfold script
    ],
)
def test_ctrl_c_during_start_up_is_one_line_exit_130(gpt2, entry):
    code, _, err = _run_in(gpt2.parent, "-c", _INTERRUPT_IMPORT + entry, gpt2)
    assert code == 130, err
    assert err == "onnx_lnfold: interrupted; nothing written\n"
    assert sorted(p.name for p in gpt2.parent.iterdir()) == ["gpt2.onnx"]


def test_importing_the_package_loads_no_dependency():
    code = "import sys, onnx_lnfold; print(sorted(m for m in ('numpy', 'onnx', 'onnx_ir') if m in sys.modules))"
    _, out, err = _run_in(ROOT, "-c", code)
    assert out.strip() == "[]", err
    assert onnx_lnfold.fold is onnx_lnfold._api.fold and "analyze" in dir(onnx_lnfold)


def _model_that_fails_at_run_time(path):
    """x[b, 8] -> MatMul -> Reshape(-1, 4, 16) -> LN: folds, but a batch of 3 cannot be reshaped,
    so ONNX Runtime fails inside a kernel (where it logs an error line of its own)."""
    h = onnx.helper
    rng = np.random.default_rng(0)
    g = h.make_graph(
        [
            h.make_node("MatMul", ["x", "w"], ["y"], name="fc"),
            h.make_node("Reshape", ["y", "shape"], ["r"], name="reshape"),
            h.make_node("LayerNormalization", ["r", "gamma", "beta"], ["z"], name="ln", axis=-1),
        ],
        "g",
        [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["b", 8])],
        [h.make_tensor_value_info("z", onnx.TensorProto.FLOAT, None)],
        [
            onnx.numpy_helper.from_array(rng.normal(0.3, 1, (8, 16)).astype(np.float32), "w"),
            onnx.numpy_helper.from_array(np.array([-1, 4, 16], np.int64), "shape"),
            onnx.numpy_helper.from_array(rng.normal(1, 0.1, 16).astype(np.float32), "gamma"),
            onnx.numpy_helper.from_array(rng.normal(0, 0.1, 16).astype(np.float32), "beta"),
        ],
    )
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), path)
    return path


@pytest.mark.parametrize("quiet", [[], ["-q"]])
def test_stderr_holds_only_the_tools_own_lines(tmp_path, quiet):
    src = _model_that_fails_at_run_time(tmp_path / "m.onnx")
    report = tmp_path / "r.json"
    # (--fold-costly: the LN's beta would stay an Add, so it is kept by default and nothing would run)
    code, out, err = _cli(src, "-o", tmp_path / "o.onnx", "--input-shape", "x:3,8", "--json", report, "--fold-costly", *quiet)
    assert "does not run in onnxruntime" in json.loads(report.read_text())["verification"]["reason"]
    # ORT's own log lines look like '2026-... [E:onnxruntime:, sequential_executor.cc:...]' (colored);
    # the tool's refusal may quote the exception text, but only on its own 'onnx_lnfold:' line.
    assert not re.search(r"\[[EWIV]:onnxruntime", err) and "\x1b[" not in err
    assert all(line.startswith("onnx_lnfold:") for line in err.splitlines()), err


def test_summary_line_first_and_an_unchanged_copy_said_so(gpt2):
    code, out, _ = _cli(gpt2)
    target = gpt2.with_name("gpt2.lnfold.onnx")
    first = out.splitlines()[0]
    size_before, size_after = gpt2.stat().st_size / 1e6, target.stat().st_size / 1e6
    assert first.startswith(
        f"onnx_lnfold: {gpt2} -> {target}, 5/5 LayerNorms folded at 8192 tokens (the default guess; --input-shape or "
        f"--inputs sets it), {size_before:.2f} -> {size_after:.2f} MB, "
        "verified (in float64, worst relative diff "
    )
    assert first.endswith(" s") and out.splitlines()[1].startswith("Nodes: 161 -> 163; Add 12 -> 13; LayerNormalization 5 -> 0")
    code, out, _ = _cli(target, "-o", gpt2.with_name("again.onnx"))
    assert code == 0
    assert "(unchanged copy), already folded (5 SimplifiedLayerNormalization)" in out
    assert f"Wrote {gpt2.with_name('again.onnx')} (an unchanged copy of the input: nothing was folded)" in out
    # Unchanged means the input's bytes: no value_info added, no node renamed.
    assert gpt2.with_name("again.onnx").read_bytes() == target.read_bytes()
    first = out.splitlines()[0]
    assert first.endswith(" s") and "verification skipped (nothing was folded)" in first
    assert "Verification: skipped (nothing was folded: the model is unchanged)" in out


def test_sizes_count_external_data(tmp_path):
    from helpers import make_large_model

    src = make_large_model.make_model(tmp_path / "m.onnx", hidden=32, layers=2, vocab=64, positions=32)
    out = tmp_path / "o.onnx"
    code, _, err = _cli(src, "-o", out, "--json", tmp_path / "r.json", "-q")
    assert code == 0, err
    report = json.loads((tmp_path / "r.json").read_text())
    data = tmp_path / "m.onnx.data"
    assert data.is_file() and report["size_before"] == src.stat().st_size + data.stat().st_size
    assert report["size_after"] == out.stat().st_size + (tmp_path / "o.onnx.data").stat().st_size


# --- the command line, finished ---------------------------------------------------------------------

_HEAVY = ("numpy", "onnx", "onnx_ir", "onnxruntime")
_MODULES_AT_EXIT = f"""
import atexit, runpy, sys
atexit.register(lambda: print("heavy:", sorted(m for m in {_HEAVY!r} if m in sys.modules), file=sys.stderr))
sys.argv = ["onnx-lnfold", *sys.argv[1:]]
runpy.run_module("onnx_lnfold", run_name="__main__")
"""


@pytest.mark.parametrize(
    "args",
    [["-V"], ["--help"], ["--bogus"], ["m.onnx", "--target", "tpu"], ["bench", "--help"], ["calibrate", "--help"],
     ["bench", "a.onnx"], ["calibrate", "--bogus"]],
)
def test_version_help_and_usage_errors_import_nothing_heavy(tmp_path, args):
    """They answer before numpy, onnx and onnx_ir are imported (about a second of start-up); the
    subcommands' too."""
    code, out, err = _run_in(tmp_path, "-c", _MODULES_AT_EXIT, *args)
    assert code == (0 if "--help" in args or args == ["-V"] else 2), err
    assert err.splitlines()[-1] == "heavy: []"
    if args[0] in ("bench", "calibrate"):
        assert out.startswith(f"usage: onnx-lnfold {args[0]}") if "--help" in args else len(err.splitlines()) == 2
        return
    assert out.startswith("onnx_lnfold 0." if args == ["-V"] else "usage: onnx-lnfold" if args == ["--help"] else "")


_SLOW_IMPORT = """
import runpy, sys, time
class Slow:  # onnx_ir takes a second more to import than it does
    def find_spec(self, name, path=None, target=None):
        if name == "onnx_ir":
            time.sleep(1.0)
sys.meta_path.insert(0, Slow())
sys.argv = ["onnx-lnfold", *sys.argv[1:]]
runpy.run_module("onnx_lnfold", run_name="__main__")
"""


def test_elapsed_time_counts_the_imports_the_user_waited_for(gpt2):
    code, out, err = _run_in(gpt2.parent, "-c", _SLOW_IMPORT, gpt2, "--dry-run", "--json", "-", "-q")
    assert code == 0, err
    assert json.loads(out)["elapsed_s"] >= 1.0  # the dry run itself takes a fraction of that


def test_a_read_only_input_folder_names_the_way_out(gpt2, monkeypatch, capsys):
    """Without -o the output goes beside the input; when that folder refuses files, the message
    says how to write elsewhere. (The refusal is simulated: root may write to any 0o500 folder.)"""
    import tempfile

    real_mkstemp = tempfile.mkstemp

    def read_only(*args, dir=None, **kwargs):
        if dir is not None and os.path.samefile(dir, gpt2.parent):
            raise PermissionError(13, "Permission denied")
        return real_mkstemp(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    assert main([str(gpt2)]) == 2
    _, err = capsys.readouterr()
    assert err == (
        f"onnx_lnfold: error: {gpt2.parent}: cannot write to the output folder (Permission denied); "
        "use -o PATH to write elsewhere\n"
    )
    assert main([str(gpt2), "-o", str(gpt2.with_name("out.onnx"))]) == 2  # -o given: no hint to give it
    _, err = capsys.readouterr()
    assert err.endswith("cannot write to the output folder (Permission denied)\n")
    assert sorted(p.name for p in gpt2.parent.iterdir()) == ["gpt2.onnx"]


def test_a_signal_landing_as_the_output_folder_is_made_leaves_no_staging_folder(tmp_path, monkeypatch, capsys):
    """A SIGTERM between the staging folder's making and the code that would remove it on the way
    out: the command line removes what the run made all the same (`io.scratch.removed_when_interrupted`)."""
    from onnx_lnfold.core.errors import Terminated
    from onnx_lnfold.io import scratch
    from onnx_lnfold.save import staged

    made = scratch.make

    def made_then_terminated(kind, folder=None, **kwargs):
        path = made(kind, folder, **kwargs)
        if kind == "staging":
            raise Terminated
        return path

    monkeypatch.setattr(staged.scratch, "make", made_then_terminated)
    out = tmp_path / "out"
    out.mkdir()
    code = main([str(MODELS / "gpt2.onnx"), "-o", str(out / "g.onnx"), "--no-verify"])
    assert code == Terminated.exit_code and capsys.readouterr().err.endswith("terminated; nothing written\n")
    assert list(out.iterdir()) == []


def test_a_signal_landing_right_after_the_staging_folders_mkdir_leaves_no_folder(tmp_path, monkeypatch, capsys):
    """A SIGTERM landing inside `io.scratch.make`, after its mkdir and before it returns: the folder
    was recorded before it was made, so the way out removes it."""
    import os

    from onnx_lnfold.core.errors import Terminated

    mkdir = os.mkdir

    def made_then_terminated(path, *args, **kwargs):
        mkdir(path, *args, **kwargs)
        if ".lnfold-staging-" in str(path):
            raise Terminated

    monkeypatch.setattr(os, "mkdir", made_then_terminated)
    out = tmp_path / "out"
    out.mkdir()
    code = main([str(MODELS / "gpt2.onnx"), "-o", str(out / "g.onnx"), "--no-verify"])
    assert code == Terminated.exit_code and capsys.readouterr().err.endswith("terminated; nothing written\n")
    assert list(out.iterdir()) == []


def test_the_command_leaves_what_it_holds_to_the_system_at_exit(gpt2):
    """The process ends once the command returns: its objects are frozen (`gc.freeze`) so that
    the collector does not walk them at exit (seconds for a graph of 200,000 nodes); the output
    is written and the report printed before."""
    code = (
        "import gc, sys; from onnx_lnfold.__main__ import main; sys.argv = ['onnx-lnfold', *sys.argv[1:]]; "
        "assert gc.get_freeze_count() == 0; rc = main(); print('frozen', gc.get_freeze_count() > 0); sys.exit(rc)"
    )
    returncode, out, err = _run_in(gpt2.parent, "-c", code, gpt2, "-o", "out.onnx", "--no-verify")
    assert returncode == 0, err
    assert out.rstrip().endswith("frozen True") and (gpt2.parent / "out.onnx").stat().st_size > 0
