"""One vLLM scheduler-side process sharing a kvtier tier with another (see
``vllm_scenarios.run_sharing_processes``).

``python vllm_share_proc.py TIERS_JSON SYNC_DIR ME OTHER N``: builds vLLM's own stack on the
``secondary_tiers`` list TIERS_JSON, stores its N blocks, writes ``SYNC_DIR/ME.stored``, waits for
the other's, loads the other's N blocks through vLLM's manager until they hit (another instance's
writes reach a tier's index within its refresh or negative-lookup interval), stays alive until the
other has loaded too, and prints ``{"exact": [bool per block], "blocks_sent": n}`` (blocks its p2p
block server sent, ``null`` without one). While it waits it takes no step: a serving tier answers
the other from vLLM's tier-poll thread, as in an idle engine.
"""

from __future__ import annotations

import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np

warnings.simplefilter("ignore")  # vLLM's and torch's import-time deprecations are not under test

from vllm_helpers import offload_keys, payload, vllm_stack  # noqa: E402
from vllm_scenarios import load_until_hit  # noqa: E402

_DEADLINE_S = 240.0


def _wait_for(path: Path, deadline: float) -> bool:
    while not path.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def main() -> None:
    tiers, sync = json.loads(sys.argv[1]), Path(sys.argv[2])
    me, other, n = sys.argv[3], sys.argv[4], int(sys.argv[5])
    mine, theirs = offload_keys(n, salt=me.encode()), offload_keys(n, salt=other.encode())
    deadline = time.monotonic() + _DEADLINE_S
    with vllm_stack(tiers=tiers) as stack:
        stack.store(mine)
        (sync / f"{me}.stored").write_text("1")
        if not _wait_for(sync / f"{other}.stored", deadline):
            sys.exit("the other process never stored")
        out = load_until_hit(stack, theirs, timeout=max(1.0, deadline - time.monotonic()))
        exact = [v is not None and bool(np.array_equal(v, payload(k, v.size))) for k, v in out.items()]
        (sync / f"{me}.done").write_text("1")
        _wait_for(sync / f"{other}.done", deadline)  # stay up while the other loads, like two servers
        service = getattr(stack.tier, "block_service", None)
        sent = None if service is None else service.server.stats["blocks_sent"]
    print(json.dumps({"exact": exact, "blocks_sent": sent}))


if __name__ == "__main__":
    main()
