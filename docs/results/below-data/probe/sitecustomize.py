"""Loaded by a gateway started with this folder on PYTHONPATH (and TIERGATE_COMPILED=0): where
TG_PROBE is set, every routing decision is printed to stderr (the gateway's log) with what the
learned policy's outlook read on each backend just after it: the streams there, the predicted
TPOT with the request, the probability of meeting its SLO and the gain. Not part of the
gateway."""

import os
import sys

if os.environ.get("TG_PROBE"):
    from gateway.pipeline import router
    from gateway.routing.learned import outlook

    _decide = router.Router.decide

    def _probed(self, req):  # type: ignore[no-untyped-def]
        d = _decide(self, req)
        snap = self.registry.snapshot()
        rows = []
        for b in snap.backends:
            o = outlook(b, snap.load(b.url), snap.curves.get(b.url), req.slo, self.policy.limits)
            rows.append(f"{b.url.rsplit(':', 1)[-1]} n={o.load} tpot_ms={o.tpot * 1000:.2f} "
                        f"p={o.p:.2f} gain={o.gain:.1f}")  # fmt: skip
        first = d.candidates[0].url.rsplit(":", 1)[-1] if d.candidates else None
        print(f"PROBE {d.reason} -> {first} home={req.home is not None} | " + " | ".join(rows),
              file=sys.stderr, flush=True)  # fmt: skip
        return d

    router.Router.decide = _probed
