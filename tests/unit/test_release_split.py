"""Gray releases' split (gateway.pipeline.releases): ranges, stickiness, changes, shadow choice."""

from __future__ import annotations

import random
from typing import Any

import pytest

from gateway.config.settings import ReleaseConfig, ShadowConfig
from gateway.pipeline.releases import Release, ReleaseError, Releases, key_point


def config(*weights: float, shadow: tuple[str, float] | None = None) -> ReleaseConfig:
    variants = [{"name": f"v{i + 1}", "model": f"llama-v{i + 1}", "weight": w}
                for i, w in enumerate(weights)]  # fmt: skip
    doc: dict[str, Any] = {"model": "llama", "variants": variants}
    if shadow is not None:
        doc["shadow"] = {"variant": shadow[0], "share": shadow[1]}
    return ReleaseConfig.model_validate(doc)


@pytest.mark.parametrize(
    ("weights", "point", "expected"),
    [
        ((95, 5), 0.0, "v1"),
        ((95, 5), 0.9499, "v1"),
        ((95, 5), 0.95, "v2"),
        ((95, 5), 0.999999, "v2"),
        ((0.95, 0.05), 0.96, "v2"),  # relative weights: fractions work as well
        ((1, 0, 1), 0.5, "v3"),  # a weight of 0 owns an empty range
        ((1, 0, 1), 0.4999, "v1"),
        ((1, 1, 0), 0.999999, "v2"),  # a last variant of weight 0: the range ends earlier
        ((0, 1), 0.0, "v2"),
        ((1, 1, 1), 1 / 3, "v2"),
        ((7,), 0.7, "v1"),
    ],
)
def test_pick_by_range(weights: tuple[float, ...], point: float, expected: str) -> None:
    assert Release.build(config(*weights)).pick(point).name == expected


def test_bounds_end_at_one() -> None:
    for weights in ((1, 2), (0.1, 0.2, 0.7), (3, 0), (1e6, 1e-6)):
        assert Release.build(config(*weights)).bounds[-1] == 1.0


def test_key_point_is_stable_and_per_release() -> None:
    assert key_point("llama", b"alice") == key_point("llama", b"alice")
    assert key_point("llama", b"alice") != key_point("mistral", b"alice")
    # blake2b, not hash(): the same in every process (a fixed value guards against a change).
    assert key_point("llama", b"alice") == pytest.approx(0.1360965047516022)
    points = [key_point("llama", f"user-{i}".encode()) for i in range(4000)]
    assert all(0 <= p < 1 for p in points)
    # Spread evenly: each tenth of [0, 1) gets 10% +- 2.5 points.
    for tenth in range(10):
        share = sum(tenth / 10 <= p < (tenth + 1) / 10 for p in points) / len(points)
        assert 0.075 < share < 0.125, (tenth, share)


def test_a_key_keeps_its_variant() -> None:
    releases = Releases([config(50, 50)], random.Random(1))
    release = releases.table["llama"]
    first = {k: releases.choose(release, k)[0].name for k in (f"u{i}".encode() for i in range(500))}
    for _ in range(3):
        for key, name in first.items():
            assert releases.choose(release, key)[0].name == name
    assert set(first.values()) == {"v1", "v2"}


def test_a_weight_change_moves_only_the_keys_in_the_moved_range() -> None:
    releases = Releases([config(95, 5)], random.Random(1))
    keys = [f"user-{i}".encode() for i in range(4000)]
    before = {k: releases.choose(releases.table["llama"], k)[0].name for k in keys}
    releases.update("llama", {"v1": 90, "v2": 10})
    after = {k: releases.choose(releases.table["llama"], k)[0].name for k in keys}
    moved = [k for k in keys if before[k] != after[k]]
    assert all(before[k] == "v1" and after[k] == "v2" for k in moved)
    assert 0.03 < len(moved) / len(keys) < 0.07  # the 5% in [0.90, 0.95)


def test_random_split_without_a_key() -> None:
    releases = Releases([config(95, 5)], random.Random(7))
    release = releases.table["llama"]
    n = 20_000
    share = sum(releases.choose(release, None)[0].name == "v2" for _ in range(n)) / n
    sigma = (0.05 * 0.95 / n) ** 0.5
    assert abs(share - 0.05) < 4 * sigma


@pytest.mark.parametrize(
    ("model", "weights", "status", "match"),
    [
        ("mistral", {"v1": 1}, 404, "No release for model `mistral`"),
        ("llama", {"v3": 1}, 400, r"Unknown variants \['v3'\]"),
        ("llama", {"v1": -1}, 400, "between 0 and 1e6"),
        ("llama", {"v1": 0, "v2": 0}, 400, "at least one variant needs a weight above 0"),
        ("llama", {"v1": float("nan")}, 400, "between 0 and 1e6"),
    ],
)
def test_update_refusals(model: str, weights: dict[str, float], status: int, match: str) -> None:
    releases = Releases([config(95, 5)])
    with pytest.raises(ReleaseError, match=match) as info:
        releases.update(model, weights)
    assert info.value.status == status
    assert releases.version == 0
    assert [v.weight for v in releases.table["llama"].variants] == [95, 5]


def test_update_keeps_what_it_is_not_told() -> None:
    releases = Releases([config(95, 5, shadow=("v2", 0.1))])
    release = releases.update("llama", {"v2": 20})
    assert [v.weight for v in release.variants] == [95, 20]
    assert release.shadow == ShadowConfig(variant="v2", share=0.1)
    assert releases.version == 1
    release = releases.update("llama", {}, shadow=None)
    assert release.shadow is None
    release = releases.update("llama", {}, shadow=ShadowConfig(variant="v1", share=0.5))
    assert release.shadow == ShadowConfig(variant="v1", share=0.5)
    with pytest.raises(ReleaseError, match="shadow"):
        releases.update("llama", {}, shadow=ShadowConfig(variant="v9", share=0.5))


def test_an_unchanged_update_is_not_a_change() -> None:
    releases = Releases([config(95, 5)])
    releases.update("llama", {"v1": 95})
    assert releases.version == 0


def test_load_reports_changed_models() -> None:
    releases = Releases([config(95, 5)])
    assert releases.load([config(95, 5)]) == []
    assert releases.version == 0
    assert releases.load([config(90, 10)]) == ["llama"]
    assert releases.load([]) == ["llama"]
    assert not releases
    assert releases.version == 2


@pytest.mark.parametrize(
    ("shadow", "point_variant", "mirrored"),
    [
        (("v2", 1.0), "v1", "v2"),  # every v1 request is copied to v2
        (("v2", 1.0), "v2", None),  # a request v2 serves itself is not copied to it
        (None, "v1", None),
    ],
)
def test_shadow_choice(
    shadow: tuple[str, float] | None, point_variant: str, mirrored: str | None
) -> None:
    releases = Releases([config(50, 50, shadow=shadow)], random.Random(3))
    release = releases.table["llama"]
    key = next(k for k in (f"k{i}".encode() for i in range(100))
               if release.pick(key_point("llama", k)).name == point_variant)  # fmt: skip
    chosen, copy = releases.choose(release, key)
    assert chosen.name == point_variant
    assert (copy.name if copy else None) == mirrored


def test_shadow_share() -> None:
    releases = Releases([config(100, 0, shadow=("v2", 0.1))], random.Random(5))
    release = releases.table["llama"]
    n = 10_000
    copies = sum(releases.choose(release, None)[1] is not None for _ in range(n))
    assert abs(copies / n - 0.1) < 4 * (0.1 * 0.9 / n) ** 0.5
