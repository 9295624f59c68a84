"""Session-wide test settings .

* Hypothesis: no deadline (the machine is shared and timing is noisy) and modest example counts;
  ``HYPOTHESIS_PROFILE=thorough`` raises them for a deliberate long run.
* Markers: every test under ``tests/integration/`` is marked ``integration`` (real files, processes
  and servers) and, per service its module starts or needs, ``redis``, ``s3``, ``mooncake``,
  ``vllm`` or ``hf`` (:data:`SERVICES`: ``pytest -m "not s3"`` runs everything but the S3 tests);
  the slowest tests carry ``slow`` themselves. ``pytest -m "not slow"`` is the quick loop; CI runs
  everything.
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

#: Service marker -> what in a test module's source shows it starts or needs that service (the
#: helpers of tests/integration that start it, or the engine it imports).
SERVICES: dict[str, tuple[str, ...]] = {
    "redis": ("redis_server", "RedisServer", "RedisCluster"),
    "s3": ("s3_settings", "CephGateway", "KVTIER_TEST_S3"),
    "mooncake": ("mooncake_servers", "mooncake_procs", "mooncake_store"),
    "vllm": ("vllm_helpers", "vllm_scenarios", "import vllm", "from vllm", "KVTIER_TEST_VLLM"),
    "hf": ("hf_helpers", "import transformers", "from transformers"),
}


def service_markers(source: str) -> list[str]:
    """The service markers of a test module with this source text."""
    return [name for name, signs in SERVICES.items() if any(sign in source for sign in signs)]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    by_path: dict[str, list[str]] = {}
    for item in items:
        path = str(item.path)
        if not path.startswith(_INTEGRATION_DIR):
            continue
        item.add_marker(pytest.mark.integration)
        if path not in by_path:
            with open(path, encoding="utf-8") as f:
                by_path[path] = service_markers(f.read())
        for name in by_path[path]:
            item.add_marker(getattr(pytest.mark, name))


@pytest.fixture(autouse=True)
def _restore_plugin_registries() -> Iterator[None]:
    from kvtier import plugins

    state = plugins.snapshot_state()
    try:
        yield
    finally:
        plugins.restore_state(state)
