"""Scratch folders: where a run stages its output (beside the destination) and keeps the copies
its checks need (in the temporary folder). Each is named for the process that made it, so that a
run killed before it could clean up (SIGKILL, a power cut) leaves nothing the next run does not
find: `sweep` removes the folders of processes that are gone, and says how much it freed."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

_NAME = re.compile(r"^\.?lnfold-(?P<kind>[a-z]+)-(?P<pid>\d+)-")


def make(kind: str, folder: Path | str | None = None, *, hidden: bool = False) -> Path:
    """A new scratch folder (`lnfold-KIND-PID-...`, `.lnfold-...` when `hidden`) in `folder`
    (default: the temporary folder)."""
    prefix = f"{'.' if hidden else ''}lnfold-{kind}-{os.getpid()}-"
    return Path(tempfile.mkdtemp(prefix=prefix, dir=folder))


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def _size(folder: Path) -> int:
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def sweep(folder: Path | str | None = None) -> list[str]:
    """Remove the scratch folders in `folder` (default: the temporary folder) left by processes
    that are gone; one line for each removed."""
    folder = Path(folder or tempfile.gettempdir())
    removed = []
    try:
        entries = list(folder.iterdir())
    except OSError:
        return []
    for entry in entries:
        found = _NAME.match(entry.name)
        if found is None or not entry.is_dir() or entry.is_symlink() or _alive(int(found["pid"])):
            continue
        size = _size(entry)
        shutil.rmtree(entry, ignore_errors=True)
        if not entry.exists():
            removed.append(
                f"removed {entry} ({size / 1e6:,.1f} MB), left by an interrupted run (process {found['pid']})"
            )
    return removed
