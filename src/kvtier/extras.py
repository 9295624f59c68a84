"""Which ``pip install 'kvtier[<extra>]'`` brings a missing third-party module.

Every "not installed" message names the extra that installs the module (pyproject's
``[project.optional-dependencies]``), so the fix is one copyable command;
tests/unit/test_extras.py checks this table against pyproject.
"""

from __future__ import annotations

__all__ = ["EXTRA_OF", "install_hint"]

#: Top-level module name -> the kvtier extra that installs it.
EXTRA_OF = {
    "rich": "cli",
    "yaml": "cli",
    "matplotlib": "plot",
    "prometheus_client": "metrics",
    "redis": "redis",
    "boto3": "s3",
    "botocore": "s3",
    "mooncake": "mooncake",
    "torch": "torch",
    "transformers": "hf",
}


def install_hint(module: str) -> str:
    """``"pip install 'kvtier[plot]'"`` for ``matplotlib`` (or a submodule of it); for a module
    no extra installs, ``"pip install <module>"``."""
    top = module.split(".", 1)[0]
    extra = EXTRA_OF.get(top)
    return f"pip install 'kvtier[{extra}]'" if extra else f"pip install {top}"
