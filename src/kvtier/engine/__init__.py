"""The tiering engine: :class:`Engine`, the one object an inference engine talks to.

A package of components behind one facade (:mod:`kvtier.engine.facade`); the facade imports the
components, the components never import the facade:

* :mod:`~kvtier.engine.types`: the values the API takes and returns (requests, reports, handles,
  events);
* :mod:`~kvtier.engine.build`: construction (policy and slot count, tiers, cost model, metrics);
* :mod:`~kvtier.engine.parts`: what the components share (primary tier, tiers, counters, lock...);
* :mod:`~kvtier.engine.tenants`: tenant-scoped internal keys;
* :mod:`~kvtier.engine.events`: the event queue and its subscribers;
* :mod:`~kvtier.engine.residency`: which primary blocks the secondary tiers hold;
* :mod:`~kvtier.engine.jobs`: tier jobs from submission to their one result;
* :mod:`~kvtier.engine.writes`: the per-tier write policies and slot reservation;
* :mod:`~kvtier.engine.admission`: which tier hits are promoted (budget share, cost gate);
* :mod:`~kvtier.engine.movers`: byte copies and the transfer pool.

``docs/engine.md`` describes the behaviour.
"""

from __future__ import annotations

from kvtier.engine.facade import Engine
from kvtier.engine.types import EngineEvent, LoadHandle, LookupReport, RequestContext, StoreHandle

__all__ = ["Engine", "EngineEvent", "LoadHandle", "LookupReport", "RequestContext", "StoreHandle"]
