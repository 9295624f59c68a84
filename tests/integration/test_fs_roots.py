"""Where fs tiers may live (issue 28): two tiers on one directory through a symlink are refused
like two tiers on one path, and a ``root_dir`` that is (or is inside) a regular file is a one-line
``ConfigError`` from ``Engine`` and ``kvtier check``, not a raw ``NotADirectoryError``. Real
directories, files and symlinks under ``tmp_path``; nothing is created when refused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvtier import Engine
from kvtier.cli.main import main
from kvtier.errors import ConfigError


def config(*roots: Path) -> dict[str, Any]:
    tiers = [{"type": "fs", "root_dir": str(r), "max_bytes": "1MiB"} for r in roots]
    return {"block_bytes": 4096, "cpu_bytes_to_use": 16 * 4096, "secondary_tiers": tiers}


def refused(cfg: dict[str, Any], capsys: pytest.CaptureFixture[str], match: str) -> str:
    with pytest.raises(ConfigError, match=match):
        Engine(cfg)
    assert main(["check", json.dumps(cfg)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_two_fs_tiers_on_one_root_through_a_symlink_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    real = tmp_path / "nvme"
    real.mkdir()
    (tmp_path / "alias").symlink_to(real)
    err = refused(
        config(real, tmp_path / "alias"), capsys, r"secondary_tiers\[1\]\.root_dir: .*also the root_dir"
    )
    assert "secondary_tiers[0]" in err
    assert list(real.iterdir()) == []  # refused before anything was written
    # Through a symlinked parent, too.
    (tmp_path / "mnt").symlink_to(tmp_path)
    refused(config(real, tmp_path / "mnt" / "nvme"), capsys, r"secondary_tiers\[1\]\.root_dir")
    # Two real directories are fine.
    other = tmp_path / "ssd"
    Engine(config(real, other)).close()


@pytest.mark.parametrize("inside", [False, True])
def test_a_root_dir_that_is_a_regular_file_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], inside: bool
) -> None:
    f = tmp_path / "afile"
    f.write_text("not a directory")
    root = f / "kvtier" if inside else f
    err = refused(config(root), capsys, r"secondary_tiers\[0\]\.root_dir: .*not a directory")
    assert str(f) in err and "NotADirectoryError" not in err
    assert f.read_text() == "not a directory"


def test_kvtier_check_leaves_nothing_behind_that_did_not_exist(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "mine.txt").write_text("kept")
    fresh = tmp_path / "a" / "b" / "c"
    assert main(["check", json.dumps(config(existing, fresh))]) == 0, capsys.readouterr().err
    assert not (tmp_path / "a").exists()  # every level it created is gone
    assert sorted(p.name for p in existing.iterdir()) == ["mine.txt"]  # only the probe went
