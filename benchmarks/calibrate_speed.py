"""Time calibrating the EFA platform on the shipped records (a benchmark: minutes on 2 cores).

    python benchmarks/calibrate_speed.py [--max-nfev N] [--seeds N]

Prints the wall time, the number of model evaluations (one simulation of one
scenario, all its ops, all seeds) and the fit's cost; writes nothing under scenarios/.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lever.calibration.fit import fit  # noqa: E402

from lever.commands.calibrate import load_records, resolve_platform, shipped_records  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-nfev", type=int, default=8)
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--platform", default="platforms/efa-p5.toml")
    a = ap.parse_args()
    recs = load_records(shipped_records("efa"))
    plat, base = resolve_platform(recs, a.platform)
    t0 = time.perf_counter()
    res = fit(recs, plat, base, seeds=a.seeds, max_nfev=a.max_nfev)
    wall = time.perf_counter() - t0
    with tempfile.TemporaryDirectory():
        pass
    print(f"calibrate efa: {len(recs)} records, {len(res.names)} free params, "
          f"{res.evaluations} model evaluations, {wall:.1f} s wall, cost {res.cost:.3f}, "
          f"limit 600 s: {'OK' if wall < 600 else 'TOO SLOW'}")
    return 0 if wall < 600 else 1


if __name__ == "__main__":
    sys.exit(main())
