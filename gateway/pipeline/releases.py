"""Gray releases: a model name clients ask for, split by weight over variants (deployments
served under model names of their own), changeable while the gateway runs.

The split is sticky: a request's key (its `x-session-id`, else its `user`) hashes to a point in
[0, 1), stable across processes and restarts, and the variants own consecutive ranges of that
interval in proportion to their weights. While the weights stay, a key keeps its variant; when
they change, only the keys in the ranges that moved change variant (95/5 -> 90/10 moves the keys
in [0.90, 0.95), nobody else). A request without a key gets a random point.

Pure, no I/O: intake asks `choose`, the admin API and the config reload call `update` and
`load`, and every change makes new immutable `Release` values, so a request holds a consistent
one whatever changes meanwhile.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import ValidationError

from gateway.config.settings import ReleaseConfig, ShadowConfig, VariantConfig, validation_problems
from gateway.routing.affinity import affinity_key

__all__ = ["Release", "ReleaseError", "Releases", "Variant", "key_point"]

_SPAN = float(1 << 64)


class ReleaseError(ValueError):
    """A change that cannot be made; `status` is what the admin API answers."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class Variant:
    release: str  # the model name clients ask for
    name: str
    model: str  # the model name its backends serve
    weight: float


@dataclass(frozen=True, slots=True)
class Release:
    model: str
    variants: tuple[Variant, ...]
    # The upper end of each variant's range of [0, 1), in order; the last is 1.
    bounds: tuple[float, ...]
    shadow: ShadowConfig | None = None

    @classmethod
    def build(cls, config: ReleaseConfig) -> Release:
        variants = tuple(Variant(config.model, v.name, v.model, v.weight)
                         for v in config.variants)  # fmt: skip
        total = sum(v.weight for v in variants)
        bounds, acc = [], 0.0
        for v in variants:
            acc += v.weight
            bounds.append(acc / total)
        # The last range ends at 1 exactly, whatever the rounding: every point has a variant.
        last = max(i for i, v in enumerate(variants) if v.weight > 0)
        bounds[last:] = [1.0] * (len(bounds) - last)
        return cls(config.model, variants, tuple(bounds), config.shadow)

    def pick(self, point: float) -> Variant:
        """The variant whose range holds `point` (in [0, 1)); a variant of weight 0 owns an
        empty range and is never picked."""
        return self.variants[bisect.bisect_right(self.bounds, point)]

    def variant(self, name: str) -> Variant | None:
        return next((v for v in self.variants if v.name == name), None)

    def config(self) -> ReleaseConfig:
        return ReleaseConfig(
            model=self.model,
            variants=[
                VariantConfig(name=v.name, model=v.model, weight=v.weight) for v in self.variants
            ],
            shadow=self.shadow,
        )


def key_point(model: str, key: bytes) -> float:
    """Where a request key falls in [0, 1) for `model`'s release (one key falls in unrelated
    places for different releases, so being a canary user of one says nothing of another)."""
    return affinity_key(b"release:" + model.encode() + b"\0" + key) / _SPAN


class Releases:
    """The gateway's releases now: read by every request, replaced whole by a change."""

    def __init__(self, configs: Sequence[ReleaseConfig], rng: random.Random | None = None):
        self.rng = rng or random.Random()
        self.table: dict[str, Release] = {c.model: Release.build(c) for c in configs}
        self.version = 0  # counts changes, so a watcher can tell one happened

    def __bool__(self) -> bool:
        return bool(self.table)

    def get(self, model: str) -> Release | None:
        return self.table.get(model)

    def choose(self, release: Release, key: bytes | None) -> tuple[Variant, Variant | None]:
        """The variant that serves a request of `release` with `key` (None: no key, a random
        one), and the variant its copy goes to in shadow mode (None: no copy)."""
        point = self.rng.random() if key is None else key_point(release.model, key)
        chosen = release.pick(point)
        shadow = release.shadow
        if shadow is None or shadow.variant == chosen.name or self.rng.random() >= shadow.share:
            return chosen, None
        return chosen, release.variant(shadow.variant)

    def update(
        self,
        model: str,
        weights: Mapping[str, float],
        shadow: ShadowConfig | Literal["keep"] | None = "keep",
    ) -> Release:
        """Set `model`'s weights (variants left out keep theirs) and its shadow (None: off).
        The release as it now is."""
        old = self.table.get(model)
        if old is None:
            raise ReleaseError(404, f"No release for model `{model}`.")
        names = {v.name for v in old.variants}
        unknown = sorted(set(weights) - names)
        if unknown:
            raise ReleaseError(
                400, f"Unknown variants {unknown} of `{model}`; its variants: {sorted(names)}."
            )
        for name, weight in weights.items():
            if not 0 <= weight <= 1e6:
                raise ReleaseError(400, f"weights.{name}: must be between 0 and 1e6, got {weight}.")
        data = old.config().model_dump()
        for v in data["variants"]:
            v["weight"] = weights.get(v["name"], v["weight"])
        if shadow != "keep":
            data["shadow"] = None if shadow is None else shadow.model_dump()
        try:
            new = ReleaseConfig.model_validate(data)
        except ValidationError as e:
            raise ReleaseError(400, validation_problems(e)[0]) from None
        return self._put(Release.build(new))

    def load(self, configs: Sequence[ReleaseConfig]) -> list[str]:
        """Replace every release (a config reload); the models whose releases changed."""
        new = {c.model: Release.build(c) for c in configs}
        changed = sorted(m for m in new.keys() | self.table.keys()
                         if new.get(m) != self.table.get(m))  # fmt: skip
        if changed:
            self.table = new
            self.version += 1
        return changed

    def _put(self, release: Release) -> Release:
        if self.table.get(release.model) != release:
            self.table = {**self.table, release.model: release}
            self.version += 1
        return release
