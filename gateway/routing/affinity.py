"""Prefix-cache affinity: a conversation, a session or a repeated prompt prefix goes back to the
instance that served it last, so that the engine's prefix cache (vLLM's automatic prefix
caching) holds its earlier turns and only the new part is prefilled.

The policy decides first, on load and latency alone; this stage may then put another backend
first:
- a request whose key was served lately (`req.home`, remembered by the pipeline, which gives no
  home to a key other requests hold right now) goes back to that backend, in whichever tier it
  is, while it is not saturated (by the policy's own measure), has no queue where the policy's
  choice is idle, and, where the latency model knows it, it is neither full nor predicted to
  miss the request's SLO where the policy's choice would meet it, nor to lose SLO-meeting
  output (past a knee it has shown) where the policy's choice would lose none, nor to add less
  than a `give_way`-th of what the policy's choice would. So a conversation that started on the
  latency tier stays there while that tier is before its knee for the request's SLO, and moves
  when it is past it; one that started in the pool comes up to the latency tier where that adds
  over twice its output (an idle latency engine decoding twice as fast or more);
- a session the client declared (`x-session-id`, `user`) and seen for the first time goes to its
  own backend of the policy's tier, by consistent hashing with bounded loads: the tier's
  backends ranked by rendezvous hashing of the key (each key has its own fixed order, and adding
  or removing a backend moves only its keys), the first that is not saturated and holds at most
  `(1 + balance)` times its tier's mean load (counting this request) plus `slack` requests, so a
  hot session cannot pile onto one instance. Every gateway replica and worker maps such a key to
  the same backend;
- anything else (a prompt seen for the first time, a prefix other requests are using right now)
  keeps the policy's order: affinity costs nothing where nothing repeats.

Pure, like every routing stage: the key is a 64-bit integer the intake derived from the request
(gateway.pipeline.intake), the home a URL, and the hashes fixed functions of them.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gateway.routing.learned import NOTHING, Learned, Outlook, outlook
from gateway.routing.params import PolicyParams
from gateway.routing.saturation import Saturation
from gateway.routing.types import (
    Backend,
    BackendLoad,
    Decision,
    LoadSnapshot,
    Reason,
    RouteRequest,
    Stay,
)

__all__ = ["Affinity", "affinity_key", "rank"]

_MASK = (1 << 64) - 1
# Decisions whose first candidate affinity must not move: nothing has room, or the request or
# the policy chose that backend for a reason of its own.
_KEEP = frozenset({Reason.SATURATED, Reason.NO_BACKEND, Reason.EXPLORE, Reason.POLICY_ERROR})
# A home is kept over an exploring decision: exploration may try another backend with a request
# that has no cache to lose. Not over a backend kept for a tighter class: the request meets its
# SLO where the policy sent it, and pays a prefill there; at home it would take the room a
# tighter class's request needs, which nothing else may serve.
_KEEP_HOME = (_KEEP - {Reason.EXPLORE}) | {Reason.RESERVED}


def affinity_key(data: bytes) -> int:
    """A request's affinity key from the bytes that identify its prefix (stable across
    processes, unlike `hash()`)."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def _mix(x: int) -> int:
    """splitmix64's finaliser: spreads the bits of `x`."""
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & _MASK
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & _MASK
    return x ^ (x >> 31)


def rank(key: int, pool: Sequence[Backend], urls: Mapping[str, int] | None = None) -> list[Backend]:
    """`pool` in `key`'s rendezvous order (highest random weight first); `urls`: the backends'
    URL hashes when known in advance (each is computed otherwise)."""
    known = urls or {}

    def weight(b: Backend) -> int:
        url = known.get(b.url)
        return _mix(key ^ (affinity_key(b.url.encode()) if url is None else url))

    return sorted(pool, key=weight, reverse=True)


@dataclass(frozen=True, slots=True)
class Affinity:
    # A backend takes keyed requests up to (1 + balance) x its tier's mean load, + slack.
    balance: float
    slack: int
    saturation: Saturation
    # How the learned policy reads a prediction (its SLO margin, when a backend is full).
    learned: Learned
    # A known home gives way where the policy's choice adds this many times its SLO-meeting
    # output (0: never for that reason).
    give_way: float = 0.0
    # The configured backends' URL hashes, computed once rather than in every decision.
    urls: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, params: PolicyParams, backends: Sequence[Backend] = ()) -> Affinity:
        urls = {b.url: affinity_key(b.url.encode()) for b in backends}
        return cls(params.affinity_balance, params.affinity_slack, Saturation.of(params),
                   Learned.build("learned", params), params.affinity_yield, urls)  # fmt: skip

    def bound(self, loads: Sequence[int]) -> int:
        """The most requests a backend may hold after taking this one for affinity's sake."""
        mean = (sum(loads) + 1) / len(loads)
        return max(1, math.ceil((1 + self.balance) * mean)) + self.slack

    def __call__(self, req: RouteRequest, decision: Decision, snap: LoadSnapshot) -> Decision:
        """`decision` with its first candidate moved to the request's home, or to a declared
        session's own backend of the policy's tier, when that backend may take it; otherwise
        the policy's order. Either way it says what affinity did (`Decision.affinity`, a Stay)
        where the request has a home or a declared session."""
        ordered = decision.candidates
        if req.affinity is None or not ordered:
            return decision
        if req.home is not None:
            home = next((b for b in ordered if b.url == req.home), None)
            if home is None:
                return decision._replace(affinity=Stay.GONE)
            if home is ordered[0]:
                return decision._replace(affinity=Stay.HOME)
            if decision.reason in _KEEP_HOME:
                return decision._replace(affinity=Stay.POLICY)
            here = snap.load(home.url)
            if self._saturated(home, here, decision, snap):
                return decision._replace(affinity=Stay.SATURATED)
            if here.waiting and not here.stale and not snap.load(ordered[0].url).effective:
                # Requests queue at the home (the engine's batch is full) while the policy's
                # choice holds none: a prefill there costs less than a wait for a slot here,
                # whether or not the latency model knows either.
                return decision._replace(affinity=Stay.QUEUE)
            away = self._sent_away(req, home, ordered[0], snap)
            if away is not None:
                return decision._replace(affinity=away)
            rest = tuple(b for b in ordered if b is not home)
            return decision._replace(candidates=(home, *rest), affinity=Stay.HOME)
        if not req.session:
            return decision
        if decision.reason in _KEEP:
            return decision._replace(affinity=Stay.POLICY)
        tier = ordered[0].tier
        pool = [b for b in ordered if b.tier == tier]
        if len(pool) < 2:
            return decision._replace(affinity=Stay.SESSION)
        load, full = snap.load, self.saturation.backend
        bound = self.bound([load(b.url).effective for b in pool])
        for b in rank(req.affinity, pool, self.urls):
            own = load(b.url)
            if own.effective + 1 <= bound and not full(b, own):
                if b is ordered[0]:
                    return decision._replace(affinity=Stay.SESSION)
                rest = tuple(x for x in ordered if x is not b)
                return decision._replace(candidates=(b, *rest), affinity=Stay.SESSION)
        return decision._replace(affinity=Stay.SATURATED)

    def _saturated(
        self, home: Backend, here: BackendLoad, decision: Decision, snap: LoadSnapshot
    ) -> bool:
        """Whether the home has no room by the policy's own measure: the learned policy's is
        its model's (a home it knows is full where the model says so: `_sent_away`), not the fixed
        policies' latency cap, which it does not keep either (a cap of 24 moved conversations
        off a latency backend that the policy itself had just given 29 streams, all within the
        SLO); the fixed limits otherwise."""
        if decision.policy == self.learned.name:
            at_home = snap.curves.get(home.url)
            if at_home is not None and at_home.frontier:
                return False
        return self.saturation.backend(home, here)

    def _sent_away(
        self, req: RouteRequest, home: Backend, chosen: Backend, snap: LoadSnapshot
    ) -> Stay | None:
        """Why the latency model sends the request to the policy's choice rather than home, or
        None where it lets it go home: the home full (FULL); predicted to miss the request's
        SLO where the choice would meet it (MISS); nothing known of the choice yet while the
        home misses the SLO, or is past its knee by more output than the move's prefill would
        stall there (UNKNOWN: a guess there stands against a guess here only where the home is
        past the streams it has shown); the choice adding `give_way` times the home's
        SLO-meeting output, beyond the history's prefill there (GIVE_WAY); the home past its
        knee losing more output with the request than the prefill stalls at the choice
        (PAST_KNEE). None where the model knows nothing of the home: the cache hit is all that
        is known then (saturation still moves it).

        Only a knee within the streams the home has shown counts: past its frontier the model
        guesses one (a ridge that may lie anywhere out there; gateway.backends.latency_model),
        with a doubt that a predicted SLO miss already prices, and the cache hit is known. The
        request then tries the home's next stream, as the policy's own exploration does, and the
        frontier moves up by evidence.

        A home is held to this, not to the load bound: one conversation holds one request at a
        time (a key other requests hold has no home), so going home piles no hot prefix onto an
        instance; and at the start of a burst the bound, against a tier's mean load while most
        of the burst has not arrived yet, moved conversations off their caches for nothing."""
        curves, load, limits, slo = snap.curves, snap.load, self.learned.limits, req.slo
        at_home = curves.get(home.url)
        if at_home is None or not at_home.frontier:
            return None
        there = outlook(home, load(home.url), at_home, slo, limits)
        if there.full:
            return Stay.FULL
        # A gain the policy counts as none (gateway.routing.learned): the cache hit decides
        # near the knee.
        nothing = NOTHING / slo.tpot_s
        past_knee = there.gain < -nothing and not there.ahead
        at_chosen = curves.get(chosen.url)
        if at_chosen is None or not at_chosen.frontier:
            # The choice is unknown (the policy tries it, as good as the best known backend for
            # a first stream): home while it meets the SLO and is before its knee, or while it
            # is past the streams it has shown: a guess there stands against a guess here, and
            # only the home holds the cache. (A burst of conversations on a fresh gateway
            # otherwise left their homes on the prior's guess alone, before a scrape had shown
            # the streams they had just been served at.) Past its knee, within the SLO, the move
            # is priced as the past-knee rule below prices it, the choice's TPOT guessed as the
            # home's for one stream (unpriced, it took 10 of 64 later turns of a `bench
            # conversations` crowd off the latency engine, read past its knee:
            # docs/results/conversations-outcomes).
            if (there.p >= 0.5 or there.ahead) and not past_knee:
                return None
            if there.p >= 0.5:
                unknown = outlook(chosen, load(chosen.url), at_chosen, slo, limits)
                cost = _move_cost(req, unknown, at_home.prefill_s)
                if not _leaving_pays(req, there, cost, at_home.tpot.at(1)):
                    return None
            return Stay.UNKNOWN
        other = outlook(chosen, load(chosen.url), at_chosen, slo, limits)
        if there.p < 0.5 <= other.p:
            return Stay.MISS
        # The cache saves the history's prefill; a choice adding `give_way` times the home's
        # SLO-meeting output (an idle engine decoding that much faster: there a stream's gain
        # is its own rate) saves more, for all but the shortest answers (conversations kept on
        # a pool instance while the latency engine had room cost the 25 ms cells of `bench
        # routing-sim --workload chat` up to 8% of the best fixed limit's count: docs/results/
        # routing-sim-give-way).
        # (The choice's prefill time per token where it has learned one, else the home's: a
        # pool engine the conversations have not used yet knows none.)
        cost = _move_cost(req, other, at_chosen.prefill_s or at_home.prefill_s)
        if (
            self.give_way
            and other.p >= 0.5
            and not there.ahead  # (a guess there: the home's next stream is tried, as above)
            and other.gain > self.give_way * max(there.gain, nothing)
            # ... where the decoding it saves the request outweighs the history's prefill, or
            # where the home is past its knee: the move then relieves the home's other streams
            # too, which the request's own decoding does not count (priced there as well, it
            # cost the A100 chat cells' 25 ms bursts 4-5%: docs/results/
            # conversations-prefill-priced)
            and (
                cost is None
                or past_knee
                or (req.max_tokens - 1) * (there.tpot - other.tpot) > cost
            )
        ):
            return Stay.GIVE_WAY
        # Past its knee, one more stream at home costs its other streams SLO-meeting output:
        # the request goes where it costs none (even where it adds none either: a pool that
        # cannot meet a tight class, beside a latency engine the class has filled), where
        # that loss, over the request's decoding at home, outweighs the output the history's
        # prefill stalls at the choice.
        if past_knee and other.gain > -nothing and _leaving_pays(req, there, cost, other.tpot):
            return Stay.PAST_KNEE
        return None


# A TPOT taken as no less than this where it divides (an engine that sends a whole answer at
# once has a TPOT of 0).
_FLOOR = 1e-4


def _leaving_pays(req: RouteRequest, there: Outlook, cost: float | None, tpot: float) -> bool:
    """Whether a move off a home past its knee pays: the output the home would lose with the
    request, over its decoding there, outweighs the output the move's `cost` (stream-seconds
    of prefill, None: not known, the move unpriced) stalls where it goes, `tpot` a token."""
    return cost is None or -there.gain * req.max_tokens * there.tpot > cost / max(tpot, _FLOOR)


def _move_cost(req: RouteRequest, other: Outlook, prefill_s: float) -> float | None:
    """Stream-seconds a move to `other` costs in prefill: the request's history prefilled
    there (`prefill_s` a prompt token), stalling each of its streams and the request's own. None
    where not known (the prompt's size or the answer's limit not given, or no prefill time
    learned there): a move is then weighed by decoding alone. (Moves made on decoding alone
    took 4-10 of the 64 later turns of `bench conversations`' 32 chats at once off their
    caches for 24-token answers: docs/results/conversations-crowd-moves.)"""
    if not (req.max_tokens and req.prompt_tokens and prefill_s > 0):
        return None
    return prefill_s * req.prompt_tokens * (other.load + 1)
