"""Every Python example in docs/fs.md runs, and its JSON config example is a valid config."""

from __future__ import annotations

import json
import re
from pathlib import Path

from kvtier.config import load_config

DOC = Path(__file__).resolve().parents[2] / "docs" / "fs.md"


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)


def test_python_examples_run() -> None:
    blocks = _blocks("python")
    assert blocks
    for code in blocks:
        exec(compile(code, str(DOC), "exec"), {})


def test_json_config_examples_load() -> None:
    one, striped = _blocks("json")
    parsed = load_config(json.loads(one))
    assert parsed.secondary_tiers[0].type == "fs"
    assert parsed.secondary_tiers[0].options["max_bytes"] == "200GiB"
    tier = load_config(json.loads(striped)).secondary_tiers[0]
    assert tier.type == "fs" and len(tier.options["root_dirs"]) == 3
