"""What every bench's report is made of: the run's header, tables for the terminal (rich)
and for markdown, and the JSON, markdown and chart written side by side."""

from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, TypeVar

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table


def bars(console: Console) -> Progress:
    """A bench's progress bars: what runs, how far, how long; gone when done."""
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())  # fmt: skip
    return Progress(*columns, console=console, transient=True)


class OutputPaths:
    """A bench's report files: its JSON (`out`), and its markdown and chart beside it."""

    out: Path

    @property
    def markdown_path(self) -> Path:
        return self.out.with_suffix(".md")

    @property
    def chart_path(self) -> Path:
        return self.out.with_suffix(".png")


def markdown_table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


Section = tuple[str, list[str], list[list[str]]]  # title, header, rows


def run_header(command: str, options: dict[str, Any], drop: Sequence[str]) -> dict[str, Any]:
    """What opens a report: the command, the date, the machine, and the run's `options` less
    those in `drop` (paths as text)."""
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in options.items()
                if k not in drop}  # fmt: skip
    return {
        "command": command,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "nproc": os.cpu_count() or 0,
        "machine": f"{platform.system()} {platform.machine()}, Python {platform.python_version()}",
        "settings": settings,
    }


@dataclass
class JsonReport:
    """A report kept as the JSON it is written as (what `save` writes), with its notes."""

    data: dict[str, Any]
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.notes = self.data["notes"]

    def to_json(self) -> dict[str, Any]:
        return self.data


def print_tables(sections: Sequence[Section], console: Console, left: Sequence[str]) -> None:
    """Each section as a rich table (columns named in `left` aligned left, the rest right;
    a "Goals" section's rows coloured by their verdict); sections "Each round..." are left to
    the markdown. Then the goals' verdicts, one line each."""
    styles = {"MET": "bold green", "NOT MET": "bold red"}
    for title, head, rows in sections:
        if title.startswith("Each round"):
            continue
        table = Table(title=title)
        for h in head:
            table.add_column(h, justify="left" if h in left else "right")
        for row in rows:
            table.add_row(*row, style=styles.get(row[-1]) if title == "Goals" else None)
        console.print(table)
    for title, _, rows in sections:
        if title == "Goals":
            for goal, measured, word in rows:
                console.print(f"[{styles.get(word, '')}]{word}[/]: {goal} ({measured})")


def finish_markdown(
    parts: list[str],
    notes: Sequence[str],
    sections: Sequence[Section],
    chart: tuple[Path, str] | None,
) -> str:
    """A report's markdown: its opening `parts`, then its notes, its sections as tables and
    its chart (file, caption) when there is one."""
    parts = [*parts, *(f"- Note: {n}" for n in notes)]
    for title, head, rows in sections:
        parts += ["", f"## {title}", "", markdown_table(head, rows)]
    if chart is not None:
        parts += ["", f"![{chart[1]}]({chart[0].name})"]
    return "\n".join(parts) + "\n"


class Written(Protocol):
    """A benchmark's report as `save` writes it: JSON, markdown, and a chart when it can."""

    notes: list[str]

    def to_json(self) -> dict[str, Any]: ...


class Destinations(Protocol):
    @property
    def out(self) -> Path: ...

    @property
    def chart(self) -> bool: ...

    @property
    def markdown_path(self) -> Path: ...

    @property
    def chart_path(self) -> Path: ...


R = TypeVar("R", bound=Written)


def save(
    report: R,
    opts: Destinations,
    console: Console,
    draw: Callable[[R, Path], None],
    render: Callable[[R, Path | None], str],
) -> None:
    """Write `report` where `opts` say: its chart (`draw`, skipped with a note without
    matplotlib), its JSON and its markdown (`render`, given the chart's path)."""
    opts.out.parent.mkdir(parents=True, exist_ok=True)
    png: Path | None = None
    if opts.chart:
        try:
            draw(report, opts.chart_path)
            png = opts.chart_path
        except ImportError:
            report.notes.append("chart skipped: matplotlib is not installed (extra `load`)")
    opts.out.write_text(json.dumps(report.to_json(), indent=2) + "\n")
    opts.markdown_path.write_text(render(report, png))
    written = [opts.out, opts.markdown_path, *([png] if png else [])]
    console.print("wrote " + ", ".join(str(p) for p in written))


def command_line(argv: Sequence[str]) -> str:
    """The command as typed (`tiergate` + its arguments), with the API key masked."""
    out: list[str] = []
    hide = False
    for arg in argv:
        if hide:
            out.append("***")
            hide = False
        elif arg == "--api-key":
            out.append(arg)
            hide = True
        elif arg.startswith("--api-key="):
            out.append("--api-key=***")
        else:
            out.append(arg)
    return shlex.join(["tiergate", *out])


def revision(code: Sequence[str]) -> dict[str, Any]:
    """The commit the code ran at, and which files of `code` (paths in the repository)
    differed from it. Read when a run starts: the tree may change while it runs."""

    def git(*args: str) -> str:  # stdout, not stripped: porcelain lines start with a space
        try:
            return subprocess.run(("git", *args), capture_output=True, text=True, check=True,
                                  cwd=Path(__file__).resolve().parents[2]).stdout  # fmt: skip
        except (OSError, subprocess.CalledProcessError):
            return ""

    changed = git("status", "--porcelain", "--", *code)
    return {"commit": git("rev-parse", "--short", "HEAD").strip(),
            "modified": sorted(line[3:] for line in changed.splitlines())}  # fmt: skip
