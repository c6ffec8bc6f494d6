"""The docs a newcomer reads: a short README, and links that lead somewhere."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The README and the guides, and every other README of the repository.
DOCS = sorted(
    p for p in {ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *ROOT.glob("*/README.md"),
                *ROOT.glob("*/*/README.md"), *ROOT.glob("*/*/*/README.md")}
    if not any(part.startswith(".") for part in p.relative_to(ROOT).parts)  # .venv, caches
)  # fmt: skip
LINK = re.compile(r"\]\(([^)\s]+)\)")


def links(text: str) -> list[str]:
    """The relative targets of a markdown text's links and images, anchors dropped; links in
    code blocks and spans do not count."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    found = []
    for target in LINK.findall(text):
        if re.match(r"^([a-z]+:|#)", target):
            continue
        found.append(target.split("#", 1)[0])
    return found


def test_the_readme_is_read_in_five_minutes() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_resolves(doc: Path) -> None:
    missing = [t for t in links(doc.read_text()) if not (doc.parent / t).exists()]
    assert missing == [], f"{doc.relative_to(ROOT)} links to what is not there: {missing}"


def test_links_are_read_as_a_reader_follows_them() -> None:
    text = ("[a](docs/a.md) ![p](results/p.png#x) [web](https://example.com) [top](#top)\n"
            "`[not](a link)` and\n```\n[nor](this)\n```\n")  # fmt: skip
    assert links(text) == ["docs/a.md", "results/p.png"]


def test_the_configuration_reference_is_the_settings_models() -> None:
    from tiergate.config_reference import render

    written = (ROOT / "docs" / "configuration-reference.md").read_text()
    assert written == render(), (
        "regenerate: python -m tiergate.config_reference > docs/configuration-reference.md"
    )


def test_the_reference_names_every_field_with_its_meaning() -> None:
    from gateway.config.settings import LearningConfig, Settings
    from tiergate.config_reference import comments, render

    text = render()
    for name in Settings.model_fields:
        assert f"| `{name}` |" in text
    assert comments(LearningConfig)["tier_unlike"].startswith("Past its own frontier")
    assert "| `memory` | float | `16.0` | >= 1 | Observations each knot" in text
