"""Every decision the drain moved in one run of the learned policy (TIERGATE_COMPILED=0): the
keys before (candidate, streams, gain), the first choice's peak, each candidate's peak, where it
went, and each prediction's TPOT at 1/4/8/16/24/32 streams (ms), bias, spread, tokens a step.

    python docs/results/little-12ms-seeds/drains.py SEED [DEPLOYMENT/SHAPE/SLO]"""

import collections
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import gateway.routing.learned as L
from gateway.routing.params import PolicyParams
from loadtests.routing_sim.cosim import simulate
from loadtests.routing_sim.study import Arm, spec_of

orig = L._drain
log = []


def wrapped(keys, preds, outlooks, slo):
    before = [(k[-1], outlooks[k[-1]][5], round(outlooks[k[-1]][3], 1)) for k in keys]
    first = keys[0][-1]
    pred = preds[first]
    info = None
    if pred is not None and pred.frontier:
        most, at = L.peak(slo.log_tpot, pred)
        info = (
            round(most * slo.tpot_s, 2),
            at,
            round(L.output(slo.log_tpot, outlooks[first][5], pred) * slo.tpot_s, 2),
            pred.frontier,
        )
    peaks = [
        (
            k[-1],
            None
            if preds[k[-1]] is None
            else (
                round(L.peak(slo.log_tpot, preds[k[-1]])[0] * slo.tpot_s, 2),
                L.peak(slo.log_tpot, preds[k[-1]])[1],
                preds[k[-1]].frontier,
            ),
        )
        for k in keys
    ]
    r = orig(keys, preds, outlooks, slo)
    if r:
        log.append(
            (
                before,
                info,
                peaks,
                keys[0][-1],
                [
                    None
                    if pr is None
                    else (
                        [round(pr.tpot.at(n) * 1e3, 2) for n in (1, 4, 8, 16, 24, 32)],
                        round(pr.bias, 3),
                        round(pr.spread, 3),
                        round(pr.tokens_per_step, 2),
                    )
                    for pr in preds
                ],
            )
        )
    return r


L._drain = wrapped
seed = int(sys.argv[1])
cell = tuple(sys.argv[2].split("/")) if len(sys.argv) > 2 else ("little", "burst", "interactive")
spec = spec_of(cell, Arm("learned", "learned", PolicyParams()), seed, 20.0, "chat")
r = simulate(spec)
print("met", sum(d.met for d in r.done if d.phase is not None), len(log), "drains")
print(collections.Counter((e[0][0][0], e[3]) for e in log))
for e in log[:5] + log[len(log) // 2 : len(log) // 2 + 5]:
    print(e)
