"""One calibration over every platform's records at once, shared parameters tied.

``lever calibrate --joint`` fits the records of several NICs together (the IB reference,
the EFA campaign, the emulated-NIC EP records): each record runs on the base platform of
its NIC (:data:`BASE_PLATFORM`), and

- a free parameter that the platforms' GPU-class file sets (``scenarios/gpus/CLASS.toml``:
  the GPU-side costs of every Hopper platform) is *one* parameter for every platform of
  that class: the records of all of them pull on the same value;
- any other free parameter is fitted per platform, named ``PATH@PLATFORM`` in the fit
  (what physically differs: NIC, fabric, host, where a queue lives).

The bounds of a shared parameter are the tightest of the platforms'; its prior is the
class file's. The result says, per parameter, which records constrain it
(:meth:`FitResult.constrained_by`); one no record constrains stays at its prior, and the
report says so. Each platform's calibrated file is then written as a single fit writes
it, with its own parameters and the shared ones, and their covariance block.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from lever.calibration.fit import (
    GROUP_SEP,
    FitError,
    FitResult,
    Job,
    _canonical,
    _get,
    fit,
    flatten_platform,
    plan_jobs,
)
from lever.calibration.paramtable import load_class
from lever.calibration.records import BASE_PLATFORM, RunRecord
from lever.sim.params import FreeParam, Platform


@dataclass
class Group:
    """One platform of a joint fit: its base platform and its records."""

    name: str
    platform: Platform
    base_sets: dict[str, Any]
    records: list[RunRecord]


@dataclass
class JointPlan:
    groups: list[Group]
    free: dict[str, FreeParam]
    start: dict[str, float]
    jobs: list[Job]
    shared: list[str]


def plan(groups: list[Group], warm: Mapping[str, Platform] | None = None) -> JointPlan:
    """Name every free parameter (shared or ``PATH@PLATFORM``) and plan one job per distinct
    simulation of each platform's records. ``warm`` (group name -> a platform, e.g. its last
    calibrated file) gives start values where it has them: a local fit then starts near the
    last optimum instead of at the hand-set values."""
    warm = warm or {}
    if not groups:
        raise FitError("joint fit: no records")
    free: dict[str, FreeParam] = {}
    start: dict[str, float] = {}
    shared: set[str] = set()
    for g in groups:
        plat = g.platform
        cls = load_class(plat.gpu_class)
        for path, fp in plat.free.items():
            if path in cls.values:  # one parameter for the class: the common range, the class's prior
                cf = cls.free.get(path, fp)
                prev = free.get(path)
                lo = max(fp.lo, cf.lo, prev.lo if prev else fp.lo)
                hi = min(fp.hi, cf.hi, prev.hi if prev else fp.hi)
                if not lo < hi:
                    raise FitError(f"joint fit: {path}: the platforms' ranges do not overlap")
                free[path] = FreeParam(lo=lo, hi=hi, prior=cf.prior)
                start.setdefault(path, _start(plat, warm.get(g.name), path))
                shared.add(path)
            else:
                name = f"{path}{GROUP_SEP}{g.name}"
                free[name] = fp
                start[name] = _start(plat, warm.get(g.name), path)
    jobs: list[Job] = []
    for g in groups:  # each platform's simulations, run on its base platform
        base = tuple(sorted(g.base_sets.items()))
        jobs += [replace(j, group=g.name, base=base) for j in plan_jobs(g.records)]
    keys = [j.key() for j in jobs]
    if len(set(keys)) != len(keys):
        dup = next(k for k in keys if keys.count(k) > 1)
        raise FitError(f"joint fit: two platforms' records share one simulation {dup[0]} "
                       f"{_canonical(dup[2])}: give each its own scenario")
    return JointPlan(groups, free, start, jobs, sorted(shared))


def _start(plat: Platform, warm: Platform | None, path: str) -> float:
    if warm is not None:
        from lever.sim.params import parameter_value

        v = parameter_value(warm, path)
        if v is not None and v > 0:
            return v
    return _get(plat, path)


def warm_starts(groups: list[Group]) -> dict[str, Platform]:
    """Each group's shipped calibrated platform (``scenarios/platforms/<base>-calibrated.toml``)
    where there is one that loads."""
    from lever.calibration.paramtable import load_platform
    from lever.sim import scenario as scn_mod

    out: dict[str, Platform] = {}
    for g in groups:
        p = scn_mod.SCENARIO_DIR / "platforms" / f"{g.name}-calibrated.toml"
        if p.is_file():
            try:
                out[g.name] = load_platform(p).platform
            except scn_mod.ScenarioError:
                continue
    return out


def joint_fit(groups: list[Group], seeds: int = 1, max_nfev: int = 10, workers: int | None = None,
              progress: Callable[[int, int], None] | None = None,
              warm: Mapping[str, Platform] | None = None) -> tuple[JointPlan, FitResult]:
    p = plan(groups, warm)
    records = [r for g in groups for r in g.records]
    res = fit(records, groups[0].platform, {}, free=p.free, seeds=seeds, max_nfev=max_nfev,
              workers=workers, progress=progress, jobs=p.jobs, start=p.start)
    return p, res


def group_result(res: FitResult, group: Group, shared: list[str]) -> FitResult:
    """The part of a joint result one platform's calibrated file carries: its own parameters
    (suffix dropped) and the shared ones, with their block of the covariance."""
    idx, names = [], []
    for i, n in enumerate(res.names):
        path, sep, g = n.partition(GROUP_SEP)
        if (not sep and n in shared) or g == group.name:
            idx.append(i)
            names.append(path)
    ix = np.array(idx, dtype=int)
    rows = [r for r in res.rows if r.record in {rec.id for rec in group.records}]
    return FitResult(
        names=names, x=res.x[ix], log_cov=res.log_cov[np.ix_(ix, ix)], se_log=res.se_log[ix],
        corr=res.corr[np.ix_(ix, ix)],
        unidentifiable=[p for i, p in zip(idx, names, strict=True) if res.names[i] in res.unidentifiable],
        at_bound=[p for i, p in zip(idx, names, strict=True) if res.names[i] in res.at_bound],
        cost=res.cost, rows=rows, evaluations=res.evaluations, wall_s=res.wall_s, nfev=res.nfev,
        status=res.status, priors={p: group.platform.free[p] for p in names if p in group.platform.free})


def report(plan_: JointPlan, res: FitResult) -> dict[str, Any]:
    """The identifiability report: per parameter its estimate, whether it is shared, which
    records constrain it, and whether it stayed at its prior for want of any."""
    by = res.constrained_by()
    out = []
    for p in res.params():
        n = p["name"]
        recs = by.get(n, [])
        out.append({**p, "shared": n in plan_.shared, "constrained_by": recs,
                    "at_prior": not recs})
    return {"params": out, "groups": {g.name: [r.id for r in g.records] for g in plan_.groups}}


def resolve_groups(records: list[RunRecord], bases: Mapping[str, str] | None = None) -> list[Group]:
    """Group records by NIC onto their base platforms (``bases`` overrides :data:`BASE_PLATFORM`)."""
    from lever.calibration.paramtable import load_platform

    bases = {**BASE_PLATFORM, **(bases or {})}
    groups: dict[str, Group] = {}
    for r in records:
        if r.nic not in bases:
            raise FitError(f"record {r.id}: no base platform for nic '{r.nic}' (give --base {r.nic}=TOML)")
        path = bases[r.nic]
        if path not in groups:
            lp = load_platform(path)
            plat = lp.platform
            groups[path] = Group(Path(path).stem, plat, flatten_platform(plat.model_dump(mode="json")), [])
        groups[path].records.append(r)
    return list(groups.values())
