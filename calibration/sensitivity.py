"""Global sensitivity of a lever's predicted delta to the platform's free parameters (SALib).

The output is the lever's predicted delta per op, exactly as ``lever predict``
computes it: lever p50 minus baseline p50 on common random numbers (the same
seeds on both sides), averaged over seeds. The inputs are the platform's
parameters within their ranges, in log space:

- calibrated platform (``platform.calibrated``): each parameter in
  ``log_mean ± k·sigma`` (k = ``sigmas``, sigma from the diagonal of
  ``log_cov``);
- otherwise the ``[platform.free]`` bounds ``[lo, hi]``, log-uniform.

Morris elementary effects (cheap: r·(D+1) model evaluations, each a baseline
and a lever run) rank the parameters by mu* (mean absolute effect on the
delta, us); Sobol (Saltelli sampling, N·(2D+2) evaluations) gives first-order
and total indices. A parameter the lever's path never reads has every effect
exactly 0: with common random numbers both sides see the same change.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from lever.calibration import predict as pr
from lever.calibration.pool import imap_unordered
from lever.sim import levers as levers_mod
from lever.sim.errors import UserError
from lever.sim.params import Scenario
from lever.sim.scenario import Overrides


class SensitivityError(UserError):
    """A sensitivity analysis that can not be set up: one line for the user."""


def parameter_space(scn: Scenario, sigmas: float = 2.0,
                    extra: Sequence[tuple[str, float, float]] = (),
                    only_extra: bool = False) -> list[dict[str, Any]]:
    """``[{name, path, log_lo, log_hi, lo, hi, source, integer}]`` for the platform's parameters,
    plus ``extra`` ranges ``(path, lo, hi)`` (log-uniform, lo > 0; replacing a parameter of the
    same name)."""
    plat = scn.platform
    out = []
    added = []
    for path, lo, hi in extra:
        if not 0 < lo < hi:
            raise SensitivityError(f"--param {path}: needs 0 < LO < HI (log-uniform), got {lo}:{hi}")
        added.append(_param(scn, path, math.log(lo), math.log(hi), "--param"))
    if only_extra:
        plat = plat.model_copy(update={"calibrated": None, "free": {}})
    if plat.calibrated is not None and plat.calibrated.names:
        cal = plat.calibrated
        cov = np.asarray(cal.log_cov, dtype=float)
        for i, name in enumerate(cal.names):
            sd = math.sqrt(max(float(cov[i, i]), 0.0))
            mu = float(cal.log_mean[i])
            lo, hi, src = mu - sigmas * sd, mu + sigmas * sd, f"calibrated ±{sigmas:g}σ"
            fp = plat.free.get(name.removeprefix("platform."))
            if fp is not None and (lo < math.log(fp.lo) or hi > math.log(fp.hi)):
                # a poorly identified parameter's ±σ can leave the physically possible range:
                # the platform's free bounds say what that range is
                lo, hi = max(lo, math.log(fp.lo)), min(hi, math.log(fp.hi))
                src += ", clipped to the free bounds"
            out.append(_param(scn, name, lo, hi, src))
    else:
        for name, fp in plat.free.items():
            out.append(_param(scn, name, math.log(fp.lo), math.log(fp.hi), "free bounds"))
    names = {p["name"] for p in added}
    out = [p for p in out if p["name"] not in names] + added
    if not out:
        raise SensitivityError(f"platform {plat.name}: no calibrated or free parameters to vary (add --param)")
    return out


def _param(scn: Scenario, name: str, log_lo: float, log_hi: float, source: str) -> dict[str, Any]:
    rel = name.removeprefix("platform.")
    obj: Any = scn.platform
    for k in rel.split("."):
        obj = getattr(obj, k, None)
        if obj is None:
            raise SensitivityError(f"platform parameter '{name}': no such field")
    if log_hi <= log_lo:  # zero variance: a sliver around the value so SALib accepts it
        log_lo, log_hi = log_lo - 1e-9, log_hi + 1e-9
    return {"name": rel, "path": f"platform.{rel}", "log_lo": log_lo, "log_hi": log_hi,
            "lo": math.exp(log_lo), "hi": math.exp(log_hi), "source": source,
            "integer": isinstance(obj, int) and not isinstance(obj, bool)}


def _sets(space: list[dict[str, Any]], row: np.ndarray) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for p, x in zip(space, row, strict=True):
        v = math.exp(float(x))
        out[p["path"]] = max(1, round(v)) if p["integer"] else v
    return out


def _eval(job: tuple) -> dict[str, float]:
    """One sample: baseline and lever on the same seeds; the mean paired p50 delta per op."""
    base_name, names, common, lever_only, ps, seeds = job
    b = pr._side_job((base_name, [], {**common, **ps}, seeds, False))
    x = pr._side_job((base_name, names, {**common, **lever_only, **ps}, seeds, False))
    return {op: pr.paired_delta(b, x, op)[0] for op in b}


def sensitivity(lever: str, method: str = "morris", n: int | None = None, seeds: int = 1,
                sets: Overrides | None = None, sigmas: float = 2.0, num_levels: int = 4,
                executor: str = "local", workers: int | None = None, address: str | None = None,
                rng_seed: int = 0, params: Sequence[tuple[str, float, float]] = (),
                params_only: bool = False,
                progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Sensitivity of ``lever``'s predicted delta (per op) to the platform parameters;
    ``progress(done, total)`` after each sample."""
    if method not in ("morris", "sobol"):
        raise SensitivityError(f"--method: '{method}': expected morris or sobol")
    if seeds < 1:
        raise SensitivityError("--seeds: must be >= 1")
    try:
        import SALib  # noqa: F401
    except ImportError:
        raise SensitivityError("sensitivity: SALib is not installed (pip install -e '.[dist]')") from None
    lev = levers_mod.load_lever(lever)
    common, lever_only = pr.split_sets(lev, dict(sets or {}))
    base_scn = levers_mod.load_with_levers(lev.baseline, [], common)
    levers_mod.load_with_levers(lev.baseline, [lever], {**common, **lever_only})  # fail early
    space = parameter_space(base_scn, sigmas, params, params_only)
    problem = {"num_vars": len(space), "names": [p["name"] for p in space],
               "bounds": [[p["log_lo"], p["log_hi"]] for p in space]}
    if method == "morris":
        from SALib.sample import morris as sampler

        n = n or 4
        X = sampler.sample(problem, n, num_levels=num_levels, seed=rng_seed)
    else:
        from SALib.sample import sobol as sampler

        n = n or 8
        if n & (n - 1):
            raise SensitivityError(f"--n: {n}: Sobol needs a power of two")
        X = sampler.sample(problem, n, calc_second_order=False, seed=rng_seed)
    seed_list = list(range(seeds))
    jobs = [(lev.baseline, [lever], common, lever_only, _sets(space, row), seed_list) for row in X]
    for j in jobs:  # validate every sample before the runs
        levers_mod.load_with_levers(lev.baseline, [lever], {**common, **lever_only, **j[4]})

    t0 = time.perf_counter()
    results: list[dict[str, float] | None] = [None] * len(jobs)
    for k, (i, r) in enumerate(imap_unordered(_eval, jobs, executor, workers, address), 1):
        results[i] = r
        if progress is not None:
            progress(k, len(jobs))
    ops = list(results[0]) if results and results[0] else []
    out_ops: dict[str, Any] = {}
    for op in ops:
        Y = np.asarray([r[op] for r in results], dtype=float)
        rows = _analyze(method, problem, X, Y, num_levels, rng_seed)
        for p, row in zip(space, rows, strict=True):
            row.update({"lo": p["lo"], "hi": p["hi"]})
        rows.sort(key=lambda r: -r["score"])
        out_ops[op] = {"delta_mean_us": round(float(Y.mean()), 4),
                       "delta_sd_us": round(float(Y.std(ddof=1)) if len(Y) > 1 else 0.0, 4),
                       "delta_range_us": [round(float(Y.min()), 4), round(float(Y.max()), 4)],
                       "ranking": rows}
    return {"lever": lever, "baseline": lev.baseline, "method": method, "n": n,
            "evaluations": len(jobs), "model_runs": 2 * len(jobs) * seeds, "seeds": seeds,
            "sets": dict(sets or {}), "platform": base_scn.platform.name,
            "space": [{k: p[k] for k in ("name", "lo", "hi", "source")} for p in space],
            "score": "mu_star_us" if method == "morris" else "ST",
            "wall_s": round(time.perf_counter() - t0, 3), "ops": out_ops}


def _analyze(method, problem, X, Y, num_levels, rng_seed) -> list[dict[str, Any]]:
    names = problem["names"]
    if float(np.ptp(Y)) == 0.0:  # the delta never moves: every index is exactly 0
        zero = {"mu_star_us": 0.0, "mu_us": 0.0, "sigma_us": 0.0, "mu_star_conf_us": 0.0} \
            if method == "morris" else {"S1": 0.0, "S1_conf": 0.0, "ST": 0.0, "ST_conf": 0.0}
        return [{"name": nm, **zero, "score": 0.0} for nm in names]
    if method == "morris":
        from SALib.analyze import morris

        a = morris.analyze(problem, X, Y, num_levels=num_levels, seed=rng_seed, print_to_console=False)
        # X is in log space: mu* is the delta's change (us) per elementary step of 1/(levels-1)
        # of the log range
        return [{"name": nm, "mu_star_us": _f(a["mu_star"][i]), "mu_us": _f(a["mu"][i]),
                 "sigma_us": _f(a["sigma"][i]), "mu_star_conf_us": _f(a["mu_star_conf"][i]),
                 "score": _f(a["mu_star"][i])} for i, nm in enumerate(names)]
    from SALib.analyze import sobol

    a = sobol.analyze(problem, Y, calc_second_order=False, seed=rng_seed, print_to_console=False)
    return [{"name": nm, "S1": _f(a["S1"][i]), "S1_conf": _f(a["S1_conf"][i]), "ST": _f(a["ST"][i]),
             "ST_conf": _f(a["ST_conf"][i]), "score": _f(a["ST"][i])} for i, nm in enumerate(names)]


def _f(v: Any) -> float:
    v = float(v)
    return round(v, 6) if math.isfinite(v) else 0.0
