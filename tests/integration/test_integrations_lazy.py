"""Importing kvtier, its integrations package or the transformers adapter never imports torch or
transformers; using the adapter without them says which extra to install."""

from __future__ import annotations

import subprocess
import sys


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_importing_the_adapter_pulls_in_neither_torch_nor_transformers() -> None:
    proc = _run(
        "import sys, kvtier, kvtier.integrations, kvtier.integrations.transformers as t\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules), t.__all__)"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[] ['PrefixCache', 'PrefixForward', 'block_bytes_for']"


def test_without_the_extra_the_error_names_it() -> None:
    # A None entry in sys.modules makes the import fail exactly as an absent package does.
    proc = _run(
        "import sys\n"
        "sys.modules['transformers'] = None\n"
        "from kvtier.integrations.transformers import PrefixCache\n"
        "try:\n"
        "    PrefixCache(object(), object())\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    assert proc.returncode == 0, proc.stderr
    assert "pip install 'kvtier[hf]'" in proc.stdout
    assert "transformers is missing" in proc.stdout
