"""scenarios/emu-ep2-native is exactly what the emulated-NIC EP2 records ran, so a lever
predicted on it (lever predict LEVER --baseline emu-ep2-native) is comparable with them."""

from __future__ import annotations

import json

from calibration.records import DATA_DIR
from sim import scenario
from sim.levers import load_with_levers


def test_emu_scenario_matches_the_records_sim_link():
    rec = json.loads((DATA_DIR / "emu-ep2-native-baseline.json").read_text())
    link = rec["sim"]
    from_record = load_with_levers(link["scenario"], link["levers"],
                                   [f"{k}={json.dumps(v)}" for k, v in link["set"].items()])
    shipped = scenario.load("emu-ep2-native")
    skip = {"name", "description"}
    assert shipped.model_dump(exclude=skip) == from_record.model_dump(exclude=skip)
    assert shipped.platform.nic_kind == "emulated-srd"
    assert rec["nic"] == "emulated-srd"
