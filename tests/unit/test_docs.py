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


# -- figures ------------------------------------------------------------------------------------
# A figure: a number with a unit a measurement has (a ratio, a time, a rate, a share, a size).
FIGURE = re.compile(
    r"(?<![\w.])\d+(?:\.\d+)?\s?(?:x\b|×|%|ms\b|µs\b|us\b|req/s|tok/s|tokens/s|s\b|KB|MB|GB)"
)
GUIDES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Passages whose figures are settings' values or rules (defaults, timeouts, windows), not
# measurements: (file, how the passage opens). Any other passage with a figure links its results.
SETTINGS_PASSAGES = {
    ("README.md", "tiergate reads live queue depth"),
    ("operations.md", "Tests check these files without"),
    ("operations.md", "- [`deploy/prometheus/`](../deplo"),
    ("operations.md", "- [`grafana/`](../grafana): provi"),
    ("reliability.md", "- **Before the first byte, any fa"),
    ("reliability.md", "- **Outlier ejection, after Envoy"),
    ("reliability.md", "- **No silent stream** (`gateway/"),
    ("reliability.md", "- **Graceful drain** (`gateway/se"),
    ("reliability.md", "- **Hostile input** (`server.*`):"),
    ("reliability.md", "**Shared state**: in-flight count"),
    ("reliability.md", "**Errors**: every answer the gate"),
    ("tenants-and-releases.md", "- **Sticky**: a request with an `"),
    ("tenants-and-releases.md", "- **Limits**: requests per minute"),
}


def passages(text: str) -> list[str]:
    """Paragraphs, list items and table rows (code blocks left out); the items of a list that
    a paragraph opens carry that paragraph's links too."""
    out: list[str] = []
    current: list[str] = []
    lead = ""  # the links of the paragraph before a list
    in_code = False

    def close() -> None:
        if current:
            out.append(" ".join(current))
            current.clear()

    for line in text.split("\n"):
        if line.startswith("```"):
            in_code = not in_code
            continue
        if in_code:
            continue
        item = line.startswith(("- ", "* ", "|", "#")) or re.match(r"\d+\. ", line)
        if item or not line.strip():
            was_paragraph = bool(current) and not current[0].startswith(("- ", "* "))
            if was_paragraph:
                lead = " ".join(links(" ".join(current)))
            close()
            if not line.strip():
                if not item:
                    lead = "" if not out or not out[-1].startswith(("- ", "* ")) else lead
                continue
            if line.startswith("|"):
                out.append(line)
                continue
            current.append(f"{line} {lead}" if line.startswith(("- ", "* ")) else line)
            continue
        current.append(line)
    close()
    return out


def unlinked_figures(path: Path) -> list[str]:
    found = []
    for passage in passages(path.read_text()):
        bare = re.sub(r"`[^`]*`", "", passage)
        if FIGURE.search(bare) and "results/" not in passage:
            found.append(passage)
    return found


def test_every_figure_in_the_readme_and_guides_links_to_its_results() -> None:
    unlinked = [(p.name, text) for p in GUIDES for text in unlinked_figures(p)
                if p.name != "configuration-reference.md"]  # fmt: skip (settings, generated)
    allowed = [(n, t) for n, t in unlinked
               if any(n == f and t.startswith(o) for f, o in SETTINGS_PASSAGES)]  # fmt: skip
    assert [(n, t[:80]) for n, t in unlinked if (n, t) not in allowed] == [], (
        "figures without a link to their results file"
    )
    stale = [(f, o) for f, o in SETTINGS_PASSAGES
             if not any(n == f and t.startswith(o) for n, t in allowed)]  # fmt: skip
    assert stale == [], "passages listed here that no longer exist"


def test_a_figure_without_its_results_is_found(tmp_path: Path) -> None:
    doc = tmp_path / "guide.md"
    doc.write_text("Intro ([r](results/r.md)):\n- learned 0.98x of the oracle\n\n"
                   "The gateway adds 0.2 ms.\n\n| a | 3.5 ms |\n\n```\n9 ms\n```\n")  # fmt: skip
    assert unlinked_figures(doc) == ["The gateway adds 0.2 ms.", "| a | 3.5 ms |"]
