"""Real servers for the remote-tier tests: redis-server (single node and a 3-master Cluster) on
free loopback ports in temp dirs, and the Ceph RGW S3 gateway started by ``.ci/run``.

``RedisServer`` wraps one ``redis-server`` process that can be killed (SIGKILL), paused (SIGSTOP,
a stalled server), resumed and restarted on the same port. Nothing here listens anywhere but
127.0.0.1, and every process is ended at teardown.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from needs import need

__all__ = ["CephGateway", "RedisCluster", "RedisServer", "free_port", "s3_settings"]


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(bus: bool = False) -> int:
    """A loopback port that is free (and ``port + 10000`` too, for a Cluster bus)."""
    for _ in range(200):
        port = random.randint(20000, 29999)
        if _port_free(port) and (not bus or _port_free(port + 10000)):
            return port
    raise RuntimeError("no free loopback port")


def _ping(port: int, timeout: float = 0.2) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(b"*1\r\n$4\r\nPING\r\n")
            return s.recv(16).startswith((b"+PONG", b"-NOAUTH"))  # up (with or without a password)
    except OSError:
        return False


class RedisServer:
    """One redis-server on 127.0.0.1 (see the module doc)."""

    def __init__(self, workdir: Path, *, cluster: bool = False, extra: tuple[str, ...] = ()) -> None:
        need(
            shutil.which("redis-server") is not None,
            "redis-server is not installed (apt-get install redis-server)",
        )
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.cluster = cluster
        self.extra = extra
        self.port = free_port(bus=cluster)
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        args = [
            "redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--dir", str(self.dir), "--protected-mode", "yes",
            *self.extra,
        ]  # fmt: skip
        if self.cluster:
            args += ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                     "--cluster-node-timeout", "2000"]  # fmt: skip
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while not _ping(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()  # never leave a half-started server behind
                raise RuntimeError(f"redis-server on port {self.port} did not start")
            time.sleep(0.02)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(10)

    def pause(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def cli(self, *args: str) -> str:
        out = subprocess.run(
            ["redis-cli", "-h", "127.0.0.1", "-p", str(self.port), *args],
            capture_output=True, text=True, timeout=10, check=True,
        )  # fmt: skip
        return out.stdout


class RedisCluster:
    """Three cluster-enabled redis-servers joined with ``redis-cli --cluster create`` (3 masters)."""

    def __init__(self, workdir: Path) -> None:
        self.nodes = [RedisServer(workdir / f"n{i}", cluster=True) for i in range(3)]
        try:
            subprocess.run(
                ["redis-cli", "--cluster", "create", *(f"127.0.0.1:{n.port}" for n in self.nodes),
                 "--cluster-replicas", "0", "--cluster-yes"],
                capture_output=True, text=True, timeout=60, check=True,
            )  # fmt: skip
            deadline = time.monotonic() + 30
            while not all("cluster_state:ok" in n.cli("cluster", "info") for n in self.nodes):
                if time.monotonic() > deadline:
                    raise RuntimeError("the Redis Cluster did not reach cluster_state:ok")
                time.sleep(0.1)
        except BaseException:
            self.stop()
            raise

    @property
    def url(self) -> str:
        return f"redis+cluster://127.0.0.1:{self.nodes[0].port}"

    def stop(self) -> None:
        for n in self.nodes:
            n.kill()


def s3_settings() -> dict[str, str]:
    """The S3 endpoint of the Ceph RGW gateway (env ``KVTIER_TEST_S3_ENDPOINT``), or skip/fail."""
    endpoint = os.environ.get("KVTIER_TEST_S3_ENDPOINT", "")
    need(bool(endpoint), "KVTIER_TEST_S3_ENDPOINT is not set (start tests/services/ceph-rgw.sh)")
    return {
        "endpoint_url": endpoint,
        "access_key_id": os.environ.get("KVTIER_TEST_S3_ACCESS_KEY", "kvtier"),
        "secret_access_key": os.environ.get("KVTIER_TEST_S3_SECRET_KEY", "kvtier-secret"),
    }


@contextlib.contextmanager
def redis_server(workdir: Path, **kw: object):  # type: ignore[no-untyped-def]
    server = RedisServer(workdir, **kw)  # type: ignore[arg-type]
    try:
        yield server
    finally:
        server.kill()


class CephGateway:
    """The radosgw process of the Ceph cluster ``ceph-rgw.sh`` started (env ``KVTIER_TEST_CEPH_DIR``):
    stopped and restarted alone, with the conf the script wrote; the cluster keeps running."""

    def __init__(self, endpoint: str) -> None:
        self.dir = Path(os.environ.get("KVTIER_TEST_CEPH_DIR", ""))
        need(
            bool(os.environ.get("KVTIER_TEST_CEPH_DIR")) and (self.dir / "ceph.conf").is_file(),
            "KVTIER_TEST_CEPH_DIR does not name the directory of a running ceph-rgw.sh cluster",
        )
        self.endpoint = endpoint
        self.pidfile = self.dir / "run" / "client.rgw.0.pid"

    def up(self) -> bool:
        import urllib.request

        try:
            with urllib.request.urlopen(self.endpoint, timeout=1):
                return True
        except OSError:
            return False

    def stop(self) -> None:
        pid = int(self.pidfile.read_text().strip())
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)
        raise RuntimeError(f"radosgw {pid} did not exit")

    def start(self) -> None:
        # radosgw daemonizes itself and writes its pid file; the conf binds it to 127.0.0.1 only.
        subprocess.run(
            ["radosgw", "-c", str(self.dir / "ceph.conf"), "-n", "client.rgw.0", "--no-mon-config"],
            check=True, timeout=60, capture_output=True,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while not self.up():
            if time.monotonic() > deadline:
                raise RuntimeError("radosgw did not answer after a restart")
            time.sleep(0.2)
