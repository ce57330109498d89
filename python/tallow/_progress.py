"""A small progress bar drawn on stderr (no dependency)."""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["ProgressBar", "format_bytes"]


def format_bytes(n: float) -> str:
    """``n`` bytes in human units (powers of 1024)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


class ProgressBar:
    """A byte-count progress bar.

    On a terminal it redraws one line (at most ten times a second); elsewhere (a log, a pipe) it
    writes a single summary line when closed, so logs stay readable.
    """

    def __init__(
        self, label: str, total: int, stream: TextIO | None = None, enabled: bool = True
    ) -> None:
        self.label = label
        self.total = max(total, 0)
        self.done = 0
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.interactive = enabled and self.stream.isatty()
        self._start = time.monotonic()
        self._last_draw = 0.0

    def update(self, n: int) -> None:
        """Count ``n`` more bytes."""
        self.done += n
        if self.interactive:
            now = time.monotonic()
            if now - self._last_draw >= 0.1:
                self._last_draw = now
                self._draw()

    def _line(self) -> str:
        elapsed = max(time.monotonic() - self._start, 1e-9)
        rate = format_bytes(self.done / elapsed) + "/s"
        if self.total > 0:
            frac = min(self.done / self.total, 1.0)
            width = 30
            filled = int(frac * width)
            bar = "#" * filled + "-" * (width - filled)
            return (
                f"{self.label} {frac * 100:5.1f}% [{bar}] "
                f"{format_bytes(self.done)} / {format_bytes(self.total)} {rate}"
            )
        return f"{self.label} {format_bytes(self.done)} {rate}"

    def _draw(self) -> None:
        self.stream.write("\r" + self._line() + "\x1b[K")
        self.stream.flush()

    def close(self) -> None:
        """Finish the bar (draw it complete, end the line)."""
        if not self.enabled:
            return
        if self.interactive:
            self._draw()
            self.stream.write("\n")
        else:
            self.stream.write(self._line() + "\n")
        self.stream.flush()
