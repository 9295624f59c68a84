"""Read KV-cache request traces (Mooncake, Qwen-Bailian and kvtier's generic JSONL), gzip or plain.

Three line formats, one JSON object per line, requests in arrival order; blank lines are skipped and
the format is detected per line, so files may even mix them:

* **Mooncake** (FAST'25 release)::

      {"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1, 2]}

  ``hash_ids`` are chained prefix-block ids (512 tokens per block in the public traces).

* **Generic** (kvtier's own; for traces from other engines or synthetic workloads)::

      {"timestamp": 12.5, "blocks": [17, 18, 99], "tenant": "acme",
       "input_length": 1400, "output_length": 80}

  ``timestamp`` (milliseconds, number) and ``blocks`` (list of non-negative integer block ids, each
  naming its whole prefix, as ``hash_ids`` do) are required; ``tenant`` (string), ``input_length``
  and ``output_length`` (integers) are optional.

* **Qwen-Bailian** (Alibaba's ``qwen_trace*_blksz_16.jsonl``): Mooncake's fields plus ``chat_id``,
  ``parent_chat_id`` (-1 for a first turn), ``turn`` and ``type``, with ``timestamp`` in **seconds**
  (a line with ``chat_id`` is read as this format; its timestamp is converted to milliseconds).
  ``hash_ids`` there are per 16-token block: replay and plan such traces with ``--block-tokens 16``
  (``--tokens-per-block 16`` for replay). The extra fields are kept on :class:`TraceRequest`.

A line that matches no format gets a message naming, for each format, the fields it lacks.

Gzip-compressed files are recognised by their magic bytes, whatever the file name. Bad input raises
:class:`TraceError` with a one-line message naming the file and the real line number: invalid JSON
or UTF-8 (decoded line by line, so a bad byte on line 2 is reported on line 2), ids outside
``0..2**63-1`` (:data:`MAX_ID`: they must fit the ``int64`` arrays the simulator uses), a
timestamp that is not finite (``NaN``, ``Infinity``), a line longer than :data:`MAX_LINE_BYTES`
(read at most that far: a 1 GB line costs no more memory than the cap).

API: :func:`iter_trace` / :func:`read_trace` yield :class:`TraceRequest`; :func:`flatten` turns
requests into the flat block-id sequence a generic cache simulator sees (numpy ``int64``);
:func:`unique_blocks` counts distinct ids.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import os
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, cast

import numpy as np

from kvtier.errors import KvtierError

__all__ = [
    "MAX_ID",
    "MAX_LINE_BYTES",
    "TraceError",
    "TraceRequest",
    "flatten",
    "guess_block_tokens",
    "iter_trace",
    "read_trace",
    "unique_blocks",
]


#: Largest block/chat id a trace may hold (ids are kept in ``int64`` arrays).
MAX_ID = (1 << 63) - 1
#: Longest trace line in bytes (a 128k-token request at 16 tokens per block is ~80 KB).
MAX_LINE_BYTES = 16 << 20


class TraceError(KvtierError, ValueError):
    """A trace file is missing or malformed; the message names the file and line."""


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a trace.

    Attributes:
        timestamp_ms: arrival time in milliseconds.
        blocks: chained prefix-block ids (``hash_ids`` in Mooncake traces), in prefix order.
        input_length: prompt tokens, when the trace says.
        output_length: generated tokens, when the trace says.
        tenant: tenant name (generic format only).
        chat_id / parent_chat_id / turn / type: conversation fields (Qwen-Bailian format only;
            ``parent_chat_id`` is ``None`` for a first turn, which the trace writes as -1).
    """

    timestamp_ms: float
    blocks: tuple[int, ...]
    input_length: int | None = None
    output_length: int | None = None
    tenant: str | None = None
    chat_id: int | None = None
    parent_chat_id: int | None = None
    turn: int | None = None
    type: str | None = None


def _open_binary(path: Path) -> IO[bytes]:
    # Opened without blocking and checked on the descriptor: a FIFO would otherwise wait for a
    # writer forever, and a device (/dev/zero) is no trace.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise TraceError(f"{path}: not a regular file (a FIFO, device or directory); give a trace file")
    os.set_blocking(fd, True)
    raw = open(fd, "rb")  # noqa: SIM115 - returned to the caller, who closes it
    magic = raw.peek(2)[:2] if isinstance(raw, io.BufferedReader) else b""
    if magic == b"\x1f\x8b":
        raw.close()
        # GzipFile.readline is a Python method; a BufferedReader over it reads lines in C.
        return cast(IO[bytes], io.BufferedReader(gzip.GzipFile(path, "rb"), 1 << 16))
    return raw


def _int_field(obj: dict[str, Any], name: str, where: str, *, required: bool) -> int | None:
    value = obj.get(name)
    if value is None:
        if required:
            raise TraceError(f"{where}: missing required field {name!r}")
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_ID:
        raise TraceError(f"{where}: field {name!r} must be an integer in 0..2**63-1, got {value!r}")
    return value


def _block_list(value: Any, name: str, where: str) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise TraceError(f"{where}: field {name!r} must be a list of integers, got {type(value).__name__}")
    # C-level passes for the usual all-good list (json gives exact ints, never bool subclasses here).
    if not value or (set(map(type, value)) == {int} and min(value) >= 0 and max(value) <= MAX_ID):
        return tuple(value)
    for item in value:
        if isinstance(item, bool) or not isinstance(item, int) or not 0 <= item <= MAX_ID:
            raise TraceError(
                f"{where}: field {name!r} holds {item!r}; block ids must be integers in 0..2**63-1"
            )
    return tuple(value)


def _parse(obj: Any, where: str) -> TraceRequest:
    if not isinstance(obj, dict):
        raise TraceError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    if "timestamp" not in obj or not ("hash_ids" in obj or "blocks" in obj):
        raise TraceError(f"{where}: not a known trace line: {_missing(obj)}")
    ts = obj.get("timestamp")
    if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts):
        raise TraceError(f"{where}: field 'timestamp' must be a finite number of milliseconds, got {ts!r}")
    if "hash_ids" in obj and "chat_id" in obj:
        return _parse_bailian(obj, float(ts), where)
    if "hash_ids" in obj:
        blocks = _block_list(obj["hash_ids"], "hash_ids", where)
        tenant = None
    elif "blocks" in obj:
        blocks = _block_list(obj["blocks"], "blocks", where)
        tenant = obj.get("tenant")
        if tenant is not None and not isinstance(tenant, str):
            raise TraceError(f"{where}: field 'tenant' must be a string, got {tenant!r}")
    else:  # pragma: no cover - excluded above
        raise TraceError(f"{where}: not a known trace line: {_missing(obj)}")
    return TraceRequest(
        timestamp_ms=float(ts),
        blocks=blocks,
        input_length=_int_field(obj, "input_length", where, required=False),
        output_length=_int_field(obj, "output_length", where, required=False),
        tenant=tenant,
    )


#: Required fields per format, for the message naming what a line lacks.
_FORMATS = {
    "Mooncake": ("timestamp", "hash_ids"),
    "generic": ("timestamp", "blocks"),
    "Qwen-Bailian": ("chat_id", "parent_chat_id", "turn", "timestamp", "hash_ids"),
}


def _missing(obj: dict[str, Any]) -> str:
    parts = []
    for fmt, fields in _FORMATS.items():
        lacking = [f for f in fields if f not in obj]
        parts.append(f"{fmt} lacks {', '.join(repr(f) for f in lacking)}")
    return "; ".join(parts)


def _parse_bailian(obj: dict[str, Any], ts_seconds: float, where: str) -> TraceRequest:
    lacking = [f for f in _FORMATS["Qwen-Bailian"] if f not in obj]
    if lacking:
        raise TraceError(f"{where}: Qwen-Bailian line (has 'chat_id') lacks {', '.join(map(repr, lacking))}")
    parent = obj["parent_chat_id"]
    if isinstance(parent, bool) or not isinstance(parent, int) or not -1 <= parent <= MAX_ID:
        raise TraceError(f"{where}: field 'parent_chat_id' must be an integer in -1..2**63-1, got {parent!r}")
    kind = obj.get("type")
    if kind is not None and not isinstance(kind, str):
        raise TraceError(f"{where}: field 'type' must be a string, got {kind!r}")
    return TraceRequest(
        timestamp_ms=ts_seconds * 1000.0,
        blocks=_block_list(obj["hash_ids"], "hash_ids", where),
        input_length=_int_field(obj, "input_length", where, required=False),
        output_length=_int_field(obj, "output_length", where, required=False),
        chat_id=_int_field(obj, "chat_id", where, required=True),
        parent_chat_id=None if parent == -1 else parent,
        turn=_int_field(obj, "turn", where, required=True),
        type=kind,
    )


def iter_trace(path: str | Path, *, limit: int | None = None) -> Iterator[TraceRequest]:
    """Yield the requests of a trace file in order (at most ``limit``, when given)."""
    p = Path(path)
    if not p.exists():
        raise TraceError(f"{p}: trace file not found")
    count = 0
    cap = MAX_LINE_BYTES + 1  # never read more than this at once: a 1 GB line costs ~the cap
    with _open_binary(p) as fh:
        readline = fh.readline
        lineno = 0
        while True:
            try:
                raw = readline(cap)
            except (OSError, EOFError) as exc:  # a truncated or corrupt gzip stream, an I/O error
                raise TraceError(f"{p}:{lineno + 1}: cannot read trace ({exc})") from exc
            if not raw or (limit is not None and count >= limit):
                return
            lineno += 1
            where = f"{p}:{lineno}"
            if len(raw) == cap and raw[-1] != 10:  # no newline within the cap
                raise TraceError(
                    f"{where}: line longer than {MAX_LINE_BYTES} bytes (kvtier.sim.trace.MAX_LINE_BYTES); "
                    "one request per line, as JSON"
                )
            try:
                line = raw.decode("utf-8")  # per line: a bad byte is reported on its own line
            except UnicodeDecodeError as exc:
                raise TraceError(f"{where}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
            if line.isspace():
                continue
            yield _parse(_loads(line, where), where)
            count += 1


def _loads(line: str, where: str) -> Any:
    try:
        return json.loads(line)
    except json.JSONDecodeError as exc:
        raise TraceError(f"{where}: invalid JSON ({exc.msg} at column {exc.colno})") from None
    except RecursionError:
        raise TraceError(f"{where}: invalid JSON (nested too deeply)") from None
    except ValueError as exc:  # an integer of more than 4300 digits
        raise TraceError(f"{where}: invalid JSON ({exc})") from None


def read_trace(path: str | Path, *, limit: int | None = None) -> list[TraceRequest]:
    """All requests of a trace file (at most ``limit``) as a list."""
    return list(iter_trace(path, limit=limit))


def flatten(requests: Iterable[TraceRequest]) -> np.ndarray:
    """Every block of every request, in order, as one ``int64`` array (a generic cache's view)."""
    chunks = [r.blocks for r in requests]
    total = sum(len(c) for c in chunks)
    out = np.empty(total, dtype=np.int64)
    pos = 0
    for c in chunks:
        out[pos : pos + len(c)] = c
        pos += len(c)
    return out


def unique_blocks(requests_or_flat: Iterable[TraceRequest] | np.ndarray) -> int:
    """Number of distinct block ids."""
    flat = requests_or_flat if isinstance(requests_or_flat, np.ndarray) else flatten(requests_or_flat)
    return int(np.unique(flat).size)


def guess_block_tokens(
    requests: Iterable[TraceRequest],
    candidates: Iterable[int] = (16, 32, 64, 128, 256, 512),
    *,
    prefer: int | None = None,
) -> int | None:
    """The tokens per block that best explains ``len(blocks) == ceil(input_length / b)``.

    ``None`` when no request gives ``input_length`` or no size fits at least half of those that do.
    A size fitting as many requests as the best one wins when it is ``prefer`` (short requests fit
    several sizes and say nothing), else the smallest such size.
    """
    pairs = [(r.input_length, len(r.blocks)) for r in requests if r.input_length and r.blocks]
    if not pairs:
        return None
    sizes = sorted(set(candidates) | ({prefer} if prefer else set()))
    fits = {b: sum(1 for n_tok, n_blk in pairs if -(-n_tok // b) == n_blk) for b in sizes}
    top = max(fits.values())
    if 2 * top < len(pairs):
        return None
    if prefer is not None and fits.get(prefer) == top:
        return prefer
    return min(b for b in sizes if fits[b] == top)
