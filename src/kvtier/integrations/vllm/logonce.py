"""Warnings the vLLM plug-in logs once per process (a misconfiguration seen on every step)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

from kvtier.config.vllm import inline_secrets

__all__ = ["log_once", "reset_log_once", "warn_inline_secrets"]

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


def warn_inline_secrets(entry: Mapping[str, Any]) -> None:
    """Warn once per option of the ``KvtierTier`` ``entry`` that holds a secret inline (vLLM logs
    ``--kv-transfer-config`` at start-up)."""
    for key, instead in inline_secrets(entry):
        # The key's name only: the value is the secret.
        log_once(
            f"inline-secret:{key}",
            "kvtier: KvtierTier option %r holds a secret in --kv-transfer-config, which vLLM logs at "
            "start-up; name an environment variable instead (%s)",
            key,
            instead,
        )
