"""scenarios/emu-ep2-native is exactly what the emulated-NIC EP2 records ran, so a lever
predicted on it (lever predict LEVER --baseline emu-ep2-native) is comparable with them."""

from __future__ import annotations

import json

from lever.calibration.records import DATA_DIR
from lever.sim import scenario
from lever.sim.levers import load_with_levers


def test_emu_scenario_matches_the_records_sim_link():
    rec = json.loads((DATA_DIR / "emu-bed-ep2-native-baseline.json").read_text())
    link = rec["sim"]
    from_record = load_with_levers(link["scenario"], link["levers"],
                                   link["set"])
    shipped = scenario.load("emu-ep2-native")
    # same workload and design as the runs; the platform is the emulated one, calibrated on
    # the testbed's records (emu-bed-*)
    assert shipped.workload == from_record.workload
    assert shipped.design.model_dump(exclude={"name"}) == from_record.design.model_dump(exclude={"name"})
    assert shipped.platform.fabric == from_record.platform.fabric
    assert shipped.platform.name == "emulated-nvlink-calibrated"
    assert shipped.platform.calibrated is not None
    assert "emu-bed-ep2-native-baseline" in shipped.platform.calibrated.records
    assert shipped.platform.nic_kind == "emulated-srd"
    assert rec["nic"] == "emulated-srd"
