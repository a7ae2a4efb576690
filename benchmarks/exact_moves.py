"""How far two ``exact_dump.py`` dumps are apart: per case that moved, the largest relative
change of a rank's latency, of the op's p50 over ranks and of a profiler category, and the
event counts (a case whose every number is the same but its event count is listed apart).

    python benchmarks/exact_moves.py /tmp/base.json /tmp/new.json

For speed work whose event-granularity changes may move numbers (issue 19): the list says
which cases moved and by how much; identical cases are counted, not listed.
"""

from __future__ import annotations

import argparse
import json

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("base")
    ap.add_argument("new")
    a = ap.parse_args()
    with open(a.base) as f:
        base = json.load(f)
    with open(a.new) as f:
        new = json.load(f)
    same = 0
    events_only = 0
    worst = 0.0
    for k in sorted(base):
        b, n = base[k], new.get(k)
        if n is None:
            print(f"missing: {k}")
            continue
        if b == n:
            same += 1
            continue
        if {**b, "events": 0} == {**n, "events": 0}:  # every number the same: fewer events only
            events_only += 1
            print(f"events only: {k}: {b['events']} -> {n['events']}")
            continue
        lb = np.array([float.fromhex(x) for x in b["latency_us"]])
        ln = np.array([float.fromhex(x) for x in n["latency_us"]])
        rank = float(np.max(np.abs(ln - lb) / lb))
        p50 = abs(float(np.percentile(ln, 50)) / float(np.percentile(lb, 50)) - 1.0)
        worst = max(worst, p50)
        busy = max((abs(float.fromhex(n["busy"].get(c, "0x0p+0")) / float.fromhex(v) - 1.0)
                    for c, v in b["busy"].items() if float.fromhex(v) > 0), default=0.0)
        print(f"moved: {k}\n  p50 {p50:.2e}  max rank {rank:.2e}  busy {busy:.2e}"
              f"  events {b['events']} -> {n['events']}"
              f"  counters {'same' if b['counters'] == n['counters'] else 'differ'}"
              f"  ledger events {'same' if b['ledger_events'] == n['ledger_events'] else 'differ'}")
    print(f"{same} of {len(base)} cases identical, {events_only} the same numbers with other event "
          f"counts, {len(base) - same - events_only} moved; largest p50 change {worst:.2e}")


if __name__ == "__main__":
    main()
