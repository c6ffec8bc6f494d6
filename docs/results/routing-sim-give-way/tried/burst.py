"""Each decision of one instant of a `bench routing-sim` run, with what the learned policy read
of every backend: its streams, its frontier (the most streams observed there), the chance that
the request meets its SLO there, the SLO-meeting tokens per second one more stream adds, the
predicted TPOT, and whether the request is past the frontier.

Usage: python burst.py WORKLOAD DEPLOYMENT/SHAPE/SLO SEED AT (virtual seconds)"""

import sys

from gateway.routing.learned import Learned, outlook
from loadtests.routing_sim import cosim
from loadtests.routing_sim.study import Arm, spec_of


def main() -> None:
    workload, cell, seed, at = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    deployment, shape, slo = cell.split("/")
    arm = Arm("learned", "learned")
    spec = spec_of((deployment, shape, slo), arm, seed, 20.0, workload)
    sim = cosim._Sim(spec)
    limits = Learned.build("learned", spec.params).limits
    send = sim.send

    def logged(user: int) -> None:
        if sim.now != at:
            send(user)
            return
        snap = sim.registry.snapshot()
        seen = []
        for b in snap.backends:
            pred = snap.curves.get(b.url)
            o = outlook(b, snap.load(b.url), pred, spec.slo, limits)
            seen.append(f"{b.url[7:].split('.')[0]} n {o.load:2d} frontier "
                        f"{pred.frontier if pred else 0:2d} p {o.p:.2f} gain {o.gain:7.1f} "
                        f"tpot {o.tpot * 1e3:5.2f} ms{' ahead' if o.ahead else ''}")  # fmt: skip
        send(user)
        ex = next(r.ex for r in reversed(sim.requests.values()) if r.user == user)
        assert ex.backend is not None
        assert ex.decision is not None
        print(f"user {user:2d} -> {ex.backend.url[7:].split('.')[0]:12s} "
              f"{ex.decision.reason:17s} | " + " | ".join(seen))  # fmt: skip

    sim.send = logged  # type: ignore[method-assign]
    sim.run()


if __name__ == "__main__":
    main()
