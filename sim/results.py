"""From simulated ops to the numbers engineers read: latency statistics and the two attributions.

*Profiler* attribution: share of the GPU warps' time per category, summed over
every issuing, polling and forwarding warp of every rank and seed: what a
sampling profiler on those warps sees. ``put_path`` restricts it to the time
inside the put call (the campaign's "share of the put path"): WQE, fence,
doorbell, lock, credit check and proxy hand-off.

*Critical path* attribution: for each category c, the p50 latency of the op
minus its p50 when every cost of c is set to zero (waits of c's kind
skipped), on the same seeds. A category can be busy on the profiler yet
worth ~0 here when its time overlaps the wire; the two disagree by design.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from lever.sim.engine import Trace
from lever.sim.model import OpResult, simulate_op
from lever.sim.params import CATEGORIES, Scenario

# Time inside the put call itself (what a profiler scoped to the put function sees):
# not the token packing before it, nor the flush/signal waits after it.
PUT_PATH = ("wqe", "fence", "doorbell", "lock", "credit_wait", "proxy_queue")


def stats(lat_us: list[float]) -> dict[str, float]:
    a = np.asarray(lat_us)
    return {
        "p50_us": float(np.percentile(a, 50)),
        "p99_us": float(np.percentile(a, 99)),
        "mean_us": float(a.mean()),
        "max_us": float(a.max()),
    }


def run_seeds(scn: Scenario, op: str, seeds: int, scale: dict[str, float] | None = None,
              trace: bool = False) -> list[OpResult]:
    return [simulate_op(scn, op, s, scale=scale, trace=trace and s == 0) for s in range(seeds)]


def profiler_shares(results: list[OpResult], cats: tuple[str, ...] | None = None) -> dict[str, float]:
    busy: dict[str, float] = {}
    for r in results:
        for c, v in r.ledger.busy.items():
            if cats is None or c in cats:
                busy[c] = busy.get(c, 0.0) + v
    total = sum(busy.values())
    if total <= 0:
        return {}
    return {c: round(busy[c] / total, 6) for c in CATEGORIES if busy.get(c, 0.0) > 0}


def cp_entry(base_p50: float, whatif_lat_us: list[float]) -> float:
    """One critical-path entry: the p50 drop when a category's costs are zeroed."""
    return round(base_p50 - stats(whatif_lat_us)["p50_us"], 4)


def critical_path(scn: Scenario, op: str, base_p50: float, seeds: int,
                  cats: tuple[str, ...] = CATEGORIES) -> dict[str, float]:
    return {c: cp_entry(base_p50, [x for r in run_seeds(scn, op, seeds, scale={c: 0.0})
                                   for x in r.latency_us])
            for c in cats}


def _op_job(job: tuple[Scenario, str, int, dict[str, float] | None, bool]) -> OpResult | list[float]:
    """One (op, seed, what-if scale) run; what-if runs send back only their latencies."""
    scn, op, seed, scale, trace = job
    r = simulate_op(scn, op, seed, scale=scale, trace=trace)
    return r if scale is None else r.latency_us


def _run_jobs(jobs: list, workers: int) -> list:
    """Every job is a pure function of (scenario, op, seed, scale): a process pool
    returns, in order, exactly what a serial loop would."""
    if workers > 1 and len(jobs) > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=min(workers, len(jobs))) as ex:
            return list(ex.map(_op_job, jobs))
    return [_op_job(j) for j in jobs]


@dataclass(frozen=True)
class OpStats:
    """Latency of one op over every rank and seed (us)."""

    p50_us: float
    p99_us: float
    mean_us: float
    max_us: float

    @classmethod
    def of(cls, lat_us: list[float]) -> OpStats:
        return cls(**stats(lat_us))

    def to_json(self) -> dict[str, float]:
        return {"p50_us": self.p50_us, "p99_us": self.p99_us, "mean_us": self.mean_us,
                "max_us": self.max_us}


@dataclass(frozen=True)
class OpAttribution:
    """The two attributions of one op: profiler shares (all warps and the put path) and,
    when computed, the critical path (us per category)."""

    profiler: dict[str, float]
    put_path: dict[str, float]
    critical_path: dict[str, float] | None = None

    def to_json(self) -> dict[str, dict[str, float]]:
        out = {"profiler": self.profiler, "put_path": self.put_path}
        if self.critical_path is not None:
            out["critical_path"] = self.critical_path
        return out


@dataclass
class SimulationResult:
    """What ``lever simulate`` reports for one scenario: per op the latency statistics, the
    attributions, the counters and the per-rank means; the traces of seed 0 when asked."""

    scenario: str
    seeds: int
    events: int
    ops: dict[str, OpStats]
    attribution: dict[str, OpAttribution]
    counters: dict[str, dict[str, int]]
    per_rank_us: dict[str, list[float]]
    wall_s: float = 0.0
    traces: list[tuple[str, Trace]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The ``lever simulate --json`` object (traces are written to their own file)."""
        return {"scenario": self.scenario, "seeds": self.seeds, "events": self.events,
                "ops": {op: s.to_json() for op, s in self.ops.items()},
                "attribution": {op: a.to_json() for op, a in self.attribution.items()},
                "counters": self.counters, "per_rank_us": self.per_rank_us, "wall_s": self.wall_s}


def simulate(scn: Scenario, seeds: int = 1, with_critical_path: bool = True, cp_seeds: int = 1,
             trace: bool = False, workers: int = 1) -> SimulationResult:
    """Every op of ``scn`` on seeds 0..seeds-1, with both attributions.

    The base runs and the critical path's what-if runs (one per category, op and
    seed: most of the work) are independent, so ``workers`` > 1 spreads them over
    processes; the numbers are identical to a serial run.
    """
    t0 = time.perf_counter()
    kcp = max(1, min(cp_seeds, seeds))
    cp_cats = CATEGORIES if with_critical_path else ()
    jobs: list = []
    for op in scn.ops:
        jobs += [(scn, op, s, None, trace and s == 0) for s in range(seeds)]
        jobs += [(scn, op, s, {c: 0.0}, False) for c in cp_cats for s in range(kcp)]
    done = iter(_run_jobs(jobs, workers))
    out = SimulationResult(scn.name, seeds, 0, {}, {}, {}, {})
    for op in scn.ops:
        res: list[OpResult] = [next(done) for _ in range(seeds)]
        whatif = {c: [x for _ in range(kcp) for x in next(done)] for c in cp_cats}
        lat = [x for r in res for x in r.latency_us]
        out.ops[op] = OpStats.of(lat)
        out.per_rank_us[op] = [
            round(float(np.mean([r.latency_us[k] for r in res])), 4) for k in range(len(res[0].latency_us))
        ]
        out.events += sum(r.events for r in res)
        cp = None
        if with_critical_path:
            base = stats([x for r in res[:kcp] for x in r.latency_us])["p50_us"]
            cp = {c: cp_entry(base, v) for c, v in whatif.items()}
        out.attribution[op] = OpAttribution(profiler_shares(res), profiler_shares(res, PUT_PATH), cp)
        cnt: dict[str, int] = {}
        for r in res:
            for key, v in r.counters.items():
                cnt[key] = cnt.get(key, 0) + v
        ev: dict[str, int] = {}
        for r in res:
            for key, v in r.ledger.events.items():
                ev[key] = ev.get(key, 0) + v
        cnt.update({f"events_{k}": v for k, v in ev.items()})
        out.counters[op] = cnt
        if trace:
            out.traces.append((op, res[0].trace))
    out.wall_s = round(time.perf_counter() - t0, 4)
    return out
