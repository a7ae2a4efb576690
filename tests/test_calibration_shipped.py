"""The shipped calibrated platforms reproduce their training numbers (docs/physics.md) within 5%,
but for the known misses listed with their reasons.

Deltas are judged in % of their latency level (a -2.8 us change can not be held to 5% of
itself by a stochastic model); absolute medians in % of themselves. Slow: ~1 min on 2 cores.
"""

from __future__ import annotations

import pytest
from lever.calibration.fit import predict

from lever.commands.calibrate import load_records, shipped_records

pytestmark = pytest.mark.slow

# Training numbers the model can not reach by mechanism yet, with the reason, per (record,
# quantity). Each also has a test below that fails when the model gains the mechanism; this
# list must then shrink. Since the joint calibration (one Hopper value for the
# GPU-side costs of IB, EFA and the emulator, published line rates) the platforms no longer
# reproduce every training number: the misses say what the EFA-only and IB-only fits had
# been hiding in strange values.
QP_FANOUT = ("the record now runs as the campaign's state then (QPs capped at 2: the fix takes "
             "16 channels from one data QP to two): -145 us of 789 against -251 us; the rest of the "
             "gain is not modelled (what 16 channels on one send queue cost beyond the doorbell "
             "turn, credit polls and the NIC's queue). With 17 QPs it was ~0 (8 -> 9 data QPs)")
IB_SPLIT = ("DeepEP LL without NVLink (its first table) runs over the model by 5-10% while the same "
            "kernels with NVLink within a node run under it by 15-21%: one fabric latency (14.6 us "
            "one way, fitted) splits the difference. An IB-only fit gives 6.2 us with the pure-RDMA "
            "records within 6% and the NVLink ones 21% under: what DeepEP LL pays when a warp's "
            "NVLink copies and RDMA posts share it is not modelled")
KNOWN_MISSES: dict[tuple[str, str], str] = {
    ("efa-ep16-qp-fanout-fix", "dispatch.delta"): QP_FANOUT,
    ("efa-ep16-lazy-completion-dispatch", "dispatch.delta"):
        "the credit checks read the completion CQ at the measured PCIe read (1073 ns, shared "
        "Hopper value) instead of the EFA-only fit's 1798 ns: the model's credit wait is a third "
        "of the campaign's -30 us; what else a real credit check waits on is not modelled",
    ("ib-ep16-ll-reference", "combine.p50"):
        "with the line rate at the published 400 Gb/s and the GPU costs shared, one fabric "
        "latency (fitted 14.6 us one way, still a defect) does not give DeepEP LL's EP8 -> EP16 "
        "scaling: combine EP16 over, dispatch EP8 under",
    ("ib-ep8-ll-reference", "combine.p50"):
        "as for ib-ep16-ll-reference combine (+5.7%, at the edge)",
    ("ib-ep8-ll-reference", "dispatch.p50"):
        "as for ib-ep16-ll-reference combine: the EP8 -> EP16 scaling is not reproduced",
    ("ib-ep16-ll-reference", "dispatch.p50"):
        "as for ib-ep16-ll-reference combine (-5.1%, at the edge)",
    ("ib-ep8-ll-rdma-reference", "dispatch.p50"): IB_SPLIT,
    ("ib-ep8-ll-rdma-reference", "combine.p50"): IB_SPLIT,
}
TOLERANCE_PCT = 5.0


def _rows(nic: str):
    recs = load_records(shipped_records(nic))
    return recs, [row for row in predict(recs, workers=2) if row.unit == "us"]


@pytest.mark.parametrize("nic,platform", [("efa", "efa-p5-calibrated"), ("ib", "ib-cx7-calibrated")])
def test_shipped_platform_reproduces_training_numbers(nic, platform):
    recs, rows = _rows(nic)
    for r in recs:
        scn = r.sim.load()
        assert scn.platform.name == platform, (r.id, scn.platform.name)
        assert scn.platform.calibrated is not None and r.id in scn.platform.calibrated.records
    bad = [f"{x.record} {x.quantity}: {x.predicted:.1f} vs {x.measured:.1f} ({x.level_pct_err:+.1f}%)"
           for x in rows if abs(x.level_pct_err) > TOLERANCE_PCT and (x.record, x.quantity) not in KNOWN_MISSES]
    assert not bad, "; ".join(bad)
    # a miss stays a miss of its size: none may grow past 35% of its level unnoticed (the QP
    # fan-out record was the largest, 31.6%, before it ran with the QPs of its time: 13.5%)
    for x in rows:
        assert abs(x.level_pct_err) < 35.0, (x.record, x.quantity, x.level_pct_err)


@pytest.mark.parametrize("key", sorted(KNOWN_MISSES), ids=["/".join(k) for k in sorted(KNOWN_MISSES)])
def test_known_miss_is_still_a_miss(key):
    """Strict: when the model gains the mechanism, this fails and KNOWN_MISSES must shrink."""
    nic = "ib" if key[0].startswith("ib-") else "efa"
    _recs, rows = _rows(nic)
    row = next(x for x in rows if (x.record, x.quantity) == key)
    if abs(row.level_pct_err) <= TOLERANCE_PCT:
        pytest.fail(f"{key}: now within {TOLERANCE_PCT}% ({row.level_pct_err:+.1f}%): "
                    f"remove it from KNOWN_MISSES ({KNOWN_MISSES[key][:60]}...)")
