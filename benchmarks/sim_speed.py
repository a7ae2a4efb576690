"""Model speed: wall time and events/s per EP size beside bare SimPy's rate, in one run.

    python benchmarks/sim_speed.py [--eps 8,16,32,64] [--scenario decode-ep16-efa-native]
                                   [--out benchmarks/sim_speed.json] [--critical-path]

Each EP size runs dispatch+combine for one seed in a fresh subprocess, so its
peak resident memory (ru_maxrss) is its own. Bare SimPy rate: a loop of
``env.timeout`` in a single process, measured in this same run, so the ratio
is meaningful on a noisy shared machine.

SimPy's own cost per event grows with how many events are pending (its heap,
and the objects it points at, stop fitting in cache). So the table also gives,
per EP, the model's mean pending-queue length and bare SimPy's rate *at that
depth*: that many independent callback timeouts (no process, no model code)
with uniform random delays. ``engine floor s`` is the model's event count at
that rate: what the same events would cost with the model's work made free.
``--critical-path`` records the one-run critical path in every run (its overhead).
``leftover GC s`` is what the cyclic collector still frees after the runs (a run left in
reference cycles is freed only by it; a process that runs on pays that later).
"""

from __future__ import annotations

import argparse
import gc
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


def bare_simpy_rate_at_depth(pending: int, n: int = 400_000, seed: int = 1) -> float:
    """Events/s of bare SimPy keeping ``pending`` callback timeouts queued at once."""
    import random

    import simpy

    env = simpy.Environment()
    pending = max(1, pending)
    rnd = random.Random(seed)
    delays = [rnd.random() * 1000.0 for _ in range(4096)]
    left = [n]

    def fire(ev):
        if left[0] > 0:
            left[0] -= 1
            env.timeout(delays[left[0] & 4095]).callbacks.append(fire)

    for i in range(pending):
        env.timeout(delays[(i * 7) & 4095]).callbacks.append(fire)
    t = time.perf_counter()
    env.run()
    return (n + pending) / (time.perf_counter() - t)


def _one(args: tuple[str, int, bool]) -> dict:
    scenario, ep, critical_path = args
    from lever.sim import scenario as scn_mod
    from lever.sim.model import simulate_op

    sets = {"workload.ep_ranks": ep}
    if ep < 8:
        sets["workload.gpus_per_node"] = ep
    scn = scn_mod.load(scenario, sets)
    t = time.perf_counter()
    cpu = time.process_time()
    events = 0
    lat = {}
    pend = 0.0
    for op in ("dispatch", "combine"):
        r = simulate_op(scn, op, 0, depth=True, critical_path=critical_path)
        events += r.events
        pend += r.mean_pending * r.events
        lat[op] = max(r.latency_us)
    wall = time.perf_counter() - t
    cpu = time.process_time() - cpu
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    # what the cyclic collector still has to free of the runs (their reference cycles): a
    # process that runs on pays it later
    t = time.perf_counter()
    gc.collect()
    leftover = time.perf_counter() - t
    return {"ep": ep, "wall_s": wall, "cpu_s": cpu, "events": events, "events_per_s": events / wall,
            "peak_rss_mib": rss_mib, "max_latency_us": lat, "mean_pending": pend / events,
            "leftover_gc_s": leftover}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--eps", default="8,16,32,64")
    ap.add_argument("--scenario", default="decode-ep16-efa-native")
    ap.add_argument("--out", default=None)
    ap.add_argument("--critical-path", action="store_true", help="record the one-run critical path")
    a = ap.parse_args()
    eps = [int(x) for x in a.eps.split(",")]
    bare = bare_simpy_rate()
    ctx = mp.get_context("spawn")
    rows = []
    with ctx.Pool(1, maxtasksperchild=1) as pool:
        for ep in eps:
            rows.append(pool.apply(_one, ((a.scenario, ep, a.critical_path),)))
    from rich.console import Console
    from rich.table import Table

    for r in rows:  # bare SimPy at the model's own depth, measured here (in this process)
        r["bare_at_depth_per_s"] = bare_simpy_rate_at_depth(round(r["mean_pending"]))
        r["engine_floor_s"] = r["events"] / r["bare_at_depth_per_s"]
    t = Table(title=f"{a.scenario}: dispatch+combine, 1 seed; bare SimPy {bare:,.0f} timeouts/s")
    for c in ("EP", "wall s", "events", "events/s", "vs bare", "pending", "bare@pending/s",
              "vs bare@pending", "engine floor s", "peak RSS MiB", "leftover GC s"):
        t.add_column(c, justify="right")
    for r in rows:
        t.add_row(str(r["ep"]), f"{r['wall_s']:.2f}", f"{r['events']:,}", f"{r['events_per_s']:,.0f}",
                  f"{r['events_per_s'] / bare:.2f}", f"{r['mean_pending']:,.0f}",
                  f"{r['bare_at_depth_per_s']:,.0f}", f"{r['events_per_s'] / r['bare_at_depth_per_s']:.2f}",
                  f"{r['engine_floor_s']:.1f}", f"{r['peak_rss_mib']:.0f}", f"{r['leftover_gc_s']:.2f}")
    Console(width=200).print(t)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"bare_simpy_timeouts_per_s": bare, "rows": rows, "scenario": a.scenario}, f, indent=2)


if __name__ == "__main__":
    main()
