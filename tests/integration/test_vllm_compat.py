"""kvtier.integrations.vllm.compat: which vLLM versions the plug-in accepts, and how it says no.

Runs without vLLM (the module reads distribution metadata only); the refusal inside vLLM's own
factory is tested in tests/integration/test_vllm_factory.py.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvtier.errors import PluginError
from kvtier.integrations.vllm import compat


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("0.32.0", (0, 32)),
        ("0.33.0", (0, 33)),
        ("0.34.1", (0, 34)),
        ("0.34.0rc1", (0, 34)),
        ("0.34rc1", None),  # no separator after the minor: not a version this parser trusts
        ("0.34.1.dev3+g1234abc", (0, 34)),
        ("0.33+cpu", (0, 33)),
        ("dev", None),
        ("", None),
        (None, None),
    ],
)
def test_parse_version_reads_major_and_minor(text: str | None, line: tuple[int, int] | None) -> None:
    assert compat.parse_version(text) == line


@given(st.integers(0, 99), st.integers(0, 999), st.integers(0, 99))
def test_only_the_supported_release_lines_pass(major: int, minor: int, patch: int) -> None:
    version = f"{major}.{minor}.{patch}"
    if (major, minor) in compat.SUPPORTED:
        assert compat.check_version(version) == (major, minor)
        return
    with pytest.raises(PluginError) as err:
        compat.check_version(version)
    message = str(err.value)
    assert "\n" not in message
    assert f"vLLM {version} is installed" in message
    assert "0.32, 0.33, 0.34" in message


def test_no_vllm_is_refused_in_one_line() -> None:
    with pytest.raises(PluginError, match=r"no vLLM is installed") as err:
        compat.check_version(None)
    assert "\n" not in str(err.value)


def test_the_switches_follow_the_installed_release_line() -> None:
    line = compat.parse_version(compat.VLLM_VERSION)
    if line is None:
        pytest.skip(f"no vLLM release line installed ({compat.VLLM_VERSION!r}): the switches take 0.34's")
    assert compat.HAS_TOUCH is (line < (0, 34))
    assert compat.HAS_DEFERRED_RELEASE is (line >= (0, 34))
    assert compat.HAS_MANAGER_LOCK is compat.HAS_RESET_FLUSHED is (line >= (0, 33))
    assert compat.FAILED_STORES_FEED_BACKPRESSURE is (line >= (0, 33))


def test_the_version_is_read_without_importing_vllm() -> None:
    code = (
        "import sys\n"
        "from kvtier.integrations.vllm import compat\n"
        "print(compat.VLLM_VERSION, 'vllm' in sys.modules)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    version, imported = proc.stdout.split()
    assert version == str(compat.VLLM_VERSION)
    if compat.VLLM_VERSION is not None:
        assert imported == "False"
