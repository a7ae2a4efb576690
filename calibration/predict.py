"""Predict a lever before it is built: baseline and lever on common random numbers.

For every seed s the baseline and the lever scenario run with the same seed
(the same routing, the same generator seed), and the per-seed p50 latency
(over ranks) gives a paired difference d_s. The predicted delta is the mean
of d_s, its noise band a Student-t interval of that mean. A no-op lever
therefore has a band of exactly zero; a real lever's band is narrower than
with unpaired seeds, because most seed noise (routing, jitter) cancels.

Parameter uncertainty: when the platform carries ``calibrated`` (names,
log_mean, log_cov), K parameter vectors are drawn from that multivariate
normal in log space and applied as ``--set`` overrides to *both* sides; the
spread of their deltas widens the band (``band_kind = "noise+params"``).
Otherwise the band is ``"noise-only"``.

Attribution: per op, profiler shares (all warps, and the put path) and the
one-run critical path (us per category of the p50 rank's chain, recorded in the
same runs: no reruns) of the baseline and the lever, so the reader sees
which category the lever moves.
"""

from __future__ import annotations

import datetime as _dt
import math
import os
import subprocess
from collections.abc import Callable, Mapping
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from lever.sim import levers as levers_mod
from lever.sim import scenario as scn_mod
from lever.sim.errors import UserError
from lever.sim.params import Scenario
from lever.sim.results import PUT_PATH, chain_at_p50, profiler_shares, stats
from lever.sim.scenario import Overrides

BAND_LEVEL = 0.90
PREREG_KIND = "lever-preregistration"
VERDICT_RULE = (
    "per op: measured delta (lever p50 - baseline p50, us) with its 90% band. "
    "inconclusive if the measured band is wider than the predicted band and contains one of its edges; "
    "else validated if the measured delta lies inside the predicted band [lo, hi]; "
    "else refuted (sign_flip flagged when the measured band lies entirely on the other side of zero "
    "from the predicted delta)."
)


def t_quantile(level: float, dof: int) -> float:
    """Two-sided Student-t quantile for a ``level`` interval."""
    from scipy.stats import t

    return float(t.ppf(0.5 + level / 2.0, dof))


def _side(scn: Scenario, seeds: list[int], with_cp: bool,
          runs: dict[tuple[str, int], Any] | None = None) -> dict[str, Any]:
    """Run one scenario on the given seeds; a picklable summary per op. ``runs`` holds the
    (op, seed) runs already made elsewhere (a pool's), else they are made here."""
    from lever.sim.model import simulate_op

    out: dict[str, Any] = {}
    for op in scn.ops:
        res = [runs[(op, s)] if runs is not None else simulate_op(scn, op, s, critical_path=with_cp)
               for s in seeds]
        lat = [x for r in res for x in r.latency_us]
        per_seed = [float(np.percentile(r.latency_us, 50)) for r in res]
        cnt: dict[str, int] = {}
        for r in res:
            for k, v in r.counters.items():
                cnt[k] = cnt.get(k, 0) + v
            for k, v in r.ledger.events.items():
                cnt[f"events_{k}"] = cnt.get(f"events_{k}", 0) + v
        side: dict[str, Any] = {
            "stats": stats(lat),
            "per_seed_p50": per_seed,
            "profiler": {k: float(v) for k, v in profiler_shares(res).items()},
            "put_path": {k: float(v) for k, v in profiler_shares(res, PUT_PATH).items()},
            "counters": cnt,
        }
        if with_cp:  # the one-run chain of the p50 rank: no reruns (sim/results.py)
            side["critical_path"] = {c: round(v, 4) for c, v in chain_at_p50(res).items()}
        out[op] = side
    return out


def _side_scenario(args: tuple) -> Scenario:
    baseline, lever_names, sets, _seeds, _with_cp, *rest = args
    return levers_mod.load_with_levers(baseline, lever_names, sets,
                                       variants=rest[0] if rest else None)


def _side_job(args: tuple) -> dict[str, Any]:
    return _side(_side_scenario(args), args[3], args[4])


_SCENARIOS: dict[str, Scenario] = {}  # a pool worker's scenarios, by their side's arguments


def _run_job(args: tuple[tuple, str, int]) -> Any:
    """One (op, seed) run of a side, in a pool worker: the side's scenario is loaded once per
    worker (a side's runs share it)."""
    side, op, seed = args
    key = repr(side)
    scn = _SCENARIOS.get(key)
    if scn is None:
        scn = _SCENARIOS[key] = _side_scenario(side)
    from lever.sim.model import simulate_op

    return simulate_op(scn, op, seed, critical_path=side[4])


def _noise_band(d: np.ndarray, level: float = BAND_LEVEL) -> float:
    """Half-width of the t-interval of the mean of paired differences."""
    n = len(d)
    if n < 2:
        return 0.0
    sd = float(np.std(d, ddof=1))
    if sd == 0.0:
        return 0.0
    return t_quantile(level, n - 1) * sd / math.sqrt(n)


def _welch_band(a: np.ndarray, b: np.ndarray, level: float = BAND_LEVEL) -> float:
    va, vb = np.var(a, ddof=1) / len(a), np.var(b, ddof=1) / len(b)
    se2 = float(va + vb)
    if se2 == 0.0:
        return 0.0
    dof = se2**2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    return t_quantile(level, max(1, int(dof))) * math.sqrt(se2)


def param_sets(scn: Scenario, k: int, rng_seed: int = 12345) -> list[dict[str, float]]:
    """K draws of the calibrated parameters as overrides ([] when uncalibrated)."""
    cal = scn.platform.calibrated
    if cal is None or k <= 0 or not cal.names:
        return []
    return draw_params(cal.names, cal.log_mean, cal.log_cov, k, rng_seed=rng_seed)


def cov_factor(cov: Any) -> np.ndarray:
    """A factor ``L`` of a covariance (``L @ L.T == cov``) that is the same on every machine.

    Why not ``Generator.multivariate_normal``: it factors by SVD, whose singular vectors'
    signs and order are the LAPACK build's choice, so one seed gave other draws (and other
    bands, some crossing zero on one machine and not on another) under another numpy. The
    Cholesky factor is unique; a covariance that is not positive definite (a parameter the
    data do not constrain, no prior) falls back to ``eigh`` with each eigenvector's sign fixed
    (its largest component positive) and negative eigenvalues set to 0."""
    c = np.asarray(cov, dtype=float)
    c = 0.5 * (c + c.T)
    try:
        return np.linalg.cholesky(c)
    except np.linalg.LinAlgError:
        w, v = np.linalg.eigh(c)
        cols = np.arange(v.shape[1])
        v = v * np.where(v[np.argmax(np.abs(v), axis=0), cols] < 0, -1.0, 1.0)
        return v * np.sqrt(np.clip(w, 0.0, None))


def draw_params(names: list[str], log_mean: Any, log_cov: Any, k: int,
                bounds: Mapping[str, tuple[float, float]] | None = None,
                rng_seed: int = 12345) -> list[dict[str, float]]:
    """K draws from a log-normal (a fit's estimate and covariance) as ``platform.*`` overrides.

    ``bounds`` clip each draw into the parameter's fit bounds: an unidentified parameter has a
    huge log variance, and a draw far outside the range the fit may use says nothing physical."""
    if k <= 0 or not names:
        return []
    rng = np.random.default_rng(rng_seed)
    mean = np.asarray(log_mean, dtype=float)
    draws = mean + rng.standard_normal((k, mean.size)) @ cov_factor(log_cov).T
    out = []
    for row in draws:
        draw = {}
        for name, v in zip(names, np.exp(row), strict=True):
            if bounds is not None and name in bounds:
                v = min(max(float(v), bounds[name][0]), bounds[name][1])
            path = name if name.startswith("platform.") else f"platform.{name}"
            draw[path] = float(v)
        out.append(draw)
    return out


def model_band(delta: float, band: tuple[float, float], sd_us: float | None) -> tuple[float, float]:
    """``band`` combined per side, in quadrature, with the 90% half-width of the calibration's
    own error on a lever delta (``platform.calibrated.delta_discrepancy_us``, a normal's sd):
    what the model misses by even at its best parameters, which no draw of them shows."""
    from lever.calibration.compare import Z90  # not at import: compare imports this module
    from lever.calibration.validate import widen_by

    return widen_by(delta, band, Z90 * sd_us) if sd_us else band


def combine_band(delta: float, hw: float, param_deltas: list[float]) -> tuple[float, float]:
    """The predicted band: the seed-noise half-width combined (in quadrature, per side) with the
    spread of the deltas over parameter draws (their 5-95% quantiles about their median)."""
    if not param_deltas:
        return delta - hw, delta + hw
    pd = np.asarray(param_deltas, dtype=float)
    q = (1 - BAND_LEVEL) / 2
    plo, phi = np.quantile(pd, [q, 1 - q]) if len(pd) > 1 else (pd[0], pd[0])
    pmid = float(np.median(pd))
    return (delta - math.hypot(hw, max(0.0, pmid - float(plo))),
            delta + math.hypot(hw, max(0.0, float(phi) - pmid)))


def paired_delta(base: dict, lev: dict, op: str, paired: bool = True) -> tuple[float, float]:
    """(delta, noise half-width) of p50 for one op."""
    b = np.asarray(base[op]["per_seed_p50"])
    x = np.asarray(lev[op]["per_seed_p50"])
    if paired:
        d = x - b
        return float(d.mean()), _noise_band(d)
    return float(x.mean() - b.mean()), _welch_band(x, b)


def attribution_shift(base: dict, lev: dict, op: str) -> dict[str, dict[str, float]]:
    """Per category: profiler share, put-path share and critical path (us), baseline vs lever."""
    cats = sorted(set(base[op]["profiler"]) | set(lev[op]["profiler"])
                  | set(base[op].get("critical_path", {})) | set(lev[op].get("critical_path", {})))
    from lever.sim.params import CATEGORIES

    order = {c: i for i, c in enumerate(CATEGORIES)}
    cats.sort(key=lambda c: order.get(c, 99))
    out = {}
    for c in cats:
        row = {
            "profiler_base": base[op]["profiler"].get(c, 0.0),
            "profiler_lever": lev[op]["profiler"].get(c, 0.0),
            "put_path_base": base[op]["put_path"].get(c, 0.0),
            "put_path_lever": lev[op]["put_path"].get(c, 0.0),
        }
        if "critical_path" in base[op]:
            row["cp_base_us"] = base[op]["critical_path"].get(c, 0.0)
            row["cp_lever_us"] = lev[op]["critical_path"].get(c, 0.0)
        out[c] = row
    return out


def main_shift(shift: dict[str, dict[str, float]]) -> tuple[str, str]:
    """The category the lever moves most: by critical path when present, else profiler share."""
    if not shift:
        return "", ""
    if any("cp_base_us" in r for r in shift.values()):
        c = max(shift, key=lambda k: abs(shift[k]["cp_lever_us"] - shift[k]["cp_base_us"]))
        r = shift[c]
        if abs(r["cp_lever_us"] - r["cp_base_us"]) < 1e-9:
            return "", "none"
        return c, f"{c} cp {r['cp_base_us']:+.1f}->{r['cp_lever_us']:+.1f} us"
    c = max(shift, key=lambda k: abs(shift[k]["profiler_lever"] - shift[k]["profiler_base"]))
    r = shift[c]
    if abs(r["profiler_lever"] - r["profiler_base"]) < 1e-9:
        return "", "none"
    return c, f"{c} {100 * r['profiler_base']:.1f}%->{100 * r['profiler_lever']:.1f}%"


def split_sets(lev: levers_mod.Lever, sets: Overrides) -> tuple[dict[str, Any], dict[str, Any]]:
    """(common, lever_only): an override of a field the lever itself sets re-parameterises the
    lever (e.g. ``design.doorbell_batch=4``) and applies to the lever side only; others to both.
    A field any runnable variant sets counts as the lever's."""
    own = set(lev.set)
    for v in lev.variants.values():
        own |= set(v.set or {})
    common = {k: v for k, v in sets.items() if k not in own}
    only = {k: v for k, v in sets.items() if k in own}
    return common, only


def predict(lever: str, seeds: int = 3, sets: Overrides | None = None, param_samples: int = 0,
            with_cp: bool = True, paired: bool = True, baseline: str | None = None,
            lever_names: list[str] | None = None, workers: int = 1,
            progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Baseline vs lever on common random numbers: the ``lever predict --json`` object.

    ``sets`` apply to both sides, except those naming a field the lever sets: those
    re-parameterise the lever (``--set design.doorbell_batch=4``) on the lever side only. ``lever_names=[]`` runs the baseline against itself.
    """
    lev = levers_mod.load_lever(lever)
    base_name = baseline or lev.baseline
    names = [lever] if lever_names is None else list(lever_names)
    sets = dict(sets or {})
    common, lever_only = split_sets(lev, sets) if names else (sets, {})
    base_scn = levers_mod.load_with_levers(base_name, [], common)
    lev_scn = levers_mod.load_with_levers(base_name, names, {**common, **lever_only})
    base_seeds = list(range(seeds))
    lev_seeds = base_seeds if paired else list(range(seeds, 2 * seeds))

    jobs = [(base_name, [], common, base_seeds, with_cp),
            (base_name, names, {**common, **lever_only}, lev_seeds, with_cp)]
    psets = param_sets(base_scn, param_samples)
    p_seeds = base_seeds[: max(1, min(2, seeds))]
    for ps in psets:
        jobs.append((base_name, [], {**common, **ps}, p_seeds, False))
        jobs.append((base_name, names, {**common, **lever_only, **ps}, p_seeds, False))
    # the other runnable variants: their lever side on the same seeds and draws (the baseline
    # sides are shared); the primary is the lever itself, already above
    others = [v for v, var in lev.variants.items() if var.runnable and v != lev.primary] \
        if lever_names is None else []
    # a variant this baseline's platform can not run (hw-counter counting on a NIC without
    # completion counters) is reported as refused with the reason, not run: the primary and
    # the other variants are still predicted
    refused: dict[str, str] = {}
    for v in list(others):
        try:
            levers_mod.load_with_levers(base_name, names, {**common, **lever_only}, variants={lever: v})
        except UserError as e:
            refused[v] = str(e)
            others.remove(v)
    first_var = len(jobs)
    for v in others:
        vmap = {lever: v}
        jobs.append((base_name, names, {**common, **lever_only}, lev_seeds, False, vmap))
        for ps in psets:
            jobs.append((base_name, names, {**common, **lever_only, **ps}, p_seeds, False, vmap))
    sides = _run_sides(jobs, workers, progress)
    base, levr = sides[0], sides[1]

    band_kind = "noise+params" if psets else "noise-only"
    cal = base_scn.platform.calibrated
    # the baseline against itself (no lever) is the same run twice: no model error between them
    sd_model = cal.delta_discrepancy_us if cal is not None and names else None
    if sd_model:
        band_kind += "+model"
    ops: dict[str, Any] = {}
    for op in base_scn.ops:
        delta, hw = paired_delta(base, levr, op, paired)
        lo, hi = delta - hw, delta + hw
        row: dict[str, Any] = {
            "baseline_p50_us": round(base[op]["stats"]["p50_us"], 4),
            "lever_p50_us": round(levr[op]["stats"]["p50_us"], 4),
            "baseline_p99_us": round(base[op]["stats"]["p99_us"], 4),
            "lever_p99_us": round(levr[op]["stats"]["p99_us"], 4),
            "delta_us": round(delta, 4),
            "noise_halfwidth_us": round(hw, 4),
            "per_seed_delta_us": [round(b - a, 4) for a, b in
                                  zip(base[op]["per_seed_p50"], levr[op]["per_seed_p50"], strict=True)],
        }
        if psets:
            pd = [sides[2 + 2 * i + 1][op]["stats"]["p50_us"] - sides[2 + 2 * i][op]["stats"]["p50_us"]
                  for i in range(len(psets))]
            lo, hi = combine_band(delta, hw, pd)
            row["param_deltas_us"] = [round(float(v), 4) for v in pd]
        lo, hi = model_band(delta, (lo, hi), sd_model)
        row["band_us"] = [round(lo, 4), round(hi, 4)]
        row["attribution"] = attribution_shift(base, levr, op)
        row["main_shift"] = main_shift(row["attribution"])[1]
        row["counters_baseline"] = base[op]["counters"]
        row["counters_lever"] = levr[op]["counters"]
        ops[op] = row
    variants: dict[str, Any] = {}
    for name, var in (lev.variants.items() if lever_names is None else ()):
        entry: dict[str, Any] = {"description": var.description, "source": var.source,
                                 "runnable": var.runnable}
        if not var.runnable:
            entry["needs"] = var.needs
        elif name in refused:  # not on this platform: reported as a variant that can not run
            entry["runnable"] = False
            entry["needs"] = f"a platform that runs it (here: {refused[name]})"
        elif name == lev.primary:
            entry["ops"] = {op: {k: ops[op][k] for k in ("lever_p50_us", "delta_us", "band_us")}
                            for op in ops}
        else:
            i = first_var + others.index(name) * (1 + len(psets))
            vside = sides[i]
            vops = {}
            for op in base_scn.ops:
                delta, hw = paired_delta(base, vside, op, paired)
                pd = [sides[i + 1 + j][op]["stats"]["p50_us"] - sides[2 + 2 * j][op]["stats"]["p50_us"]
                      for j in range(len(psets))]
                lo, hi = model_band(delta, combine_band(delta, hw, pd), sd_model)
                vops[op] = {"lever_p50_us": round(vside[op]["stats"]["p50_us"], 4),
                            "delta_us": round(delta, 4), "band_us": [round(lo, 4), round(hi, 4)]}
            entry["ops"] = vops
        variants[name] = entry
    return {
        "lever": lever,
        "levers_applied": names,
        "baseline": base_name,
        "sets": common,
        "lever_only_sets": lever_only,
        "lever_sets": {k: v for k, v in lev.set.items()} if lever_names is None else {},
        "description": lev.description,
        "platform": base_scn.platform.name,
        "platform_digest": scn_mod.platform_digest(base_scn),
        "lever_scenario_digest": scn_mod.digest(lev_scn.model_dump(mode="json")),
        "seeds": seeds,
        "paired": paired,
        "param_samples": len(psets),
        "band_kind": band_kind,
        "band_level": BAND_LEVEL,
        "critical_path": with_cp,
        "ops": ops,
        "primary": lev.primary if lever_names is None else None,
        "primary_why": lev.primary_why if lever_names is None else None,
        "variants": variants,
    }


def _run_sides(jobs: list[tuple], workers: int,
               progress: Callable[[int, int], None] | None) -> list[dict[str, Any]]:
    """Every side in order; ``progress(done, total)`` counts runs. With ``workers`` > 1 one
    process pool takes every (side, op, seed) run of the command, so the runs balance over
    the cores however few sides there are (a baseline and a lever are two); each side is
    summarised from its runs exactly as a serial loop would."""
    if workers <= 1 or len(jobs) <= 1:
        out: list[dict[str, Any]] = []
        for j in jobs:
            out.append(_side_job(j))
            if progress:
                progress(len(out), len(jobs))
        return out
    scns = [_side_scenario(j) for j in jobs]
    units = [(j, op, s) for j, scn in zip(jobs, scns, strict=True) for op in scn.ops for s in j[3]]
    done: list[Any] = []
    with ProcessPoolExecutor(max_workers=min(workers, len(units))) as ex:
        for r in ex.map(_run_job, units, chunksize=1):
            done.append(r)
            if progress:
                progress(len(done), len(units))
    runs: list[dict[tuple[str, int], Any]] = [{} for _ in jobs]
    k = 0
    for i, (j, scn) in enumerate(zip(jobs, scns, strict=True)):
        for op in scn.ops:
            for s in j[3]:
                runs[i][(op, s)] = done[k]
                k += 1
    return [_side(scn, j[3], j[4], runs[i]) for i, (j, scn) in enumerate(zip(jobs, scns, strict=True))]


def predict_all(seeds: int = 2, with_cp: bool = False,
                sets: Overrides | None = None, workers: int | None = None,
                progress: Callable[[int, int], None] | None = None) -> list[dict[str, Any]]:
    """Every lever on its baseline; baselines shared; runs in a process pool. Sorted by gain."""
    workers = workers or os.cpu_count() or 1
    names = levers_mod.all_levers()
    if not names:
        raise UserError(f"predict --all: no lever files in {levers_mod.LEVER_DIR}")
    levs = {n: levers_mod.load_lever(n) for n in names}
    seeds_l = list(range(seeds))
    baselines = sorted({lv.baseline for lv in levs.values()})
    sets = dict(sets or {})
    jobs = [(b, [], sets, seeds_l, with_cp) for b in baselines]
    jobs += [(levs[n].baseline, [n], sets, seeds_l, with_cp) for n in names]
    errors: dict[str, str] = {}
    with ProcessPoolExecutor(max_workers=workers) as ex:
        futs = [ex.submit(_side_job, j) for j in jobs]
        sides = []
        for j, f in zip(jobs, futs, strict=True):
            try:
                sides.append(f.result())
            except Exception as e:  # a lever the model refuses: reported, not fatal
                sides.append(None)
                errors[j[1][0] if j[1] else j[0]] = f"{type(e).__name__}: {e}"
            if progress:
                progress(len(sides), len(jobs))
    base_of = dict(zip(baselines, sides[: len(baselines)], strict=True))
    rows = []
    for n, side in zip(names, sides[len(baselines):], strict=True):
        b = base_of[levs[n].baseline]
        row: dict[str, Any] = {"lever": n, "baseline": levs[n].baseline, "ops": {}}
        if side is None or b is None:
            row["error"] = errors.get(n) or errors.get(levs[n].baseline, "failed")
            rows.append(row)
            continue
        for op in b:
            delta, hw = paired_delta(b, side, op)
            shift = attribution_shift(b, side, op)
            row["ops"][op] = {
                "baseline_p50_us": round(b[op]["stats"]["p50_us"], 4),
                "lever_p50_us": round(side[op]["stats"]["p50_us"], 4),
                "delta_us": round(delta, 4),
                "band_us": [round(delta - hw, 4), round(delta + hw, 4)],
                "main_shift": main_shift(shift)[1],
            }
        row["gain_us"] = round(-sum(v["delta_us"] for v in row["ops"].values()), 4)
        rows.append(row)
    rows.sort(key=lambda r: -r.get("gain_us", -math.inf))
    return rows


# -- preregistration ----------------------------------------------------------------

def git_rev() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                              cwd=Path(__file__).resolve().parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def content_sha256(obj: dict[str, Any]) -> str:
    """sha256 of the preregistration's canonical JSON without its ``sha256`` field."""
    return scn_mod.digest({k: v for k, v in obj.items() if k != "sha256"})


def preregistration(pred: dict[str, Any]) -> dict[str, Any]:
    """The record written by ``--out``: what is predicted, how it will be judged, sealed by sha256."""
    obj: dict[str, Any] = {
        "kind": PREREG_KIND,
        "lever": pred["lever"],
        "baseline": pred["baseline"],
        "sets": pred["sets"],
        "lever_only_sets": pred["lever_only_sets"],
        "lever_sets": pred["lever_sets"],
        "platform": pred["platform"],
        "platform_digest": pred["platform_digest"],
        "seeds": pred["seeds"],
        "param_samples": pred["param_samples"],
        "band_kind": pred["band_kind"],
        "band_level": pred["band_level"],
        "predictions": {
            op: {k: r[k] for k in ("baseline_p50_us", "lever_p50_us", "delta_us", "band_us")}
            for op, r in pred["ops"].items()
        },
        # every variant is sealed with the primary: a later measurement may support any of them
        "primary": pred.get("primary"),
        "primary_why": pred.get("primary_why"),
        "variants": {
            name: ({"runnable": True, "source": v["source"],
                    "predictions": {op: {k: r[k] for k in ("lever_p50_us", "delta_us", "band_us")}
                                    for op, r in v["ops"].items()}}
                   if v["runnable"] else {"runnable": False, "source": v["source"], "needs": v["needs"]})
            for name, v in pred.get("variants", {}).items()
        },
        "verdict_rule": VERDICT_RULE,
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "git_rev": git_rev(),
    }
    obj["sha256"] = content_sha256(obj)
    return obj


# -- a record's lever, on fitted parameters (lever validate --levers) -------------------

def _link_side(args: tuple) -> dict[str, Any]:
    scenario, lever_names, base, overrides, seeds = args
    scn = levers_mod.load_with_levers(scenario, lever_names, overrides, base=base,
                                      base_source="record sim.set")
    return _side(scn, seeds, False)


def predict_links(base_link: Any, lever_link: Any, base_sets: Mapping[str, Any],
                  values: Mapping[str, float], draws: list[dict[str, float]], ops: list[str],
                  seeds: int = 3, workers: int = 1) -> dict[str, dict[str, Any]]:
    """Per op: the delta between two of a record's run configurations (``SimLink``: scenario,
    levers, ``set``), lever minus baseline, on common seeds, at fitted ``values`` (dotted
    platform paths), with the band of :func:`predict`: seed noise of the paired per-seed p50
    differences, widened by the deltas over parameter ``draws`` (:func:`draw_params`).

    Layering is the fitter's (``fit.run_job``): the base platform (``base_sets``), the record's
    ``set``, its levers, then the parameters, so the prediction runs the very model the fit
    saw."""
    fitted = {f"platform.{k}": float(v) for k, v in values.items()}
    sel = {"ops": list(ops)}
    all_seeds = list(range(seeds))
    p_seeds = all_seeds[: max(1, min(2, seeds))]

    def job(link: Any, params: dict[str, float], s: list[int]) -> tuple:
        return (link.scenario, list(link.levers), {**base_sets, **link.set}, {**params, **sel}, s)

    jobs = [job(base_link, fitted, all_seeds), job(lever_link, fitted, all_seeds)]
    for d in draws:
        jobs += [job(base_link, {**fitted, **d}, p_seeds), job(lever_link, {**fitted, **d}, p_seeds)]
    if workers > 1 and len(jobs) > 1:
        with ProcessPoolExecutor(max_workers=min(workers, len(jobs))) as ex:
            sides = list(ex.map(_link_side, jobs))
    else:
        sides = [_link_side(j) for j in jobs]
    out: dict[str, dict[str, Any]] = {}
    for op in ops:
        delta, hw = paired_delta(sides[0], sides[1], op)
        pd = [sides[2 + 2 * i + 1][op]["stats"]["p50_us"] - sides[2 + 2 * i][op]["stats"]["p50_us"]
              for i in range(len(draws))]
        lo, hi = combine_band(delta, hw, pd)
        out[op] = {"baseline_p50_us": float(sides[0][op]["stats"]["p50_us"]),
                   "lever_p50_us": float(sides[1][op]["stats"]["p50_us"]),
                   "delta_us": delta, "noise_halfwidth_us": hw, "band_us": [lo, hi],
                   "param_deltas_us": [float(v) for v in pd]}
    return out
