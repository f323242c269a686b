"""A progress line on stderr for long runs, without a dependency.

Drawn only when stderr is a terminal (and the CLI was not told `--quiet`); otherwise every call
does nothing, so logs and pipes never see carriage returns.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

_WIDTH = 28
_MIN_INTERVAL = 0.1  # seconds between redraws


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"  # pragma: no cover


class Progress:
    """`phase(text)` shows what is being done; `start(label, total)` / `advance(n)` draw a bar in
    bytes; `close()` clears the line. Does nothing when disabled."""

    def __init__(self, enabled: bool | None = None, stream: TextIO | None = None):
        self.stream = stream if stream is not None else sys.stderr
        if enabled is None:
            enabled = bool(getattr(self.stream, "isatty", lambda: False)())
        self.enabled = enabled
        self._label = ""
        self._total = 0
        self._done = 0
        self._last = 0.0
        self._shown = False

    def _draw(self, text: str) -> None:
        self.stream.write("\r\x1b[2K" + text)
        self.stream.flush()
        self._shown = True

    def phase(self, text: str) -> None:
        if self.enabled:
            self._draw(text + " ...")

    def start(self, label: str, total: int) -> None:
        self._label, self._total, self._done, self._last = label, max(total, 0), 0, 0.0
        self._redraw(force=True)

    def advance(self, n: int) -> None:
        self._done += n
        self._redraw()

    def _redraw(self, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last < _MIN_INTERVAL and self._done < self._total:
            return
        self._last = now
        frac = min(self._done / self._total, 1.0) if self._total else 1.0
        filled = int(frac * _WIDTH)
        bar = "#" * filled + "." * (_WIDTH - filled)
        self._draw(f"{self._label} [{bar}] {frac:4.0%} {_size(self._done)} / {_size(self._total)}")

    def save_callback(self, label: str, total: int):
        """A callback for `onnx_ir.save(..., callback=...)`, which calls it before writing each
        tensor: the bar counts the bytes of the tensors before it. `finish()` completes it."""
        self.start(label, total)
        pending = [0]

        def callback(tensor, info) -> None:
            self.advance(pending[0])
            pending[0] = int(getattr(tensor, "nbytes", 0) or 0)

        return callback

    def finish(self) -> None:
        self._done = self._total
        self._redraw(force=True)

    def close(self) -> None:
        if self.enabled and self._shown:
            self.stream.write("\r\x1b[2K")
            self.stream.flush()
        self._shown = False
