"""Warnings the vLLM plug-in logs once per process (a misconfiguration seen on every step)."""

from __future__ import annotations

import logging
import threading

__all__ = ["log_once", "reset_log_once"]

log = logging.getLogger("kvtier.integrations.vllm")

_lock = threading.Lock()
_seen: set[str] = set()


def log_once(key: str, msg: str, *args: object) -> None:
    """Log a WARNING the first time ``key`` is seen in this process."""
    with _lock:
        if key in _seen:
            return
        _seen.add(key)
    log.warning(msg, *args)


def reset_log_once() -> None:
    """Forget which once-per-process warnings were logged (for tests)."""
    with _lock:
        _seen.clear()
