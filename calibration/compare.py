"""Judge a preregistered lever prediction against measured run records.

Pure functions (the CLI in ``lever.commands.predict`` reads files and prints):

- :func:`check_prereg`: the preregistration is intact (its sha256 matches its
  content) and was made on the platform file that is current now.
- :func:`measured_delta`: lever minus baseline median latency with a 90% noise
  band, from samples when both records carry them (bootstrap of the median
  difference), else from p10/p90/n (``Distribution.median_se``).
- :func:`verdict`: the preregistered rule (``lever.calibration.predict.VERDICT_RULE``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from lever.calibration.predict import PREREG_KIND, content_sha256
from lever.calibration.records import Distribution, RunRecord
from lever.sim.errors import UserError

Z90 = 1.6448536269514722  # two-sided 90%
BAND_LEVEL = 0.90


def check_prereg(prereg: dict[str, Any], current_platform_digest: str | None, label: str = "prereg") -> None:
    """Refuse a tampered preregistration or one made on another platform file (one-line UserError)."""
    if not isinstance(prereg, dict) or prereg.get("kind") != PREREG_KIND:
        raise UserError(f"{label}: not a lever preregistration (kind != 'lever-preregistration')")
    want = prereg.get("sha256")
    got = content_sha256(prereg)
    if want != got:
        raise UserError(f"{label}: sha256 mismatch: content changed after preregistration "
                        f"(recorded {str(want)[:12]}, now {got[:12]})")
    if current_platform_digest is not None and prereg.get("platform_digest") != current_platform_digest:
        raise UserError(f"{label}: platform digest {str(prereg.get('platform_digest'))[:12]} differs from the "
                        f"current platform file ({current_platform_digest[:12]}): predict again")


def measured_delta(base: Distribution | None, lever: Distribution | None,
                   delta: Distribution | None = None, n_boot: int = 2000) -> dict[str, Any]:
    """Measured lever - baseline (us) with a 90% band; ``halfwidth`` is NaN when the records carry no spread."""
    if delta is not None:
        se = delta.median_se()
        d = float(delta.median)
        src = "latency_delta_us"
        hw = Z90 * se if se > 0 else math.nan
        return {"delta_us": d, "band_us": [d - hw, d + hw], "halfwidth_us": hw, "source": src}
    assert base is not None and lever is not None
    if base.samples and lever.samples and len(base.samples) >= 3 and len(lever.samples) >= 3:
        b, x = np.asarray(base.samples), np.asarray(lever.samples)
        d = float(np.median(x) - np.median(b))
        rng = np.random.default_rng(0)
        bi = rng.integers(0, len(b), size=(n_boot, len(b)))
        xi = rng.integers(0, len(x), size=(n_boot, len(x)))
        boots = np.median(x[xi], axis=1) - np.median(b[bi], axis=1)
        q = (1 - BAND_LEVEL) / 2
        lo, hi = np.quantile(boots, [q, 1 - q])
        lo, hi = min(float(lo), d), max(float(hi), d)
        return {"delta_us": d, "band_us": [lo, hi], "halfwidth_us": (hi - lo) / 2, "source": "samples"}
    d = float(lever.median - base.median)
    sb, sl = base.median_se(), lever.median_se()
    if sb == 0 or sl == 0:
        hw = math.nan
    else:
        hw = Z90 * math.hypot(sb, sl)
    return {"delta_us": d, "band_us": [d - hw, d + hw], "halfwidth_us": hw, "source": "p10/p90/n"}


def verdict(pred_delta: float, pred_band: list[float], meas_delta: float, meas_band: list[float]) -> dict[str, Any]:
    """validated / refuted / inconclusive under the preregistered rule."""
    plo, phi = float(pred_band[0]), float(pred_band[1])
    mlo, mhi = float(meas_band[0]), float(meas_band[1])
    if any(math.isnan(v) for v in (mlo, mhi)):
        return {"verdict": "inconclusive", "sign_flip": False,
                "reason": "measurement carries no spread (no samples, p10/p90 or n)"}
    sign_flip = (pred_delta < 0 and mlo > 0) or (pred_delta > 0 and mhi < 0)
    straddles = (mlo < plo < mhi) or (mlo < phi < mhi)
    if (mhi - mlo) > (phi - plo) and straddles:
        return {"verdict": "inconclusive", "sign_flip": False,
                "reason": f"measured band {mhi - mlo:.2f} us wide, wider than the predicted "
                          f"{phi - plo:.2f} us and across its edge"}
    if plo <= meas_delta <= phi:
        return {"verdict": "validated", "sign_flip": False, "reason": "measured delta inside the predicted band"}
    side = "below" if meas_delta < plo else "above"
    reason = f"measured delta {side} the predicted band"
    if sign_flip:
        reason += "; sign flipped"
    return {"verdict": "refuted", "sign_flip": bool(sign_flip), "reason": reason}


def _pick(records: list[RunRecord], lever: str, op: str) -> tuple[RunRecord | None, RunRecord | None]:
    base = [r for r in records if lever not in r.what.levers and op in r.latency_us]
    lev = [r for r in records if lever in r.what.levers and (op in r.latency_us or op in r.latency_delta_us)]
    if len(base) > 1:
        raise UserError(f"{op}: several baseline records ({', '.join(r.id for r in base)}): pass one")
    if len(lev) > 1:
        raise UserError(f"{op}: several records of lever {lever} ({', '.join(r.id for r in lev)}): pass one")
    return (base[0] if base else None), (lev[0] if lev else None)


def compare(prereg: dict[str, Any], records: list[RunRecord]) -> dict[str, Any]:
    """Per preregistered op: predicted band, measured delta and band, verdict."""
    lever = prereg["lever"]
    if not any(lever in r.what.levers for r in records):
        raise UserError(f"no record lists lever '{lever}' in what.levers")
    out: dict[str, Any] = {"lever": lever, "baseline": prereg["baseline"], "prereg_sha256": prereg["sha256"],
                           "band_kind": prereg.get("band_kind", ""), "ops": {}}
    measured: dict[str, dict[str, Any]] = {}
    for op, pred in prereg["predictions"].items():
        b, x = _pick(records, lever, op)
        if x is None:
            continue
        if op in x.latency_delta_us and op not in x.latency_us:
            m = measured_delta(None, None, x.latency_delta_us[op])
        elif b is None:
            raise UserError(f"{op}: no baseline record (one without '{lever}' in what.levers)")
        else:
            m = measured_delta(b.latency_us[op], x.latency_us[op])
        measured[op] = m
        v = verdict(pred["delta_us"], pred["band_us"], m["delta_us"], m["band_us"])
        out["ops"][op] = {
            "predicted_delta_us": pred["delta_us"],
            "predicted_band_us": pred["band_us"],
            "measured_delta_us": round(m["delta_us"], 4),
            "measured_band_us": [round(v_, 4) if not math.isnan(v_) else None for v_ in m["band_us"]],
            "measured_source": m["source"],
            "baseline_record": b.id if b else None,
            "lever_record": x.id,
            **v,
        }
    if not out["ops"]:
        raise UserError(f"no record measures a preregistered op of lever '{lever}'")
    if prereg.get("variants"):
        out["primary"] = prereg.get("primary")
        out["variants"] = judge_variants(prereg["variants"], measured)
        out["supported"] = [n for n, v in out["variants"].items() if v["verdict"] == "validated"]
    return out


def overall(verdicts: list[str]) -> str:
    """One verdict for a variant over its ops: refuted if any op is, validated if every op is,
    else inconclusive."""
    if "refuted" in verdicts:
        return "refuted"
    if verdicts and all(v == "validated" for v in verdicts):
        return "validated"
    return "inconclusive"


def judge_variants(variants: dict[str, Any], measured: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per preregistered variant: each measured op judged by the same rule, and one overall
    verdict; a variant the model could not run is ``not-runnable`` (its ``needs`` says why)."""
    out: dict[str, Any] = {}
    for name, v in variants.items():
        if not v.get("runnable"):
            out[name] = {"verdict": "not-runnable", "needs": v.get("needs", ""), "ops": {}}
            continue
        ops = {}
        for op, m in measured.items():
            pred = v["predictions"].get(op)
            if pred is None:
                continue
            j = verdict(pred["delta_us"], pred["band_us"], m["delta_us"], m["band_us"])
            ops[op] = {"predicted_delta_us": pred["delta_us"], "predicted_band_us": pred["band_us"],
                       "measured_delta_us": round(m["delta_us"], 4), **j}
        out[name] = {"verdict": overall([o["verdict"] for o in ops.values()]), "ops": ops}
    return out
