"""The emulated NIC's host engine, model against testbed: per record of a testbed folder whose
runs counted the engine's work, the copies a WQE costs, the CQEs a pass writes, how busy the
engine is and what it spends its time on, beside the op latencies.

    python benchmarks/host_engine_table.py [--dir calibration/data/testbed/h100-d354afd]
                                           [--match TEXT] [--set PATH=VALUE ...] [--workers N]

Why: the testbed's NIC is GPU warps, and its host engine (one per NIC block: reads every host
doorbell in one pass, copies each moved QP's new WQEs into the mirror, writes up to a claim of
due CQEs into host memory; docs/testbed.md) is where several levers act: qp17-ownership's owned
QPs ring apart and cost the engine a copy each. `sim/nic_host_engine.py` runs the same loop;
this table says whether it does the same work. The testbed's record gives, per iteration and
summed over its engines, passes, QP copies, mirrored WQEs and CQEs, and the engine's time
shares (doorbell reads, copies, CQE writes, idle). The model runs each record's own scenario
and sets on the shipped calibrated emulated platform (as the joint fit runs a record) and
counts the same work; its shares are that work at the platform's prices over its engines'
time, taken as dispatch p50 + combine p50 on every engine (the testbed's iteration also holds
its launch gaps, so its idle share reads a little high). The model's engine sleeps when it has
nothing to do where the testbed's reads the doorbells back to back, so only the testbed counts
idle passes: compare copies and CQEs, not passes.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DIR = ROOT / "calibration" / "data" / "testbed" / "h100-d354afd"
SHARES = ("read", "copy", "cqe", "idle")


def measured(metrics: dict) -> dict[str, float] | None:
    """The testbed's engine row from a record's metrics (name -> median), or None when the
    run did not count its host engine."""
    try:
        wqes = metrics["mirrored_wqes_per_iteration_count"]
        row = {"passes": metrics["host_passes_per_iteration_count"],
               "copies_per_wqe": metrics["host_qp_copies_per_iteration_count"] / wqes,
               # send CQEs and, under write-with-immediate, receive CQEs: both the engine's writes
               "cqes_per_pass": (metrics["cqes_per_iteration_count"] + metrics.get("rx_cqes_per_iteration_count", 0.0))
               / metrics["host_passes_per_iteration_count"]}
        row.update({s: metrics[f"host_{s}_share_ratio"] for s in SHARES})
    except (KeyError, ZeroDivisionError):
        return None
    return row


def model_row(args: tuple) -> tuple[dict[str, float], dict[str, float]]:
    """The model's engine row and its op latencies (us) for one record's run configuration."""
    rid, scenario, levers, base, sets = args
    from lever.sim.levers import load_with_levers
    from lever.sim.model import simulate_op

    scn = load_with_levers(scenario, list(levers), dict(sets), base=dict(base), base_source=f"{rid} sim.set")
    nic = scn.platform.nic
    counts: dict[str, int] = {}
    lat: dict[str, float] = {}
    engines = 0
    for op in ("dispatch", "combine"):
        res = simulate_op(scn, op, 0)
        ranks = sorted(res.latency_us)
        lat[op] = ranks[len(ranks) // 2]
        engines = len(ranks) * nic.nics_per_gpu
        for k, v in res.counters.items():
            counts[k] = counts.get(k, 0) + v
    passes = counts.get("nic_host_passes", 0)
    wqes = counts.get("messages_data", 0) + counts.get("messages_signal", 0)
    cqes = counts.get("nic_host_cqe_writes", 0)
    span = (lat["dispatch"] + lat["combine"]) * 1e3 * engines
    busy = {"read": passes * nic.host_doorbell_read_ns, "copy": counts.get("nic_host_qp_copies", 0) *
            nic.host_mirror_copy_ns, "cqe": cqes * nic.host_cqe_write_ns}
    row = {"passes": float(passes), "copies_per_wqe": counts.get("nic_host_qp_copies", 0) / max(wqes, 1),
           "cqes_per_pass": cqes / max(passes, 1)}
    row.update({k: v / span for k, v in busy.items()})
    row["idle"] = 1.0 - sum(busy.values()) / span
    return row, lat


def _put_path_table():
    """benchmarks/put_path_table.py, whose record loading and runs this table shares (the
    scripts are not a package: loaded by path)."""
    spec = importlib.util.spec_from_file_location("put_path_table", Path(__file__).with_name("put_path_table.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def rows(folder: Path, match: str, sets: dict, workers: int) -> list[tuple]:
    """(record id, testbed row, model row, testbed latencies, model latencies) per record of
    ``folder`` that counted its host engine and whose id contains ``match``."""
    ppt = _put_path_table()
    recs = ppt.emulated_records(sorted(folder.glob("*.json")), match)
    hws = {r.id: measured({k: v.median for k, v in r.metrics.items()}) for r in recs}
    recs = [r for r in recs if hws[r.id] is not None]
    models = ppt.run_on_calibrated(model_row, recs, sets, workers)
    return [(r.id, hws[r.id], m, {op: r.latency_us[op].median for op in ("dispatch", "combine")}, lat)
            for r, (m, lat) in zip(recs, models, strict=True)]


def table(got: list[tuple]) -> str:
    head = ("record | copies a WQE hw / model | CQEs a pass hw / model | "
            + " | ".join(f"{s} share hw / model" for s in SHARES) + " | dispatch us hw / model | combine us hw / model")
    lines = [f"| {head} |", "|---|" + "---|" * (4 + len(SHARES))]
    for rid, hw, model, hlat, mlat in got:
        cells = [f"{hw['copies_per_wqe']:.2f} / {model['copies_per_wqe']:.2f}",
                 f"{hw['cqes_per_pass']:.2f} / {model['cqes_per_pass']:.2f}"]
        cells += [f"{hw[s]:.2f} / {model[s]:.2f}" for s in SHARES]
        cells += [f"{hlat[op]:.0f} / {mlat[op]:.0f}" for op in ("dispatch", "combine")]
        lines.append(f"| `{rid}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from lever.sim.scenario import parse_sets

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="a testbed folder of records")
    p.add_argument("--match", default="", help="records whose id contains this")
    p.add_argument("--set", action="append", default=[], metavar="PATH=VALUE")
    p.add_argument("--workers", type=int, default=2)
    a = p.parse_args(sys.argv[1:] if argv is None else argv)
    got = rows(a.dir, a.match, parse_sets(a.set), a.workers)
    if not got:
        print(f"no record of {a.dir} counted its host engine (match {a.match!r})", file=sys.stderr)
        return 1
    print(table(got))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
