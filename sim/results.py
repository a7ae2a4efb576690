"""From simulated ops to the numbers engineers read: latency statistics and the attributions.

*Profiler* attribution: share of the GPU warps' time per category, summed over
every issuing, polling and forwarding warp of every rank and seed: what a
sampling profiler on those warps sees. ``put_path`` restricts it to the time
inside the put call (the campaign's "share of the put path"): WQE, fence,
doorbell, lock, credit check and proxy hand-off.

*Critical path* (one run): the chain of segments that ended the rank at the op's
p50 latency, walked back from its end to time 0 along what released every wait
(``CriticalPath`` in ``sim/engine.py``), in us per category; it sums to the p50.

*What-if* (``what_if_us``, on request): for each category c, the p50 latency of
the op minus its p50 when every cost of c is set to zero (waits of c's kind
skipped), on the same seeds: 14 reruns, overlapping entries that do not sum to
the latency. A category can be busy on the profiler and on the chain yet worth
~0 here when a parallel chain is almost as long; they disagree by design
(docs/attributions.md).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterable, Iterator
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
              trace: bool = False, critical_path: bool = False) -> list[OpResult]:
    return [simulate_op(scn, op, s, scale=scale, trace=trace and s == 0,
                        critical_path=critical_path) for s in range(seeds)]


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
    """One what-if entry: the p50 drop when a category's costs are zeroed."""
    return round(base_p50 - stats(whatif_lat_us)["p50_us"], 4)


def what_if_reruns(scn: Scenario, op: str, base_p50: float, seeds: int,
            cats: tuple[str, ...] = CATEGORIES) -> dict[str, float]:
    """The what-if column: per category, ``base_p50`` minus the p50 of seeds 0..seeds-1
    rerun with that category's costs zeroed (one rerun per category and seed)."""
    return {c: cp_entry(base_p50, [x for r in run_seeds(scn, op, seeds, scale={c: 0.0})
                                   for x in r.latency_us])
            for c in cats}




def chain_at_p50(results: list[OpResult]) -> dict[str, float]:
    """The one-run critical path of an op: us per category (every category), summing to
    the op's p50 latency over every rank of every seed (``OpStats.p50_us``).

    The ranks of all seeds are pooled and ordered by latency as the p50 is; the chain is
    that of the rank at the median, or with an even count the two middle ranks' chains
    weighted as ``np.percentile`` interpolates their latencies. p50 rather than the mean
    over ranks: the op's headline latency, the what-if column and lever predictions are
    all p50s, so the chain sums to the number it explains and compares entry by entry
    with the what-if; and it stays one (or two) real causal chains, where a mean would
    blend ranks that ended through different resources.
    """
    lat = [x for r in results for x in r.latency_us]
    chains = [_as_row(c) for r in results for c in (r.critical_path or [])]
    return _median_chain(lat, chains)


def _as_row(chain: dict[str, float]) -> tuple[float, ...]:
    return tuple(chain.get(c, 0.0) for c in CATEGORIES)


def _median_chain(lat: list[float], chains: list[tuple[float, ...]]) -> dict[str, float]:
    """The chain (a row per rank, in CATEGORIES order) at the p50 of ``lat``, interpolated
    between the two middle ranks as ``np.percentile`` does."""
    if len(chains) != len(lat):
        raise ValueError("chain_at_p50 needs results simulated with critical_path=True")
    order = np.argsort(np.asarray(lat), kind="stable")
    pos = (len(lat) - 1) * 0.5
    i = int(pos)
    f = pos - i
    lo = chains[order[i]]
    hi = chains[order[min(i + 1, len(lat) - 1)]]
    return {c: (1.0 - f) * lo[k] + f * hi[k] for k, c in enumerate(CATEGORIES)}


def _op_job(job: tuple[Scenario, str, int, dict[str, float] | None, bool, bool],
            keep: list | None = None) -> OpResult | list[float]:
    """One (op, seed, what-if scale) run; what-if runs send back only their latencies."""
    scn, op, seed, scale, trace, path = job
    r = simulate_op(scn, op, seed, scale=scale, trace=trace, critical_path=path, keep=keep)
    return r if scale is None else r.latency_us


# A pool worker's last finished run: freed when the worker takes its next job, or never (a
# worker process ends without freeing its objects), so the freeing is off the result's path.
_FINISHED: list = []


def _op_job_in_worker(job: tuple[Scenario, str, int, dict[str, float] | None, bool, bool]
                      ) -> OpResult | list[float]:
    """:func:`_op_job` in a pool worker: the previous run freed first, this one kept."""
    _FINISHED.clear()
    gc.unfreeze()
    return _op_job(job, keep=_FINISHED)


def _run_jobs(jobs: Iterable, workers: int) -> Iterator:
    """Every job is a pure function of (scenario, op, seed, scale): a process pool yields,
    in order, exactly what a serial loop would. Jobs are taken from ``jobs`` as results
    are consumed (at most a few per worker in flight), so memory does not grow with the
    number of seeds."""
    it = iter(jobs)
    if workers <= 1:
        for j in it:
            yield _op_job(j)
        return
    from collections import deque
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=workers) as ex:
        window: deque = deque()
        for j in it:
            window.append(ex.submit(_op_job_in_worker, j))
            if len(window) >= 4 * workers:
                yield window.popleft().result()
        while window:
            yield window.popleft().result()


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
    """The attributions of one op: profiler shares (all warps and the put path) and, when
    computed, the one-run critical path (us per category, summing to the op's p50:
    :func:`chain_at_p50`) and the what-if column (us per category: :func:`what_if_reruns`)."""

    profiler: dict[str, float]
    put_path: dict[str, float]
    critical_path: dict[str, float] | None = None
    what_if_us: dict[str, float] | None = None

    def to_json(self) -> dict[str, dict[str, float]]:
        out = {"profiler": self.profiler, "put_path": self.put_path}
        if self.critical_path is not None:
            out["critical_path"] = self.critical_path
        if self.what_if_us is not None:
            out["what_if_us"] = self.what_if_us
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
    busy_ns: dict[str, dict[str, float]] = field(default_factory=dict)
    """Per op the issuing warps' busy time per category (ns, summed over the seeds): what the
    shares are shares of, for a comparison in time (the fit's per-WQE metrics). Not in
    :meth:`to_json`."""

    def to_json(self) -> dict[str, Any]:
        """The ``lever simulate --json`` object (traces are written to their own file)."""
        return {"scenario": self.scenario, "seeds": self.seeds, "events": self.events,
                "ops": {op: s.to_json() for op, s in self.ops.items()},
                "attribution": {op: a.to_json() for op, a in self.attribution.items()},
                "counters": self.counters, "per_rank_us": self.per_rank_us, "wall_s": self.wall_s}


class _OpAccumulator:
    """One op's seeds folded in as they arrive: latencies (every rank, kept for the
    percentiles), profiler busy time, counters and, when recorded, each rank's chain as a
    tuple per category. The seed's OpResult is dropped once added."""

    def __init__(self, chains: bool) -> None:
        self.lat: list[list[float]] = []
        self.busy: dict[str, float] = {}
        self.busy_put: dict[str, float] = {}
        self.counters: dict[str, int] = {}
        self.ledger_events: dict[str, int] = {}
        self.events = 0
        self.chains: list[tuple[float, ...]] | None = [] if chains else None

    def add(self, r: OpResult) -> None:
        self.lat.append(r.latency_us)
        self.events += r.events
        for c, v in r.ledger.busy.items():  # summed in the order profiler_shares sums them
            self.busy[c] = self.busy.get(c, 0.0) + v
            if c in PUT_PATH:
                self.busy_put[c] = self.busy_put.get(c, 0.0) + v
        for k, v in r.counters.items():
            self.counters[k] = self.counters.get(k, 0) + v
        for k, v in r.ledger.events.items():
            self.ledger_events[k] = self.ledger_events.get(k, 0) + v
        if self.chains is not None:
            self.chains += [_as_row(ch) for ch in r.critical_path or []]

    def chain_at_p50(self, lat: list[float]) -> dict[str, float]:
        """As :func:`chain_at_p50`, on the folded chains."""
        return _median_chain(lat, self.chains or [])


def _shares(busy: dict[str, float]) -> dict[str, float]:
    total = sum(busy.values())
    if total <= 0:
        return {}
    return {c: round(busy[c] / total, 6) for c in CATEGORIES if busy.get(c, 0.0) > 0}


def simulate(scn: Scenario, seeds: int = 1, with_critical_path: bool = True, cp_seeds: int = 1,
             trace: bool = False, workers: int = 1, what_if: bool = False,
             progress: Callable[[int, int], None] | None = None) -> SimulationResult:
    """Every op of ``scn`` on seeds 0..seeds-1, with the attributions.

    ``with_critical_path`` records the one-run critical path in every base run (no extra
    run; a run takes ~10% (EP16) to ~30% (EP32) longer). ``what_if`` adds the what-if
    column: one rerun per category, op and seed 0..cp_seeds-1 (most of the work when
    asked for). The runs are independent, so ``workers`` > 1 spreads them over processes;
    the numbers are identical to a serial run.
    """
    t0 = time.perf_counter()
    kcp = max(1, min(cp_seeds, seeds))
    cp_cats = CATEGORIES if what_if else ()

    def jobs():  # made as they are consumed: nothing per seed is held up front
        for op in scn.ops:
            for s in range(seeds):
                yield (scn, op, s, None, trace and s == 0, with_critical_path)
            for c in cp_cats:
                for s in range(kcp):
                    yield (scn, op, s, {c: 0.0}, False, False)

    total = len(scn.ops) * (seeds + len(cp_cats) * kcp)

    def counted():  # progress(done, total) after each run
        for k, r in enumerate(_run_jobs(jobs(), min(workers, total)), 1):
            if progress is not None:
                progress(k, total)
            yield r

    done = counted()
    out = SimulationResult(scn.name, seeds, 0, {}, {}, {}, {})
    for op in scn.ops:
        acc = _OpAccumulator(with_critical_path)
        for s in range(seeds):
            r = next(done)
            acc.add(r)
            if trace and s == 0:
                out.traces.append((op, r.trace))
        whatif = {c: [x for _ in range(kcp) for x in next(done)] for c in cp_cats}
        lat = [x for row in acc.lat for x in row]
        out.ops[op] = OpStats.of(lat)
        out.per_rank_us[op] = [
            round(float(np.mean([row[k] for row in acc.lat])), 4) for k in range(len(acc.lat[0]))
        ]
        out.events += acc.events
        chain = acc.chain_at_p50(lat) if with_critical_path else None
        wi = None
        if what_if:
            base = stats([x for row in acc.lat[:kcp] for x in row])["p50_us"]
            wi = {c: cp_entry(base, v) for c, v in whatif.items()}
        out.attribution[op] = OpAttribution(_shares(acc.busy), _shares(acc.busy_put), chain, wi)
        out.busy_ns[op] = dict(acc.busy)
        cnt = dict(acc.counters)
        cnt.update({f"events_{k}": v for k, v in acc.ledger_events.items()})
        out.counters[op] = cnt
    out.wall_s = round(time.perf_counter() - t0, 4)
    return out
