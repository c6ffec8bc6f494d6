export PYTHONPATH=/tmp/site:$PWD
cat > /tmp/child.py <<'PY'
import gc, json, sys, os
from loadtests.decision_cost import snapshot, one_pass, _pct
from gateway.routing.params import PolicyParams
from gateway.routing.policies import build_policy
import gateway.routing.learned as L
pol = build_policy("learned", PolicyParams())
snap = snapshot(3)
gc.collect(); gc.freeze()
out = []
for r in range(3): out += one_pass(pol, snap, "moving", r, 4000)
out.sort()
cpu = open("/proc/self/stat").read().split()[38]
print(sys.argv[1], "cpu", cpu, "so" if L.__file__.endswith(".so") else "py", "p50", _pct(out, 50), "p99", _pct(out, 99))
PY
for c in $(seq 0 15); do taskset -c $c python3 /tmp/child.py pin$c; done
for i in 1 2 3 4 5 6; do python3 /tmp/child.py free$i; done
for c in 0 5 10 15; do TIERGATE_COMPILED=0 taskset -c $c python3 /tmp/child.py srcpin$c; done
for i in 1 2 3 4; do TIERGATE_COMPILED=0 python3 /tmp/child.py srcfree$i; done
cat /proc/cpuinfo | grep "model name" | head -1; grep MHz /proc/cpuinfo | head -16 | tr '\n' ' '
