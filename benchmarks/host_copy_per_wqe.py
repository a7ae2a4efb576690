"""What one copy of the emulated NIC's host engine costs against the WQEs it carries, across
every H100 testbed record that counts them: a least-squares line, copy ns = base + per-WQE ns x
WQEs a copy (the WQEs mirrored an iteration over the copies an iteration).

    python benchmarks/host_copy_per_wqe.py [--glob 'calibration/data/testbed/h100-*/emu-*.json']

Why: the model's host engine priced a copy at one fitted cost whatever it carried
(`nic.host_mirror_copy_ns`), while the testbed's copy reads each new WQE over PCIe: at EP4,
batched doorbells carry 12.5 WQEs a copy at 12.8 us where the baseline carries 4.1 at 8.7 us.
The line's slope is `nic.host_mirror_copy_per_wqe_ns` on the emulated platform, its base the
prior of `nic.host_mirror_copy_ns`.
"""

from __future__ import annotations

import argparse
import glob

import numpy as np


def points(pattern: str) -> list[tuple[str, float, float]]:
    """(record id, WQEs a copy, ns a copy) of every record matching ``pattern`` that counts them."""
    from lever.calibration.records import load_record

    out = []
    for path in sorted(glob.glob(pattern)):
        rec = load_record(path)
        m = {k: v.median for k, v in rec.metrics.items()}
        copy, copies, wqes = (m.get("host_copy_per_qp_copy_ns"), m.get("host_qp_copies_per_iteration_count"),
                              m.get("mirrored_wqes_per_iteration_count"))
        if copy and copies and wqes:
            out.append((rec.id, wqes / copies, copy))
    return out


def fit(pts: list[tuple[str, float, float]]) -> tuple[float, float, float]:
    """Base ns, ns per WQE and the median relative miss of the line."""
    x = np.array([p[1] for p in pts])
    y = np.array([p[2] for p in pts])
    a = np.vstack([np.ones_like(x), x]).T
    (base, slope), *_ = np.linalg.lstsq(a, y, rcond=None)
    return float(base), float(slope), float(np.median(np.abs((a @ np.array([base, slope])) / y - 1)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--glob", default="calibration/data/testbed/h100-*/emu-*.json")
    a = ap.parse_args()
    pts = points(a.glob)
    print("| record | WQEs a copy | ns a copy |\n|---|---|---|")
    for rid, x, y in sorted(pts, key=lambda p: p[1]):
        print(f"| `{rid}` | {x:.2f} | {y:.0f} |")
    base, slope, miss = fit(pts)
    print(f"\n{len(pts)} records: copy = {base:.0f} ns + {slope:.1f} ns a WQE (median miss {miss:.1%})")


if __name__ == "__main__":
    main()
