"""The "Try it here" block of README and every doc runs on this machine as written (issue 28):
each ``<!-- try-it -->`` bash block is run by bash with ``kvtier`` meaning this checkout's
``python -m kvtier``, in an empty directory. Every command must succeed, and what ``kvtier check``
created (the ``/tmp/kvtier-try`` root, moved under the test's own temporary directory so runs do not
meet) must be gone afterwards. The remote doc's block starts and stops its own redis-server; its
fixed port is swapped for a free one, so parallel runs do not collide.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from needs import need

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"<!-- try-it -->\n```bash\n(.*?)```", re.S)
COMMAND = re.compile(r"^((?:[A-Z_][A-Z0-9_]*=\S+ )*)kvtier ", re.M)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_the_try_it_block_runs_here_and_leaves_nothing_behind(doc: Path, tmp_path: Path) -> None:
    blocks = BLOCK.findall(doc.read_text())
    assert blocks, f"{doc.name} has no <!-- try-it --> block"
    script = "\n".join(blocks)
    if "redis-server" in script:
        need(shutil.which("redis-server") is not None, "redis-server is not installed")
        script = script.replace("6399", str(free_port()))
    root = tmp_path / "kvtier-try"
    script = script.replace("/tmp/kvtier-try", str(root))
    script = COMMAND.sub(lambda m: f'{m.group(1)}"$KVTIER_PY" -m kvtier ', script)
    work = tmp_path / "cwd"
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "KVTIER_PY": sys.executable}
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=work, env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, f"{doc.name}:\n{script}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    assert not root.exists(), f"{doc.name}: kvtier check left {sorted(p.name for p in root.rglob('*'))}"
    assert list(work.iterdir()) == [], f"{doc.name}: left files in the working directory"
