"""Feeding the latency model: what the gateway sees goes in, predictions come out to routing.

In: every scrape of an engine (its running count, inter-token latency histogram and speculative
counters, from the monitor) and every stream the gateway relayed (its TTFT and TPOT, the
backend's lease count when it joined and on average while it decoded). Out: the registry's
`curves`, refitted once per monitor round where something was learned, which every routing
snapshot carries; the model's gauges; and the view `/state` shows.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from types import MappingProxyType

from gateway.backends.latency_model import (
    UNKNOWN,
    BackendModel,
    EngineSample,
    mate_prior,
    with_mate,
)
from gateway.backends.registry import BackendEntry, Registry
from gateway.config.settings import Settings
from gateway.core import api
from gateway.core.exchange import Exchange
from gateway.observe.telemetry import Telemetry
from gateway.routing import Role
from gateway.routing.curves import Prediction
from gateway.routing.learned import remember_limits, remember_outlooks, remember_peaks
from gateway.wire.metrics import EngineStats

__all__ = ["SHOWN_CONCURRENCIES", "Learner", "engine_sample", "slo_limit"]

# Where /state and the gauges show each curve.
SHOWN_CONCURRENCIES = (1, 8, 16, 24, 32, 48, 64)


def engine_sample(
    stats: Mapping[str, EngineStats], leases: tuple[float, float, int] | None = None
) -> EngineSample:
    """One scrape's figures, summed over the engine's models; `leases`: this gateway's marks
    of its leases there at the scrape (EngineSample.leases)."""
    s = list(stats.values())
    itl = [x for x in s if x.itl_sum is not None and x.itl_count is not None]
    spec = [x for x in s if x.spec_drafts is not None and x.spec_draft_tokens is not None
            and x.spec_accepted_tokens is not None]  # fmt: skip
    prompt = [x for x in s if x.prompt_tokens is not None]
    prefill = [x for x in s if x.prefill_time_sum is not None and x.prefill_time_count is not None
               and x.prefill_computed_sum is not None]  # fmt: skip
    return EngineSample(
        running=sum(x.running for x in s),
        waiting=sum(x.waiting for x in s),
        leases=leases,
        itl_sum=sum(x.itl_sum or 0.0 for x in itl) if itl else None,
        itl_count=sum(x.itl_count or 0.0 for x in itl) if itl else None,
        spec=(
            sum(x.spec_drafts or 0.0 for x in spec),
            sum(x.spec_draft_tokens or 0.0 for x in spec),
            sum(x.spec_accepted_tokens or 0.0 for x in spec),
        ) if spec else None,
        prefilled=sum((x.prompt_tokens or 0.0) - (x.prefix_hit_tokens or 0.0) for x in prompt)
        if prompt else None,
        prefill=(sum(x.prefill_time_sum or 0.0 for x in prefill),
                 sum(x.prefill_computed_sum or 0.0 for x in prefill),
                 sum(x.prefill_time_count or 0.0 for x in prefill)) if prefill else None,
        # (Where some of its models say and some do not, as if none did: the steps of those
        # that do would be too few for all of its prompts.)
        steps=sum(x.steps or 0.0 for x in s) if s and all(x.steps is not None for x in s)
        else None,
    )  # fmt: skip


def slo_limit(pred: Prediction, tpot_s: float, upto: int = 256) -> int:
    """The most streams at which the predicted TPOT still meets `tpot_s` (0: not even one, or
    nothing known)."""
    if not pred.known:
        return 0
    n = 0
    while n < upto and pred.tpot.at(n + 1) <= tpot_s:
        n += 1
    return n


class Learner:
    def __init__(
        self,
        registry: Registry,
        settings: Settings,
        telemetry: Telemetry,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.registry, self.telemetry, self.clock = registry, telemetry, clock
        self.slo = settings.slo.slo()
        self.cfg = settings.learning
        self.unlike = self.cfg.tier_unlike
        self.models: dict[str, BackendModel] = {}
        # Each backend's prediction from its own observations; routing reads them told what
        # their tier-mates have seen (with_mate): a backend that joins a tier learns from its
        # mates at once.
        self.own: dict[str, Prediction] = {}
        self.tiers: dict[str, list[str]] = {}
        # Backends discovery found while the gateway ran: they start from a mate's curves.
        self.joined: set[str] = set()
        self.registry.curves = MappingProxyType({})
        self._dirty: set[str] = set()
        self._generation = -1
        self._follow()
        self.refresh()

    def _follow(self) -> None:
        """Learn of the registry's backends as they are now (discovery adds and forgets)."""
        if self._generation == self.registry.generation:
            return
        self._generation = self.registry.generation
        cfg, now = self.cfg, {e.url: e for e in self.registry}
        for url, e in now.items():
            if url not in self.models:
                self.models[url] = BackendModel(cfg.memory, cfg.acceptance_halflife_s,
                                                cfg.spread, cfg.ridge_max_tokens)  # fmt: skip
                self.own[url] = UNKNOWN
                self.tiers.setdefault(e.backend.tier, []).append(url)
                if e.discovered:
                    self.joined.add(url)
                self._dirty.add(url)
        gone = set(self.models) - set(now)
        if gone:
            for url in gone:
                del self.models[url], self.own[url]
                self.joined.discard(url)
            self.tiers = {t: kept for t, urls in self.tiers.items()
                          if (kept := [u for u in urls if u not in gone])}  # fmt: skip
            self._dirty -= gone
            self.registry.curves = MappingProxyType(
                {u: p for u, p in self.registry.curves.items() if u not in gone})
            for urls in self.tiers.values():  # a mate ahead may be gone: tell them anew
                self._dirty.update(urls)

    # -- in ------------------------------------------------------------------------------------
    def scraped(self, entry: BackendEntry, stats: Mapping[str, EngineStats], now: float) -> None:
        self._follow()
        if entry.url not in self.models:
            return
        # (Marked now, not at `now`, the round's start: leases may have changed since.)
        sample = engine_sample(stats, entry.load_marks(self.clock()))
        self.models[entry.url].observe_engine(sample, now)
        self._dirty.add(entry.url)

    def finished(self, ex: Exchange) -> None:
        """A relayed stream, if it ran to its end: TTFT at the load it joined, TPOT at the
        mean load while it decoded."""
        b, ttft, tpot = ex.backend, ex.ttft, ex.tpot
        if b is None or ex.status != 200 or ttft is None or ex.midstream_error:
            return
        if ex.continuations:  # its TPOT is two backends' (and a gap): no one's curve
            return
        entry = self.registry.entries.get(b.url)
        if entry is None:  # forgotten (gone from discovery) while the stream ended
            return
        if self._generation != self.registry.generation:
            self._follow()
        now = self.clock()
        decoding, since = None, None
        if tpot is not None and ex.busy_mark is not None:
            area, since = ex.busy_mark
            end_area, _ = entry.busy_mark(now)
            mean = (end_area - area) / (now - since) if now > since else float(entry.busy)
            decoding = (max(1.0, mean), tpot)
        self.models[b.url].observe_request(now, decoding, (ex.joined_at_load, ttft), since)
        self._dirty.add(b.url)

    def slow_start(self, url: str, load: int, waited: float) -> None:
        """A stream left `url` for a hedge after `waited` s without a byte at `load`: a TTFT
        it has at least, learned at once so that routing keeps away while it stays slow."""
        self._follow()
        if url not in self.models:
            return
        self.models[url].observe_request(self.clock(), None, (max(1, load), waited))
        self._dirty.add(url)

    # -- out -----------------------------------------------------------------------------------
    def refresh(self) -> None:
        """Refit what learned something since the last call and hand it to routing."""
        self._follow()
        if not self._dirty:
            return
        curves = dict(self.registry.curves)
        made: list[tuple[Prediction, Prediction | None]] = []  # the new ones, each's before
        for url in self._dirty:
            self.own[url] = self.models[url].prediction()
        for urls in self.tiers.values():
            if self._dirty.isdisjoint(urls):
                continue
            # The tier-mate that has seen the most streams tells the others about the load
            # they have not seen yet.
            ahead = max(urls, key=lambda u: self.own[u].frontier)
            for url in urls:
                # Unchanged unless it or the mate ahead learned (a new mate ahead learned).
                if url not in self._dirty and ahead not in self._dirty:
                    continue
                pred, mate = self.own[url], self.own[ahead]
                if url != ahead and not pred.known and url in self.joined and mate.known:
                    pred = mate_prior(mate, self.unlike)
                elif url != ahead:
                    pred = with_mate(pred, mate, self.unlike)
                made.append((pred, curves.get(url)))
                curves[url] = pred
                self._gauges(self.registry.entry(url), pred)
        # The classes' limits on each new prediction, and the peaks of those in flight, found
        # now rather than by the first decision that asks (a search or a scan per class and
        # candidate, ~20 us each).
        classes = {s for e in self.registry for s, _ in (*e.slos, *e.recent)}
        flying = {s for e in self.registry for s, _ in e.slos}
        for fresh, before in made:
            if fresh.known and len(classes) > 1:
                remember_limits(fresh, classes)
            if fresh.known and flying:
                remember_peaks(fresh, flying)
            # ... and the outlooks decisions asked of its predecessor lately (~2 us each).
            if before is not None:
                remember_outlooks(fresh, before)
        self._dirty.clear()
        self.registry.curves = MappingProxyType(curves)

    def view(self, url: str, now: float) -> api.ModelView | None:
        pred = self.registry.curves.get(url)
        if pred is None:
            return None
        tpot, ttft, tps = pred.tpot, pred.ttft, pred.tokens_per_step
        return api.ModelView(
            frontier=pred.frontier,
            spread=round(pred.spread, 4),
            bias=round(pred.bias, 4),
            curve=[api.CurvePoint(concurrency=n, tpot_ms=round(tpot.at(n) * 1000, 3),
                                  step_ms=round(tpot.at(n) * tps * 1000, 3),
                                  ttft_ms=round(ttft.at(n) * 1000, 3),
                                  evidence=round(tpot.evidence_at(n), 2))
                   for n in SHOWN_CONCURRENCIES],
            tokens_per_step=round(pred.tokens_per_step, 3),
            acceptance_rate=None if pred.acceptance is None else round(pred.acceptance, 4),
            prefill_ms_per_1k_tokens=round(self.models[url].prefill.per_token * 1e6, 3)
            if url in self.models else 0.0,
            prompt_ms_per_1k_tokens=round(pred.prefill_s * 1e6, 3),
            slo_limit=slo_limit(pred, self.slo.tpot_s),
            observed_ago_s=None if pred.observed_at is None else round(now - pred.observed_at, 3),
        )  # fmt: skip

    def _gauges(self, entry: BackendEntry, pred: Prediction) -> None:
        t, b = self.telemetry, entry.backend
        for n in SHOWN_CONCURRENCIES:
            value = pred.tpot.at(n) if pred.known else math.nan
            t.child(t.predicted_tpot, b.role.value, b.url, str(n)).set(value)
        t.child(t.frontier, b.role.value, b.url).set(pred.frontier)
        if (model := self.models.get(b.url)) is not None:
            t.child(t.prefill_cost, b.role.value, b.url).set(model.prefill.per_token)
        if b.role is Role.LATENCY:
            t.child(t.latency_limit, b.url).set(slo_limit(pred, self.slo.tpot_s))
