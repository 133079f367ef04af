"""The docs users are sent to exist: README and messages point into docs/, never to a design document
outside the repository or to issue notes users cannot see; every link in the docs resolves."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [p for d in ("collector", "timeline", "localize", "explain", "simulator", "laggard", "bench")
           for p in (ROOT / d).rglob("*.py")]


@pytest.mark.parametrize("path", [ROOT / "README.md", ROOT / "traces" / "README.md", *SOURCES],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_nothing_points_outside_the_repository(path: Path) -> None:
    text = path.read_text()
    assert "DESIGN.md" not in text and "closing note" not in text


@pytest.mark.parametrize("page", [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"],
                         ids=lambda p: p.name)
def test_links_resolve(page: Path) -> None:
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", page.read_text()):
        if not target.startswith("http"):
            assert (page.parent / target).exists(), f"{page.name} links to missing {target}"


def test_figures_name_commands_that_exist() -> None:
    text = (ROOT / "docs" / "figures.md").read_text()
    for mod in set(re.findall(r"python -m (bench\.\w+)", text)):
        assert (ROOT / (mod.replace(".", "/") + ".py")).exists(), mod
