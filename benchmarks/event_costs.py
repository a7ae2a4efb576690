"""Where a run's time goes, per kind of event: how many of each and the time spent in their
callbacks, so speed work starts from the events that cost the most rather than the most
numerous ones.

    python benchmarks/event_costs.py [--ep 64] [--ops dispatch,combine] [--critical-path] [--top 25]

A kind is a plain callback's function (a packet's arrival, a landing...) or, for a process
resume, the event type and the chain of generators the process waits in (``_Hold:scaleout>
put>post>_ring``): the code that runs on that resume. The loop is :func:`lever.sim.engine.
run_events` with a clock read around each callback (the same events in the same order);
the clock reads roughly double the run's time, so read the shares and the ratios between
kinds, not the absolute microseconds.
"""

from __future__ import annotations

import argparse
import heapq
from collections import Counter
from time import perf_counter


def _kind(event, callback, args=None) -> str:
    if args is not None:  # a call entry: event(*args)
        if getattr(event, "__name__", "") == "_wake":  # a hold's end (engine.hold): its process
            return "_Hold:" + _waits_in(args[0])
        return "call:" + getattr(event, "__qualname__", str(event))
    proc = getattr(callback, "__self__", None)
    if getattr(proc, "_generator", None) is None:
        return f"{type(event).__name__}:cb:{getattr(callback, '__qualname__', callback)}"
    return f"{type(event).__name__}:{_waits_in(proc)}"


def _waits_in(proc) -> str:
    """The chain of generators a process waits in (``scaleout>put>post``)."""
    gen = proc._generator
    name = gen.__qualname__.replace(".<locals>", "")
    sub = gen.gi_yieldfrom
    while sub is not None and hasattr(sub, "gi_yieldfrom"):
        name += ">" + sub.__qualname__.split(".")[-1]
        sub = sub.gi_yieldfrom
    return name


def timed_run(env, time_s: Counter, count: Counter) -> int:
    """``run_events`` with every callback timed by kind."""
    queue = env._queue
    path = env.path
    n = 0
    while queue or env.refill():
        env._now, _, _, event, args, rec = heapq.heappop(queue)
        if args is not None:  # a call entry
            k = _kind(event, None, args)
            if rec is not None:
                path.cur = rec
            t = perf_counter()
            event(*args)
            time_s[k] += perf_counter() - t
            count[k] += 1
        else:
            callbacks, event.callbacks = event.callbacks, None
            for cb in callbacks:
                k = _kind(event, cb)
                t = perf_counter()
                cb(event)
                time_s[k] += perf_counter() - t
                count[k] += 1
            if not event._ok and not hasattr(event, "_defused"):
                raise event._value
        n += 1
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="decode-ep16-efa-native")
    ap.add_argument("--ep", type=int, default=16)
    ap.add_argument("--ops", default="dispatch,combine")
    ap.add_argument("--critical-path", action="store_true")
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    import lever.sim.model as model
    from lever.sim import scenario

    scn = scenario.load(a.scenario, {"workload.ep_ranks": a.ep})
    for op in a.ops.split(","):
        time_s: Counter = Counter()
        count: Counter = Counter()
        run = model._run_counting
        model._run_counting = lambda env, ts=time_s, c=count: timed_run(env, ts, c)
        try:
            r = model.simulate_op(scn, op, 0, critical_path=a.critical_path)
        finally:
            model._run_counting = run
        total = sum(time_s.values())
        print(f"{op}: {r.events:,} events, {total:.3f} s in callbacks (timed)")
        print("| kind | events | ms | share | us/event |\n|---|---|---|---|---|")
        for k, v in time_s.most_common(a.top):
            print(f"| `{k}` | {count[k]:,} | {v * 1e3:.1f} | {v / total:.1%} | {v / count[k] * 1e6:.2f} |")
        print()


if __name__ == "__main__":
    main()
