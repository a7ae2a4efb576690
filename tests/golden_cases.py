"""Golden results: the model's exact numbers for a few small cases, committed as data.

A change meant to make the model faster must leave these bit for bit
(``tests/test_golden.py``). The cases' scenarios are frozen with the numbers, so
a recalibrated platform does not move them. A change meant to alter the model
regenerates both on purpose, in the same commit, and says so:

    python -m tests.golden_cases --write
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

GOLDEN = Path(__file__).resolve().parent / "data" / "golden_sim.json"
# The cases' scenarios, frozen (full parameter sets), so recalibrating a shipped
# platform does not move the golden numbers: only a change of the model does.
FROZEN = Path(__file__).resolve().parent / "data" / "golden_scenarios.json"
SMALL = {"workload.tokens_per_rank": 16}
CASES: dict[str, tuple[str, list[str]]] = {
    "hybrid-native-flush": ("decode-ep16-efa-native", SMALL),
    "hybrid-proxy": ("decode-ep16-efa-proxy", SMALL),
    "hybrid-native-unordered-loss": ("decode-ep16-efa-native", {**SMALL, "design.signal_mode": "unordered-counting", "platform.fabric.loss_prob": 0.05}),
    "direct-native-imm": ("decode-ep16-efa-native", {**SMALL, "design.protocol": "v2-direct", "design.signal_mode": "imm-counting"}),
    "v1-ll-ib": ("decode-ep16-ib", SMALL),
    "v1-ll-native-lazy-b8": ("decode-ep16-efa-native", {**SMALL, "design.protocol": "v1-ll", "design.lazy_completion_dispatch": True, "design.doorbell_batch": 8}),
}


def freeze() -> dict:
    from lever.sim import scenario

    return {name: scenario.load(scn, sets).model_dump(mode="json")
            for name, (scn, sets) in CASES.items()}


def compute(frozen: dict | None = None) -> dict:
    from lever.sim.model import simulate_op
    from lever.sim.params import Scenario

    frozen = frozen if frozen is not None else json.loads(FROZEN.read_text())
    out = {}
    for name, data in frozen.items():
        scn = Scenario.model_validate(data)
        for op in ("dispatch", "combine"):
            r = simulate_op(scn, op, 0)
            out[f"{name}/{op}"] = {
                "latency_us": [float(x).hex() for x in r.latency_us],
                "events": r.events,
                "counters": dict(sorted(r.counters.items())),
            }
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true")
    a = ap.parse_args()
    if a.write:
        frozen = freeze()
        FROZEN.write_text(json.dumps(frozen, indent=1, sort_keys=True) + "\n")
        data = compute(frozen)
        GOLDEN.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        print(f"wrote {FROZEN} and {GOLDEN}")
    else:
        print(json.dumps(compute(), indent=1)[:2000])
