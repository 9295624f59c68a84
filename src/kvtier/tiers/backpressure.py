"""Back-pressure for tier stores: the :class:`StoreGate` an :class:`~kvtier.tiers.async_tier.AsyncTier`
consults before it queues a store job.

A store is never urgent (the block is still in the primary tier), so a tier that cannot keep up or
whose medium is full should *drop* stores early rather than queue bytes it cannot take: a dropped
store is a failed job, counted in ``stats.dropped_stores``, and the engine simply keeps the block in
RAM (or evicts it). Two signals feed the gate:

* **Pauses** -- a tier that learns its medium is full (``ENOSPC``, a server's out-of-memory reply, a
  throttling response) calls :meth:`StoreGate.pause`; every store is dropped until it expires.
* **Latency** -- the base reports each finished store job's bytes and seconds (queueing included:
  a growing backlog is exactly what must slow stores down) to :meth:`StoreGate.observe`, which keeps
  an exponential moving average of the **seconds per MiB** (a job counts as at least
  ``min_bytes``, 1 MiB by default, so a job of small blocks is judged by its latency). Against
  three marks, with hysteresis:

  ========== ================================================ =====================================
  state      entered when                                     stores
  ========== ================================================ =====================================
  ``open``   EMA falls below ``low_water`` (start state)      all admitted
  ``thrott`` EMA rises above ``high_water``                   ``throttle_ratio`` of them admitted
  ``drop``   EMA rises above ``drop_water``                   all dropped, but one probe store
                                                              every ``probe_interval`` s, so the
                                                              EMA can fall again
  ========== ================================================ =====================================

  Leaving ``thrott``/``drop`` needs the EMA under ``low_water`` (not just under ``high_water``), so a
  tier hovering around the mark does not flap. The defaults (throttle above 2 s/MiB, i.e. under
  ~0.5 MiB/s or 2 s for a job of small blocks, drop above 8 s/MiB, reopen under 1 s/MiB) only bite
  on a medium that is clearly failing -- an S3 gateway's first requests (a new connection, TLS)
  take a few hundred ms and must not throttle anything; a tier config tunes them with a
  ``backpressure`` mapping (:meth:`GateConfig.from_options`).

:meth:`StoreGate.counters` are merged into the tier's ``get_stats()`` (``gate_state`` 0/1/2,
``gate_throttled`` stores refused by the throttle or the drop state, ``gate_ms_per_mib`` the EMA in
milliseconds), so they reach ``kvtier replay``; the metrics exporter shows them as
``kvtier_store_gate_state`` and ``kvtier_store_gate_throttled_total``. Every tier built on the base
has a gate: the fs tier and the remote tiers take the marks from their ``backpressure`` option.

Thread model: :meth:`admit` runs on the engine thread inside ``submit_store`` and must not block;
:meth:`pause` and :meth:`observe` run on worker threads. One small lock guards the state; nothing
is done under it but arithmetic.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from kvtier.errors import ConfigError
from kvtier.numbers import MAX_BYTES, SECONDS, Range, check_number

__all__ = ["GateConfig", "StoreGate"]

_MIB = float(1 << 20)
OPEN, THROTTLED, DROPPING = 0, 1, 2
_STATE_NAMES = ("open", "throttled", "dropping")


#: The numeric ``backpressure`` options and their ranges (:mod:`kvtier.numbers`).
GATE_RANGES = {
    "high_water": Range(0, 1e6, open_low=True, unit="seconds per MiB"),
    "low_water": Range(0, 1e6, open_low=True, unit="seconds per MiB"),
    "drop_water": Range(0, 1e6, open_low=True, unit="seconds per MiB"),
    "throttle_ratio": Range(0, 1, open_low=True),
    "alpha": Range(0, 1, open_low=True),
    "probe_interval": SECONDS,
    "min_bytes": Range(1, MAX_BYTES, integer=True),
}


@dataclass(frozen=True, slots=True)
class GateConfig:
    """Latency marks of a :class:`StoreGate` (seconds per MiB of store payload).

    Attributes:
        high_water: EMA above this throttles stores.
        low_water: EMA below this ends throttling/dropping (hysteresis; ``< high_water``).
        drop_water: EMA above this drops every store but the probes (``>= high_water``).
        throttle_ratio: fraction of stores admitted while throttled (0 < r <= 1).
        alpha: weight of the newest observation in the EMA (0 < a <= 1).
        probe_interval: seconds between two probe stores admitted while dropping.
        min_bytes: a job is counted as at least this many bytes, so the fixed cost of a job of
            small blocks (a round trip, a syscall) is not read as a slow medium.
        enabled: ``False`` turns latency throttling off (pauses still work).
    """

    high_water: float = 2.0
    low_water: float = 1.0
    drop_water: float = 8.0
    throttle_ratio: float = 0.5
    alpha: float = 0.2
    probe_interval: float = 0.5
    min_bytes: int = 1 << 20
    enabled: bool = True

    def __post_init__(self) -> None:
        key = "backpressure"
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "enabled":
                if not isinstance(value, bool):
                    raise ConfigError(f"{key}.enabled", f"expected true or false, got {value!r}")
                continue
            check_number(f"{key}.{f.name}", value, GATE_RANGES[f.name])
        if not self.low_water < self.high_water <= self.drop_water:
            raise ConfigError(
                key,
                f"need low_water < high_water <= drop_water, got {self.low_water} / {self.high_water}"
                f" / {self.drop_water}",
            )
        if self.throttle_ratio > 1 or self.alpha > 1:
            raise ConfigError(key, "throttle_ratio and alpha must be <= 1")

    @classmethod
    def from_options(cls, options: Mapping[str, Any] | None) -> GateConfig:
        """From a tier config's ``backpressure`` mapping; unknown keys are a :class:`ConfigError`."""
        if options is None:
            return cls()
        if not isinstance(options, Mapping):
            raise ConfigError("backpressure", f"expected a mapping, got {type(options).__name__}")
        names = {f.name for f in fields(cls)}
        for k in options:
            if k not in names:
                known = ", ".join(sorted(names))
                raise ConfigError(f"backpressure.{k}", f"unknown key; expected one of {known}")
        return cls(**dict(options))


class StoreGate:
    """Accept or drop store jobs: pausable, and throttled by store latency (see the module doc).

    Args:
        config: the latency marks (default :class:`GateConfig`).
        clock: monotonic seconds (injectable for tests).
    """

    def __init__(self, config: GateConfig | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config or GateConfig()
        self._clock = clock
        self._lock = threading.Lock()
        self._paused_until = 0.0
        self._pause_reason = ""
        self._state = OPEN
        self._credit = 0.0  # throttle: admitted when it reaches 1 (deterministic, no randomness)
        self._next_probe = 0.0
        self.throttled = 0
        #: Seconds per MiB of the last store job that moved bytes (``None`` before the first).
        self.seconds_per_mib: float | None = None
        #: The moving average the marks are compared with (``None`` before the first store).
        self.ema: float | None = None

    @property
    def state(self) -> str:
        """``"open"``, ``"throttled"`` or ``"dropping"``."""
        return _STATE_NAMES[self._state]

    def admit(self, nbytes: int) -> str | None:
        """``None`` to queue a store job of ``nbytes`` payload bytes, else the reason it is dropped
        (becomes the failed job's ``error``). Engine thread; non-blocking."""
        now = self._clock()
        with self._lock:
            if now < self._paused_until:
                return self._pause_reason
            if self._state == OPEN:
                return None
            if self._state == THROTTLED:
                self._credit += self.config.throttle_ratio
                if self._credit >= 1.0:
                    self._credit -= 1.0
                    return None
            elif now >= self._next_probe:  # dropping: let one store through to re-measure
                self._next_probe = now + self.config.probe_interval
                return None
            self.throttled += 1
            ema = self.ema or 0.0
        return f"store latency {ema * 1000:.0f} ms/MiB is over the back-pressure mark ({self.state})"

    def pause(self, seconds: float, reason: str) -> None:
        """Drop every store for the next ``seconds`` (extends, never shortens, a running pause)."""
        until = self._clock() + seconds
        with self._lock:
            if until > self._paused_until:
                self._pause_reason = reason
                self._paused_until = until

    @property
    def paused(self) -> bool:
        return self._clock() < self._paused_until

    def observe(self, nbytes: int, seconds: float) -> None:
        """A store job finished after ``seconds`` having written ``nbytes`` (worker thread)."""
        if nbytes <= 0:
            return
        spm = max(0.0, seconds) * _MIB / max(nbytes, self.config.min_bytes)
        cfg = self.config
        with self._lock:
            self.seconds_per_mib = spm
            self.ema = spm if self.ema is None else self.ema + cfg.alpha * (spm - self.ema)
            if not cfg.enabled:
                return
            ema = self.ema
            if ema > cfg.drop_water:
                if self._state != DROPPING:
                    self._next_probe = self._clock() + cfg.probe_interval
                self._state = DROPPING
            elif ema > cfg.high_water:
                # From dropping, come down to throttled only once under the drop mark.
                self._state = THROTTLED
            elif ema < cfg.low_water:
                self._state = OPEN
                self._credit = 0.0
            # between low and high water: keep the state (hysteresis)

    def counters(self) -> dict[str, int]:
        """Integer counters for ``get_stats()``: ``gate_state``, ``gate_throttled``, ``gate_ms_per_mib``."""
        with self._lock:
            ema = self.ema
            return {
                "gate_state": self._state,
                "gate_throttled": self.throttled,
                "gate_ms_per_mib": round((ema or 0.0) * 1000),
            }
