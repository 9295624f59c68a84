"""Progress of a long command on stderr, on a terminal and on a pipe alike.

On a terminal the line is rewritten in place (``\\r``) as work advances; on a pipe or a log
file, where ``\\r`` would pile up, one whole line is written every :data:`PIPE_INTERVAL` seconds
(and when a stage ends), so a ``kvtier plan | tee`` or a CI log shows the command is alive
instead of staying silent for a minute. The first line comes after one interval, and the final
line only once a line was shown: a quick command (or one that fails at once on bad input) stays
silent on a pipe, as ``kvtier ... | head`` expects. Used as a context manager, a heartbeat thread repeats
the last state on a pipe while a long step (one simulation) reports nothing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TextIO

__all__ = ["PIPE_INTERVAL", "ProgressLine"]

#: Seconds between progress lines when stderr is not a terminal.
PIPE_INTERVAL = 3.0


class ProgressLine:
    """``update(label, done, total)`` callbacks rendered on ``stream`` (see the module doc)."""

    def __init__(
        self,
        stream: TextIO,
        *,
        terminal: bool | None = None,
        interval: float = PIPE_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stream = stream
        isatty = getattr(stream, "isatty", None)
        self.terminal = bool(isatty and isatty()) if terminal is None else terminal
        self.interval = interval
        self.clock = clock
        self._start = clock()
        # The first line waits one interval: a command that fails at once (bad input) prints its
        # one-line error alone, and a quick one prints only its final lines.
        self._last: float | None = self._start
        self._shown = False
        self._state: tuple[str, int, int] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    def __enter__(self) -> ProgressLine:
        if not self.terminal:
            self._beat = threading.Thread(target=self._heartbeat, name="kvtier-progress", daemon=True)
            self._beat.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join()

    def update(self, label: str, done: int, total: int) -> None:
        finished = done >= total
        with self._lock:
            self._state = (label, done, total)
            if self.terminal:
                self.stream.write(f"\r{label}: {done}/{total}" + ("\n" if finished else ""))
                self.stream.flush()
                return
            now = self.clock()
            if (finished and self._shown) or (self._last is not None and now - self._last >= self.interval):
                self._write(now)

    def _write(self, now: float) -> None:
        assert self._state is not None
        label, done, total = self._state
        self._last = now
        self._shown = True
        self.stream.write(f"{label}: {done}/{total} ({now - self._start:.0f} s)\n")
        self.stream.flush()

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.interval / 3):
            with self._lock:
                now = self.clock()
                if self._state is not None and self._last is not None and now - self._last >= self.interval:
                    self._write(now)
