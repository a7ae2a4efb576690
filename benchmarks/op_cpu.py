"""CPU seconds of one op of the default scenario at one EP size, in this process: the
quickest A/B of two trees on a loaded machine (alternate them, several runs each).

    PYTHONPATH=TREE python benchmarks/op_cpu.py EP dispatch|combine [--critical-path]
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ep", type=int)
    ap.add_argument("op", choices=("dispatch", "combine"))
    ap.add_argument("--scenario", default="decode-ep16-efa-native")
    ap.add_argument("--critical-path", action="store_true")
    a = ap.parse_args()
    from lever.sim import scenario
    from lever.sim.model import simulate_op

    scn = scenario.load(a.scenario, {"workload.ep_ranks": a.ep})
    t = time.process_time()
    r = simulate_op(scn, a.op, 0, critical_path=a.critical_path)
    print(f"{a.op} EP{a.ep}: {time.process_time() - t:.2f} CPU s, {r.events:,} events")


if __name__ == "__main__":
    main()
