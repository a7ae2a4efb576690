"""Model speed: wall time and events/s per EP size beside bare SimPy's rate, in one run.

    python benchmarks/sim_speed.py [--eps 8,16,32,64] [--scenario decode-ep16-efa-native]
                                   [--out benchmarks/sim_speed.json]

Each EP size runs dispatch+combine for one seed in a fresh subprocess, so its
peak resident memory (ru_maxrss) is its own. Bare SimPy rate: a loop of
``env.timeout`` in a single process, measured in this same run, so the ratio
is meaningful on a noisy shared machine.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import resource
import time


def bare_simpy_rate(n: int = 300_000) -> float:
    import simpy

    env = simpy.Environment()

    def proc():
        for _ in range(n):
            yield env.timeout(1)

    env.process(proc())
    t = time.perf_counter()
    env.run()
    return n / (time.perf_counter() - t)


def _one(args: tuple[str, int, str]) -> dict:
    scenario, ep, q = args
    from sim import scenario as scn_mod
    from sim.model import simulate_op

    sets = [f"workload.ep_ranks={ep}"]
    if ep < 8:
        sets.append(f"workload.gpus_per_node={ep}")
    scn = scn_mod.load(scenario, sets)
    t = time.perf_counter()
    events = 0
    lat = {}
    for op in ("dispatch", "combine"):
        r = simulate_op(scn, op, 0)
        events += r.events
        lat[op] = max(r.latency_us)
    wall = time.perf_counter() - t
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"ep": ep, "wall_s": wall, "events": events, "events_per_s": events / wall,
            "peak_rss_mib": rss_mib, "max_latency_us": lat}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--eps", default="8,16,32,64")
    ap.add_argument("--scenario", default="decode-ep16-efa-native")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    eps = [int(x) for x in a.eps.split(",")]
    bare = bare_simpy_rate()
    ctx = mp.get_context("spawn")
    rows = []
    with ctx.Pool(1, maxtasksperchild=1) as pool:
        for ep in eps:
            rows.append(pool.apply(_one, ((a.scenario, ep, ""),)))
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"{a.scenario}: dispatch+combine, 1 seed; bare SimPy {bare:,.0f} timeouts/s")
    for c in ("EP", "wall s", "events", "events/s", "vs bare", "peak RSS MiB"):
        t.add_column(c, justify="right")
    for r in rows:
        t.add_row(str(r["ep"]), f"{r['wall_s']:.2f}", f"{r['events']:,}", f"{r['events_per_s']:,.0f}",
                  f"{r['events_per_s'] / bare:.2f}", f"{r['peak_rss_mib']:.0f}")
    Console().print(t)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"bare_simpy_timeouts_per_s": bare, "rows": rows, "scenario": a.scenario}, f, indent=2)


if __name__ == "__main__":
    main()
