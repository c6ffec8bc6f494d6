"""The processes the harness starts run the code it was imported from, wherever it is started:
`python -m` puts the working directory first on sys.path, so a bench started from one checkout
with another on PYTHONPATH used to run the first one's gateway."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from loadtests.harness.procs import SimProcess


def test_a_process_runs_the_harness_code_not_the_working_directorys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = tmp_path / "tiergate"
    other.mkdir()
    (other / "__init__.py").write_text("")
    (other / "__main__.py").write_text('raise SystemExit("the working directory\'s tiergate")\n')
    monkeypatch.chdir(tmp_path)
    with SimProcess(profile="instant", log=tmp_path / "sim.log") as sim:
        assert httpx.get(sim.url + "/health").status_code == 200
    assert "working directory" not in (tmp_path / "sim.log").read_text()
