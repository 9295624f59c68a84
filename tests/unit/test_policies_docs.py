"""The examples in docs/policies.md run as written."""

from __future__ import annotations

import json
import re
from importlib.metadata import entry_points
from pathlib import Path

from kvtier.config import load_config
from kvtier.policies.base import CachePolicy

DOC = Path(__file__).parents[2] / "docs" / "policies.md"


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", DOC.read_text(), flags=re.S)


def test_json_config_example_builds_the_policy() -> None:
    (block,) = _blocks("json")
    cfg = load_config(json.loads(block))
    (ep,) = [ep for ep in entry_points(group="kvtier.policies") if ep.name == cfg.eviction_policy]
    cls = ep.load()
    policy = cls(64, **dict(cfg.policy_options))
    assert isinstance(policy, CachePolicy) and policy.capacity == 64


def test_python_examples_run() -> None:
    for block in _blocks("python"):
        exec(compile(block, str(DOC), "exec"), {})


def test_every_builtin_is_documented() -> None:
    text = DOC.read_text()
    for ep in entry_points(group="kvtier.policies"):
        if ep.value.startswith("kvtier."):
            assert f"`{ep.name}`" in text
