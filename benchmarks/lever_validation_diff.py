"""Two runs of `lever validate --levers --json`, side by side: the summary of each and the rows
whose verdict changed (or every row), so a model change is judged on the held-out levers row by
row, not by its count alone.

    python benchmarks/lever_validation_diff.py BEFORE.json AFTER.json [--all]

Why: the count of validated rows hides what moved under it. A change can keep 23 of 31 while
its point predictions drift, or lose a row by a hair while its bands tighten; the summary gives,
over the emulated rows, the validated count, the confident right signs (a band on the measured
side of zero), the median miss |predicted - measured| and the median band width, which the
README's lever table quotes for each try. `benchmarks/validate_levers_2core.json` is the
shipped model's run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path


def summary(run: dict) -> dict[str, float]:
    """Over the emulated rows the model predicted (refused rows left out): how many, validated,
    with a confidently right sign, the median miss (us) and the median band width (us); and the
    run's own tally."""
    rows = [r for r in run["levers"] if r["record"].startswith("emu-") and r["predicted_delta_us"] is not None]
    right = sum(1 for r in rows if (r["band_us"][0] > 0 < r["measured_delta_us"])
                or (r["band_us"][1] < 0 > r["measured_delta_us"]))
    return {"validated": run["validated"], "total": run["total"], "wrong_sign": run["wrong_sign"],
            "emulated": len(rows), "emulated_validated": sum(r["verdict"] == "validated" for r in rows),
            "confident_right": right,
            "median_miss_us": statistics.median(abs(r["predicted_delta_us"] - r["measured_delta_us"]) for r in rows)
            if rows else float("nan"),
            "median_band_us": statistics.median(r["band_us"][1] - r["band_us"][0] for r in rows) if rows else float("nan")}


def _cell(r: dict) -> str:
    if r["predicted_delta_us"] is None:
        return f"refused ({r['verdict']})"
    lo, hi = r["band_us"]
    return f"{r['predicted_delta_us']:+.1f} [{lo:+.1f}, {hi:+.1f}] {r['verdict']}"


def table(before: dict, after: dict, every: bool = False) -> str:
    """A markdown table of the rows whose verdict changed (all rows with ``every``)."""
    old = {(r["record"], r["op"]): r for r in before["levers"]}
    lines = ["| record | op | measured us | before | after |", "|---|---|---|---|---|"]
    for r in after["levers"]:
        b = old.get((r["record"], r["op"]))
        if b is None or every or b["verdict"] != r["verdict"]:
            lines.append(f"| `{r['record']}` | {r['op']} | {r['measured_delta_us']:+.1f} | "
                         f"{_cell(b) if b else 'absent'} | {_cell(r)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("before", type=Path)
    p.add_argument("after", type=Path)
    p.add_argument("--all", action="store_true", help="every row, not only those whose verdict changed")
    a = p.parse_args(sys.argv[1:] if argv is None else argv)
    runs = [json.loads(f.read_text()) for f in (a.before, a.after)]
    for name, run in zip(("before", "after"), runs, strict=True):
        s = summary(run)
        print(f"{name}: {s['validated']} of {s['total']} validated, {s['wrong_sign']} wrong signs; emulated "
              f"{s['emulated_validated']} of {s['emulated']}, {s['confident_right']} confident right signs, "
              f"median miss {s['median_miss_us']:.0f} us, median band {s['median_band_us']:.0f} us")
    print(table(*runs, every=a.all))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
