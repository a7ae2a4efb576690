"""The V1 lever deltas of the emulated testbed as two GPUs measured them, beside the lever
folds' predictions: the H200 records (`calibration/data/emu-bed-ep2-native-*`, the ones
`lever validate --levers` holds out) and the H100 re-measurements, each against the baseline
run beside it (`calibration/data/testbed/h100-d354afd/`, `h100-1433adf/`).

Why: a fold prediction is judged against one measurement; this table shows how far the
measurement itself moves between two GPUs and emulator builds, which is what a refuted row
with a narrow band may be missing. Reads committed files only (no model run):

    python benchmarks/lever_deltas_across_gpus.py [--levers benchmarks/validate_levers_2core.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "calibration" / "data"
H100 = {"h100-d354afd": ("qp17-ownership", "deferred-doorbell-aggregation", "batched-doorbells", "put-many",
                         "lazy-completion-dispatch", "qp-fanout-fix", "provider-batched-tail"),
        "h100-1433adf": ("lazy-completion-combine", "cached-dispatch", "write-imm-counting",
                         "lazy-completion-dispatch-deferred-doorbell-aggregation")}
OPS = ("dispatch", "combine")


def medians(path: Path) -> tuple[float, float]:
    lat = json.loads(path.read_text())["latency_us"]
    return lat["dispatch"]["median"], lat["combine"]["median"]


def rows(levers_json: Path) -> list[dict]:
    folds = {(r["record"], r["op"]): r for r in json.loads(levers_json.read_text())["levers"]}
    h200_base = medians(DATA / "emu-bed-ep2-native-baseline.json")
    out = []
    for folder, levers in H100.items():
        h100_base = medians(DATA / "testbed" / folder / "emu-host-2-native-baseline.json")
        for lever in levers:
            h200 = medians(DATA / f"emu-bed-ep2-native-{lever}.json")
            h100 = medians(DATA / "testbed" / folder / f"emu-host-2-native-{lever}.json")
            for i, op in enumerate(OPS):
                f = folds[(f"emu-bed-ep2-native-{lever}", op)]
                lo, hi = f["band_us"]
                d100 = h100[i] - h100_base[i]
                out.append({"lever": lever, "op": op, "h200_delta_us": round(h200[i] - h200_base[i], 1),
                            "h100_delta_us": round(d100, 1), "predicted_delta_us": f["predicted_delta_us"],
                            "band_us": [lo, hi], "verdict_h200": f["verdict"],
                            "inside_band_h100": lo <= d100 <= hi})
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--levers", default=str(ROOT / "benchmarks" / "validate_levers_2core.json"),
                   help="a `lever validate --levers --json` output")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    rs = rows(Path(a.levers))
    if a.json:
        print(json.dumps(rs, indent=1))
        return 0
    print("| lever | op | H200 record | H100 | model [band] | verdict (H200) | inside the band (H100) |")
    print("|---|---|---|---|---|---|---|")
    for r in rs:
        lo, hi = r["band_us"]
        print(f"| {r['lever']} | {r['op']} | {r['h200_delta_us']:+.0f} | {r['h100_delta_us']:+.0f} | "
              f"{r['predicted_delta_us']:+.0f} [{lo:+.0f}, {hi:+.0f}] | {r['verdict_h200']} | "
              f"{'yes' if r['inside_band_h100'] else 'no'} |")
    n = sum(r["inside_band_h100"] for r in rs)
    print(f"\nvalidated against the H200 records: {sum(r['verdict_h200'] == 'validated' for r in rs)} of "
          f"{len(rs)}; the H100's delta inside the fold's band: {n} of {len(rs)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
