"""Session-wide test settings .

* Hypothesis: no deadline (the machine is shared and timing is noisy) and modest example counts;
  ``HYPOTHESIS_PROFILE=thorough`` raises them for a deliberate long run.
* Markers: every test under ``tests/integration/`` is marked ``integration`` (real files, processes
  and servers); the slowest tests carry ``slow`` themselves. ``pytest -m "not slow"`` is the quick
  loop; CI runs everything.
* Every test leaves the plug-in registries as it found them (registrations, resolved built-ins and
  the once-per-process experimental-API notice), so a test that registers a plug-in cannot change
  what another test sees.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator

import pytest
from hypothesis import settings

# When a property test fails, Hypothesis' pytest plugin imports its patch writer (libcst), which
# emits a DeprecationWarning from mypy_extensions; with warnings as errors that turned every
# falsified example into an INTERNALERROR hiding the failure. Import it once, quietly, up front.
with warnings.catch_warnings(), contextlib.suppress(Exception):
    warnings.simplefilter("ignore")
    import hypothesis.extra._patching  # noqa: F401

settings.register_profile("kvtier", deadline=None, max_examples=100)
settings.register_profile("thorough", deadline=None, max_examples=1000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "kvtier"))


_INTEGRATION_DIR = os.path.join(os.path.dirname(__file__), "integration") + os.sep


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if str(item.path).startswith(_INTEGRATION_DIR):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(autouse=True)
def _restore_plugin_registries() -> Iterator[None]:
    from kvtier import plugins

    state = plugins.snapshot_state()
    try:
        yield
    finally:
        plugins.restore_state(state)
