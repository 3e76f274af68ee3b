"""A dependency-free progress line on stderr: redrawn in place on a terminal, one line every
few seconds when stderr is a file or a CI log."""

from __future__ import annotations

import sys
import time


class ProgressLine:
    def __init__(self, label: str, *, every_s: float = 5.0, width: int = 28) -> None:
        self.label = label
        self.tty = sys.stderr.isatty()
        self.every_s = every_s
        self.width = width
        self._last = 0.0
        self._started = time.monotonic()

    def update(self, done: int, total: int, extra: str = "", *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and not self.tty and now - self._last < self.every_s:
            return
        if not force and self.tty and now - self._last < 0.1:
            return
        self._last = now
        frac = done / total if total else 1.0
        filled = int(self.width * min(frac, 1.0))
        bar = "#" * filled + "." * (self.width - filled)
        elapsed = now - self._started
        line = f"{self.label} [{bar}] {frac:6.1%} {done:,}/{total:,} {elapsed:6.1f}s {extra}"
        if self.tty:
            sys.stderr.write("\r" + line.ljust(110)[:160])
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def close(self) -> None:
        if self.tty:
            sys.stderr.write("\n")
            sys.stderr.flush()
