"""A platform's parameters with their provenance, and the defects that provenance shows.

``lever params PLATFORM`` prints, for every numeric parameter: the value, its unit, a
1-sigma relative uncertainty, its kind (measured, published, fitted, assumed; plus
*shared* when the value comes from the platform's GPU-class file under
``scenarios/gpus/``) and its source. The uncertainty of a fitted value comes from the
calibration's covariance; of any other from its source's ``rel_sigma``.

What it reports as a model defect instead of hiding it:

- a fitted value at a bound of its free range (the model wanted to go further), or
  more than 1.5 prior sigmas from its prior;
- a fitted value the records did not identify (it stays where its prior put it);
- a shared GPU-side parameter whose value on this platform differs from another
  platform of the same GPU class beyond both uncertainties (2 sigma in log space:
  calibrated platforms against calibrated ones, hand-set against hand-set), or, where
  it was not fitted, from the class file's own value;
- a parameter with no source at all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from lever.calibration.fit import UNIDENTIFIABLE_CORR, correlation
from lever.sim import scenario as scn_mod
from lever.sim.params import FreeParam, Platform, parameter_value

GPUS = "gpus"
"""The folder of GPU-class files under ``scenarios/``: what every platform of a class shares."""

DISAGREE_SIGMAS = 2.0
FAR_FROM_PRIOR_SIGMAS = 1.5
AT_BOUND_LOG = 1e-3

UNITS: tuple[tuple[str, str], ...] = (
    ("_gbytes_per_s", "GB/s"), ("_gbps", "Gb/s"), ("_ns_per_kib", "ns/KiB"), ("_ns", "ns"),
    ("_bytes", "B"), ("_mops", "M/s"), ("_prob", "1"), ("sigma", "1"),
)


def unit_of(path: str) -> str:
    """The unit a parameter's name carries (``gpu.fence_ns`` -> ns); counts have none."""
    for suffix, unit in UNITS:
        if path.endswith(suffix):
            return unit
    return ""


@dataclass
class ParamRow:
    """One parameter of a platform, as ``lever params`` shows it."""

    path: str
    value: float
    unit: str
    rel_sigma: float | None
    kind: str
    shared: str
    source: str
    defects: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "value": self.value, "unit": self.unit,
                "rel_sigma": None if self.rel_sigma is None else round(self.rel_sigma, 4),
                "kind": self.kind, "shared": self.shared, "source": self.source,
                "defects": self.defects}


@dataclass
class LoadedPlatform:
    """A platform with where each of its values was set (file per dotted path)."""

    platform: Platform
    origin: dict[str, str]
    path: Path


def load_platform(name_or_path: str | Path) -> LoadedPlatform:
    """A platform file (name under ``scenarios/platforms/`` or a path), includes resolved."""
    try:
        path = scn_mod.resolve(name_or_path, kind="platforms")
    except scn_mod.ScenarioError:
        known = ", ".join(sorted(p.stem for p in (scn_mod.SCENARIO_DIR / "platforms").glob("*.toml")))
        raise scn_mod.ScenarioError(f"{name_or_path}: no such platform (known: {known})") from None
    origin: dict = {}
    data = scn_mod.load_fragment(path, origin)
    if "platform" not in data:
        raise scn_mod.ScenarioError(f"{path}: platform: missing [platform] table")
    try:
        plat = Platform.model_validate(data["platform"])
    except Exception as e:  # pydantic ValidationError -> one line naming the field
        errs = getattr(e, "errors", None)
        if errs:
            err = errs()[0]
            loc = ".".join(["platform", *(str(x) for x in err["loc"])])
            raise scn_mod.ScenarioError(f"{path}: {loc}: {err['msg']}") from None
        raise
    where = {".".join(k[1:]): v for k, v in origin.items() if k and k[0] == "platform"}
    return LoadedPlatform(plat, where, path)


def _log_sigma(plat: Platform, path: str) -> float | None:
    cal = plat.calibrated
    src = plat.sources.get(path)
    if cal is not None and path in cal.names and (src is None or src.kind == "fitted"):
        i = cal.names.index(path)
        var = cal.log_cov[i][i]
        return math.sqrt(var) if var >= 0 and math.isfinite(var) else None
    return src.rel_sigma if src is not None else None


def _partner(plat: Platform, path: str,
             threshold: float = UNIDENTIFIABLE_CORR) -> tuple[str, float] | None:
    """The calibrated parameter ``path`` is most correlated with, when beyond ``threshold``
    (the fit's own test): the records then move only a combination of the two."""
    cal = plat.calibrated
    if cal is None or path not in cal.names:
        return None
    i = cal.names.index(path)
    row = correlation(np.asarray(cal.log_cov, dtype=float))[i]
    best: tuple[str, float] | None = None
    for j, other in enumerate(cal.names):
        c = float(row[j])
        if j != i and abs(c) > threshold and (best is None or abs(c) > abs(best[1])):
            best = (other, c)
    return best


@dataclass
class GpuClass:
    """What a GPU-class file (``scenarios/gpus/CLASS.toml``) sets for every platform of the
    class: values by dotted path, their log sigmas, and the free ranges a joint fit shares."""

    values: dict[str, float] = field(default_factory=dict)
    sigmas: dict[str, float | None] = field(default_factory=dict)
    free: dict[str, FreeParam] = field(default_factory=dict)


def load_class(gpu_class: str) -> GpuClass:
    """The class file of ``gpu_class`` (empty when the platform names none or it has no file)."""
    p = scn_mod.SCENARIO_DIR / GPUS / f"{gpu_class}.toml"
    if not gpu_class or not p.is_file():
        return GpuClass()
    data = scn_mod.load_fragment(p, {}).get("platform", {})
    vals: dict[str, float] = {}
    for part, table in data.items():
        if part in ("sources", "free") or not isinstance(table, dict):
            continue
        for k, v in table.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                vals[f"{part}.{k}"] = float(v)
    srcs = data.get("sources", {})
    return GpuClass(values=vals, sigmas={k: (srcs.get(k) or {}).get("rel_sigma") for k in vals},
                    free={k: FreeParam.model_validate(v) for k, v in data.get("free", {}).items()})


def _shipped_same_class(plat: Platform, path: Path) -> list[LoadedPlatform]:
    out = []
    for p in sorted((scn_mod.SCENARIO_DIR / "platforms").glob("*.toml")):
        if p.resolve() == path.resolve():
            continue
        try:
            other = load_platform(p)
        except scn_mod.ScenarioError:
            continue
        # a calibrated platform against the calibrated ones, a hand-set one against hand-set
        same_kind = (other.platform.calibrated is None) == (plat.calibrated is None)
        if other.platform.gpu_class == plat.gpu_class and other.platform.name != plat.name and same_kind:
            out.append(other)
    return out


def _differs(a: float, sa: float | None, b: float, sb: float | None) -> tuple[bool, float]:
    """Whether two positive values differ beyond DISAGREE_SIGMAS combined log sigmas."""
    if a <= 0 or b <= 0:
        return (a != b), 0.0
    gap = abs(math.log(a / b))
    sd = math.hypot(sa or 0.0, sb or 0.0)
    return gap > DISAGREE_SIGMAS * sd + 1e-9, gap


def parameter_table(name_or_path: str | Path, compare: bool = True) -> tuple[LoadedPlatform, list[ParamRow]]:
    """Every numeric parameter of a platform with its provenance and the defects it shows.

    ``compare``: check the shared parameters against the other shipped platforms of the
    same GPU class (and the class file)."""
    lp = load_platform(name_or_path)
    plat = lp.platform
    cal = plat.calibrated
    cls = load_class(plat.gpu_class)
    shared_vals, shared_sig = cls.values, cls.sigmas
    gpus_dir = (scn_mod.SCENARIO_DIR / GPUS).resolve()
    others = _shipped_same_class(plat, lp.path) if compare and shared_vals else []
    rows: list[ParamRow] = []
    for path, value in plat.numeric_parameters().items():
        src = plat.sources.get(path)
        # fitted unless a file that includes the calibrated one set the value itself again
        fitted = cal is not None and path in cal.names and (src is None or src.kind == "fitted")
        kind = "fitted" if fitted else (src.kind if src else "none")
        ref = src.ref if src else ""
        if fitted and not ref:
            ref = "lever calibrate on " + ", ".join(cal.records)
        set_in = lp.origin.get(path, "")
        from_class = bool(set_in) and Path(set_in).resolve().parent == gpus_dir
        tied = cal is not None and path in cal.shared  # one value for the class, by a joint fit
        shared = plat.gpu_class if (path in shared_vals and (from_class or tied)) else ""
        row = ParamRow(path, value, unit_of(path), None, kind, shared, ref)
        sd = _log_sigma(plat, path)
        row.rel_sigma = sd
        if src is None and not fitted:
            row.defects.append("no source")
        if fitted:
            fp = plat.free.get(path)
            if fp is not None and value > 0:
                lv = math.log(value)
                if lv <= math.log(fp.lo) + AT_BOUND_LOG or lv >= math.log(fp.hi) - AT_BOUND_LOG:
                    row.defects.append(f"fitted at a bound of [{fp.lo:g}, {fp.hi:g}]: a mechanism is missing")
            prior = fp.prior if fp is not None else None
            far = False
            if prior is not None and value > 0:
                z = abs(math.log(value / prior.value)) / prior.rel_sigma
                far = z > FAR_FROM_PRIOR_SIGMAS
                if far and path not in cal.unidentifiable:
                    row.defects.append(
                        f"fitted x{value / prior.value:.3g} from its prior {prior.value:g} "
                        f"({z:.1f} sigma): the value carries something the model lacks")
            if path in cal.unidentifiable:
                # unconstrained: it stays where the fit started, which is its prior unless a
                # warm start (an earlier calibration) put it elsewhere; or the records move it
                # only together with another parameter
                pair = _partner(plat, path)
                if pair is not None:
                    row.defects.append(
                        f"not identified apart from {pair[0]} (correlation {pair[1]:+.3f}): the "
                        "records move only a combination of the two")
                else:
                    unc = f" (1 sigma: x{math.exp(sd):.3g})" if sd is not None and sd > 0.3 else ""
                    row.defects.append(
                        f"not identified by the records{unc}: it stays near its prior" if not far else
                        f"not identified by the records{unc}: it stays where the fit started, x"
                        f"{value / prior.value:.3g} from its prior {prior.value:g} (a warm start)")
        if path in shared_vals:
            bad, gap = _differs(value, sd, shared_vals[path], shared_sig.get(path))
            if bad and not shared and not fitted:  # a fit may move it: its bounds say how far
                row.defects.append(
                    f"shared {plat.gpu_class} parameter: {value:g} here against the class's "
                    f"{shared_vals[path]:g} (x{math.exp(gap):.3g}), beyond both uncertainties")
            for o in others:
                ov = parameter_value(o.platform, path)
                if ov is None:
                    continue
                bad, gap = _differs(value, sd, ov, _log_sigma(o.platform, path))
                if bad:
                    row.defects.append(
                        f"shared {plat.gpu_class} parameter: {value:g} here against {ov:g} on "
                        f"{o.platform.name} (x{math.exp(gap):.3g}), beyond both uncertainties")
        rows.append(row)
    return lp, rows


def table_dict(lp: LoadedPlatform, rows: list[ParamRow]) -> dict[str, Any]:
    plat = lp.platform
    defects = [f"{r.path}: {d}" for r in rows for d in r.defects]
    return {"platform": plat.name, "gpu_class": plat.gpu_class, "nic_kind": plat.nic_kind,
            "file": str(lp.path), "calibrated": plat.calibrated is not None,
            "params": [r.as_dict() for r in rows], "defects": defects}
