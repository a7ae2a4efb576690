"""Full-size bit-identity check for speed work: dump the model's exact outputs
(per-rank latencies, profiler ledger, counters, event counts, as float hex) for
cases the small golden set (tests/test_golden.py) does not reach: EP16 and EP64
at full size, proxy, IB, put_many, deferred aggregation, zeroed categories (the
critical path's what-if runs), loss with unordered signals, the emulated EP2.

    git worktree add /tmp/base HEAD                          # the tree before the change
    (cd /tmp/base && PYTHONPATH=. python benchmarks/exact_dump.py /tmp/base.json)
    python benchmarks/exact_dump.py /tmp/new.json --compare /tmp/base.json

About 45 s per tree on this machine. ``--compare`` lists every case that moved
and exits 1 if any did. ``--critical-path`` makes the dump with the one-run critical
path recorded in every run: it must match a plain dump (recording changes nothing);
the largest gap found in any chain is printed (0 when every release was recorded).
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


def dump(critical_path: bool = False) -> dict[str, dict]:
    from lever.sim import scenario
    from lever.sim.model import simulate_op

    out: dict[str, dict] = {}
    gap = 0.0
    for name, sets, scale in CASES:
        scn = scenario.load(name, scenario.parse_sets(sets))
        for op in ("dispatch", "combine"):
            for seed in (0, 1):
                r = simulate_op(scn, op, seed, scale=scale, critical_path=critical_path)
                if critical_path:
                    gap = max(gap, r.path_gap_ns)
                out[f"{name}|{sets}|{scale}|{op}|{seed}"] = {
                    "latency_us": [x.hex() for x in r.latency_us],
                    "events": r.events,
                    "busy": {k: float(v).hex() for k, v in sorted(r.ledger.busy.items())},
                    "ledger_events": dict(sorted(r.ledger.events.items())),
                    "counters": dict(sorted(r.counters.items())),
                }
    if critical_path:
        print(f"largest gap in any rank's chain: {gap:.3g} ns")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--compare", default=None, help="a dump of the tree before the change")
    ap.add_argument("--critical-path", action="store_true",
                    help="record the one-run critical path in every run (must change nothing)")
    a = ap.parse_args()
    got = dump(a.critical_path)
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
