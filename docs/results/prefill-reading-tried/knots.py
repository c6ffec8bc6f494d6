import sys
import gateway.routing.learned as L
import gateway.backends.latency_model as M
from loadtests.routing_sim.cosim import simulate
from loadtests.routing_sim.study import Arm, spec_of
dep, shape, slo, workload, seed = sys.argv[1:6]
times = [float(x) for x in sys.argv[6].split(',')]
orig_pred = M.BackendModel.prediction
state = {'t': 0.0}
orig=L.Learned.__call__
def call(self, req, snap, st, rng):
    state['t'] = snap.taken_at
    while times and snap.taken_at >= times[0]:
        t = times.pop(0)
        for u, p in snap.curves.items():
            if 'latency' in u:
                print(f"t={t} frontier={p.frontier} spread={p.spread:.3f} bias={p.bias:.3f} tps={p.tokens_per_step:.2f}")
                print('  table ms', [round(v*1000,2) for v in p.tpot.table[1:13]])
                print('  p12', [round(L.met(req.slo.log_tpot, n, p),2) for n in range(1,13)])
    return orig(self, req, snap, st, rng)
L.Learned.__call__ = call
orig_prediction = M.BackendModel.prediction
def prediction(self):
    pr = orig_prediction(self)
    if times and pr.frontier and pr.acceptance is not None and state['t'] + 0.5 >= times[0]:
        pts = self.tpot.points()
        print('   cost', round(self.prefill.per_token*1e6,1), round(self.prompt.per_token*1e6,1))
        print('   knots', [(k, round(v*1000,2), round(self.tpot.weights[M.KNOTS.index(k)],1)) for k, v in pts][:10])
        print('   roof', M.fit_roofline([(k, v, self.tpot.weights[M.KNOTS.index(k)]) for k, v in pts]))
    return pr
M.BackendModel.prediction = prediction
simulate(spec_of((dep, shape, slo), Arm("learned","learned"), int(seed), 20.0, workload))
