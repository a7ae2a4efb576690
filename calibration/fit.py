"""Fitting a platform's free parameters to run records (docs/records.md).

The platform file declares what may move (``[platform.free."gpu.fence_ns"]`` with
``lo``/``hi`` and an optional log-normal ``prior``). Each record says how to
reproduce it in the model (``sim``: scenario, levers, ``set`` overrides; a delta
record also its ``baseline``). The fit:

- works in log-parameter space, within the bounds, with
  ``scipy.optimize.least_squares`` and a robust ``soft_l1`` loss;
- applies the free values as ``--set platform.PATH=VALUE`` overrides, so any
  scenario works and the whole base platform can be swapped in (``base``);
- simulates on common random numbers (fixed seeds 0..N-1) so the objective is
  a smooth-enough deterministic function;
- evaluates all simulations of one residual vector and of a finite-difference
  Jacobian in parallel across cores (one process pool);
- reports per parameter the estimate and its standard error from
  ``(J^T J)^-1 s^2`` and flags what the records can not identify.

Residuals (each divided by its scale, so one unit is "one typical miss"):
- absolute medians: (sim - meas) / meas / max(REL_SIGMA, se/meas)
- deltas: (sim_d - meas_d) / max(|meas_d|, DELTA_FLOOR_US) / DELTA_SIGMA, or,
  when the record carries the baseline's measured level, the relative change
  (sim_d/sim_base - meas_d/meas_base) / REL_DELTA_SIGMA
- attribution shares: (sim - meas) / SHARE_SIGMA
- a native record's put-path metrics (:data:`PUT_METRICS`: the time of one credit read, the
  WQE stores + fence + doorbell per WQE): log(sim / meas) / METRIC_SIGMA
- priors: log(x / prior) / rel_sigma
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from lever.calibration.records import OPS, RecordError, RunRecord, SimLink
from lever.sim.errors import UserError
from lever.sim.params import FreeParam, Platform

REL_SIGMA = 0.02
DELTA_FLOOR_US = 10.0
DELTA_SIGMA = 0.25
REL_DELTA_SIGMA = 0.03
SHARE_SIGMA = 0.05
METRIC_SIGMA = 0.25
"""A put-path metric missed by a quarter (in log) is one typical miss: the testbed's own run to
run spread of these is 1-17% (each record against its -faults twin), and the model's post is a
few costs, not the kernel's instructions. Set before any validation ran; the lever validation
depends on it (README, Leave one lever out: 16 of 31 at 0.15, 23 at 0.25, 13 at 0.5)."""
PUT_METRICS = ("credit_read_ns", "post_chain_per_wqe_ns")
"""The put-path metrics a native EP record carries per op (``{op}_{metric}``, hw/ep's profiler)
and the model reports from its ledger (:func:`put_metrics`). Why they are fitted: the shares
alone let one cost stand for another. The shipped fit's CQ read interval reproduced the
dispatch's average credit read (35 us, most of it QP 0's burst after the flush barrier) and
the share of credit waits, but read a combine's credit in 15.7 us where the testbed reads it
in 3.0 (benchmarks/put_path_table.py)."""
FD_STEP = 0.05
ROBUST_SCALE = 3.0
"""soft_l1 turns linear beyond 3 typical misses (6% on a median): outliers pull less."""
"""Finite-difference step in log space: 5%, wide enough to average over event-order jumps."""
UNIDENTIFIABLE_LOG_SE = 1.0
"""A parameter whose log standard error exceeds this (a factor e) is not identified."""
UNIDENTIFIABLE_CORR = 0.98


class FitError(UserError, ValueError):
    """A fit that can not be set up or run; ``str()`` is the one-line message."""


# --------------------------------------------------------------------------- jobs


@dataclass(frozen=True)
class Job:
    """One simulation: scenario + levers + overrides, the ops it must run.

    A joint fit (``calibration/joint.py``) runs records of several platforms at once: a job
    then belongs to one platform ``group`` whose base platform ``base`` (flattened overrides)
    it runs on, and takes of the fitted values the shared ones and those named
    ``PATH@GROUP`` (:func:`job_values`)."""

    scenario: str
    levers: tuple[str, ...]
    sets: tuple[tuple[str, Any], ...]
    ops: tuple[str, ...]
    group: str = ""
    base: tuple[tuple[str, Any], ...] = ()

    def key(self) -> tuple:
        return (self.scenario, self.levers, _canonical(self.sets))


GROUP_SEP = "@"
"""``fabric.base_latency_ns@efa-p5``: a parameter fitted for one platform of a joint fit."""


def job_values(job: Job, values: Mapping[str, float]) -> dict[str, float]:
    """The fitted values one job runs with: shared names as they are, ``PATH@GROUP`` names of
    the job's own group without the suffix, other groups' not at all."""
    out: dict[str, float] = {}
    for n, v in values.items():
        path, sep, group = n.partition(GROUP_SEP)
        if not sep:
            out[path] = v
        elif group == job.group:
            out[path] = v
    return out


def _canonical(sets: Any) -> str:
    return json.dumps(sets, sort_keys=True, separators=(",", ":"))


def link_key(link: SimLink) -> tuple:
    return (link.scenario, tuple(link.levers), _canonical(sorted(link.set.items())))


def _needs(rec: RunRecord) -> list[tuple[SimLink, set[str]]]:
    """The simulations a record needs and which ops of each."""
    if rec.sim is None:
        raise RecordError(f"record {rec.id}: sim: missing (the fitter does not know how to simulate it)")
    out = []
    ops_after = set(rec.latency_us) | set(rec.latency_delta_us) | set(rec.attribution)
    out.append((rec.sim, ops_after))
    if rec.latency_delta_us or rec.baseline_attribution:
        if rec.baseline is None:
            raise RecordError(f"record {rec.id}: baseline: missing (needed by latency_delta_us)")
        out.append((rec.baseline, set(rec.latency_delta_us) | set(rec.baseline_attribution)))
    return out


def plan_jobs(records: list[RunRecord]) -> list[Job]:
    ops: dict[tuple, set[str]] = {}
    links: dict[tuple, SimLink] = {}
    for r in records:
        for link, need in _needs(r):
            key = link_key(link)
            ops.setdefault(key, set()).update(need)
            links.setdefault(key, link)
    return [Job(k[0], k[1], tuple(sorted(links[k].set.items())), tuple(o for o in OPS if o in v))
            for k, v in ops.items()]


def flatten_platform(plat: dict, prefix: str = "platform") -> dict[str, Any]:
    """A platform table as overrides (``free``, ``sources`` and ``calibrated`` are not model inputs)."""
    out: dict[str, Any] = {}
    for k, v in plat.items():
        if prefix == "platform" and k in ("free", "calibrated", "sources"):
            continue
        if isinstance(v, dict):
            out.update(flatten_platform(v, f"{prefix}.{k}"))
        elif v is not None:
            out[f"{prefix}.{k}"] = v
    return out


def run_job(job: Job, base_sets: Mapping[str, Any], values: dict[str, float], seeds: int) -> dict:
    """Simulate one job (in a worker): per op the p50 and the two share tables."""
    from lever.sim.levers import load_with_levers
    from lever.sim.results import simulate

    # the record's run configuration before its levers, the fitted values after everything
    values = job_values(job, values)
    scn = load_with_levers(job.scenario, list(job.levers),
                           {**{f"platform.{k}": v for k, v in values.items()}, "ops": list(job.ops)},
                           base={**base_sets, **dict(job.base), **dict(job.sets)},
                           base_source="record sim.set")
    res = simulate(scn, seeds=seeds, with_critical_path=False)
    out = {}
    for op in job.ops:
        att = res.attribution[op]
        out[op] = {"p50_us": float(res.ops[op].p50_us),
                   "profiler": {k: float(v) for k, v in att.profiler.items()},
                   "put_path": {k: float(v) for k, v in att.put_path.items()},
                   **put_metrics(res.busy_ns[op], res.counters[op])}
    return out


def wqes_written(counters: Mapping[str, int]) -> int:
    """WQEs an op's issuers wrote, from its counters: one per RDMA message of any kind
    (``messages_data``, ``messages_signal``...), as hw/ep's profiler counts its posts."""
    return sum(v for k, v in counters.items() if k.startswith("messages_"))


def put_metrics(busy: Mapping[str, float], counters: Mapping[str, int]) -> dict[str, float]:
    """The model's :data:`PUT_METRICS` of one op from its ledger (busy ns per category and the
    counters, summed over the same seeds), defined as hw/ep's profiler defines them: a credit
    read is the credit check's time over its reads (a wait for room included, as the kernel's
    spin is), the post chain the WQE stores, the fences and the doorbell (the turn's release
    in the model's ``fence``, in the kernel's ``doorbell``) over the WQEs written. A metric
    with nothing to count (no credit read under lazy completion) is left out."""
    out = {}
    reads = counters.get("events_credit_wait", 0)
    if reads:
        out["credit_read_ns"] = float(busy.get("credit_wait", 0.0) / reads)
    wqes = wqes_written(counters)
    if wqes:
        out["post_chain_per_wqe_ns"] = float(
            (busy.get("wqe", 0.0) + busy.get("fence", 0.0) + busy.get("doorbell", 0.0)) / wqes)
    return out


def _run_job_star(a: tuple) -> dict:
    return run_job(*a)


# --------------------------------------------------------------------------- rows and residuals


@dataclass
class Row:
    """One compared quantity of one record."""

    record: str
    quantity: str
    unit: str
    measured: float
    predicted: float
    residual: float
    level_us: float | None = None
    """For deltas: the latency level the change is taken from (to judge it in % of level)."""

    @property
    def pct_err(self) -> float:
        return 100.0 * (self.predicted - self.measured) / max(abs(self.measured), 1e-12)

    @property
    def level_pct_err(self) -> float:
        """Error in % of the latency level (deltas) or of the measured value (others)."""
        if self.level_us:
            return 100.0 * (self.predicted - self.measured) / self.level_us
        return self.pct_err

    def as_dict(self) -> dict:
        return {"record": self.record, "quantity": self.quantity, "unit": self.unit,
                "measured": round(self.measured, 4), "predicted": round(self.predicted, 4),
                "pct_err": round(self.pct_err, 2), "level_pct_err": round(self.level_pct_err, 2)}


def record_rows(rec: RunRecord, sims: dict[tuple, dict]) -> list[Row]:
    after = sims[link_key(rec.sim)] if rec.sim else {}
    base = sims[link_key(rec.baseline)] if rec.baseline else {}
    rows = []
    for op, d in rec.latency_us.items():
        p = after[op]["p50_us"]
        sig = max(REL_SIGMA, d.median_se() / d.median)
        rows.append(Row(rec.id, f"{op}.p50", "us", d.median, p, (p - d.median) / d.median / sig))
    for op, d in rec.latency_delta_us.items():
        sa, sb = after[op]["p50_us"], base[op]["p50_us"]
        if op in rec.baseline_latency_us:
            mb = rec.baseline_latency_us[op].median
            pred = mb * (sa - sb) / sb
            r = ((sa - sb) / sb - d.median / mb) / REL_DELTA_SIGMA
            rows.append(Row(rec.id, f"{op}.delta", "us", d.median, pred, r, level_us=mb))
        else:
            r = ((sa - sb) - d.median) / max(abs(d.median), DELTA_FLOOR_US) / DELTA_SIGMA
            rows.append(Row(rec.id, f"{op}.delta", "us", d.median, sa - sb, r, level_us=sb))
    if rec.what.path == "native":  # the proxy path's chain is its host thread's, not a warp's
        for op in OPS:
            got = after.get(op, {})
            for name in PUT_METRICS:
                m = rec.metrics.get(f"{op}_{name}")
                s = got.get(name)
                if m is None or s is None or m.median <= 0 or s <= 0:
                    continue
                rows.append(Row(rec.id, f"{op}.{name}", "ns", m.median, s,
                                math.log(s / m.median) / METRIC_SIGMA))
    scope = rec.attribution_scope
    for src, table, label in ((after, rec.attribution, "share"), (base, rec.baseline_attribution, "baseline_share")):
        for op, cats in table.items():
            got = src[op][scope]
            for cat, m in cats.items():
                s = got.get(cat, 0.0)
                rows.append(Row(rec.id, f"{op}.{scope}.{cat}.{label}", "share", m, s, (s - m) / SHARE_SIGMA))
    return rows


# --------------------------------------------------------------------------- the fit


@dataclass
class FitResult:
    names: list[str]
    x: np.ndarray
    log_cov: np.ndarray
    se_log: np.ndarray
    corr: np.ndarray
    unidentifiable: list[str]
    at_bound: list[str]
    cost: float
    rows: list[Row]
    evaluations: int
    wall_s: float
    nfev: int
    status: str
    priors: dict[str, FreeParam] = field(default_factory=dict)
    jac: np.ndarray | None = None
    """d residual / d log parameter at the estimate, one row per data row (priors left out)."""

    def constrained_by(self, share: float = 0.05) -> dict[str, list[str]]:
        """Per parameter, the records that constrain it: those holding at least ``share`` of
        the information the data carries about it (sum of squared Jacobian entries)."""
        out: dict[str, list[str]] = {n: [] for n in self.names}
        if self.jac is None:
            return out
        for i, n in enumerate(self.names):
            info: dict[str, float] = {}
            for row, d in zip(self.rows, self.jac[:, i], strict=True):
                info[row.record] = info.get(row.record, 0.0) + float(d) ** 2
            total = sum(info.values())
            if total > 1e-9:
                out[n] = sorted(r for r, v in info.items() if v >= share * total)
        return out

    def params(self) -> list[dict]:
        out = []
        for i, n in enumerate(self.names):
            out.append({"name": n, "estimate": float(self.x[i]),
                        "se": float(self.x[i] * self.se_log[i]) if math.isfinite(self.se_log[i]) else None,
                        "log_se": float(self.se_log[i]),
                        "unidentifiable": n in self.unidentifiable, "at_bound": n in self.at_bound})
        return out

    def as_dict(self) -> dict:
        return {"params": self.params(), "cost": self.cost, "evaluations": self.evaluations,
                "nfev": self.nfev, "wall_s": round(self.wall_s, 2), "status": self.status,
                "unidentifiable": self.unidentifiable,
                "correlation": np.round(self.corr, 4).tolist(),
                "rows": [r.as_dict() for r in self.rows]}


def _get(plat: Platform, path: str) -> float:
    obj: Any = plat
    for k in path.split("."):
        if not hasattr(obj, k):
            raise FitError(f"platform.free: '{path}' is not a platform field")
        obj = getattr(obj, k)
    if isinstance(obj, bool) or not isinstance(obj, (int, float)):
        raise FitError(f"platform.free: '{path}' is not a number")
    return float(obj)


SimCache = dict[tuple, dict]
"""(platform group, job key, the fitted values the job runs with) -> that job's simulated
summary. A simulation is a pure function of them, so any fit over overlapping records may
reuse it (lever validate's folds), and a joint fit's Jacobian column of one platform's
parameter re-runs only that platform's jobs."""


class Evaluator:
    """Evaluates simulations of many parameter vectors, in parallel, with a cache."""

    def __init__(self, jobs: list[Job], base_sets: Mapping[str, Any], names: list[str], seeds: int,
                 workers: int | None, progress: Callable[[int], None] | None = None,
                 cache: SimCache | None = None):
        self.jobs, self.base_sets, self.names, self.seeds = jobs, base_sets, names, seeds
        self.workers = max(1, workers or os.cpu_count() or 1)
        self.pool = ProcessPoolExecutor(self.workers) if self.workers > 1 else None
        self.cache: SimCache = cache if cache is not None else {}
        self.evaluations = 0
        self.progress = progress

    def close(self) -> None:
        if self.pool:
            self.pool.shutdown(cancel_futures=True)

    def _job_key(self, job: Job, vals: dict[str, float]) -> tuple:
        return (job.group, job.key(), tuple(sorted(job_values(job, vals).items())))

    def many(self, xs: list[np.ndarray]) -> list[dict[tuple, dict]]:
        """Simulate every job at every parameter vector of ``xs`` (what the cache lacks): per
        vector, job key -> the job's summary."""
        keys = [tuple(np.round(x, 12)) for x in xs]
        vals = {k: {n: float(v) for n, v in zip(self.names, k, strict=True)} for k in dict.fromkeys(keys)}
        plan: dict[tuple, tuple] = {}
        for v in vals.values():
            for j in self.jobs:
                jk = self._job_key(j, v)
                if jk not in self.cache and jk not in plan:
                    plan[jk] = (j, self.base_sets, v, self.seeds)
        tasks = list(plan.values())
        if self.pool:
            results = []
            for r in self.pool.map(_run_job_star, tasks):
                results.append(r)
                if self.progress:
                    self.progress(1)
        else:
            results = []
            for t in tasks:
                results.append(_run_job_star(t))
                if self.progress:
                    self.progress(1)
        self.evaluations += len(tasks)
        for jk, r in zip(plan, results, strict=True):
            self.cache[jk] = r
        return [{j.key(): self.cache[self._job_key(j, vals[k])] for j in self.jobs} for k in keys]


def start_values(platform: Platform, free: Mapping[str, FreeParam],
                 start: Mapping[str, float] | None = None) -> dict[str, float]:
    """Where a fit starts, per free parameter: ``start`` if given, else the platform's value,
    except a value outside the bounds (e.g. a mechanism off by default at 0) starts at its
    prior when it has one; the fit clips whatever remains into the bounds."""
    out = {}
    for n in sorted(free):
        f = free[n]
        v = float(start[n]) if start is not None and n in start else _get(platform, n)
        if not f.lo <= v <= f.hi and f.prior is not None:
            v = f.prior.value
        out[n] = v
    return out


def log_start(names: list[str], free: Mapping[str, FreeParam], values: Mapping[str, float]) -> np.ndarray:
    """The start in the fit's log space, clipped strictly inside the bounds."""
    lo = np.log([free[n].lo for n in names])
    hi = np.log([free[n].hi for n in names])
    x0 = np.log([max(values[n], 1e-300) for n in names])
    return np.clip(x0, lo + 1e-9, hi - 1e-9)


def jacobian_points(z: np.ndarray, hi: np.ndarray) -> list[np.ndarray]:
    """``z`` and its forward-difference points (backward at an upper bound), in log space."""
    out = [z]
    for i in range(len(z)):
        h = FD_STEP if z[i] + FD_STEP <= hi[i] else -FD_STEP
        zi = z.copy()
        zi[i] += h
        out.append(zi)
    return out


def warm_cache(records: list[RunRecord], platform: Platform, base_sets: Mapping[str, Any] | None,
               free: Mapping[str, FreeParam], start: Mapping[str, float], seeds: int = 1,
               workers: int | None = None) -> SimCache:
    """Every job of ``records`` simulated at a fit's start and its Jacobian points, in one
    parallel batch: fits that start there (one per held-out fold) then share that work."""
    names = sorted(free)
    hi = np.log([free[n].hi for n in names])
    z0 = log_start(names, free, start_values(platform, free, start))
    ev = Evaluator(plan_jobs(records), dict(base_sets or {}), names, seeds, workers)
    try:
        ev.many([np.exp(p) for p in jacobian_points(z0, hi)])
    finally:
        ev.close()
    return ev.cache


def fit(records: list[RunRecord], platform: Platform, base_sets: Mapping[str, Any] | None = None,
        free: dict[str, FreeParam] | None = None, seeds: int = 1, max_nfev: int = 10,
        workers: int | None = None, progress: Callable[[int, int], None] | None = None,
        starts: int = 1, start: Mapping[str, float] | None = None,
        cache: SimCache | None = None, fixed_jacobian: bool = False,
        jobs: list[Job] | None = None) -> FitResult:
    """Fit ``free`` (default: ``platform.free``) to ``records``; ``base_sets`` swap in a platform.

    ``starts`` > 1 runs that many local fits: from the platform's own values and from
    ``starts - 1`` log-uniform draws within a decade of them (inside the bounds, seeded,
    so a calibration is reproducible), and keeps the lowest robust cost. A single local
    fit from hand-set values can settle where two costs trade off (per-doorbell against
    per-WQE NIC work) far from the records.

    ``start`` replaces the platform's values as the first start (``lever validate --levers``
    starts every fold from a fit that saw none of the held-out records; a joint fit gives
    every free name's start); ``cache`` holds simulations already made (:func:`warm_cache`)
    and receives the new ones. ``jobs`` are the simulations to run (a joint fit's, over
    several platforms); by default they come from the records.

    ``fixed_jacobian`` keeps the start's finite-difference Jacobian for every step and for the
    covariance (a chord method): each step then costs one simulation batch instead of one per
    parameter plus one, so a refit from a nearby start (a fold of ``lever validate --levers``,
    whose start's Jacobian is in ``cache``) can take many steps for the price of one.
    """
    free = dict(platform.free if free is None else free)
    if not free:
        raise FitError(f"platform {platform.name}: no [platform.free] parameters to fit")
    if not records:
        raise FitError("no records to fit")
    names = sorted(free)
    lo = np.log([free[n].lo for n in names])
    hi = np.log([free[n].hi for n in names])
    x0 = log_start(names, free, start_values(platform, free, start))
    jobs = plan_jobs(records) if jobs is None else jobs
    t0 = time.perf_counter()
    total = max_nfev * (len(names) + 1) * len(jobs) * max(starts, 1)
    done = [0]

    def tick(k: int) -> None:
        done[0] += k
        if progress:
            progress(done[0], max(total, done[0]))

    ev = Evaluator(jobs, dict(base_sets or {}), names, seeds, workers, tick, cache)

    def resid_from(sims: dict, z: np.ndarray) -> np.ndarray:
        r = [row.residual for rec in records for row in record_rows(rec, sims)]
        for i, n in enumerate(names):
            p = free[n].prior
            if p is not None:
                r.append((z[i] - math.log(p.value)) / p.rel_sigma)
        return np.asarray(r, dtype=float)

    def pts(z: np.ndarray) -> list[np.ndarray]:
        return jacobian_points(z, hi)

    def f(z: np.ndarray) -> np.ndarray:
        return resid_from(ev.many([np.exp(z)])[0], z)

    def jac(z: np.ndarray, *_: Any) -> np.ndarray:
        ps = pts(z)
        sims = ev.many([np.exp(p) for p in ps])
        r0 = resid_from(sims[0], ps[0])
        J = np.empty((r0.size, len(z)))
        for i in range(len(z)):
            J[:, i] = (resid_from(sims[i + 1], ps[i + 1]) - r0) / (ps[i + 1][i] - z[i])
        return J

    from scipy.optimize import least_squares

    try:
        rng = np.random.default_rng(0)
        x0s = [x0] + [np.clip(x0 + rng.uniform(-math.log(10), math.log(10), len(x0)), lo + 1e-9, hi - 1e-9)
                      for _ in range(max(starts, 1) - 1)]
        res = None
        J = None
        for xs in x0s:
            # Evaluate the start and its Jacobian points in one parallel batch up front.
            ev.many([np.exp(p) for p in pts(xs)])
            jk = jac
            if fixed_jacobian:  # the start's Jacobian throughout: one simulation batch per step
                j0 = jac(xs)
                jk = lambda _z, *_a, j0=j0: j0  # noqa: E731
            r_k = least_squares(f, xs, jac=jk, bounds=(lo, hi), loss="soft_l1", f_scale=ROBUST_SCALE,
                                x_scale=1.0, max_nfev=max_nfev, method="trf", diff_step=None)
            if res is None or r_k.cost < res.cost:
                res = r_k
                J = j0 if fixed_jacobian else None
        if J is None:
            J = jac(res.x)
        r = f(res.x)
    finally:
        ev.close()
    m, n = J.shape
    dof = max(m - n, 1)
    s2 = max(float(r @ r) / dof, 1e-12)
    jtj = J.T @ J
    eps = 1e-10 * max(float(np.trace(jtj)), 1e-30)
    cov = np.linalg.inv(jtj + eps * np.eye(n)) * s2
    se = np.sqrt(np.maximum(np.diag(cov), 0.0))
    corr = correlation(cov)
    unid = []
    for i, nm in enumerate(names):
        # a prior alone pins a parameter to its prior width: that is not identification
        p = free[nm].prior
        data_only = J[: m - sum(1 for k in names if free[k].prior), i]
        weak = not np.any(np.abs(data_only) > 1e-3)
        if se[i] > UNIDENTIFIABLE_LOG_SE or weak or (p is None and se[i] > UNIDENTIFIABLE_LOG_SE):
            unid.append(nm)
            continue
        if any(abs(corr[i, j]) > UNIDENTIFIABLE_CORR for j in range(n) if j != i):
            unid.append(nm)
    at_bound = [nm for i, nm in enumerate(names) if res.x[i] <= lo[i] + 1e-3 or res.x[i] >= hi[i] - 1e-3]
    sims = ev.many([np.exp(res.x)])[0]  # evaluated already: from the cache
    rows = [row for rec in records for row in record_rows(rec, sims)]
    return FitResult(names=names, x=np.exp(res.x), log_cov=cov, se_log=se, corr=corr,
                     unidentifiable=unid, at_bound=at_bound, cost=float(res.cost), rows=rows,
                     evaluations=ev.evaluations, wall_s=time.perf_counter() - t0, nfev=int(res.nfev),
                     status=str(res.message), priors=free, jac=J[: len(rows)])


def predict(records: list[RunRecord], base_sets: Mapping[str, Any] | None = None, values: dict[str, float] | None = None,
            seeds: int = 1, workers: int | None = None) -> list[Row]:
    """Simulate the records at given parameter values (default: the scenarios' own)."""
    values = values or {}
    jobs = plan_jobs(records)
    names = sorted(values)
    ev = Evaluator(jobs, dict(base_sets or {}), names, seeds, min(workers or os.cpu_count() or 1, len(jobs)))
    try:
        sims = ev.many([np.array([values[n] for n in names])])[0]
    finally:
        ev.close()
    return [row for rec in records for row in record_rows(rec, sims)]


# --------------------------------------------------------------------------- writing the platform


def git_rev() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                              cwd=Path(__file__).resolve().parent).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def correlation(cov: np.ndarray) -> np.ndarray:
    """The correlation matrix of a covariance; a parameter with no variance correlates with
    nothing (its row is its covariances, zero)."""
    se = np.sqrt(np.maximum(np.diag(cov), 0.0))
    d = np.where(se > 0, se, 1.0)
    return cov / np.outer(d, d)


def calibrated_platform(platform: Platform, result: FitResult, records: list[RunRecord],
                        name: str, refs: Mapping[str, str] | None = None,
                        shared: list[str] | None = None) -> Platform:
    """``platform`` with ``result``'s values and their provenance. ``refs``: per parameter,
    what fitted it, where that is not simply ``records`` (a joint fit: the records that
    constrain it, of every platform); ``shared``: the parameters tied across platforms."""
    plat = platform.model_copy(deep=True)
    data = plat.model_dump(mode="json")
    for n, v in zip(result.names, result.x, strict=True):
        cur = data
        keys = n.split(".")
        for k in keys[:-1]:
            cur = cur[k]
        cur[keys[-1]] = type(cur[keys[-1]])(round(float(v), 3)) if isinstance(cur[keys[-1]], float) else v
    data["name"] = name
    data["description"] = (f"{platform.description} -- calibrated by lever calibrate on "
                           f"{len(records)} records")
    ids = ", ".join(r.id for r in records)
    for n in result.names:  # the fitted value's source: the records, and the prior's reason
        was = platform.sources.get(n)
        why = f"; prior: {was.ref}" if was is not None else ""
        fitted_by = (refs or {}).get(n) or f"lever calibrate on {ids}"
        data.setdefault("sources", {})[n] = {"kind": "fitted", "ref": f"{fitted_by}{why}"}
    data["calibrated"] = {
        "names": result.names, "log_mean": [float(np.log(v)) for v in result.x],
        "log_cov": [[float(c) for c in row] for row in result.log_cov],
        "records": {r.id: r.digest() for r in records},
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "git_rev": git_rev(), "cost": result.cost, "unidentifiable": result.unidentifiable,
        "shared": [n for n in result.names if n in (shared or [])],
    }
    from lever.calibration.validate import delta_discrepancy, train_cases

    dd = delta_discrepancy(result.rows, train_cases(records))
    if dd > 0:
        data["calibrated"]["delta_discrepancy_us"] = round(dd, 3)
    return Platform.model_validate(data)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        if isinstance(v, float) and not math.isfinite(v):
            raise FitError(f"can not write non-finite value {v}")
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{_key(k)} = {_toml_value(x)}" for k, x in v.items()) + " }"
    raise FitError(f"can not write {type(v).__name__} to TOML")


def _key(k: str) -> str:
    return k if k.replace("_", "").replace("-", "").isalnum() else _toml_value(k)


def platform_toml(plat: Platform, header: str = "") -> str:
    data = plat.model_dump(mode="json", exclude_none=True)
    lines = [f"# {h}" for h in header.splitlines()]

    def table(name: str, d: dict) -> None:
        scalars = {k: v for k, v in d.items() if not isinstance(v, dict)}
        subs = {k: v for k, v in d.items() if isinstance(v, dict)}
        lines.append(f"\n[{name}]")
        for k, v in scalars.items():
            lines.append(f"{_key(k)} = {_toml_value(v)}")
        for k, v in subs.items():
            if k == "sources":  # dotted paths as quoted keys, one inline table each
                lines.append(f"\n[{name}.sources]")
                for sk, sv in v.items():
                    lines.append(f"{_toml_value(sk)} = {_toml_value(sv)}")
                continue
            if name.endswith(".free") or k == "free":
                if k == "free":
                    for fk, fv in v.items():
                        lines.append(f"\n[{name}.free.{_toml_value(fk)}]")
                        for kk, vv in fv.items():
                            lines.append(f"{kk} = {_toml_value(vv)}")
                continue
            table(f"{name}.{k}", v)

    table("platform", data)
    return "\n".join(lines).lstrip("\n") + "\n"


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        tmp.replace(path)
    finally:
        if tmp.exists():
            tmp.unlink()
