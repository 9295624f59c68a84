"""Two vLLM scheduler-side processes on one fs root hit each other's blocks.

Each child process builds vLLM's own offloading stack (``vllm_helpers.VllmStack``: vLLM's spec,
factory and manager, kvtier's fs tier under the shared root), stores its own blocks, waits until the
other process has stored too, then loads the other's blocks through vLLM's manager and checks
them byte for byte. Both processes are alive at the same time, as two vLLM instances would be.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from vllm_helpers import need_vllm

need_vllm()

_CHILD = r"""
import json, sys, time
from pathlib import Path
import numpy as np
from vllm_helpers import offload_keys, payload, vllm_stack

root, me, other = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
mine, theirs = offload_keys(5, salt=me.encode()), offload_keys(5, salt=other.encode())
with vllm_stack(root) as stack:
    stack.store(mine)
    (root / f"{me}.stored").write_text("1")
    deadline = time.monotonic() + 240
    while not (root / f"{other}.stored").exists():
        if time.monotonic() > deadline:
            sys.exit("the other process never stored")
        time.sleep(0.05)
    # The other process's stores reach this one's index within the fs tier's refresh interval.
    while True:
        out = stack.load(theirs)
        if all(v is not None for v in out.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    exact = [v is not None and bool(np.array_equal(v, payload(k, v.size))) for k, v in out.items()]
    (root / f"{me}.done").write_text("1")
    while not (root / f"{other}.done").exists() and time.monotonic() < deadline:
        time.sleep(0.05)  # stay alive until the other one has loaded, like two running servers
print(json.dumps({"exact": exact}))
"""


def test_two_vllm_processes_share_one_fs_root(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), *sys.path])}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(tmp_path), me, other],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for me, other in (("a", "b"), ("b", "a"))
    ]
    results = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=280)
        finally:
            proc.kill()
        assert proc.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    for result in results:
        assert result["exact"] == [True] * 5, "a process missed or misread the other's blocks"
