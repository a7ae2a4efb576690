"""Does the EFA campaign's fitted one-way fabric latency (~42 us on the p5 base) come from the
instance the model assumes? The campaign's records do not name their instance ("p5 assumed"),
and GIN EFA-GDA is published for p5en and newer. This refits the five EFA records on the p5
base platform as shipped and on two p5en-shaped variants of it, and prints what each fit
puts on ``fabric.base_latency_ns`` and how well it fits:

* ``p5``: ``scenarios/platforms/efa-p5.toml`` (4 x 100 Gb/s a GPU, no completion counters);
* ``p5en-nics``: the same with p5en's NICs (2 x 200 Gb/s a GPU, stripes over 2 rails);
* ``p5en-counters``: and the NIC's completion counters, so the GIN EFA-GDA design signals
  through them (``design.signal_mode_with_counters``: no flush before a tail).

    python benchmarks/efa_instance_check.py [--workers 2] [--out benchmarks/efa_instance_check.json]

Each platform is fitted from ``--starts`` points (its values and seeded draws around them), the
lowest cost kept: from its own values alone the p5 base settles at ~10 us with native dispatch
56% low, a local minimum. About 6 minutes on a 2-core machine with 4 starts.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASE = ROOT / "scenarios" / "platforms" / "efa-p5.toml"
VARIANTS = {
    "p5": None,
    "p5en-nics": "[platform.nic]\nnics_per_gpu = 2\nline_rate_gbps = 200.0\n\n[platform.proxy]\nstripe_rails = 2\n",
    "p5en-counters": ("[platform.nic]\nnics_per_gpu = 2\nline_rate_gbps = 200.0\nhw_counters = true\n"
                      "unsolicited_write_recv = true\n\n[platform.proxy]\nstripe_rails = 2\n"),
}


def fit(name: str, body: str | None, tmp: Path, workers: int, starts: int) -> dict:
    plat = BASE
    if body is not None:
        plat = tmp / f"efa-{name}.toml"
        plat.write_text(f'include = ["{BASE}"]\n\n[platform]\nname = "efa-{name}"\n'
                        f'description = "benchmarks/efa_instance_check.py: {name}"\n\n{body}')
    recs = sorted(str(p) for p in (ROOT / "calibration" / "data").glob("efa-ep16-*.json"))
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "lever.cli", "calibrate", *recs, "--platform", str(plat),
                          "--out", str(tmp / f"{name}-cal.toml"), "--workers", str(workers),
                          "--starts", str(starts), "--json"],
                         capture_output=True, text=True, check=True)
    d = json.loads(out.stdout)
    rows = {f"{r['record']} {r['quantity']}": {"measured": r["measured"], "predicted": round(r["predicted"], 1),
                                               "pct_err": r["pct_err"]}
            for r in d["rows"] if r["quantity"].endswith((".p50", ".delta"))}
    return {"cost": round(d["cost"], 2), "wall_s": round(time.perf_counter() - t0, 1),
            "params": {p["name"]: round(p["estimate"], 1) for p in d["params"]}, "rows": rows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--starts", type=int, default=4,
                    help="local fits per platform, the lowest cost kept (one start can stay in a local minimum)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    res = {}
    with tempfile.TemporaryDirectory() as td:
        for name, body in VARIANTS.items():
            res[name] = fit(name, body, Path(td), a.workers, a.starts)
            r = res[name]
            print(f"{name:14s} base_latency_ns {r['params']['fabric.base_latency_ns']:9.1f}  cost {r['cost']:7.2f}  "
                  f"({r['wall_s']} s)")
            for k, v in r["rows"].items():
                print(f"    {k:48s} measured {v['measured']:8.1f}  model {v['predicted']:8.1f}  ({v['pct_err']:+.1f}%)")
    if a.out:
        cmd = f"python benchmarks/efa_instance_check.py --starts {a.starts}"
        Path(a.out).write_text(json.dumps({"command": cmd, **res}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
