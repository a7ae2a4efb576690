"""Before/after speed of the model on one noisy machine: this tree beside a checkout of the
tree before, interleaved, with bare SimPy's rate measured in the same run.

    git worktree add /tmp/speed-base <commit>      # the tree before
    python benchmarks/speed_compare.py --base /tmp/speed-base [--eps 16,64,128,256]
           [--cli] [--repeat 3] [--out speed.json]

Per EP size (dispatch+combine of the default scenario, one seed, no critical path, each run
in a fresh process so its peak RSS is its own; ``benchmarks/sim_speed.py`` does the same for
one tree): wall s, CPU s (the process's own: less sensitive to other jobs than wall time),
events (ev/s against CPU s, over bare SimPy's rate) and peak RSS of each tree, and the
after/before ratios of CPU time and events. With
``--cli``, the commands a user runs: the default ``lever simulate`` (3 seeds, both
attributions) and ``lever predict batched-doorbells``, whole processes timed (``--validate``
adds ``lever validate``, once per tree). Runs of the two
trees alternate (before, after, before, ...) and each figure is the median of ``--repeat``,
so load from other jobs falls on both; the ratios are what to read on a shared machine, and
event counts are exact.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TREE = HERE.parent


def _worker(scenario: str, ep: int, critical_path: bool) -> None:
    """One row, in a fresh process (the tree is whatever PYTHONPATH names)."""
    sys.path.insert(0, str(HERE))
    from sim_speed import _one

    print(json.dumps(_one((scenario, ep, critical_path))))


def _run_row(tree: Path, scenario: str, ep: int, critical_path: bool) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, __file__, "--worker", str(ep), "--scenario", scenario]
    if critical_path:
        cmd.append("--critical-path")
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True, cwd=tree)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _run_cli(tree: Path, args: list[str]) -> tuple[float, float]:
    """Wall s of the whole command, and the CPU s of it and every process it started."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "lever", *args], env=env, check=True,
                   capture_output=True, cwd=tree)
    wall = time.perf_counter() - t
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)


CLI = {
    "lever simulate decode-ep16-efa-native": ["simulate", "decode-ep16-efa-native", "--json"],
    "lever predict batched-doorbells": ["predict", "batched-doorbells", "--json"],
}
VALIDATE = {"lever validate": ["validate", "--json"]}  # minutes a run: only with --validate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", help="a checkout of the tree before the change")
    ap.add_argument("--eps", default="16,64")
    ap.add_argument("--scenario", default="decode-ep16-efa-native")
    ap.add_argument("--repeat", type=int, default=1, help="runs per tree and row (median)")
    ap.add_argument("--cli", action="store_true", help="also time lever simulate and predict")
    ap.add_argument("--validate", action="store_true",
                    help="with --cli, also time lever validate (minutes per run; once per tree)")
    ap.add_argument("--critical-path", action="store_true")
    ap.add_argument("--out", default=None)
    ap.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker is not None:
        _worker(a.scenario, a.worker, a.critical_path)
        return
    sys.path.insert(0, str(HERE))
    from sim_speed import bare_simpy_rate

    trees = {"after": TREE}
    if a.base:
        trees = {"before": Path(a.base).resolve(), "after": TREE}
    bare = []
    rows: dict[str, dict[int, list[dict]]] = {k: {} for k in trees}
    cli: dict[str, dict[str, list[tuple[float, float]]]] = {k: {} for k in trees}
    for _ in range(a.repeat):
        bare.append(bare_simpy_rate())
        for ep in [int(x) for x in a.eps.split(",") if x]:
            for name, tree in trees.items():
                rows[name].setdefault(ep, []).append(_run_row(tree, a.scenario, ep, a.critical_path))
        if a.cli:
            for label, args in CLI.items():
                for name, tree in trees.items():
                    cli[name].setdefault(label, []).append(_run_cli(tree, args))
    if a.cli and a.validate:
        CLI.update(VALIDATE)
        for label, args in VALIDATE.items():
            for name, tree in trees.items():
                cli[name].setdefault(label, []).append(_run_cli(tree, args))
    med = statistics.median
    result = {"bare_simpy_timeouts_per_s": med(bare), "trees": {k: str(v) for k, v in trees.items()},
              "rows": {}, "cli": {}}
    print(f"bare SimPy: {med(bare):,.0f} timeouts/s (median of {len(bare)} in this run)\n")
    head = "| EP |" + "".join(f" {n} wall s | {n} CPU s | {n} events | {n} ev/s vs bare | {n} RSS MiB |"
                              for n in trees)
    if "before" in trees:
        head += " CPU after/before | events after/before |"
    print(head)
    print("|" + "---|" * (1 + 5 * len(trees) + (2 if "before" in trees else 0)))
    for ep in rows["after"]:
        line = f"| {ep} |"
        got = {}
        for n in trees:
            rs = rows[n][ep]
            wall = med(r["wall_s"] for r in rs)
            cpu = med(r["cpu_s"] for r in rs)
            ev = rs[0]["events"]
            rss = max(r["peak_rss_mib"] for r in rs)
            got[n] = (cpu, ev)
            line += f" {wall:.2f} | {cpu:.2f} | {ev:,} | {ev / cpu / med(bare):.2f} | {rss:.0f} |"
            result["rows"].setdefault(str(ep), {})[n] = {
                "wall_s": wall, "cpu_s": cpu, "events": ev, "peak_rss_mib": rss,
                "walls": [r["wall_s"] for r in rs], "cpus": [r["cpu_s"] for r in rs],
                "mean_pending": rs[0]["mean_pending"]}
        if "before" in trees:
            line += (f" {got['after'][0] / got['before'][0]:.2f} |"
                     f" {got['after'][1] / got['before'][1]:.3f} |")
        print(line)
    if a.cli:
        print("\n| command |" + "".join(f" {n} wall s | {n} CPU s |" for n in trees)
              + (" wall after/before | CPU after/before |" if "before" in trees else ""))
        print("|---|" + "---|" * (2 * len(trees) + (2 if "before" in trees else 0)))
        for label in CLI:
            vals = {n: (med(w for w, _c in cli[n][label]), med(c for _w, c in cli[n][label]))
                    for n in trees}
            line = f"| `{label}` |" + "".join(f" {vals[n][0]:.2f} | {vals[n][1]:.2f} |" for n in trees)
            if "before" in trees:
                line += (f" {vals['after'][0] / vals['before'][0]:.2f} |"
                         f" {vals['after'][1] / vals['before'][1]:.2f} |")
            print(line)
            result["cli"][label] = {n: cli[n][label] for n in trees}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
