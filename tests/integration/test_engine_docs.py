"""Every SGLang / LMCache command line in docs/sglang.md, docs/lmcache.md and the README, run
through the engine's own parser.

The ``bash`` blocks are read from the files; only the ``root_dir`` (a temporary directory) and the
Redis address (a redis-server this test starts on 127.0.0.1) are replaced. SGLang's
``ServerArgs`` parser and LMCache's ``lmcache server`` parser read the rest as written, and the
scenario scripts build the engine's storage stack from the result and round-trip real bytes
through it (a launched server would need a GPU: see the docs' "What is tested").
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from engine_venvs import HERE, engine_python, run_scenario
from remote_servers import redis_server

pytestmark = pytest.mark.slow

ROOT = HERE.parents[1]


def commands(doc: str, program: str) -> list[list[str]]:
    """The command lines of ``doc`` that start with ``program`` (a doc of one engine has no other but
    its "try it here" block, which tests/cli/test_cli_try_it.py runs)."""
    text = re.sub(r"<!-- try-it -->\n```bash\n.*?```", "", (ROOT / doc).read_text(), flags=re.S)
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    lines = [ln for b in blocks for ln in b.splitlines() if ln.strip()]
    if doc.startswith("docs/"):
        assert lines and all(ln.startswith(program) for ln in lines), (
            f"{doc}: every command starts with {program}"
        )
    return [shlex.split(ln) for ln in lines if ln.startswith(program)]


def test_readme_has_one_command_per_engine() -> None:
    assert len(commands("README.md", "python -m sglang.launch_server")) == 1
    assert len(commands("README.md", "lmcache server")) == 1


def test_every_doc_command_line_has_its_test() -> None:
    # The two tests below run commands by index: a command added to a doc must add its index there.
    assert len(commands("docs/sglang.md", "python -m sglang.launch_server")) == 2
    assert len(commands("docs/lmcache.md", "lmcache server")) == 2


def localize(argv: list[str], root: Path, redis_url: str) -> list[str]:
    out = []
    for arg in argv:
        if arg.startswith("{"):
            arg = arg.replace("/mnt/nvme/kvtier", str(root)).replace("redis://127.0.0.1:6379/0", redis_url)
            json.loads(arg)  # still one JSON object
        out.append(arg)
    return out


@pytest.mark.parametrize(("doc", "index"), [("docs/sglang.md", 0), ("docs/sglang.md", 1), ("README.md", 0)])
def test_sglang_doc_command_lines(tmp_path: Path, doc: str, index: int) -> None:
    py = engine_python("SGLANG")
    argv = commands(doc, "python -m sglang.launch_server")[index]
    assert argv[:3] == ["python", "-m", "sglang.launch_server"]
    with redis_server(tmp_path / "redis") as server:
        args = localize(argv[3:], tmp_path / "kv", server.url)
        out = run_scenario(py, "sglang_scenarios.py", "round_trip", json.dumps(args))
    assert out["exact"] and out["hit"] == 6 and out["loaded"] == [True] * 6


@pytest.mark.parametrize(("doc", "index"), [("docs/lmcache.md", 0), ("docs/lmcache.md", 1), ("README.md", 0)])
def test_lmcache_doc_command_lines(tmp_path: Path, doc: str, index: int) -> None:
    py = engine_python("LMCACHE")
    argv = commands(doc, "lmcache server")[index]
    assert argv[:2] == ["lmcache", "server"]
    with redis_server(tmp_path / "redis") as server:
        args = localize(argv[2:], tmp_path / "kv", server.url)
        out = run_scenario(py, "lmcache_scenarios.py", "manager_round_trip", json.dumps(args))
    assert out["exact"] and out["bits"] == [1, 1, 1, 1, 0] and out["locked"] == 0
