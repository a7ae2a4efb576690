"""Where a post's time goes, model against testbed: per emulated EP record, the put path per
WQE (us) of the model at the shipped emulated fit and of the testbed's profiler.

    python benchmarks/put_path_table.py [--op dispatch|combine] [--match TEXT] [--dir DIR]
                                         [--seeds N] [--set PATH=VALUE ...] [--workers N]

Why: latencies can agree while the time inside a post does not (the shipped fit's 12 us
fence stood for the testbed's doorbell turn: README, Leave one lever out). The testbed's
profiler times, per sampled post group, the turn (`lock`), the credit reads, the WQE stores,
the fence and the doorbell with the turn's release (`doorbell`); its record carries their
shares and the stores + fence + doorbell time per WQE, from which the per-WQE time of each
follows. The model runs each record's own scenario and sets on the shipped calibrated
emulated platform (as the joint fit runs a record), and its ledger gives the same categories
(its turn release is in `fence`; its `doorbell` is the store alone). `--dir` reads the records
of a testbed folder instead of the shipped ones (e.g. `calibration/data/testbed/h100-aac18cb`,
V2); `--set` tries a model change (e.g. `platform.gpu.release_waits_host_reads=true`) without
touching the platform files.
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

CATS = ("lock", "credit_wait", "wqe", "fence", "doorbell")


def measured_per_wqe(metrics: dict, op: str) -> dict[str, float] | None:
    """The testbed's put path per WQE (ns) of ``op`` from a record's metrics (name -> median),
    or None when the record was not profiled."""
    try:
        chain = metrics[f"{op}_post_chain_per_wqe_ns"]
        share = {c: metrics[f"{op}_putpath_{c}_ratio"] for c in CATS}
    except KeyError:
        return None
    chain_share = share["wqe"] + share["fence"] + share["doorbell"]
    if chain_share <= 0:
        return None
    total = chain / chain_share
    return {c: share[c] * total for c in CATS}


def model_per_wqe(args: tuple) -> dict[str, dict[str, float]]:
    """The model's put path per WQE (ns) of both ops for one record's run configuration:
    ``base`` the calibrated platform and the record's sets, ``sets`` the change tried."""
    rid, scenario, levers, base, sets, seeds = args
    from lever.calibration.fit import wqes_written
    from lever.sim.levers import load_with_levers
    from lever.sim.model import simulate_op

    scn = load_with_levers(scenario, list(levers), dict(sets), base=dict(base), base_source=f"{rid} sim.set")
    out: dict[str, dict[str, float]] = {}
    for op in ("dispatch", "combine"):
        acc = dict.fromkeys(CATS, 0.0)
        wqes = 0
        for seed in range(seeds):
            led = simulate_op(scn, op, seed).ledger
            for c in CATS:
                acc[c] += led.busy.get(c, 0.0)
            wqes += wqes_written(led.counters)
        out[op] = {c: v / max(wqes, 1) for c, v in acc.items()}
    return out


def emulated_records(paths, match: str) -> list:
    """The emulated-NIC records among ``paths`` the model can run, whose id contains ``match``."""
    from lever.calibration.records import load_record

    return [r for r in map(load_record, paths) if r.nic == "emulated-srd" and r.sim is not None and match in r.id]


def run_on_calibrated(fn, recs: list, sets: dict, workers: int, *extra) -> list:
    """``fn((id, scenario, levers, base, sets, *extra))`` for each record, in record order: its
    own scenario, levers and sets on the shipped calibrated emulated platform (``base``, as the
    joint fit runs a record), ``sets`` the change tried. In this process with ``workers <= 1``
    (also what a test that loads this file by path needs), else in a process pool."""
    from lever.calibration.fit import flatten_platform
    from lever.sim.scenario import SCENARIO_DIR

    with open(SCENARIO_DIR / "platforms" / "emulated-nvlink-calibrated.toml", "rb") as f:
        platform = flatten_platform(tomllib.load(f)["platform"])
    jobs = [(r.id, r.sim.scenario, tuple(r.sim.levers), tuple({**platform, **r.sim.set}.items()),
             tuple(sets.items()), *extra) for r in recs]
    if workers <= 1:
        return [fn(j) for j in jobs]
    with ProcessPoolExecutor(workers) as ex:
        return list(ex.map(fn, jobs))


def rows(op: str, match: str, seeds: int, sets: dict, workers: int, folder: Path | None = None) -> list[tuple]:
    from lever.calibration.records import shipped_record_paths

    paths = sorted(folder.glob("*.json")) if folder is not None else shipped_record_paths()
    recs = emulated_records(paths, match)
    hws = {r.id: measured_per_wqe({k: v.median for k, v in r.metrics.items()}, op) for r in recs}
    recs = [r for r in recs if hws[r.id] is not None]
    models = run_on_calibrated(model_per_wqe, recs, sets, workers, seeds)
    return [(r.id, hws[r.id], m[op]) for r, m in zip(recs, models, strict=True)]


def table(op: str, got: list[tuple]) -> str:
    head = " | ".join(f"{c} hw / model" for c in CATS)
    lines = [f"| record ({op}, us a WQE) | {head} |", "|---|" + "---|" * len(CATS)]
    for rid, hw, model in got:
        cells = " | ".join(f"{hw[c] / 1e3:.1f} / {model[c] / 1e3:.1f}" for c in CATS)
        lines.append(f"| `{rid}` | {cells} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from lever.sim.scenario import parse_sets

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--op", choices=("dispatch", "combine"), default="dispatch")
    p.add_argument("--match", default="emu-bed-ep2-native", help="records whose id contains this")
    p.add_argument("--dir", type=Path, default=None, help="a folder of records (default: the shipped ones)")
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument("--set", action="append", default=[], metavar="PATH=VALUE")
    p.add_argument("--workers", type=int, default=2)
    a = p.parse_args(sys.argv[1:] if argv is None else argv)
    got = rows(a.op, a.match, a.seeds, parse_sets(a.set), a.workers, a.dir)
    if not got:
        print(f"no profiled emulated record matches {a.match!r}", file=sys.stderr)
        return 1
    print(table(a.op, got))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
