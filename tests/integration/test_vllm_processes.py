"""Two vLLM scheduler-side processes on one kvtier store hit each other's blocks.

Each child process builds vLLM's own offloading stack (``vllm_share_proc.py``: vLLM's spec, factory
and manager), stores its own blocks, waits until the other process has stored too, then loads the
other's blocks through vLLM's manager and checks them byte for byte. Both processes are alive at
the same time, as two vLLM instances would be. The redis variant lives with the other remote
tiers (``test_vllm_remote.py``).
"""

from __future__ import annotations

from pathlib import Path

from vllm_helpers import kvtier_entry, need_vllm
from vllm_scenarios import run_sharing_processes

need_vllm()


def test_two_vllm_processes_share_one_fs_root(tmp_path: Path) -> None:
    run_sharing_processes([kvtier_entry(tmp_path)], tmp_path)
