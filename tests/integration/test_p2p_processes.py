"""Three real processes on loopback share primary-tier blocks through the p2p tier.

A serves (and publishes to a real redis-server directory); B and C load A's blocks byte-exact.
A is then frozen (SIGSTOP) while B's fetch is outstanding and killed (SIGKILL): B's job fails
those keys within the deadline, B keeps working, later lookups of A's keys miss. A restarted (new
process, new port) is found again through the directory.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from p2p_node import blocks, digest
from remote_servers import redis_server

BB = 256 * 1024
NODE = str(Path(__file__).with_name("p2p_node.py"))
SECRET = "test-secret-not-real"


class Node:
    def __init__(self, directory: str, *, serve: bool, peers: list[str] | None = None) -> None:
        tier: dict[str, object] = {
            "type": "p2p", "directory": directory, "secret_env": "KVTIER_P2P_SECRET",
            "op_timeout": 1.0, "negative_ttl": 0.2, "breaker_reset": 0.5, "threads": 2,
        }  # fmt: skip
        if serve:
            tier["serve"] = {"port": 0, "directory_ttl": 5}
        if peers:
            tier["peers"] = peers
        config = {"block_bytes": BB, "cpu_bytes_to_use": BB * 64, "secondary_tiers": [tier]}
        env = dict(os.environ, KVTIER_P2P_SECRET=SECRET)
        self.proc = subprocess.Popen(
            [sys.executable, NODE, json.dumps(config)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, text=True, env=env,
        )  # fmt: skip
        self.address = self.reply("ready")[0]

    def reply(self, word: str, timeout: float = 30) -> list[str]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.startswith(word), f"expected {word!r}, got {line!r} (exit {self.proc.poll()})"
        return line.split()[1:]

    def ask(self, cmd: str, word: str) -> list[str]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        return self.reply(word)

    def send(self, cmd: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


def expected(seed: int, n: int) -> list[str]:
    _, data = blocks(seed, n, BB)
    return [digest(row) for row in data]


@pytest.mark.slow
def test_three_processes_share_blocks_survive_a_killed_peer_and_find_it_again(tmp_path: Path) -> None:
    with redis_server(tmp_path / "redis") as redis:
        a = Node(redis.url, serve=True)
        b = Node(redis.url, serve=True)
        c = Node(redis.url, serve=False)
        nodes = [a, b, c]
        try:
            assert a.ask("store 1 8", "stored") == ["8"]
            assert b.ask("get 1 8 10", "got") == expected(1, 8)  # byte-exact, through the directory
            assert c.ask("get 1 8 10", "got") == expected(1, 8)

            assert a.ask("store 2 16", "stored") == ["16"]
            os.kill(a.proc.pid, signal.SIGSTOP)  # A stalls with B's fetch outstanding ...
            t0 = time.monotonic()
            b.send("get 2 16 3")
            time.sleep(0.3)
            os.kill(a.proc.pid, signal.SIGKILL)  # ... and dies
            a.proc.wait(10)
            got = b.reply("got")
            assert got == ["-"] * 16  # every key of A's failed; none holds wrong bytes
            assert time.monotonic() - t0 < 10
            assert b.ask("local", "local") == ["ok"]  # B keeps working ...
            assert b.ask("store 4 2", "stored") == ["2"]
            assert c.ask("get 4 2 10", "got") == expected(4, 2)  # ... and serving its own blocks
            assert b.ask("get 2 16 0.5", "got") == ["-"] * 16  # later lookups miss
            stats = json.loads(" ".join(b.ask("stats", "stats")))
            assert stats["failed_jobs"] >= 1 and stats["breaker_opens"] >= 1

            a2 = Node(redis.url, serve=True)  # restarted: a new process on a new port
            nodes.append(a2)
            assert a2.address != a.address
            assert a2.ask("store 2 16", "stored") == ["16"]
            assert b.ask("get 2 16 10", "got") == expected(2, 16)  # found again via the directory
        finally:
            for n in nodes:
                n.close()


def test_static_peer_without_directory(tmp_path: Path) -> None:
    with redis_server(tmp_path / "redis") as redis:
        a = Node(redis.url, serve=True)  # A publishes, but B asks A directly (static peers)
        try:
            b = Node("", serve=False, peers=[a.address])
            try:
                assert a.ask("store 3 4", "stored") == ["4"]
                assert b.ask("get 3 4 10", "got") == expected(3, 4)
            finally:
                b.close()
        finally:
            a.close()
