"""Scratch folders: where a run stages its output (beside the destination) and keeps the copies
its checks need (in the temporary folder). Each is named for the process that made it, so that a
run killed before it could clean up (SIGKILL, a power cut) leaves nothing the next run does not
find: `sweep` removes the folders of processes that are gone, and says how much it freed. A
SIGTERM during a library call removes them too (`removed_on_sigterm`), as the command line's
handler does for its runs."""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from onnx_lnfold.core.errors import Terminated

_NAME = re.compile(r"^\.?lnfold-(?P<kind>[a-z]+)-(?P<pid>\d+)-")


# The folders this process made and may not have removed yet (pruned as new ones are made):
# what `removed_on_sigterm` removes where unwinding did not.
_made: set[Path] = set()


def make(kind: str, folder: Path | str | None = None, *, hidden: bool = False) -> Path:
    """A new scratch folder (`lnfold-KIND-PID-...`, `.lnfold-...` when `hidden`) in `folder`
    (default: the temporary folder), private to its owner as `tempfile.mkdtemp` makes one."""
    prefix = f"{'.' if hidden else ''}lnfold-{kind}-{os.getpid()}-"
    parent = Path(folder if folder is not None else tempfile.gettempdir()).absolute()
    _made.difference_update([p for p in list(_made) if not p.exists()])
    while True:
        path = parent / f"{prefix}{secrets.token_hex(4)}"
        # Recorded before it is made: a signal landing right after the mkdir finds it recorded, and
        # the way out removes it (one landing before finds nothing there to remove).
        _made.add(path)
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            _made.discard(path)
            continue
        return path  # one it could not make stays recorded: pruned by the next


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


def _raise_terminated(signum, frame) -> None:
    raise Terminated


@contextmanager
def removed_on_sigterm() -> Iterator[None]:
    """A SIGTERM (a `timeout`, a job scheduler, `kill`) during the block unwinds it, so that the
    scratch folders made in it are removed on the way out, then ends the process as it would have.

    Python's default ends the process on the spot and leaves them. A library must not keep a
    handler of its own: one is set for the block only, only on the main thread (where handlers
    run) and only where the default is in place (a program's own handler is its to keep).
    """
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return
    signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        with removed_when_interrupted():
            yield
    except Terminated:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)  # ends the process, as the default would have
        raise
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextmanager
def removed_when_interrupted() -> Iterator[None]:
    """A Ctrl-C or SIGTERM (`Terminated`) ending the block removes the scratch folders made in it
    that its way out did not: the signal can land between a folder's making and the code that
    would remove it."""
    before = set(_made)
    try:
        yield
    except KeyboardInterrupt:
        for path in _made - before:
            shutil.rmtree(path, ignore_errors=True)
        raise
