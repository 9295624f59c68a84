"""A real Mooncake Store on loopback for the ``mooncake`` tier's tests and benchmarks: a ``mooncake_master``
(metadata + allocation, with its HTTP metadata server) and a separate ``mooncake_client`` *holder*
process that owns the memory segment where the objects live.

Every process binds 127.0.0.1 only: ports are passed explicitly and ``MC_TCP_BIND_ADDRESS`` is set in
every environment (the transfer engine otherwise advertises the machine's network address). Readiness
is polled on the ports, never slept for. The holder can be killed (SIGKILL: a crashed holder) and
started again on the same settings; :meth:`MooncakeStore.stop` ends the holder, then the master
(SIGTERM, then SIGKILL after a bound).

No pytest here: ``benchmarks/bench_mooncake.py`` starts its store with this module. A missing
executable or module raises :class:`MooncakeMissing` (one line naming what to install);
``mooncake_servers`` turns that into a skip (locally) or a failure (CI).
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

__all__ = ["LOOPBACK_ENV", "MooncakeMissing", "MooncakeStore", "free_port", "loopback_env", "missing"]

LOOPBACK_ENV = {"MC_TCP_BIND_ADDRESS": "127.0.0.1"}


class MooncakeMissing(RuntimeError):
    """Mooncake's Python module or one of its executables is not installed."""


def missing(*, executables: bool = True) -> str | None:
    """What of Mooncake is not installed here (one line with the fix), or None when all is.

    ``executables=False`` checks the Python module only (a client of a store started elsewhere).
    """
    try:
        import mooncake.store  # noqa: F401
    except ImportError as exc:
        return f"mooncake.store is not installed (pip install 'kvtier[mooncake]'): {exc}"
    for exe in ("mooncake_master", "mooncake_client") if executables else ():
        if shutil.which(exe) is None:
            return f"{exe} is not on PATH (pip install 'kvtier[mooncake]')"
    return None


def loopback_env() -> dict[str, str]:
    """The calling process's environment with Mooncake's transfer engine bound to loopback."""
    return {**os.environ, **LOOPBACK_ENV}


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(avoid: set[int] | None = None) -> int:
    """A free loopback port (not in ``avoid``)."""
    for _ in range(500):
        port = random.randint(30000, 39999)
        if (avoid is None or port not in avoid) and _port_free(port):
            return port
    raise RuntimeError("no free loopback port")


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


def _wait(proc: subprocess.Popen[bytes], port: int, what: str, log: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not _listening(port):
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise RuntimeError(f"{what} did not listen on 127.0.0.1:{port}; log tail:\n{tail}")
        time.sleep(0.02)


def _end(proc: subprocess.Popen[bytes] | None, sig: int = signal.SIGTERM, timeout: float = 10.0) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout)


class MooncakeStore:
    """A master and one holder on free loopback ports (see the module doc).

    Args:
        workdir: where the processes' logs go.
        segment: the holder's global segment size (a mooncake size string, e.g. ``"256MB"``).
        master_args: extra ``mooncake_master`` flags.
    """

    def __init__(self, workdir: Path, *, segment: str = "256MB", master_args: tuple[str, ...] = ()) -> None:
        reason = missing()
        if reason is not None:
            raise MooncakeMissing(reason)
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.segment = segment
        self.master_args = master_args
        used: set[int] = set()
        for attr in ("rpc_port", "http_port", "metrics_port", "holder_port"):
            port = free_port(used)
            used.add(port)
            setattr(self, attr, port)
        self.master: subprocess.Popen[bytes] | None = None
        self.holder: subprocess.Popen[bytes] | None = None
        self._holders = 0
        try:
            self.start_master()
            self.start_holder()
        except BaseException:
            self.stop()
            raise

    # -- what a client needs ------------------------------------------------------------------------
    @property
    def master_addr(self) -> str:
        return f"127.0.0.1:{self.rpc_port}"

    @property
    def metadata_server(self) -> str:
        return f"http://127.0.0.1:{self.http_port}/metadata"

    def tier_config(self, **extra: object) -> dict[str, object]:
        """A ``mooncake`` tier config pointing at this store (a pure client: no segment of its own)."""
        return {
            "type": "mooncake",
            "master_server_addr": self.master_addr,
            "metadata_server": self.metadata_server,
            "local_hostname": "127.0.0.1",
            **extra,
        }

    # -- processes ----------------------------------------------------------------------------------
    def start_master(self) -> None:
        log = self.dir / "master.log"
        args = [
            "mooncake_master",
            "-rpc_address=127.0.0.1", f"-rpc_port={self.rpc_port}",
            "-enable_http_metadata_server=true", "-http_metadata_server_host=127.0.0.1",
            f"-http_metadata_server_port={self.http_port}",
            "-metrics_host=127.0.0.1", f"-metrics_port={self.metrics_port}",
            *self.master_args,
        ]  # fmt: skip
        with open(log, "ab") as out:
            self.master = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=loopback_env())
        _wait(self.master, self.rpc_port, "mooncake_master", log)
        _wait(self.master, self.http_port, "mooncake_master's metadata server", log)

    def start_holder(self) -> None:
        """Start (or restart) the holder; returns once its service port listens."""
        self._holders += 1
        log = self.dir / f"holder{self._holders}.log"
        args = [
            "mooncake_client",
            "-host=127.0.0.1", f"-port={self.holder_port}",
            f"-master_server_address={self.master_addr}",
            f"-metadata_server={self.metadata_server}",
            "-protocol=tcp", f"-global_segment_size={self.segment}",
        ]  # fmt: skip
        for attempt in range(3):
            with open(log, "ab") as out:
                self.holder = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=loopback_env())
            try:
                _wait(self.holder, self.holder_port, "mooncake_client (holder)", log)
                return
            except RuntimeError:
                # On a loaded host the holder can give up registering with a master that has just
                # started ("Client not available", after its own single retry) and exit; start it
                # again. One still running but not listening after the timeout is a real fault.
                if self.holder.poll() is None or attempt == 2:
                    raise
                time.sleep(0.5)

    def kill_holder(self) -> None:
        """SIGKILL the holder: its segment (and every object in it) is gone without a goodbye."""
        _end(self.holder, signal.SIGKILL)
        self.holder = None

    def stop(self) -> None:
        """SIGTERM the holder, then the master (SIGKILL after 10 s each)."""
        _end(self.holder)
        self.holder = None
        _end(self.master)
        self.master = None
