"""README.md opens with the two set-up commands, CI runs the same test command, examples load."""

from __future__ import annotations

import json
import re
from pathlib import Path

from kvtier.config import load_config

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
FIRST = "pip install -e '.[cli]' && kvtier replay"
SECOND = "pip install torch==2.13.0 && pip install -e '.[all,torch]' && python -m pytest -q"


def test_readme_opens_with_exactly_the_two_setup_commands() -> None:
    first_block = re.search(r"```(?:bash|sh|console)?\n(.*?)```", README, re.DOTALL)
    assert first_block is not None
    assert README.index(first_block.group(0)) < README.index("## ")  # before any section
    assert first_block.group(1).strip().splitlines() == [FIRST, SECOND]


def test_ci_runs_the_readme_test_command_and_fails_on_no_tests() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert f'TEST_COMMAND="{SECOND}"' in ci
    assert 'bash -c "$TEST_COMMAND"' in ci
    assert "set -euo pipefail" in ci and '"$rc" -eq 5' in ci
    assert "redis-server" in ci


def test_readme_config_example_is_valid() -> None:
    configs = [json.loads(b) for b in re.findall(r"```json\n(.*?)```", README, re.DOTALL)]
    assert configs
    for raw in configs:
        cfg = load_config(raw)
        assert cfg.secondary_tiers and cfg.secondary_tiers[1].module_path == "my_company.kv_tiers"


def test_readme_links_resolve_and_it_has_caveats() -> None:
    links = re.findall(r"\]\((docs/[^)]+)\)", README)
    assert "docs/plugins.md" in links
    for link in links:
        assert (ROOT / link).is_file(), link
    assert "## Caveats" in README
