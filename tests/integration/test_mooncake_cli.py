"""``kvtier check`` round-trips a block through a real Mooncake Store, and ``kvtier replay
--simulate`` models a mooncake tier without touching any store (real subprocesses)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from mooncake_servers import MooncakeStore, loopback_env


def kvtier(*args: str) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).with_name("kvtier")
    cmd = [str(script)] if script.exists() else [shutil.which("kvtier") or sys.executable]
    if cmd == [sys.executable]:
        cmd += ["-m", "kvtier.cli.main"]
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=120, env=loopback_env())


def test_check_round_trips_a_block_through_the_store(mooncake_store: MooncakeStore, tmp_path: Path) -> None:
    cfg = tmp_path / "kvtier.json"
    cfg.write_text(
        json.dumps(
            {
                "block_bytes": 65536,
                "cpu_bytes_to_use": 16 * 65536,
                "secondary_tiers": [mooncake_store.tier_config(key_prefix="check")],
            }
        )
    )
    proc = kvtier("check", str(cfg), "--json")
    report = json.loads(proc.stdout)
    assert proc.returncode == 0 and report["ok"] is True, proc.stdout + proc.stderr[-2000:]
    (tier,) = report["tiers"]
    assert tier["ok"] and tier["load_seconds"] is not None


def test_replay_simulate_models_a_mooncake_tier_without_a_store() -> None:
    # A master nobody listens on: simulation must not connect to it.
    cfg = {
        "block_bytes": 65536,
        "cpu_bytes_to_use": 64 * 65536,
        "secondary_tiers": [
            {
                "type": "mooncake",
                "master_server_addr": "127.0.0.1:9",
                "metadata_server": "http://127.0.0.1:9/m",
            }
        ],
    }
    proc = kvtier("replay", "--simulate", "--limit", "300", "--config", json.dumps(cfg), "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    assert "mooncake" in json.dumps(doc)
