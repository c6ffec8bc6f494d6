"""Which build of the routing modules the package imports (gateway.routing.native), and that
routing's frozen values pickle and copy alike in both builds."""

from __future__ import annotations

import copy
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import gateway.routing.learned
from gateway.routing import native
from gateway.routing.curves import UNKNOWN_CURVE, Curve, Prediction
from gateway.routing.types import Backend, BackendLoad, Role, RouterState, Slo


def _package(tmp_path: Path, **manifest: Any) -> Path:
    pkg = tmp_path / "routing"
    (pkg / native.FOLDER).mkdir(parents=True)
    (pkg / "learned.py").write_text("x = 1\n")
    (pkg / "types.py").write_text("y = 2\n")
    body = {**native.manifest(native.fingerprint(pkg)), **manifest}
    (pkg / native.FOLDER / native.MANIFEST).write_text(json.dumps(body))
    return pkg


def test_a_build_of_these_sources_for_this_interpreter_is_searched_first(tmp_path: Path) -> None:
    pkg = _package(tmp_path)
    assert native.build_path(pkg, {}) == [str(pkg / native.FOLDER)]
    assert native.build_path(pkg, {"TIERGATE_COMPILED": "1"}) == [str(pkg / native.FOLDER)]


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (lambda pkg: (pkg / "learned.py").write_text("x = 3\n"), "a compiled module edited"),
        (lambda pkg: (pkg / "params.py").write_text("z = 0\n"), "a module it imports added"),
        (lambda pkg: (pkg / "types.py").unlink(), "a source removed"),
        (lambda pkg: (pkg / native.FOLDER / native.MANIFEST).unlink(), "no manifest"),
        (lambda pkg: (pkg / native.FOLDER / native.MANIFEST).write_text("{"), "a torn one"),
        (lambda pkg: (pkg / native.FOLDER / native.MANIFEST).write_text("[]"), "not a map"),
    ],
)
def test_a_build_that_is_not_of_these_sources_is_not_used(
    tmp_path: Path, change: Any, why: str
) -> None:
    pkg = _package(tmp_path)
    change(pkg)
    assert native.build_path(pkg, {}) == [], why


def test_a_build_for_another_interpreter_or_switched_off_is_not_used(tmp_path: Path) -> None:
    assert native.build_path(_package(tmp_path / "a", ext_suffix=".cpython-99-x.so"), {}) == []
    assert native.build_path(_package(tmp_path / "b"), {"TIERGATE_COMPILED": "0"}) == []
    assert native.build_path(tmp_path / "nothing-built", {}) == []


def test_the_package_imports_the_build_when_it_is_current() -> None:
    pkg = Path(native.__file__).parent
    current = native.build_path(pkg, dict(os.environ))
    origin = Path(gateway.routing.learned.__file__).parent
    assert origin == (Path(current[0]) if current else pkg)


def test_switched_off_the_package_imports_its_sources() -> None:
    code = ("import gateway.routing.learned as m, gateway.routing.types as t; "
            "print(m.__file__, t.__file__)")
    env = {**os.environ, "TIERGATE_COMPILED": "0"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.split()  # fmt: skip
    assert [Path(p).name for p in out] == ["learned.py", "types.py"]


VALUES: list[Any] = [
    Slo(ttft_s=0.5, tpot_s=0.012),
    RouterState(latency_open=False, rr=3),
    BackendLoad(running=2, waiting=1, inflight=3, slos=((0.012, 1), (0.025, 2))),
    Backend("http://a:8000", "latency", Role.LATENCY, frozenset({"m"})),
    Curve.of(lambda n: 0.01 + 0.001 * n, evidence=2.0),
    UNKNOWN_CURVE,
]


@pytest.mark.parametrize("value", VALUES, ids=lambda v: type(v).__name__)
@pytest.mark.parametrize("how", ["pickle", "copy", "deepcopy"])
def test_routing_values_pickle_and_copy_as_equals(value: Any, how: str) -> None:
    again = {
        "pickle": lambda v: pickle.loads(pickle.dumps(v)),
        "copy": copy.copy,
        "deepcopy": copy.deepcopy,
    }[how](value)
    assert again == value
    assert type(again) is type(value)


def test_a_copied_prediction_keeps_what_it_derives_and_starts_its_own_memories() -> None:
    pred = Prediction(tpot=Curve.of(lambda n: 0.01 + 0.001 * n), ttft=Curve.of(lambda n: 0.1),
                      frontier=4, spread=0.2)  # fmt: skip
    pred.outlooks[(1,)] = (0.0, 0.0, 1.0, 0.0, False, 1, False)
    again = pickle.loads(pickle.dumps(pred))
    assert (again.rows, again.z_scale, again.frontier) == (pred.rows, pred.z_scale, 4)
    assert again.outlooks == {}
    assert Slo(tpot_s=0.012).log_tpot == pickle.loads(pickle.dumps(Slo(tpot_s=0.012))).log_tpot
