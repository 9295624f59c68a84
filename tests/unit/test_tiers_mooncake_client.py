"""The mooncake tier refuses to run without the Mooncake client before it builds anything, and
``kvtier check`` (``check_options``) says so too, naming the extra to install.

The client's absence is simulated by hiding the ``mooncake`` module from ``importlib.util.find_spec``
(uninstalling a package inside the test run is not possible); nothing here talks to a store.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import numpy as np
import pytest

from kvtier.errors import ConfigError
from kvtier.tiers.base import TierContext
from kvtier.tiers.mooncake import MooncakeTier

OPTIONS = {"master_server_addr": "127.0.0.1:50051", "metadata_server": "http://127.0.0.1:8080/metadata"}
CONTEXT = TierContext("mooncake0", 4096)


@pytest.fixture
def no_client(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any, **kwargs: Any) -> Any:
        return None if name.split(".")[0] == "mooncake" else real(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


@pytest.mark.usefixtures("no_client")
def test_check_options_names_the_extra_without_the_client() -> None:
    with pytest.raises(ConfigError, match=r"type: .*pip install 'kvtier\[mooncake\]'"):
        MooncakeTier.check_options(CONTEXT, OPTIONS)


@pytest.mark.usefixtures("no_client")
def test_constructor_refuses_before_reading_options_without_the_client() -> None:
    view = memoryview(np.zeros((4, 8192), dtype=np.uint8))
    # A bad option too: the missing client is what the user must fix first, and nothing is built.
    with pytest.raises(ConfigError, match=r"kvtier\[mooncake\]"):
        MooncakeTier(primary_kv_view=view, context=CONTEXT, **OPTIONS, replica_num=0)


def test_check_options_passes_with_the_client() -> None:
    if importlib.util.find_spec("mooncake") is None:
        pytest.skip("the Mooncake client is not installed (pip install 'kvtier[mooncake]')")
    MooncakeTier.check_options(CONTEXT, OPTIONS)
    with pytest.raises(ConfigError, match="replica_num"):
        MooncakeTier.check_options(CONTEXT, {**OPTIONS, "replica_num": 0})
