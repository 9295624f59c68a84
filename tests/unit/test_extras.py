"""Install hints name the extra that really installs the module (issue 28: ``plan --plot`` said
``kvtier[cli]`` though matplotlib is in ``plot``; engine.md said prometheus_client comes with
``cli``). Checked against pyproject.toml's extras, in the code, README and docs."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from kvtier.extras import EXTRA_OF, install_hint

ROOT = Path(__file__).resolve().parents[2]
EXTRAS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
# The distribution that provides each module (pip name), as pyproject lists it.
DIST_OF = {"yaml": "pyyaml", "prometheus_client": "prometheus_client", "botocore": "boto3",
           "mooncake": "mooncake-transfer-engine"}  # fmt: skip
HINT = re.compile(r"pip install (?:-U )?'kvtier\[([a-z,]+)\]'")


@pytest.mark.parametrize("module", sorted(EXTRA_OF))
def test_each_module_s_extra_lists_its_distribution(module: str) -> None:
    extra = EXTRA_OF[module]
    dist = DIST_OF.get(module, module).lower()
    assert any(req.lower().startswith(dist) for req in EXTRAS[extra]), (module, extra, EXTRAS[extra])
    assert install_hint(module + ".sub") == f"pip install 'kvtier[{extra}]'"


def sources() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "src").rglob("*.py"))]


def test_every_install_hint_names_an_extra_that_exists() -> None:
    for path in sources():
        for m in HINT.finditer(path.read_text()):
            for extra in m.group(1).split(","):
                assert extra in EXTRAS, f"{path.relative_to(ROOT)}: {m.group(0)}"


def test_hints_next_to_a_module_name_the_extra_that_installs_it() -> None:
    for path in sources():
        for line in path.read_text().splitlines():
            for module, extra in EXTRA_OF.items():
                hint = HINT.search(line)
                if hint and re.search(rf"\b{module}\b", line) and extra not in hint.group(1).split(","):
                    others = [m for m in EXTRA_OF if m != module and re.search(rf"\b{m}\b", line)]
                    if not any(EXTRA_OF[o] in hint.group(1) for o in others):
                        pytest.fail(f"{path.relative_to(ROOT)}: {line.strip()!r} should name kvtier[{extra}]")
