"""``learned``: each request where it adds the most SLO-meeting output, from each backend's
learned latency curves (gateway.backends.latency_model), with no hand-set golden range.

The objective is goodput, the SLO the constraint. For each candidate backend at concurrency n,
from its predicted TPOT at n and n + 1 streams and the spread of requests around it:
- `p`: the probability that the request meets its SLO there (TPOT, and TTFT within it less
  `slo_margin`);
- `gain`: the SLO-meeting output per second the backend would have with the request, less what
  it has now: each stream counts its tokens per second times its probability of meeting its own
  SLO, the request's included. It is what one more stream adds where the backend is fast and
  before its knee; it turns negative past the knee, where one more stream slows the others by
  more than it adds, and wherever it would push the streams there past their SLOs;
- `full`: its predicted TTFT is beyond `full_ttft_factor` times the request's TTFT SLO, or (as
  for every policy) a fresh scrape shows a long queue: admission then holds the request, and
  answers 429 if nothing frees.

Order: the backends with room by most gain (on a tie, where nothing is to be gained, the
fastest, then the least loaded); full ones last by least excess. In a closed loop the
SLO-meeting requests per second are what the gains add up to; in an open one, the fastest place
that keeps everyone's SLO. So the faster tier fills to its knee while others can meet the SLO
too, and past it only for requests nothing else serves better, wherever the hardware and the
acceptance put that knee.

Where the model has not looked, the predictions carry their doubt (gateway.backends.latency_model:
past the most streams observed, the step may turn compute-bound anywhere, more likely the further
out), and the probabilities of meeting an SLO widen with it: one stream past the frontier is
nearly as good as the last observed, so the request tries it and the frontier moves up by
evidence; many streams past it are a gamble the gain prices. A backend nothing is known of is
tried once, as good as the best known one for a first stream, ranking after a known backend of
equal gain (the latency tier first among unknowns): a cold start serves its first requests from
the tier the operator called fast, and tries the others when there is a second request to spare.

Past its frontier a replica's next stream is worth least just there: the streams it holds
lose their certainty of the SLO first, then the doubt widens and the expected output rises
again, so the next stream's gain is highest on the replica a burst has pushed furthest, and by
it alone a burst piled onto one of a tier's like engines. Where the first choice is past its
frontier, the replica of its tier (past its own) whose output grows most over the next few
streams on average (`envelope`) goes first instead; across tiers the next stream's gain still
decides (`_share_with_mates`).

Where nothing gains anywhere (overload), the next stream goes where one more loses least: most
often a sink, whose streams all miss their SLO already. Where that sink would give more at its
peak than another backend gives at its own (a burst piled onto an engine read too flat), the
backend with the least to give takes it instead, and the pile drains (`_drain`).

Several classes at once (open traffic): a request of a looser class does not take the room a
tighter class in flight needs on a backend where that class is placed (before its knee and
within its SLO), when another backend meets the request's SLO without loss
(`kept_for_tighter`, a trunk reservation: the tighter class's streams not yet there, and a guard
for those still to come). Without it, 25 ms requests filled EAGLE to its knee while 12 ms
requests, which only EAGLE meets, went to a pool that could not.

With probability `explore_rate` a backend whose model has had no observation for
`explore_after_s` goes first, so a tier that lost its traffic (EAGLE accepting little) is noticed
when it recovers. A backend that decodes speculatively (its drafts seen) is also tried on a
clock, whatever the draw: by the first decision that may once it has gone `explore_after_s`
unobserved and untried, then not again for as long. Its speed at a load changes unseen with the
acceptance of its drafts, which is the workload's; plain decoding's is the hardware's. (At 2% of
decisions alone, 4 users took 20-60 s to find an EAGLE engine whose drafts were accepted again:
docs/results/explore-clock.) A request with a prefix others may come back to (an affinity key:
a conversation's turn) explores only a backend that decodes speculatively, or one nothing is
known of: its conversation's later turns either stay where it went or pay their history's
prefill to leave. (Openers explored to an idle pool engine were the only later turns of `bench
conversations`' chats one at a time to leave their first turn's instance:
docs/results/explore-keyed.) `explore_rate` 0 turns both off.

A pure function of (request, snapshot with its predictions, state, rng).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from math import erf, log2
from typing import NamedTuple

from gateway.routing.curves import TABLE_MAX, Prediction
from gateway.routing.filters import eligible, of_role, pinned, serving
from gateway.routing.params import PolicyParams
from gateway.routing.types import (
    UNKNOWN_LOAD,
    Backend,
    BackendLoad,
    Decision,
    LoadSnapshot,
    Reason,
    Role,
    RouteRequest,
    RouterState,
    Slo,
    by_tier,
)

__all__ = [
    "NOTHING", "REACH", "RETOLD", "SHORTLIST", "Learned", "Outlook", "TighterClasses",
    "candidates", "envelope", "first_stream", "guard", "kept_for_tighter", "met",
    "most_streams", "outlook",
    "remember_limits", "remember_outlooks", "remember_peaks", "shortlist",
]  # fmt: skip

_FLOOR = 1e-6
# A gain below this share of a stream that just meets its SLO counts as none (so that where
# nothing is to be gained, speed and load decide, not rounding).
NOTHING = 0.01


class Outlook(NamedTuple):
    """What one more request would see on a backend, and what it would do there. (A named
    tuple: one is built per candidate per decision, and a frozen dataclass costs twice as much
    to build.)"""

    tpot: float  # predicted mean, with the request (inf: nothing known)
    ttft: float
    p: float  # the probability that the request meets its SLO there
    gain: float  # SLO-meeting tokens per second the backend would gain (negative: lose)
    full: bool
    load: int
    ahead: bool  # past the most streams observed there: the request explores


def met(log_slo: float, n: int, pred: Prediction) -> float:
    """The probability that a stream meets a TPOT SLO of exp(`log_slo`) with `n` streams on
    the backend: ln(TPOT) normal around ln(curve) + bias, with the spread observed and the
    model's own doubt there."""
    offset, scale = _terms(pred, n)
    return 0.5 * (1.0 + erf((log_slo + offset) * scale))


def _terms(pred: Prediction, n: int) -> tuple[float, float]:
    """(offset, z_scale) at `n` streams, past the tables too."""
    if n < len(pred.offset):
        return pred.offset[n], pred.z_scale[n]
    return -math.log(max(pred.tpot.at(n), _FLOOR)) - pred.bias, pred.z_scale[-1]


def outlook(
    b: Backend, load: BackendLoad, pred: Prediction | None, slo: Slo, params: _Limits,
) -> Outlook:  # fmt: skip
    """One candidate's outlook. Nothing known (no prediction, or nothing observed yet): a first
    stream there is as good as one on the best known backend (`params.first`), and no more
    streams than that until something is observed."""
    return Outlook._make(_outlook(b, load, pred, slo, params))


# ln(x) = log2(x) x ln 2: math.log takes an optional base and parses its arguments slowly
# (~150 ns against ~45 ns for log2 on CPython 3.11), and the gain takes one per SLO class.
_LN2 = math.log(2.0)


def _outlook(
    b: Backend, load: BackendLoad, pred: Prediction | None, slo: Slo, params: _Limits,
) -> tuple[float, float, float, float, bool, int, bool]:  # fmt: skip
    """`outlook` as a plain tuple in Outlook's order: a decision builds one per candidate, and a
    named tuple's constructor costs seven times as much as the tuple."""
    # load.effective, spelled out: a property's call per candidate per decision saved
    # (gateway.routing.types.BackendLoad.effective says why it is what it is).
    n = load.inflight
    if not load.stale:
        queued, at = load.running + load.waiting, load.inflight_at_scrape
        if at is None:
            if queued > n:
                n = queued
        elif queued > at:
            n += queued - at
    if pred is None or not pred.frontier:
        if n:
            return math.inf, 0.0, 0.0, 0.0, False, n, True
        return math.inf, 0.0, 1.0, params.first, False, n, True
    # Remembered by the prediction, keyed by all the rest the outlook depends on: between two
    # decisions most candidates' streams are as they were (or as they were a moment ago), and
    # a prediction lives until the model learns again. A look-up costs a fraction of the
    # computation, a miss a little more than it (docs/results/decision-cost-scenes).
    busy = not load.stale and load.waiting > params.max_waiting
    key = (n, load.slos, slo.tpot_s, slo.ttft_s, busy, params.ttft_room, params.full_ttft_factor)
    memo = pred.outlooks
    found = memo.get(key)
    if found is not None:
        return found
    found = _afresh(pred, key, slo.log_tpot)
    if len(memo) >= _OUTLOOKS:
        memo.clear()
    memo[key] = found
    return found


_Key = tuple[int, tuple[tuple[float, int], ...], float, float, bool, float, float]
_Found = tuple[float, float, float, float, bool, int, bool]


def _afresh(pred: Prediction, key: _Key, log_slo: float) -> _Found:
    """The outlook on `pred` of what `key` holds (everything else an outlook depends on: the
    streams there, their SLOs, the request's TPOT and TTFT SLOs, whether the engine's queue is
    long, the policy's margins), `log_slo` the ln of the request's TPOT SLO."""
    n, slos, _, ttft_slo, busy, ttft_room, full_ttft_factor = key
    rows = pred.rows
    if n + 1 < len(rows):  # the common case, read from the tables directly
        now, _, o0, z0 = rows[n]
        tpot, ttft, o1, z1 = rows[n + 1]
    else:
        now, tpot, ttft = pred.tpot.at(n), pred.tpot.at(n + 1), pred.ttft.at(n + 1)
        (o0, z0), (o1, z1) = _terms(pred, n), _terms(pred, n + 1)
    # A microsecond at least: an engine that streams a whole answer at once has a TPOT of 0.
    if now < _FLOOR:
        now = _FLOOR
    if tpot < _FLOOR:
        tpot = _FLOOR
    p = 0.5 * (1.0 + erf((log_slo + o1) * z1)) if ttft <= ttft_slo * ttft_room else 0.0
    # The streams there: this gateway's, each with its own SLO; others (another replica's)
    # are taken to share the request's. Summed as count x erf, halved and shifted once.
    now_sum = then_sum = 0.0
    known = 0
    for s, count in slos:
        known += count
        log_s = log2(s) * _LN2
        now_sum += count * erf((log_s + o0) * z0)
        then_sum += count * erf((log_s + o1) * z1)
    if n > known:
        others = n - known
        now_sum += others * erf((log_slo + o0) * z0)
        then_sum += others * erf((log_slo + o1) * z1)
        known = n
    gain = (0.5 * (known + then_sum) + p) / tpot
    if n:
        gain -= 0.5 * (known + now_sum) / now
    # A queue in the engine is as full on the latency tier as in the pool: past the engine's
    # batch limit a stream waits for a slot, which the TTFT curve (learned where streams ran)
    # does not show, and a backend whose streams all miss their SLO already loses nothing by
    # one more, so without this it would draw every request while its queue grows.
    full = busy or ttft > full_ttft_factor * ttft_slo
    return tpot, ttft, p, gain, full, n, n >= pred.frontier


# The most recent outlooks of a prediction that its successor is told (`remember_outlooks`).
RETOLD = 48


def remember_outlooks(fresh: Prediction, old: Prediction) -> None:
    """The outlooks `old` remembered last (at most `RETOLD`), computed afresh from `fresh` and
    remembered by it before any decision asks. Between two refits the streams on a backend
    move by a few, so the outlooks decisions asked lately are most of those they will ask
    next; without this the first decisions after a refit compute every candidate's (the
    learner calls this when it hands routing new predictions, off the request path)."""
    if not fresh.frontier:
        return
    keys = list(old.outlooks)[-RETOLD:]  # (a dict keeps the order they were remembered in)
    memo = fresh.outlooks
    for key in keys:
        if key not in memo:  # (the ln of its TPOT SLO as a request's Slo has it, to the bit)
            memo[key] = _afresh(fresh, key, Slo(key[3], key[2]).log_tpot)


# The most outlooks a prediction remembers (gateway.routing.curves.Prediction.outlooks).
_OUTLOOKS = 1024

# Read once at import: an enum member read through its class costs a lookup per candidate.
_LATENCY = Role.LATENCY


@dataclass(frozen=True, slots=True)
class _Limits:
    ttft_room: float  # 1 - slo_margin
    full_ttft_factor: float
    max_waiting: int
    explore_rate: float
    explore_after_s: float
    # Per decision, when a candidate is unknown: the gain of a first stream on the best known
    # candidate (for this request's SLO), or the most there is when none is known.
    first: float = 0.0


def first_stream(preds: Sequence[Prediction | None], slo: Slo) -> float:
    """The most a first stream gains on a known backend among `preds` (math.inf: none known)."""
    best = -math.inf
    log_slo = slo.log_tpot
    for pred in preds:
        if pred is not None and pred.known:
            gain = met(log_slo, 1, pred) / max(pred.tpot.table[1], _FLOOR)
            best = max(best, gain)
    return math.inf if best == -math.inf else best


# A class at most this share of the request's TPOT SLO counts as tighter (a few percent apart
# is the same class measured twice).
TIGHTER = 0.9


class TighterClasses:
    """The classes on a decision's candidates (in flight, or lately) whose TPOT SLO is tighter
    than its request's (by `TIGHTER`), with their streams there, and on how many of the
    candidates each is placed at all (`most_streams`; counted when first asked: a decision
    whose first choice places no tighter class never needs it)."""

    __slots__ = ("_able", "classes", "preds")

    def __init__(
        self, preds: Sequence[Prediction | None], loads: Sequence[BackendLoad], tpot_s: float
    ) -> None:
        bound = tpot_s * TIGHTER
        now: dict[float, float] = {}
        lately: dict[float, float] | None = None  # (built only where a class came lately)
        get = now.get
        for load in loads:
            for s, count in load.slos:  # tightest first
                if s >= bound:
                    break
                now[s] = get(s, 0) + count
            recent = load.recent
            if recent and recent[0][0] < bound:
                if lately is None:
                    lately = {}
                for s, mean in recent:  # tightest first
                    if s >= bound:
                        break
                    lately[s] = lately.get(s, 0.0) + mean
        # (TPOT SLO, its ln, its streams on the candidates: in flight now or, for a class that
        # comes and goes, as many as lately on average, whichever is more)
        if lately is not None:
            for s, mean in lately.items():
                if mean > get(s, 0.0):
                    now[s] = mean
        classes: list[tuple[float, float, float]] = []
        for s, total in now.items():  # (most often one: a loop costs less than a comprehension)
            classes.append((s, log2(s) * _LN2, total))
        self.classes = classes
        self.preds = preds
        self._able: dict[float, int] = {}

    def able(self, log_s: float) -> int:
        count = self._able.get(log_s)
        if count is None:
            count = 0
            for pred in self.preds:
                if pred is None or not pred.frontier:
                    continue
                # most_streams' memory, read without a call (most often it holds the limit)
                limit = pred.limits.get(log_s)
                if limit is None:
                    limit = most_streams(log_s, pred)
                if limit:
                    count += 1
            self._able[log_s] = count
        return count


# The chance a tighter class's stream may find no room left for it on a backend kept for it.
BLOCKED = 0.01
_LOG2_BLOCKED = log2(BLOCKED)
# The most streams a search for a class's limit on one backend looks at.
_MOST = 4096
# The most SLOs a prediction remembers its limits for (SLOs come from requests' headers).
_REMEMBERED = 64


def most_streams(log_slo: float, pred: Prediction) -> int:
    """The most streams a backend holds where one more of a class with a TPOT SLO of
    exp(`log_slo`) is still placed there: its streams meet the SLO (one in two at least) and
    one more adds output per second (before the knee, past which the policy sends it elsewhere
    for the output it would cost). 0: not even one. Searched as if TPOT rises with the streams
    and output per second rises, then falls (a roofline); remembered by the prediction."""
    memo = pred.limits
    found = memo.get(log_slo)
    if found is None:
        if len(memo) >= _REMEMBERED:
            memo.clear()
        found = memo[log_slo] = _most_streams(log_slo, pred)
    return found


def remember_limits(pred: Prediction, tpot_slos: Iterable[float]) -> None:
    """`most_streams` for each TPOT SLO in `tpot_slos` but the loosest, remembered by `pred`
    before any decision asks: a decision asks only of classes tighter than its request's, and
    the first one after a refit would otherwise search for every candidate (the learner calls
    this when it hands routing new predictions, off the request path)."""
    tighter = sorted(set(tpot_slos))[:-1]
    for s in tighter:
        if s > 0:
            most_streams(log2(s) * _LN2, pred)  # the ln TighterClasses reads, to the bit


def remember_peaks(pred: Prediction, tpot_slos: Iterable[float]) -> None:
    """`peak` for each TPOT SLO in `tpot_slos`, remembered by `pred` before any decision asks:
    a decision under overload asks it of its own class on every candidate (the learner calls
    this with the classes in flight when it hands routing new predictions, off the request
    path)."""
    for s in set(tpot_slos):
        if s > 0:
            peak(Slo(tpot_s=s).log_tpot, pred)  # the ln a request's Slo has, to the bit


def _most_streams(log_slo: float, pred: Prediction) -> int:
    def placed(n: int) -> bool:
        if met(log_slo, n, pred) < 0.5:
            return False
        if n == 1:
            return True
        now, before = pred.tpot.at(n), pred.tpot.at(n - 1)
        return n * max(before, _FLOOR) >= (n - 1) * max(now, _FLOOR)

    if not placed(1):
        return 0
    lo, hi = 1, 2
    while hi < _MOST and placed(hi):
        lo, hi = hi, hi * 2
    if hi >= _MOST:
        return _MOST
    while hi - lo > 1:  # placed at lo, not at hi
        mid = (lo + hi) // 2
        if placed(mid):
            lo = mid
        else:
            hi = mid
    return lo


def output(log_slo: float, n: int, pred: Prediction) -> float:
    """The SLO-meeting output per second (tokens) of `n` streams of a class with a TPOT SLO of
    exp(`log_slo`) on the backend: each stream's tokens per second times its chance."""
    return n * met(log_slo, n, pred) / max(pred.tpot.at(n), _FLOOR)


def peak(log_slo: float, pred: Prediction) -> tuple[float, int]:
    """The most `output` the backend gives streams of the class, at any number of them up to
    one past its frontier (what it has shown, and the next stream the policy would try there;
    beyond, the doubt's gamble would promise output nothing has shown), and at how many
    streams (0: none meets the SLO). Remembered by the prediction."""
    memo = pred.peaks
    found = memo.get(log_slo)
    if found is None:
        if len(memo) >= _REMEMBERED:
            memo.clear()
        most, at = 0.0, 0
        for n in range(1, min(pred.frontier + 1, TABLE_MAX) + 1):
            out = output(log_slo, n, pred)
            if out > most:
                most, at = out, n
        found = memo[log_slo] = (most, at)
    return found


def guard(streams: float, limit: int) -> int:
    """Free slots to keep for a class with `streams` in flight where it meets its SLO up to
    `limit` streams: as trunk reservation in a telephone exchange, looser streams stop
    `guard` short of the limit. Above them the class's own streams come and go as a queue of
    load streams / limit, which reaches `guard` more with a chance of load ** guard: at most
    BLOCKED. All of it when the class alone would fill the backend."""
    load = streams / limit
    if load >= 1.0:
        return limit
    if load <= 0.0:
        return 1
    slots = math.ceil(_LOG2_BLOCKED / log2(load))
    return limit if slots > limit else (slots if slots > 1 else 1)


def kept_for_tighter(
    pred: Prediction | None, load: BackendLoad, tighter: TighterClasses, streams: int | None = None
) -> bool:
    """Whether one more stream of a looser class on a backend would leave too little room for
    the streams of the `tighter` classes that belong there.

    Open traffic of several classes: a loose request that fills a fast backend to its own knee
    takes the room a tighter class needed, which often nothing else can serve, and it gains
    its own class nothing where a slower backend meets its SLO too. A tighter class's streams
    (in flight now or, for a class that comes and goes, as many as lately on average; anywhere
    among the candidates: those on a backend that cannot serve them wait there for room) are
    shared out among the candidates where the class is placed at all; the backend is kept for
    them when its streams (`streams`, or `load.effective` when not given), with the request,
    its share of them not there yet and a `guard` for those still to come, would be more than
    `most_streams` of a class there."""
    if pred is None or not pred.frontier:
        return False
    at = (load.effective if streams is None else streams) + 1
    # (A class's share is counted only where the class is placed here: a backend that places
    # none never needs `able`.) A first pass as if each class's streams all belonged here, to
    # spare `able` where even that leaves room, made the same decisions no faster
    # (docs/results/decision-cost-one-pass): where a decision asks, the backend is most often
    # kept, and both passes ran.
    needs: list[tuple[int, float]] = []  # (the class's limit there, its streams expected there)
    memo, slos = pred.limits, load.slos
    for s, log_s, total in tighter.classes:
        limit = memo.get(log_s)  # most_streams' memory, read without a call
        if limit is None:
            limit = most_streams(log_s, pred)
        if not limit:
            continue
        share = total / tighter.able(log_s)
        own = 0
        for slo, count in slos:  # one entry per SLO
            if slo == s:
                own = count
                break
        if share > own:
            at += math.ceil(share - own - 1e-9)
            needs.append((limit, share))
        else:
            needs.append((limit, own))
    for limit, expected in needs:  # noqa: SIM110 (a generator costs more than the rest here)
        if at + guard(expected, limit) > limit:
            return True
    return False


def _least_placed(pred: Prediction) -> float:
    """The tightest TPOT SLO of which `most_streams` places a stream on the backend at all: one
    stream meets it with a chance of one in two, i.e. ln SLO >= -offset at one stream. (A hair
    below it, so that rounding cannot leave out a class that `most_streams` would place.)"""
    return math.exp(-pred.offset[1]) * (1.0 - 1e-9)


def _any_between(loads: Sequence[BackendLoad], low: float, high: float) -> bool:
    """Whether a class in flight or lately on `loads` has a TPOT SLO in [low, high)."""
    for load in loads:
        for s, _ in load.slos:  # tightest first
            if s >= high:
                break
            if s >= low:
                return True
        for s, _ in load.recent:
            if s >= high:
                break
            if s >= low:
                return True
    return False


def _keep_for_tighter(
    keys: list[tuple[int, float, float, int, bool, float, int]],
    outlooks: Sequence[tuple[float, float, float, float, bool, int, bool]],
    preds: Sequence[Prediction | None],
    loads: Sequence[BackendLoad],
    slo: Slo,
) -> bool:
    """Where the first choice in `keys` (sorted) is kept for tighter classes
    (`kept_for_tighter`), move it, and the next ones kept too, after the first candidate that
    meets the request's SLO without loss and is kept for none (`keys` sorted again); where
    there is none, the request takes the room. Whether anything moved. (The failover order
    after the first choice is left as it is: a class's limit on a backend costs a search.)"""
    first = keys[0]
    if first[0]:
        return False  # nothing has room
    # Most often the first choice places no tighter class at all (a slower backend): where no
    # tighter class on the candidates reaches `_least_placed` there, the classes' streams need
    # not be gathered.
    pred = preds[first[-1]]
    if pred is None or not pred.frontier:
        return False
    least = _least_placed(pred)
    bound = slo.tpot_s * TIGHTER
    if least >= bound or not _any_between(loads, least, bound):
        return False
    tighter = TighterClasses(preds, loads, slo.tpot_s)
    moved: list[int] = []
    for pos, k in enumerate(keys):
        if k[0]:
            return False  # full from here on
        i = k[-1]
        if kept_for_tighter(preds[i], loads[i], tighter, outlooks[i][5]):
            moved.append(pos)
        elif not moved:
            return False  # the first choice is kept for no one
        elif outlooks[i][2] >= 0.5 and k[1] <= 0.0:
            break
    else:
        return False
    for pos in moved:
        k = keys[pos]
        keys[pos] = (1, k[1], k[2], k[3], k[4], k[5], k[6])
    keys.sort()
    return True


# How many more streams `envelope` looks ahead: a few steps up to where the doubt past a
# frontier has turned (a burst adds tens of streams before a scrape shows any).
REACH = (2, 4, 8, 16)


def envelope(pred: Prediction, load: BackendLoad, n: int, slo: Slo, gain: float) -> float:
    """The most SLO-meeting output per second a stream of the request's class adds on average
    over the next k streams (k = 1, `gain`, or one of `REACH`) on a backend with `n` streams
    there (`load` for their SLOs): the slope of the backend's output, as the model expects it,
    to its concave envelope."""
    rows = pred.rows
    if n + 1 >= len(rows):
        return gain
    slos, log_slo = load.slos, slo.log_tpot
    mine = 0
    for _, count in slos:
        mine += count
    others = n - mine if n > mine else 0  # (another replica's: the request's class)

    def output(m: int, added: int) -> float:
        tpot, _, o, z = rows[m]
        total = (others + added) * (1.0 + erf((log_slo + o) * z))
        for s, count in slos:
            total += count * (1.0 + erf((log2(s) * _LN2 + o) * z))
        return 0.5 * total / (tpot if tpot > _FLOOR else _FLOOR)

    now = output(n, 0) if n else 0.0
    best = gain
    for k in REACH:
        if n + k >= len(rows):
            break
        slope = (output(n + k, k) - now) / k
        if slope > best:
            best = slope
    return best


def _share_with_mates(
    keys: list[tuple[int, float, float, int, bool, float, int]],
    pool: Sequence[Backend],
    outlooks: Sequence[tuple[float, float, float, float, bool, int, bool]],
    preds: Sequence[Prediction | None],
    context: tuple[Sequence[BackendLoad], Slo],
) -> None:
    """Where the first choice in `keys` (sorted, with room) is past its frontier, the backend of
    its tier past its own frontier with the highest `envelope` goes first instead.

    Past a frontier the output the model expects first dips (the streams there lose their
    certainty of the SLO) and then rises again (the doubt widens both ways), so the next
    stream's gain is highest on the replica that a burst has already pushed furthest: by it
    alone, 46 of a burst's streams went to one of two like pool engines and 5 to the other,
    where each met a 4 ms SLO up to about 20 (`bench routing-sim`'s `knee-32` burst with
    conversations: docs/results/mate-past-frontier). Replicas of a tier are alike, and what
    one more stream is worth on each is better read over the streams still to come. Across
    tiers the next stream's gain still decides: there it is the difference between unlike
    engines (read by the envelope too, bursts piled past their frontier onto an EAGLE engine
    whose TPOT sits at a 12 ms SLO)."""
    first = keys[0][-1]
    known = preds[first]
    if known is None or not known.frontier:
        return  # a backend nothing is known of goes first to be tried, as it is
    loads, slo = context
    tier = pool[first].tier
    best_pos, best = 0, -math.inf
    for pos, k in enumerate(keys):
        if k[0]:
            break  # full from here on
        i = k[-1]
        pred, o = preds[i], outlooks[i]
        if pool[i].tier != tier or not o[6] or pred is None or not pred.frontier:
            continue
        e = envelope(pred, loads[i], o[5], slo, o[3])
        if e > best:
            best_pos, best = pos, e
    if best_pos:
        keys.insert(0, keys.pop(best_pos))


def _drain(
    keys: list[tuple[int, float, float, int, bool, float, int]],
    preds: Sequence[Prediction | None],
    outlooks: Sequence[tuple[float, float, float, float, bool, int, bool]],
    slo: Slo,
) -> bool:
    """Where nothing gains anywhere and the first choice in `keys` (sorted, with room) gives up
    more against its `peak` than another candidate gives at its own, in whole streams that just
    meet the SLO, the one of least peak among those goes first instead. Whether anything moved.

    Under overload each stream goes where one more loses least, most often a sink: a backend
    whose streams all miss their SLO already, where one more loses nothing. Right where the
    sink has the least to give. But a burst that piled onto an engine read as rising too flatly
    leaves a sink that would give much at its peak, and one stream at a time it stays one (one
    more there costs nothing), while draining it would win that peak back and a sink elsewhere
    gives up at most its own. Only onto a backend whose output is seen to fall past its peak
    (one still rising one stream past its frontier may give more further out), and by whole
    streams: a small overflow over alike engines each just past its peak loses less than one of
    them given up for it (chosen by the least peak alone, the sink cost `bench routing-sim`'s
    `knee-32` burst 4 ms with conversations 28%). In its `eagle-worse` burst 4 ms with
    conversations, seed 9, one AWQ engine of two held 48.8 streams through a 64-user phase
    (each meets 4 ms to about 24) and 250 requests met their SLO there; with this, 26.5 and 418
    (docs/results/overflow-drain)."""
    first = keys[0][-1]
    pred = preds[first]
    if pred is None or not pred.frontier:
        return False
    log_slo, unit = slo.log_tpot, slo.tpot_s  # (output x TPOT SLO: streams that just meet it)
    most, _ = peak(log_slo, pred)
    best = math.floor((most - output(log_slo, outlooks[first][5], pred)) * unit)
    best_pos = 0
    for pos in range(1, len(keys)):
        k = keys[pos]
        if k[0]:
            break  # full from here on
        other = preds[k[-1]]
        if other is None or not other.frontier:
            continue  # (nothing known: no peak to give up, and no sink to make of it)
        most, at = peak(log_slo, other)
        if at > other.frontier:
            continue  # its output still rising where the model last looks: more may lie beyond
        given_up = math.floor(most * unit)
        if given_up < best:
            best_pos, best = pos, given_up
    if best_pos:
        keys.insert(0, keys.pop(best_pos))
        return True
    return False


# A tier of more backends than this has only this many of them, drawn at random, evaluated per
# decision (power of d choices: near the quality of evaluating all of them in a pool of alike
# engines). An evaluation costs ~1-2 us; a decision over 16 backends must stay well under 40.
SHORTLIST = 4


def shortlist(
    pool: list[Backend], rng: random.Random
) -> tuple[list[Backend], list[Backend]]:
    """(the backends a decision evaluates, the others in a random order, for failover)."""
    if len(pool) <= SHORTLIST:
        return pool, []
    keep: list[Backend] = []
    rest: list[Backend] = []
    bits = rng.getrandbits
    for members in by_tier(pool):
        _sample(list(members), keep, rest, bits)
    return keep, rest


def _sample(
    members: list[Backend], keep: list[Backend], rest: list[Backend], bits: Callable[[int], int]
) -> None:
    """One tier's `members` (reordered in place) into `keep`, all of them or SHORTLIST drawn
    at random, and the others into `rest`."""
    size = len(members)
    if size <= SHORTLIST:
        keep += members
        return
    # The first SHORTLIST places of a Fisher-Yates shuffle: a uniform sample, at a draw each
    # (random.sample takes ~5 us for this; 32 random bits modulo the places left cost about
    # half of int(random() * places), and lean from uniform by under 1e-8). The others fail
    # over in the order it leaves them: ranking them by load took longer than the whole
    # evaluation of two candidates, for an order read only once the evaluated ones have all
    # failed.
    for i in range(SHORTLIST):
        j = i + bits(32) % (size - i)
        members[i], members[j] = members[j], members[i]
    keep += members[:SHORTLIST]
    rest += members[SHORTLIST:]


def candidates(
    req: RouteRequest, snap: LoadSnapshot, rng: random.Random
) -> tuple[list[Backend], list[Backend]]:
    """`shortlist` of the pool `eligible` and `pinned` leave, in one pass over the snapshot's
    backends grouped by tier (the registry groups them once, not every decision). The same
    answer as those stages one after the other, for the same draws, where each tier's backends
    are listed together (as the registry lists them); otherwise only the order the tiers are
    evaluated in differs. A snapshot that may list a URL twice takes the stages one by one."""
    if not snap.distinct:
        return shortlist(pinned(req, eligible(req, snap)), rng)
    if len(snap.backends) <= SHORTLIST:  # nothing to draw: the stages are quicker
        return pinned(req, eligible(req, snap)), []
    role = req.pinned
    keep: list[Backend] = []
    rest: list[Backend] = []
    bits = rng.getrandbits
    for tier in snap.tiers:
        members = serving(req, tier, snap)  # eligible's filter, a tier at a time
        if role is not None:  # pinned's, member by member (a tier is one role, as configured)
            members = of_role(members, role)
        _sample(members, keep, rest, bits)
    return keep, rest


@dataclass(frozen=True, slots=True)
class Learned:
    name: str
    limits: _Limits

    @classmethod
    def build(cls, name: str, params: PolicyParams) -> Learned:
        return cls(name, _Limits(1.0 - params.slo_margin, params.full_ttft_factor,
                                 params.max_waiting, params.explore_rate,
                                 params.explore_after_s))  # fmt: skip

    def __call__(
        self, req: RouteRequest, snap: LoadSnapshot, state: RouterState, rng: random.Random
    ) -> Decision:
        pool, rest = candidates(req, snap, rng)
        if not pool:
            return Decision((), Reason.NO_BACKEND, self.name, state)
        slo, curves, limits = req.slo, snap.curves, self.limits
        get = curves.get
        preds = []
        unknown = False
        for b in pool:  # (a loop, not a comprehension and a second loop: one pass)
            pr = get(b.url)
            preds.append(pr)
            if pr is None or not pr.frontier:
                unknown = True
        if unknown:
            limits = _Limits(limits.ttft_room, limits.full_ttft_factor, limits.max_waiting,
                             limits.explore_rate, limits.explore_after_s,
                             first_stream(preds, slo))  # fmt: skip
        # Sort keys: room first, the most gain first (a gain of less than a hundredth of a
        # stream that just meets the SLO is none); on a tie, the fastest (a request that gains
        # nothing anywhere slows the fewest streams least there, and is done soonest; what
        # nothing is known of comes after what is), then the least loaded, then the latency
        # tier, then at random. Full ones last, by least excess. (Built in one loop with the
        # outlooks, as plain tuples: they sort fastest, and this runs on every decision.)
        outlooks = []
        keys = []
        loads = []
        draw, tpot_slo, ttft_slo = rng.random, slo.tpot_s, slo.ttft_s
        nothing = NOTHING / tpot_slo
        bound = tpot_slo * TIGHTER
        mixed = False  # a tighter class on the candidates, in flight or lately
        load = snap.by_url.get
        for i, b in enumerate(pool):
            lb = load(b.url, UNKNOWN_LOAD)
            loads.append(lb)
            if not mixed and (
                (lb.slos and lb.slos[0][0] < bound) or (lb.recent and lb.recent[0][0] < bound)
            ):
                mixed = True  # (tightest first)
            o = _outlook(b, lb, preds[i], slo, limits)
            outlooks.append(o)
            tpot, ttft, _, gain, full, n, _ = o
            if full:  # last, by least excess
                excess = tpot / tpot_slo
                if ttft / ttft_slo > excess:
                    excess = ttft / ttft_slo
                keys.append((2, excess, 0.0, 0, False, draw(), i))
            else:
                if -nothing <= gain <= nothing:
                    gain = 0.0
                keys.append((0, -gain, tpot, n, b.role is not _LATENCY, draw(), i))
        keys.sort()
        kept = mixed and _keep_for_tighter(keys, outlooks, preds, loads, slo)
        # (Where classes mix, the room kept for tighter ones orders the first choice instead.)
        drained = False
        if not mixed and keys[0][0] == 0:
            first = keys[0]
            # Nothing gains anywhere (the first loses output, or gains none and misses the SLO
            # there): where the overflow goes (`_drain`).
            if first[1] > 0.0 or (first[1] == 0.0 and outlooks[first[-1]][2] < 0.5):
                drained = _drain(keys, preds, outlooks, slo)
            if not drained and outlooks[first[-1]][6]:
                _share_with_mates(keys, pool, outlooks, preds, (loads, slo))
        ordered = [pool[k[-1]] for k in keys] + rest
        _, _, p, _, full, _, ahead = outlooks[keys[0][-1]]
        if full:
            reason: str = Reason.SATURATED
        elif kept:
            reason = Reason.RESERVED
        elif req.pinned is not None:
            reason = Reason.PINNED
        elif drained:
            reason = Reason.DRAIN
        elif ahead:
            reason = Reason.FRONTIER
        elif p >= 0.5:
            reason = Reason.PREDICTED_SLO_MET
        else:
            reason = Reason.HEADROOM
        # One draw per decision whatever happens, so a seed replays the whole sequence.
        drawn = rng.random() < limits.explore_rate
        # (A request with a home goes home over an exploration: not the one to try with.)
        if limits.explore_rate and not full and req.home is None:
            keyed = req.affinity is not None
            now, after = snap.taken_at, limits.explore_after_s
            for k in keys[1:]:
                i = k[-1]
                if outlooks[i][4]:  # full
                    continue
                b, pred = pool[i], preds[i]
                seen = None if pred is None else pred.observed_at
                if seen is not None and now - seen <= after:
                    continue
                speculative = pred is not None and pred.acceptance is not None
                if keyed and pred is not None and not speculative:
                    continue  # (plain decoding: see the module's docstring)
                if not drawn:
                    # The clock (the module's docstring): a speculative engine seen before,
                    # not tried for `after` either.
                    if not speculative or seen is None:
                        continue
                    last = next((t for url, t in state.explored if url == b.url), None)
                    if last is not None and now - last <= after:
                        continue
                ordered.remove(b)
                ordered.insert(0, b)
                reason = Reason.EXPLORE
                # (What was tried longer ago than `after` is as good as never: dropped, so a
                # pool whose backends come and go leaves no trail.)
                tried = tuple(x for x in state.explored if x[0] != b.url and now - x[1] <= after)
                state = replace(state, explored=(*tried, (b.url, now)))
                break
        return Decision(tuple(ordered), reason, self.name, state)
