"""The shipped calibrated platforms reproduce their training numbers (docs/physics.md) within 5%.

Deltas are judged in % of their latency level (a -2.8 us change can not be held to 5% of
itself by a stochastic model); absolute medians in % of themselves. Slow: ~1 min on 2 cores.
"""

from __future__ import annotations

import pytest
from lever.calibration.fit import predict

from lever.commands.calibrate import load_records, shipped_records

pytestmark = pytest.mark.slow

# Training numbers the model can not reach by mechanism yet, with the reason. Each also has
# a strict xfail below: when the model gains the mechanism the xfail fails, and this list
# must shrink.
KNOWN_MISSES = {
    "efa-ep16-qp-fanout-fix": "8 -> 9 data QPs (V2's min(num_sms, 9) per call, one kept for notify) "
    "moves the modelled dispatch by ~1%; the campaign's -32% came from an earlier state whose "
    "shape (SMs and QPs per call) the records do not give. Where QPs are scarce the model does "
    "predict large fan-out gains (held out on 2xH200: 1->2 and 2->3 data QPs for 96 warps, "
    "tests/test_emulated_scenario.py)",
}


@pytest.mark.parametrize("nic,platform", [("efa", "efa-p5-calibrated"), ("ib", "ib-cx7-calibrated")])
def test_shipped_platform_reproduces_training_numbers(nic, platform):
    recs = load_records(shipped_records(nic))
    for r in recs:
        scn = r.sim.load()
        assert scn.platform.name == platform, (r.id, scn.platform.name)
        assert scn.platform.calibrated is not None and r.id in scn.platform.calibrated.records
    rows = [row for row in predict(recs, workers=2) if row.unit == "us"]
    bad = [f"{x.record} {x.quantity}: {x.predicted:.1f} vs {x.measured:.1f} ({x.level_pct_err:+.1f}%)"
           for x in rows if abs(x.level_pct_err) > 5.0 and x.record not in KNOWN_MISSES]
    assert not bad, "; ".join(bad)


@pytest.mark.xfail(strict=True, reason=KNOWN_MISSES["efa-ep16-qp-fanout-fix"])
def test_qp_fanout_within_5_percent():
    recs = [r for r in load_records(shipped_records("efa")) if r.id == "efa-ep16-qp-fanout-fix"]
    rows = [row for row in predict(recs, workers=2) if row.unit == "us"]
    assert rows and all(abs(x.level_pct_err) <= 5.0 for x in rows)
