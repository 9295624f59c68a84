"""Waiting for a condition another thread or process makes true, bounded in time."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(cond: Callable[[], bool], seconds: float = 10.0) -> bool:
    """Poll ``cond`` every 20 ms until it holds (True) or ``seconds`` pass (False)."""
    deadline = time.monotonic() + seconds
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True
