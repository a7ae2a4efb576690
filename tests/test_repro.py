"""The measured run-to-run noise a lever delta carries (calibration/repro.py) and its place in
the leave-one-lever-out bands (calibration/validate.py)."""

from __future__ import annotations

import math

import pytest
from lever.calibration.compare import Z90, verdict
from lever.calibration.records import DATA_DIR, load_record
from lever.calibration.repro import delta_halfwidth, repeat_records, run_noise
from lever.calibration.validate import ValidateResult, widen_by

BASE = DATA_DIR / "emu-bed-ep2-native-baseline.json"


def _copy(rec, rid: str, dispatch: float, rev: str | None = None, **what):
    d = rec.model_dump(mode="json")
    d["id"] = rid
    d["latency_us"]["dispatch"] = {"median": dispatch}
    if rev is not None:
        d["provenance"]["git_rev"] = rev
    d["what"].update(what)
    return type(rec).model_validate(d)


def test_repeats_are_one_configuration_from_one_revision():
    """Records with the same what, sim link and git revision are repeats: their medians' sd
    per op is the noise; another revision or another configuration is not a repeat."""
    base = load_record(BASE)
    a = _copy(base, "a", 1000.0)
    b = _copy(base, "b", 1040.0)
    other_rev = _copy(base, "c", 1500.0, rev="f" * 40)
    other_what = _copy(base, "d", 700.0, levers=["lazy-completion-dispatch"])
    n = run_noise([a, b, other_rev, other_what])
    (nic,) = n
    assert n[nic]["dispatch"]["groups"] == [["a", "b"]]
    assert n[nic]["dispatch"]["sd_us"] == pytest.approx(math.sqrt(2 * 20.0**2))
    assert n[nic]["dispatch"]["dof"] == 1
    assert run_noise([a, other_rev, other_what]) == {}


def test_the_testbed_measures_its_baseline_and_levers_again_in_one_call():
    """The shipped testbed records: the baseline and its two repeats at 972e2e1
    (hw/run_testbed_on_device.sh repeat) are one group; hw/run_noise_on_device.sh at 509a5a8
    measured the baseline seven times and every lever three times (testbed/noise), one group
    each; dispatch moves more between processes than combine, and the pooled estimate has the
    degrees of freedom of all of them."""
    n = run_noise(repeat_records())["emulated-srd"]
    groups = n["dispatch"]["groups"]
    first = next(g for g in groups if "emu-bed-ep2-native-baseline" in g)
    assert len(first) == 3
    base = next(g for g in groups if "emu-noise-base-r1-2-native-baseline" in g)
    # three in the lever rounds' processes, three alone, and the lateness step's run at the
    # file's own deliver_lead_ns (900 ns: the same configuration, so a repeat too)
    assert len(base) == 7 and "emu-late-lead900-2-native-baseline" in base
    put_many = next(g for g in groups if "emu-noise-r1-2-native-put-many" in g)
    assert len(put_many) == 3
    assert n["dispatch"]["dof"] == sum(len(g) - 1 for g in groups) >= 25
    assert 5.0 < n["dispatch"]["sd_us"] < 200.0
    assert n["combine"]["sd_us"] < n["dispatch"]["sd_us"]


def test_a_predicted_no_change_is_judged_against_the_noise_of_a_measured_delta():
    """A lever the model says does not touch combine (band [0, 0]) measured at +6 us on a
    testbed whose combine moves 4.3 us (sd) between processes: refuted by a band without the
    noise, validated with it; a delta far outside the noise stays refuted."""
    sd = 4.3
    m = delta_halfwidth(sd)
    assert m == pytest.approx(Z90 * math.sqrt(2) * sd)
    assert delta_halfwidth(sd, 10**6) == pytest.approx(m, rel=1e-5)
    band = widen_by(0.0, (0.0, 0.0), m)
    assert band == pytest.approx((-m, m))
    assert verdict(0.0, [0.0, 0.0], 6.0, [5.0, 7.0])["verdict"] == "refuted"
    assert verdict(0.0, list(band), 6.0, [5.0, 7.0])["verdict"] == "validated"
    assert verdict(0.0, list(band), 60.0, [59.0, 61.0])["verdict"] == "refuted"
    # in quadrature with the model's own band, per side
    lo, hi = widen_by(-100.0, (-130.0, -90.0), 10.0)
    assert lo == pytest.approx(-100.0 - math.hypot(30.0, 10.0))
    assert hi == pytest.approx(-100.0 + math.hypot(10.0, 10.0))


def test_the_json_says_which_noise_it_used():
    res = ValidateResult([], [], {}, {"emulated-srd": {"dispatch": {"sd_us": 33.06, "dof": 2,
                                                                    "groups": [["x", "y", "z"]]}}})
    out = res.as_json()
    assert out["run_noise"]["emulated-srd"]["dispatch"] == {"sd_us": 33.06, "dof": 2, "groups": [["x", "y", "z"]]}
    assert out["validated"] == 0 and out["levers"] == []


def test_an_sd_from_few_repeats_widens_by_students_t():
    """Three runs (2 dof) give an sd that is itself uncertain: its 90% half-width uses t(0.95, 2)
    = 2.920, not 1.645; more repeats bring it down toward the normal's (8 dof: 1.860)."""
    sd = 10.0
    assert delta_halfwidth(sd, 2) == pytest.approx(2.919986 * math.sqrt(2) * sd, rel=1e-5)
    assert delta_halfwidth(sd, 8) == pytest.approx(1.859548 * math.sqrt(2) * sd, rel=1e-5)
    assert delta_halfwidth(sd, 2) > delta_halfwidth(sd, 8) > delta_halfwidth(sd)
    with pytest.raises(ValueError):
        delta_halfwidth(sd, 0)
