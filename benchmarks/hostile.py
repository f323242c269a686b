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
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err_file:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err_file, env=env, text=True, preexec_fn=_limits)
        # wait4: this run's own peak memory (the largest of its process and the children it reaped)
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() - started > timeout:
                os.killpg(proc.pid, signal.SIGKILL)
                pid, status, usage = os.wait4(proc.pid, 0)
                err_file.write(f"\n(killed after {timeout:.0f} s)")
                break
            time.sleep(0.02)
        proc.returncode = os.waitstatus_to_exitcode(status)
        seconds = time.monotonic() - started
        peak = usage.ru_maxrss / 1024  # KiB on Linux
        err_file.seek(0)
        err = err_file.read()
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
                r = run_case(case, surface, Path(work), args.timeout)
                runs.append(r)
                short = shortfalls(case, r, timed=True)
                print(
                    f"{'BAD' if short else 'ok '} {r.case:32} {r.surface:3} exit {r.code:3} {r.seconds:6.1f} s "
                    f"{r.peak_mb:7.0f} MB  {r.line[:150]}" + (f"\n    short: {'; '.join(short)}" if short else ""),
                    flush=True,
                )
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in runs], indent=1))
    bad = sum(bool(shortfalls(hostile_models.case(r.case), r, timed=True)) for r in runs)
    print(f"{len(runs) - bad} passed, {bad} failed")
    return 1 if bad else 0


MAX_PEAK_MB = 1024
MAX_SECONDS = 30.0


def shortfalls(case: hostile_models.Case, r: Run, *, timed: bool) -> list[str]:
    """Where a run falls short of what the tool owes the case (none: it meets it): the expected
    exit; one line, holding the case's phrase, where the tool refuses or cannot verify; the input
    untouched; nothing left in the temp folder; nothing written but a fold's output; under
    MAX_PEAK_MB; with `timed`, under MAX_SECONDS (the benchmark's figure, never a unit test's)."""
    want = {"refuse": 2, "fold": 0, "not-verified": 1}[case.outcome]
    said = case.outcome != "fold"
    found = []
    if r.code != want:
        found.append(f"exit {r.code}, not {want}")
    if said and r.lines != 1:
        found.append(f"{r.lines} lines on stderr, not 1")
    if said and case.expect.lower() not in r.line.lower():
        found.append(f"the line does not say {case.expect!r}")
    if r.input_changed:
        found.append("the input changed")
    if r.temp_left:
        found.append(f"{r.temp_left} entries left in the temp folder")
    if said and r.written_bytes:
        found.append(f"{r.written_bytes:,} bytes written")
    if not said and r.written_bytes >= 64 << 20:
        found.append(f"{r.written_bytes:,} bytes written for a small model")
    if r.peak_mb >= MAX_PEAK_MB:
        found.append(f"peak {r.peak_mb:.0f} MB")
    if timed and r.seconds >= MAX_SECONDS:
        found.append(f"{r.seconds:.1f} s")
    return found


if __name__ == "__main__":
    sys.exit(main())
