"""kvtier's pin action in vLLM's ``kv_hints`` envelope: keep a request's blocks for a TTL.

What vLLM provides (0.32, 0.33 and 0.34 alike): a typed, versioned envelope a router attaches to a
request, ``vllm.v1.kv_hints.KvHintsEnvelope(protocol_version, message_id, actions)`` of
``KvHintAction(action_id, action_type, action_version, payload)``, carried to the offloading
manager as ``ReqContext.kv_hints`` (``offloading/scheduler.py`` ``_create_req_context``). vLLM defines
the transport only: "Action-specific schemas are validated by the component implementing the
action" (``kv_hints/protocol.py``), and no pin or retain action ships in vLLM (its one consumer,
the KVCR tier, reads ``kv.fetch``). The pin/retain idea is vLLM RFC #51428's ("Pin | Retain ...
optional TTL"); the action below is kvtier's own, under a ``kvtier.`` name so it cannot collide with
an action vLLM or another component defines later::

    {"action_id": "keep-system-prompt", "action_type": "kvtier.pin", "action_version": "1.0",
     "payload": {"ttl_s": 300}}

Every block the request stores or hits in kvtier's primary tier is then kept there for ``ttl_s``
seconds (:meth:`kvtier.Engine.pin_for`; bounded by ``pin_share`` and ``pin_max_ttl_s``). Other
action types are ignored (they belong to other components); a malformed ``kvtier.pin`` action is a
one-line :class:`~kvtier.errors.ConfigError` naming the field, which the manager logs and ignores:
a bad hint never fails the request. Imports no vLLM (the envelope is read by attribute or key).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvtier.errors import ConfigError

__all__ = ["MAX_ACTIONS", "PIN_ACTION", "PIN_VERSION", "TIER_PIN_NOTICE", "PinHint", "has_pin", "pin_hint"]

PIN_ACTION = "kvtier.pin"
PIN_VERSION = "1.0"
#: Actions read per envelope: a hint is a few actions; a huge list is not worth a scan per request.
MAX_ACTIONS = 64


#: Logged once by ``KvtierTier``: there vLLM's own CPU tier decides what stays in host memory.
TIER_PIN_NOTICE = (
    "kvtier: a kvtier.pin kv_hint has no effect on KvtierTier (vLLM's CPU tier decides its evictions); "
    "load kvtier's engine with KvtierOffloadingSpec to honour it (docs/vllm.md)"
)


@dataclass(frozen=True, slots=True)
class PinHint:
    """A parsed ``kvtier.pin`` action: keep the request's blocks ``ttl_s`` seconds."""

    ttl_s: float
    action_id: str


def _field(obj: Any, name: str) -> Any:
    """``obj.name`` for vLLM's msgspec structs, ``obj[name]`` for a plain mapping (JSON)."""
    if isinstance(obj, Mapping):
        return obj.get(name)
    return getattr(obj, name, None)


def has_pin(kv_hints: Any) -> bool:
    """Whether ``kv_hints`` carries a ``kvtier.pin`` action among its first :data:`MAX_ACTIONS`."""
    actions = _field(kv_hints, "actions") if kv_hints is not None else None
    if not isinstance(actions, list | tuple):
        return False
    return any(_field(a, "action_type") == PIN_ACTION for a in actions[:MAX_ACTIONS])


def pin_hint(kv_hints: Any, max_ttl_s: float) -> PinHint | None:
    """The first ``kvtier.pin`` action of ``kv_hints`` (a ``KvHintsEnvelope`` or its JSON form).

    ``None`` when there is no envelope or no such action. Raises a one-line :class:`ConfigError`
    whose key path names the field (``kv_hints.actions[0].payload.ttl_s``) when the action is
    malformed: another version, a payload that is not ``{"ttl_s": seconds}``, or a TTL that is not
    a finite number in ``(0, max_ttl_s]``.
    """
    if kv_hints is None:
        return None
    actions = _field(kv_hints, "actions")
    if not isinstance(actions, list | tuple):
        raise ConfigError("kv_hints.actions", f"expected a list of actions, got {type(actions).__name__}")
    for i, action in enumerate(actions[:MAX_ACTIONS]):
        if _field(action, "action_type") != PIN_ACTION:
            continue  # another component's action (kv.fetch is KVCR's)
        return _parse_pin(action, f"kv_hints.actions[{i}]", max_ttl_s)
    return None


def _parse_pin(action: Any, path: str, max_ttl_s: float) -> PinHint:
    version = _field(action, "action_version")
    if version != PIN_VERSION:
        raise ConfigError(
            f"{path}.action_version", f"{PIN_ACTION} supports version {PIN_VERSION!r}, got {version!r}"
        )
    payload = _field(action, "payload")
    if not isinstance(payload, Mapping):
        raise ConfigError(f"{path}.payload", f'expected an object such as {{"ttl_s": 300}}, got {payload!r}')
    extra = sorted(str(k) for k in payload if k != "ttl_s")
    if extra:
        raise ConfigError(f"{path}.payload", f"unknown key {extra[0]!r}; {PIN_ACTION} takes ttl_s only")
    ttl = payload.get("ttl_s")
    if (
        not isinstance(ttl, int | float)
        or isinstance(ttl, bool)
        or not math.isfinite(ttl)
        or not 0.0 < ttl <= max_ttl_s
    ):
        raise ConfigError(
            f"{path}.payload.ttl_s",
            f"expected a finite number of seconds > 0 and <= {max_ttl_s:g} (pin_max_ttl_s), got {ttl!r}",
        )
    action_id = _field(action, "action_id")
    return PinHint(float(ttl), action_id if isinstance(action_id, str) else "")
