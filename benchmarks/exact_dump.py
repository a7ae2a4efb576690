"""Full-size bit-identity check for speed work: dump the model's exact outputs
(per-rank latencies, profiler ledger, counters, event counts, as float hex) for
cases the small golden set (tests/test_golden.py) does not reach: EP16 and EP64
at full size, proxy, IB, put_many, deferred aggregation, zeroed categories (the
critical path's what-if runs), loss with unordered signals, the emulated EP2.

    git worktree add /tmp/base HEAD                          # the tree before the change
    (cd /tmp/base && PYTHONPATH=. python benchmarks/exact_dump.py /tmp/base.json)
    python benchmarks/exact_dump.py /tmp/new.json --compare /tmp/base.json

About 45 s per tree on this machine. ``--compare`` lists every case that moved
and exits 1 if any did.
"""

from __future__ import annotations

import argparse
import json
import sys

CASES: list[tuple[str, list[str], dict[str, float] | None]] = [
    ("decode-ep16-efa-native", [], None),
    ("decode-ep16-efa-native", ["workload.ep_ranks=64"], None),
    ("decode-ep16-efa-proxy", [], None),
    ("decode-ep16-ib", [], None),
    ("decode-ep16-efa-native", ["design.put_many_span=4"], None),
    ("decode-ep16-efa-native", ["design.deferred_doorbell_aggregation=4"], None),
    ("decode-ep16-efa-native", [], {"doorbell": 0.0, "fence": 0.0}),
    ("decode-ep16-efa-native", [], {"lock": 0.0}),
    ("decode-ep16-efa-native", ['design.signal_mode="unordered-counting"',
                                "platform.fabric.loss_prob=0.02"], None),
    ("emu-ep2-native", [], None),
    ("emu-ep2-native", ["design.qps_per_call=2", "design.num_sms=12"], None),
]


def dump() -> dict[str, dict]:
    from lever.sim import scenario
    from lever.sim.model import simulate_op

    out: dict[str, dict] = {}
    for name, sets, scale in CASES:
        scn = scenario.load(name, scenario.parse_sets(sets))
        for op in ("dispatch", "combine"):
            for seed in (0, 1):
                r = simulate_op(scn, op, seed, scale=scale)
                out[f"{name}|{sets}|{scale}|{op}|{seed}"] = {
                    "latency_us": [x.hex() for x in r.latency_us],
                    "events": r.events,
                    "busy": {k: float(v).hex() for k, v in sorted(r.ledger.busy.items())},
                    "ledger_events": dict(sorted(r.ledger.events.items())),
                    "counters": dict(sorted(r.counters.items())),
                }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--compare", default=None, help="a dump of the tree before the change")
    a = ap.parse_args()
    got = dump()
    with open(a.out, "w") as f:
        json.dump(got, f, indent=0, sort_keys=True)
    print(f"{len(got)} cases -> {a.out}")
    if a.compare:
        with open(a.compare) as f:
            ref = json.load(f)
        moved = sorted(k for k in ref.keys() | got.keys() if ref.get(k) != got.get(k))
        for k in moved:
            print("moved:", k)
        print("identical" if not moved else f"{len(moved)} of {len(ref)} cases moved")
        sys.exit(1 if moved else 0)


if __name__ == "__main__":
    main()
