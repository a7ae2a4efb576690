"""How late the emulated NIC delivers, by the emulator setting that ran: every committed EP2
V1 native baseline record that reports its lateness, grouped by the values of
hw/emulated_nic.toml that shape the delivering warps' schedule, one row a setting.

    python benchmarks/nic_schedule_table.py [--glob 'calibration/data/testbed/*/**/emu-*.json']

Why: the lateness campaign (docs/testbed.md, from "Where the lateness goes" on) is spread over
a dozen folders and as many device calls, each comparing two or three settings; this puts every
run of every setting in one table, so the next setting to try starts from all of them. A row is
a setting (the keys in SETTING, a key absent from an older record read as the file's value
then); its runs are the records that ran it, on any GPU, each call's runs counted apart.
"""

from __future__ import annotations

import argparse
import glob
import statistics
from typing import Any

# the emulator keys that shape the delivering warps' schedule, and the value a record made
# before the key existed ran (what the file said then)
SETTING: dict[str, Any] = {
    "nics_per_rank": 4, "line_rate_gbps": 100.0, "nic_claim": "scan", "deliver_lead_ns": 900.0,
    "deliver_batch_count": 2, "nic_copy": "one", "nic_fetcher": "dedicated", "nic_fence": "sc",
    "blocks_per_nic_count": 1, "nic_share": "qps", "mirror_poll_gap_ns": 0.0, "nic_part_timers": "on",
    "nic_claim_loads": "volatile", "nic_kernel": "shared", "nic_warps_count": 8,
}
PARTS = ("late", "early", "claim_lag", "scan", "claim_load", "copy", "fence")


def runs(pattern: str) -> list[dict[str, Any]]:
    """One dict a record: its id, GPU, setting (a tuple in SETTING's order), the lateness and its
    parts (ns a packet; None where the record has no such metric) and the dispatch median (us).
    Only gate-passed, clean, current (not superseded) V1 native EP2 baselines without loss that
    report lateness and the emulator values they ran, on the full issuing shape (no SM or warp
    count set) with the queues where the file puts them."""
    from lever.calibration.records import load_record

    out = []
    for path in sorted(set(glob.glob(pattern, recursive=True))):
        rec = load_record(path)
        w = rec.what
        if (rec.gate is None or rec.gate.passed is not True or rec.provenance.dirty or w.levers
                or rec.superseded_by is not None
                or w.path != "native" or getattr(w, "protocol", "v1-ll") != "v1-ll"
                or w.workload.ep_ranks != 2 or rec.id.endswith("-faults")):
            continue
        m = {k: v.median for k, v in rec.metrics.items()}
        if "nic_late_per_packet_ns" not in m:
            continue
        ef = w.emulated_fabric if isinstance(w.emulated_fabric, dict) else {}
        fab = ef.get("values", {})
        if not fab or fab.get("loss_prob", 0.0):  # before the emulator had its file, or lossy
            continue
        # the full issuing shape with the queues where the file puts them: a one-warp chain or
        # a run with its queues moved loads the delivering warps differently (another row of
        # the testbed, not a run of this setting)
        sets = rec.sim.set if rec.sim is not None else {}
        if "design.num_sms" in sets or "design.warps_per_sm" in sets or any(
                ef.get(q, fab.get(q)) != fab.get(q) for q in ("sq", "cq")):
            continue
        setting = tuple(fab.get(k, v) for k, v in SETTING.items())
        if setting[list(SETTING).index("blocks_per_nic_count")] == 1:  # the share means nothing alone
            setting = tuple("-" if k == "nic_share" else v for k, v in zip(SETTING, setting, strict=True))
        out.append({"id": rec.id, "path": path, "gpu": w.platform.gpu, "setting": setting,
                    "dispatch_us": rec.latency_us["dispatch"].median,
                    **{p: m.get(f"nic_{p}_per_packet_ns") for p in PARTS}})
    return out


def table(rs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row a setting: its runs, how many under 1 us late, the lateness's range and median,
    and the medians of its parts and of the dispatch, sorted by the median lateness."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in rs:
        groups.setdefault(r["setting"], []).append(r)
    rows = []
    for setting, g in groups.items():
        late = [r["late"] for r in g]
        row = {"setting": dict(zip(SETTING, setting, strict=True)), "runs": len(g),
               "under_1us": sum(x < 1000.0 for x in late), "late_min": min(late), "late_max": max(late),
               "late_median": statistics.median(late),
               "dispatch_us": statistics.median(r["dispatch_us"] for r in g),
               "gpus": sorted({r["gpu"] for r in g})}
        for p in PARTS[1:]:
            vals = [r[p] for r in g if r[p] is not None]
            row[p] = statistics.median(vals) if vals else None
        rows.append(row)
    return sorted(rows, key=lambda r: r["late_median"])


def _differs(setting: dict[str, Any]) -> str:
    """The setting as the keys where it differs from the first record's (SETTING)."""
    out = [f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
           for k, v in setting.items() if v != SETTING[k] and v != "-"]
    return ", ".join(out) or "as the file was first"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--glob", default="calibration/data/testbed/*/**/emu-*.json")
    a = ap.parse_args()
    rows = table(runs(a.glob))
    fmt = lambda v: "" if v is None else f"{v:.0f}"  # noqa: E731
    print("| setting (keys unlike scan / 0.9 us / one / dedicated / 4 x 100 Gb/s) | runs | under 1 us | late ns "
          "(median, range) | early | claim lag | claim | its loads | copies | fence | dispatch us |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {_differs(r['setting'])} | {r['runs']} | {r['under_1us']} | {r['late_median']:.0f} "
              f"({r['late_min']:.0f}-{r['late_max']:.0f}) | {fmt(r['early'])} | {fmt(r['claim_lag'])} | "
              f"{fmt(r['scan'])} | {fmt(r['claim_load'])} | {fmt(r['copy'])} | {fmt(r['fence'])} | {r['dispatch_us']:.0f} |")
    n = sum(r["runs"] for r in rows)
    kept = [r for r in rows if r["under_1us"] == r["runs"] and r["runs"] >= 2]
    print(f"\n{n} runs in {len(rows)} settings; every run under 1 us, in two runs or more: "
          + ("; ".join(_differs(r["setting"]) for r in kept) or "none"))


if __name__ == "__main__":
    main()
