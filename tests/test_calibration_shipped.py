"""The shipped calibrated platforms reproduce their training numbers (DESIGN §5) within 5%.

Deltas are judged in % of their latency level (a -2.8 us change can not be held to 5% of
itself by a stochastic model); absolute medians in % of themselves. Slow: ~1 min on 2 cores.
"""

from __future__ import annotations

import pytest

from calibration.cli import load_records, shipped_records
from calibration.fit import predict
from sim.levers import load_with_levers

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("nic,platform", [("efa", "efa-p5-calibrated"), ("ib", "ib-cx7-calibrated")])
def test_shipped_platform_reproduces_training_numbers(nic, platform):
    recs = load_records(shipped_records(nic))
    for r in recs:
        scn = load_with_levers(r.sim.scenario, r.sim.levers)
        assert scn.platform.name == platform, (r.id, scn.platform.name)
        assert scn.platform.calibrated is not None and r.id in scn.platform.calibrated.records
    rows = [row for row in predict(recs, workers=2) if row.unit == "us"]
    bad = [f"{x.record} {x.quantity}: {x.predicted:.1f} vs {x.measured:.1f} ({x.level_pct_err:+.1f}%)"
           for x in rows if abs(x.level_pct_err) > 5.0]
    assert not bad, "; ".join(bad)
