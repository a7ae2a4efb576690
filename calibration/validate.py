"""Leave-one-out lever validation (``lever validate --levers``): is a lever's measured change
predicted by a model that never saw it?

A *lever record* measures a lever: either a delta against a named baseline
(``latency_delta_us``, the EFA campaign's facts) or absolute latencies of a run with
``what.levers`` set, whose measured baseline is the record of the same run configuration
without levers (same scenario, ``sim.set``, emulated fabric and workload: the emulated-NIC EP
records). For each lever record:

1. **Hold out** the record and every record that measures one of its levers (a lever measured
   twice, e.g. with and without packet loss, is one fact; fitting one copy and predicting the
   other would be a number predicted after fitting it).
2. **Refit** the platform's free parameters (``[platform.free]`` of the NIC's base platform) on
   every other record of that NIC: baselines, sweeps, fault runs, other shapes and the other
   levers. Every fold starts from one *start fit* on the records that measure no lever at all,
   so no fold sees its held-out record through its start; the start's simulations (the point
   and its finite-difference Jacobian, for every record) are made once and shared by all
   folds (:func:`lever.calibration.fit.warm_cache`), and each refit keeps that Jacobian for
   its steps and its covariance (``fit(fixed_jacobian=True)``), so a step costs one batch of
   simulations of the fold's own records.
3. **Predict** the held-out delta on the refit (paired seeds, band = seed noise and the spread
   over parameter draws from the refit's covariance, clipped to the bounds:
   :func:`lever.calibration.predict.predict_links`), widened by the refit's own model
   discrepancy, the larger of two estimates of it: its typical relative miss on the latencies
   it was fitted to, times the predicted change (:func:`discrepancy`), and its typical miss on
   the lever deltas among its training records (:func:`delta_discrepancy`), which does not
   vanish where the predicted change does. Parameter draws can not show this error: it is the
   model's, not the parameters'.
4. **Judge** it with the preregistration rule (:func:`lever.calibration.compare.verdict`)
   against the measured delta and its band (:func:`lever.calibration.compare.measured_delta`).

Records the model refuses to run (a lever configuration it can not represent) are reported
with verdict ``refused`` and are in no training set. Folds are independent and run through
:mod:`lever.calibration.pool` (local processes or Ray).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from lever.calibration.compare import Z90, measured_delta, verdict
from lever.calibration.records import OPS, RecordError, RunRecord, SimLink
from lever.calibration.repro import delta_halfwidth
from lever.sim.params import FreeParam, Platform

if TYPE_CHECKING:
    from lever.calibration.fit import SimCache

VERDICTS = ("validated", "refuted", "inconclusive", "refused")


@dataclass(frozen=True)
class LeverCase:
    """One lever record and how its delta is measured."""

    record: RunRecord
    baseline: RunRecord | None
    """The measured baseline record (absolute latencies); None for a delta record."""
    ops: tuple[str, ...]

    @property
    def lever(self) -> str:
        return "+".join(self.record.what.levers)

    @property
    def base_link(self) -> SimLink:
        """The run configuration the delta is taken against, as the model runs it."""
        r = self.record
        if r.latency_delta_us:
            assert r.baseline is not None  # the record schema requires it
            return r.baseline
        assert r.sim is not None
        return SimLink(scenario=r.sim.scenario, levers=[], set=dict(r.sim.set))


def _config(r: RunRecord) -> str:
    """What must match between a lever record and its measured baseline record."""
    assert r.sim is not None
    return json.dumps([r.nic, r.sim.scenario, sorted(r.sim.set.items()), r.what.path,
                       r.what.emulated_fabric, r.what.workload and r.what.workload.model_dump()],
                      sort_keys=True, default=str)


def lever_cases(records: list[RunRecord]) -> list[LeverCase]:
    """Every lever record among ``records`` with the baseline its delta is measured against."""
    plain: dict[str, list[RunRecord]] = {}
    for r in records:
        if r.sim is not None and not r.what.levers and not r.sim.levers and r.latency_us:
            plain.setdefault(_config(r), []).append(r)
    out = []
    for r in records:
        if not r.what.levers or r.sim is None:
            continue
        if r.latency_delta_us:
            out.append(LeverCase(r, None, tuple(o for o in OPS if o in r.latency_delta_us)))
            continue
        cands = plain.get(_config(r), [])
        if len(cands) > 1:
            raise RecordError(f"record {r.id}: baseline: several records measure its configuration "
                              f"without levers ({', '.join(c.id for c in cands)})")
        if not cands:
            raise RecordError(f"record {r.id}: baseline: no record measures its configuration "
                              "without levers (same scenario, sim.set, fabric and workload)")
        b = cands[0]
        out.append(LeverCase(r, b, tuple(o for o in OPS if o in r.latency_us and o in b.latency_us)))
    return out


def held_out(case: LeverCase, records: list[RunRecord]) -> frozenset[str]:
    """Ids left out of the refit for ``case``: its record and every record measuring one of its levers."""
    mine = set(case.record.what.levers)
    return frozenset(r.id for r in records if r.id == case.record.id or mine & set(r.what.levers))


@dataclass(frozen=True)
class Fold:
    """One refit: the records it leaves out and the cases it predicts."""

    excluded: frozenset[str]
    cases: tuple[LeverCase, ...]


def plan_folds(records: list[RunRecord], cases: list[LeverCase]) -> list[Fold]:
    """Cases with the same left-out set share one refit (a lever measured twice is one fold)."""
    by: dict[frozenset[str], list[LeverCase]] = {}
    for c in cases:
        by.setdefault(held_out(c, records), []).append(c)
    return [Fold(k, tuple(v)) for k, v in sorted(by.items(), key=lambda kv: sorted(kv[0]))]


# --------------------------------------------------------------------------- rows and tallies


@dataclass
class LeverRow:
    """One held-out (record, op): predicted delta and band against the measured delta."""

    record: str
    lever: str
    op: str
    predicted_delta_us: float | None
    band_us: tuple[float, float] | None
    measured_delta_us: float
    measured_band_us: tuple[float, float]
    verdict: str
    reason: str = ""
    nic: str = ""

    @property
    def wrong_sign(self) -> bool:
        """A confident wrong sign: the predicted band lies on one side of zero and the measurement
        on the other (its band when it has one, else its value). A band that contains zero
        claims no sign and can not have the wrong one."""
        if self.band_us is None:
            return False
        lo, hi = self.band_us
        mlo, mhi = self.measured_band_us
        if math.isnan(mlo) or math.isnan(mhi):
            mlo = mhi = self.measured_delta_us
        return (hi < 0 and mlo > 0) or (lo > 0 and mhi < 0)

    @property
    def sign(self) -> str:
        """right / wrong / none: does the predicted band claim the measured sign?"""
        if self.wrong_sign:
            return "wrong"
        if self.band_us is None or self.band_us[0] <= 0 <= self.band_us[1] or self.measured_delta_us == 0:
            return "none"
        return "right" if (self.band_us[0] > 0) == (self.measured_delta_us > 0) else "none"

    def as_json(self) -> dict[str, Any]:
        """The row of the ``lever validate --levers --json`` contract (docs/cli.md)."""
        return {"record": self.record, "lever": self.lever, "op": self.op,
                "predicted_delta_us": None if self.predicted_delta_us is None else round(self.predicted_delta_us, 4),
                "band_us": None if self.band_us is None else [round(v, 4) for v in self.band_us],
                "measured_delta_us": round(self.measured_delta_us, 4), "verdict": self.verdict,
                "sign": self.sign}


def tally(rows: list[LeverRow]) -> dict[str, int]:
    """validated / total / wrong_sign over ``rows`` (every row counts in total, refused ones too)."""
    return {"validated": sum(r.verdict == "validated" for r in rows), "total": len(rows),
            "wrong_sign": sum(r.wrong_sign for r in rows)}


def contract(rows: list[LeverRow]) -> dict[str, Any]:
    """The JSON object of ``lever validate --levers --json``, rows in record then op order."""
    order = {o: i for i, o in enumerate(OPS)}
    rows = sorted(rows, key=lambda r: (r.record, order.get(r.op, 9)))
    return {"levers": [r.as_json() for r in rows], **tally(rows)}


def discrepancy(rows: list[Any]) -> float:
    """The refit's typical relative miss on the absolute latencies it was fitted to (the median
    of |sim - meas| / meas over its ``*.p50`` rows); 0 when it has none. A median, so the few
    records the model can not represent at all do not set it."""
    errs = [abs(r.pct_err) / 100.0 for r in rows if r.unit == "us" and r.quantity.endswith(".p50")]
    return float(np.median(errs)) if errs else 0.0


MAD_TO_SD = 1.4826
"""A normal distribution's standard deviation over its median absolute deviation."""


def delta_discrepancy(rows: list[Any], cases: list[LeverCase]) -> float:
    """The refit's typical miss (us, as a normal's sd) on the lever deltas among its own
    training records: per training lever case and op, |(sim lever - sim baseline) - (measured
    lever - measured baseline)| from their ``*.p50`` rows (a delta record's own ``*.delta``
    row), the median over them times :data:`MAD_TO_SD`; 0 where there is none. What a delta is
    predicted, a delta is judged by: unlike :func:`discrepancy` it does not shrink with the
    predicted change, so a lever predicted to do nothing gets the model's typical delta error,
    not a band of zero width."""
    by = {(r.record, r.quantity): r for r in rows}
    errs = []
    for c in cases:
        for op in c.ops:
            if c.baseline is None:
                d = by.get((c.record.id, f"{op}.delta"))
                if d is not None:
                    errs.append(abs(d.predicted - d.measured))
                continue
            a, b = by.get((c.record.id, f"{op}.p50")), by.get((c.baseline.id, f"{op}.p50"))
            if a is not None and b is not None:
                errs.append(abs((a.predicted - b.predicted) - (a.measured - b.measured)))
    return MAD_TO_SD * float(np.median(errs)) if errs else 0.0


def widen(delta: float, band: tuple[float, float], rel: float, sd_us: float = 0.0) -> tuple[float, float]:
    """``band`` combined per side, in quadrature, with a 90% model discrepancy: the larger of
    ``rel`` x |delta| (:func:`discrepancy`) and ``sd_us`` (:func:`delta_discrepancy`), two
    estimates of the model's own error on this delta."""
    return widen_by(delta, band, Z90 * max(rel * abs(delta), sd_us))


def widen_by(delta: float, band: tuple[float, float], m: float) -> tuple[float, float]:
    """``band`` combined per side, in quadrature, with a 90% half-width ``m`` (us)."""
    return delta - math.hypot(delta - band[0], m), delta + math.hypot(band[1] - delta, m)


def judge(case: LeverCase, op: str, pred: dict[str, Any] | None, reason: str = "") -> LeverRow:
    """A case's row for one op: its measured delta and band, and the verdict on ``pred``."""
    r, b = case.record, case.baseline
    if b is None:
        m = measured_delta(None, None, r.latency_delta_us[op])
    else:
        m = measured_delta(b.latency_us[op], r.latency_us[op])
    mband = (float(m["band_us"][0]), float(m["band_us"][1]))
    if pred is None:
        return LeverRow(r.id, case.lever, op, None, None, float(m["delta_us"]), mband, "refused", reason, r.nic)
    d = pred["delta_us"]
    band = (float(pred["band_us"][0]), float(pred["band_us"][1]))
    if op in r.baseline_latency_us:
        # the campaign's baseline level differs from the model's: predict the relative change
        # at the campaign's level, as the fit compares it (fit.record_rows)
        k = r.baseline_latency_us[op].median / pred["baseline_p50_us"]
        d, band = d * k, (band[0] * k, band[1] * k)
    v = verdict(d, list(band), float(m["delta_us"]), list(mband))
    return LeverRow(r.id, case.lever, op, float(d), band, float(m["delta_us"]), mband, v["verdict"],
                    v["reason"], r.nic)


# --------------------------------------------------------------------------- folds


@dataclass
class FoldTask:
    """Everything one refit needs, picklable (runs in a pool worker)."""

    train: list[RunRecord]
    cases: list[LeverCase]
    platform: Platform
    base_sets: dict[str, Any]
    free: dict[str, FreeParam]
    start: dict[str, float]
    cache: SimCache
    seeds: int = 1
    max_nfev: int = 3
    pred_seeds: int = 3
    param_samples: int = 8
    with_discrepancy: bool = True
    run_noise: dict[str, tuple[float, int]] = field(default_factory=dict)  # op -> (sd us, dof)
    """Per op, the measured sd (us) of one process's median between processes of one call
    (calibration/repro.py): a measured delta carries it twice."""


@dataclass
class FoldResult:
    rows: list[LeverRow]
    train: list[str]
    excluded: list[str]
    params: list[dict[str, Any]] = field(default_factory=list)
    evaluations: int = 0
    cost: float = 0.0
    discrepancy: float = 0.0
    """The refit's median relative miss on its training latencies (widens the bands when used)."""
    delta_discrepancy_us: float = 0.0
    """The refit's typical miss on its training lever deltas (:func:`delta_discrepancy`)."""


def train_cases(records: list[RunRecord]) -> list[LeverCase]:
    """The lever cases among a refit's training records, each with its baseline; none where
    a lever record's baseline is not among them."""
    try:
        return lever_cases(records)
    except RecordError:
        return []


def run_fold(task: FoldTask) -> FoldResult:
    """Refit without the held-out records, then predict and judge each of them."""
    from lever.calibration.fit import fit
    from lever.calibration.predict import draw_params, predict_links

    res = fit(task.train, task.platform, task.base_sets, free=task.free, seeds=task.seeds,
              max_nfev=task.max_nfev, workers=1, start=task.start, cache=task.cache,
              fixed_jacobian=True)
    values = dict(zip(res.names, (float(v) for v in res.x), strict=True))
    bounds = {n: (task.free[n].lo, task.free[n].hi) for n in res.names}
    draws = draw_params(res.names, np.log(res.x), res.log_cov, task.param_samples, bounds)
    rel = discrepancy(res.rows) if task.with_discrepancy else 0.0
    sd_us = delta_discrepancy(res.rows, train_cases(task.train)) if task.with_discrepancy else 0.0
    rows = []
    for case in task.cases:
        assert case.record.sim is not None
        pred = predict_links(case.base_link, case.record.sim, task.base_sets, values, draws,
                             list(case.ops), seeds=task.pred_seeds)
        for op in case.ops:
            p = pred[op]
            band = widen(p["delta_us"], (p["band_us"][0], p["band_us"][1]), rel, sd_us)
            if op in task.run_noise:  # what the measurement of a delta adds, measured
                band = widen_by(p["delta_us"], band, delta_halfwidth(*task.run_noise[op]))
            p["band_us"] = list(band)
            rows.append(judge(case, op, p))
    return FoldResult(rows=rows, train=[r.id for r in task.train],
                      excluded=sorted({c.record.id for c in task.cases}), params=res.params(),
                      evaluations=res.evaluations, cost=res.cost, discrepancy=rel,
                      delta_discrepancy_us=sd_us)


def refusal(link: SimLink, base_sets: Mapping[str, Any]) -> str | None:
    """The model's one-line refusal of a run configuration, or None when it runs."""
    from lever.sim.errors import UserError
    from lever.sim.levers import load_with_levers
    from lever.sim.model import simulate_op

    try:
        scn = load_with_levers(link.scenario, link.levers, None, base={**base_sets, **link.set},
                               base_source="record sim.set")
        simulate_op(scn, scn.ops[0], 0)
    except UserError as e:
        return str(e)
    return None


@dataclass
class ValidateResult:
    rows: list[LeverRow]
    folds: list[FoldResult]
    start_params: dict[str, list[dict[str, Any]]]
    run_noise: dict[str, dict[str, Any]] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        out = contract(self.rows)
        out["run_noise"] = {nic: {op: {"sd_us": round(v["sd_us"], 3), "dof": v["dof"],
                                       "groups": v["groups"]} for op, v in ops.items()}
                            for nic, ops in sorted(self.run_noise.items())}
        return out

    def fits(self, wall_s: float | None = None) -> dict[str, Any]:
        """What the fits found (``--fits-out``): the start fit per NIC and each fold's refit."""
        return {"wall_s": None if wall_s is None else round(wall_s, 1), "start": self.start_params,
                "folds": [{"held_out": f.excluded, "train": f.train, "cost": f.cost,
                           "evaluations": f.evaluations, "discrepancy": round(f.discrepancy, 4),
                           "delta_discrepancy_us": round(f.delta_discrepancy_us, 2),
                           "params": f.params} for f in self.folds]}


def validate_levers(groups: Mapping[str, tuple[list[RunRecord], Platform, dict[str, Any]]], *,
                    seeds: int = 1, max_nfev: int = 3, start_nfev: int = 8, pred_seeds: int = 3,
                    param_samples: int = 8, with_discrepancy: bool = True,
                    run_noise: Mapping[str, Mapping[str, Mapping[str, Any]]] | None = None,
                    workers: int | None = None, executor: str = "local", address: str | None = None,
                    progress: Callable[[str, int, int], None] | None = None) -> ValidateResult:
    """Leave-one-out over the lever records of each group (NIC kind -> records, base platform,
    its overrides). ``max_nfev`` bounds each fold's refit, ``start_nfev`` the start fit;
    ``with_discrepancy`` widens each band by its refit's model discrepancy; ``run_noise``
    (:func:`lever.calibration.repro.run_noise`) by the measured run-to-run noise of its NIC."""
    noise_all = {k: dict(v) for k, v in (run_noise or {}).items()}
    from lever.calibration.fit import FitError, fit, warm_cache
    from lever.calibration.pool import imap_unordered

    tasks: list[FoldTask] = []
    rows: list[LeverRow] = []
    start_params: dict[str, list[dict[str, Any]]] = {}
    for nic, (records, plat, base_sets) in groups.items():
        cases = lever_cases(records)
        if not cases:
            continue
        refused = {}
        for c in cases:
            assert c.record.sim is not None
            why = refusal(c.record.sim, base_sets)
            if why is not None:
                refused[c.record.id] = why
                rows += [judge(c, op, None, why) for op in c.ops]
        cases = [c for c in cases if c.record.id not in refused]
        usable = [r for r in records if r.id not in refused and (r.sim is not None)]
        free = dict(plat.free)
        if not free:
            raise FitError(f"platform {plat.name}: no [platform.free] parameters to fit")
        lever_ids = {r.id for r in usable if r.what.levers}
        plain = [r for r in usable if r.id not in lever_ids]
        if not plain:
            raise FitError(f"{nic}: no record without levers to start the folds' fits from")
        if progress:
            progress(f"{nic}: start fit on {len(plain)} records", 0, 1)
        s = fit(plain, plat, base_sets, free=free, seeds=seeds, max_nfev=start_nfev, workers=workers)
        start = dict(zip(s.names, (float(v) for v in s.x), strict=True))
        start_params[nic] = s.params()
        cache = warm_cache(usable, plat, base_sets, free, start, seeds=seeds, workers=workers)
        for f in plan_folds(usable, cases):
            train = [r for r in usable if r.id not in f.excluded]
            tasks.append(FoldTask(train, list(f.cases), plat, base_sets, free, start, cache, seeds,
                                  max_nfev, pred_seeds, param_samples, with_discrepancy,
                                  {op: (float(v["sd_us"]), int(v["dof"])) for op, v in noise_all.get(nic, {}).items()}))
    folds: list[FoldResult] = []
    for i, (_k, fr) in enumerate(imap_unordered(run_fold, tasks, executor, workers, address), 1):
        folds.append(fr)
        rows += fr.rows
        if progress:
            progress(f"fold {', '.join(fr.excluded)}", i, len(tasks))
    order = {o: i for i, o in enumerate(OPS)}
    rows.sort(key=lambda r: (r.record, order.get(r.op, 9)))
    folds.sort(key=lambda f: f.excluded)
    return ValidateResult(rows, folds, start_params, noise_all)
