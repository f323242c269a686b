"""Every hostile model of tests/hostile_models.py through the command line and the API, each run in
its own process: exit code, the line it printed, wall time, peak memory of the process tree, what it
left (the input changed, an output, files in the temp folder) and the apparent size of what it wrote.

    python -m benchmarks.hostile [--cases NAME,...] [--json OUT.json] [--timeout S]

Each run's file size is capped (RLIMIT_FSIZE, 2 GiB) so a run that would write a multi-GB file ends
with SIGXFSZ instead of filling the disk; a run past --timeout is killed. Exit codes: 0 a fold, 1 a
failed check, 2 a refusal, 3 an internal error, negative a signal (-25: the file-size cap).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import hostile_models  # noqa: E402

FSIZE_CAP = 2 << 30
ORT_OWN_TEMP = {".ses"}  # onnxruntime writes its session id there on import

# The API as a user calls it: fold(path).save(out); the exit codes the command line would give.
API_SCRIPT = r"""
import sys, traceback
import onnx_lnfold
from onnx_lnfold import LnFoldError, VerificationFailed
path, out, extra = sys.argv[1], sys.argv[2], sys.argv[3:]
kw = {"verify": False} if "--no-verify" in extra else {}
try:
    onnx_lnfold.fold(path, **kw).save(out)
except VerificationFailed as e:
    print(f"{type(e).__name__}: {e}", file=sys.stderr); sys.exit(1)
except LnFoldError as e:
    print(f"{type(e).__name__}: {e}", file=sys.stderr); sys.exit(2)
except BaseException as e:
    print(f"{type(e).__name__}: {str(e)[:300]}", file=sys.stderr); sys.exit(3)
"""


@dataclass
class Run:
    case: str
    surface: str
    code: int
    seconds: float
    peak_mb: float
    line: str
    lines: int
    input_changed: bool
    written_bytes: int  # apparent size of everything in the output folder
    temp_left: int  # entries the run left in its temp folder (ONNX Runtime's own .ses aside)


def _snapshot(folder: Path) -> dict:
    out = {}
    for p in sorted(folder.rglob("*")):
        try:
            st = p.lstat()
        except OSError:
            continue
        out[str(p)] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return out


def _apparent(folder: Path) -> int:
    return sum(p.lstat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def _limits():
    resource.setrlimit(resource.RLIMIT_FSIZE, (FSIZE_CAP, FSIZE_CAP))
    os.setsid()


def run_case(case: hostile_models.Case, surface: str, work: Path, timeout: float) -> Run:
    folder = work / f"{case.name}-{surface}" / "in"
    folder.mkdir(parents=True)
    out_dir = folder.parent / "out"
    out_dir.mkdir()
    tmp = folder.parent / "tmp"
    tmp.mkdir()
    model = case.build(folder)
    before = _snapshot(folder)
    if surface == "cli":
        dest = folder / case.cli_output if case.cli_output else out_dir / "folded.onnx"
        cmd = [sys.executable, "-m", "onnx_lnfold", str(model), "-o", str(dest), "-q", *case.args]
    else:
        dest = folder / case.api_save_to if case.api_save_to else out_dir / "folded.onnx"
        cmd = [sys.executable, "-c", API_SCRIPT, str(model), str(dest), *case.args]
    env = dict(os.environ, TMPDIR=str(tmp))
    started = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True, preexec_fn=_limits)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        err += f"\n(killed after {timeout:.0f} s)"
    seconds = time.monotonic() - started
    # ru_maxrss of the children reaped so far: the largest process of the tree (KiB on Linux)
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    # the folder's path holds the case's name: the words matched are the tool's own
    lines = [ln.replace(str(folder.parent), "<case>") for ln in err.splitlines() if ln.strip()]
    changed = _snapshot(folder) != before if not case.api_save_to and not case.cli_output else _changed_inputs(folder, before)
    return Run(
        case=case.name,
        surface=surface,
        code=proc.returncode,
        seconds=round(seconds, 2),
        peak_mb=round(peak, 1),
        line=(lines[-1] if lines else "")[:400],
        lines=len(lines),
        input_changed=changed,
        written_bytes=_apparent(out_dir) + sum(
            p.lstat().st_size for p in folder.rglob("*") if str(p) not in before and p.is_file()
        ),
        temp_left=len([p for p in tmp.iterdir() if p.name not in ORT_OWN_TEMP]),
    )


def _changed_inputs(folder: Path, before: dict) -> bool:
    """Whether a file the input had changed (new files in its folder are the output's)."""
    now = _snapshot(folder)
    return any(now.get(p) != v for p, v in before.items())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", help="comma-separated case names (default: all)")
    ap.add_argument("--surfaces", default="cli,api")
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    names = set(args.cases.split(",")) if args.cases else None
    cases = [c for c in hostile_models.CASES if names is None or c.name in names]
    runs = []
    with tempfile.TemporaryDirectory(prefix="hostile-") as work:
        for case in cases:
            for surface in args.surfaces.split(","):
                # ru_maxrss of RUSAGE_CHILDREN is the maximum over every child so far: one
                # process per case keeps each figure its own
                r = _isolated(case.name, surface, Path(work), args.timeout)
                runs.append(r)
                ok = _meets(case, r)
                print(
                    f"{'ok ' if ok else 'BAD'} {r.case:32} {r.surface:3} exit {r.code:3} {r.seconds:6.1f} s "
                    f"{r.peak_mb:7.0f} MB  {r.line[:150]}",
                    flush=True,
                )
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in runs], indent=1))
    bad = sum(not _meets(hostile_models.case(r.case), r) for r in runs)
    print(f"{len(runs) - bad} passed, {bad} failed")
    return 1 if bad else 0


def _isolated(name: str, surface: str, work: Path, timeout: float) -> Run:
    """run_case in a child of its own, so that its peak memory is not mixed with the others'."""
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); from benchmarks import hostile; "
        "from dataclasses import asdict; import hostile_models as h; from pathlib import Path; "
        "print(json.dumps(asdict(hostile.run_case(h.case(sys.argv[2]), sys.argv[3], Path(sys.argv[4]), float(sys.argv[5])))))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(ROOT), name, surface, str(work), str(timeout)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    if proc.returncode != 0:
        return Run(name, surface, 99, 0.0, 0.0, proc.stderr.strip().splitlines()[-1][:300] if proc.stderr else "", 0, False, 0, 0)
    return Run(**json.loads(proc.stdout.strip().splitlines()[-1]))


def _meets(case: hostile_models.Case, r: Run) -> bool:
    """What the issue asks of each run: the expected exit, one line (naming the problem), the input
    untouched, nothing left, under 1 GB and 30 s."""
    want = {"refuse": 2, "fold": 0, "not-verified": 1}[case.outcome]
    said = case.outcome != "fold"
    one_line = r.lines == 1 if said else True
    words = case.expect.lower() in r.line.lower() if said else True
    return (
        r.code == want
        and one_line
        and words
        and not r.input_changed
        and r.temp_left == 0
        and r.peak_mb < 1024
        and r.seconds < 30
        and (r.written_bytes == 0 if said else r.written_bytes < 64 << 20)
    )


if __name__ == "__main__":
    sys.exit(main())
