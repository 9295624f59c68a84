"""fs options checked where they are read (issue 17): each bad value is a one-line ConfigError naming
the key, raised before anything is written to disk."""

from __future__ import annotations

import os
from pathlib import Path

import fs_helpers as h  # tests/integration is on pytest's pythonpath
import pytest

from kvtier import Engine
from kvtier.errors import ConfigError

BLOCK = 8192
BAD = [
    ("threads", 100_000),
    ("threads", 0),
    ("refresh_interval", -1),
    ("refresh_interval", float("inf")),
    ("full_backoff", float("nan")),
    ("record_access", "yes"),
    ("fsync", 1),
    ("precreate_dirs", "no"),
    ("read_io", "fast"),
    ("read_io", True),
    ("shared_root", "true"),
    ("log_interval", 0),
    ("max_bytes", "999999999PiB"),
]


@pytest.mark.parametrize(("key", "value"), BAD, ids=[f"{k}={v!r}" for k, v in BAD])
def test_a_bad_option_is_a_one_line_config_error_and_writes_nothing(
    tmp_path: Path, key: str, value: object
) -> None:
    root = tmp_path / "root"
    primary = h.aligned_primary(2, BLOCK)
    with pytest.raises(ConfigError) as err:
        h.make_tier(primary, root, **{key: value})
    assert key in str(err.value) and "\n" not in str(err.value)
    assert not root.exists()


def test_root_dir_empty_is_refused_and_tilde_is_expanded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    primary = h.aligned_primary(2, BLOCK)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for empty in ("", "  "):
        with pytest.raises(ConfigError, match="root_dir"):
            h.make_tier(primary, empty)
    tier = h.make_tier(primary, "~/kv")
    tier.shutdown()
    assert tier.layout.root_dir == str(tmp_path / "home" / "kv")
    assert os.listdir(cwd) == []  # no literal ./~


def test_two_fs_tiers_on_one_root_dir_are_refused(tmp_path: Path) -> None:
    root = str(tmp_path / "root")
    cfg = {
        "block_bytes": BLOCK,
        "cpu_bytes_to_use": 4 * BLOCK,
        "secondary_tiers": [
            {"type": "fs", "name": "a", "root_dir": root},
            {"type": "fs", "name": "b", "root_dir": root + "/"},
        ],
    }
    with pytest.raises(ConfigError, match=r"secondary_tiers\[1\]\.root_dir"):
        Engine(cfg)


@pytest.mark.parametrize(
    ("direct_io", "read_io"), [("auto", "auto"), ("never", "auto"), ("auto", "buffered"), ("never", "direct")]
)
def test_every_read_mode_returns_the_stored_bytes_and_still_catches_a_flipped_byte(
    tmp_path: Path, direct_io: str, read_io: str
) -> None:
    # Real files on the test's file system: where it refuses O_DIRECT (tmpfs) every mode reads
    # buffered, which the read_direct flag shows; the bytes must be right either way.
    primary = h.aligned_primary(4, BLOCK)
    tier = h.make_tier(primary, tmp_path / "root", direct_io=direct_io, read_io=read_io)
    try:
        if read_io == "auto":
            assert tier.read_direct == tier.direct_io  # direct reads exactly when writes are
        elif read_io == "buffered":
            assert tier.read_direct is False
        keys = [h.key_of(f"mode-{i}") for i in range(3)]
        assert h.store(tier, primary, keys).success
        res = h.load(tier, primary, keys)
        assert res.success
        for slot, k in enumerate(keys):
            assert (primary.block(slot) == h.payload_of(k, BLOCK)).all()
        path = tier.layout.path_of(keys[1])
        with open(path, "r+b") as f:  # flip one payload byte: the checksum must catch it
            f.seek(-1, 2)
            last = f.read(1)
            f.seek(-1, 2)
            f.write(bytes([last[0] ^ 0xFF]))
        res = h.load(tier, primary, keys)
        assert not res.success and keys[1] not in (res.successful_keys or ())
        assert tier.stats.corrupt == 1
    finally:
        tier.shutdown()
