"""A seconds-long run of `tiergate bench tables`: the report is produced and consistent."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from engines.sim.fit import load_targets
from loadtests.tables import little_flags, run

pytestmark = pytest.mark.e2e


def test_little_flags_name_the_inconsistent_cells() -> None:
    flags = little_flags(load_targets())
    # v4 at 64: 64 x 256 / 3.1 s = 5285 tok/s, the table says 1800.
    assert ("v4", 64) in flags
    assert "5285" in flags[("v4", 64)]
    assert ("v4", 16) not in flags  # 16 x 256 / 1.8 = 2276, the table says 2200: consistent


def test_tables_report(tmp_path: Path) -> None:
    report = run(["v4"], out_dir=tmp_path, v5_instances=(1, 2), v5_seconds=1.5,
                 v5_users_per_instance=8, v5_speedup=10, requests_per_user=2, speedup=10,
                 console=Console(width=200))  # fmt: skip
    cells = report["cells"]
    targets = load_targets()["profiles"]["v4"]
    expected = sum(len([k for k in row if k.endswith(("_ms", "_s"))])
                   for row in [*targets["match"], *targets["unmatched"]])  # fmt: skip
    assert len(cells) == expected
    for c in cells:
        assert c["samples"] > 0
        assert c["measured"] > 0
        assert abs(c["ratio"] - c["measured"] / c["target"]) < 1e-9
    v5 = report["v5"]
    assert [(r["instances"], r["killed_at_s"] is not None) for r in v5] == [
        (1, False), (1, True), (2, False), (2, True)]  # fmt: skip
    assert all(r["completed"] > 0 for r in v5)
    assert v5[0]["failed"] == 0
    md = (tmp_path / "tables.md").read_text()
    assert "## v4" in md
    assert "## v5" in md
    for name in ("tables.json", "tables-curves.png"):
        assert (tmp_path / name).stat().st_size > 0
