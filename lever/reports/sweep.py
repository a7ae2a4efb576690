"""Sweeps: many scenario points, run in parallel, streamed to a CSV table that a rerun resumes.

A *point* is one scenario with ``--set``-style assignments (the swept values),
one lever (``"none"`` is the baseline) and a seed count. Its *key* is a short
digest of exactly those things, so it is stable across runs, machines and the
order of enumeration: a rerun with the same ``--out`` reads the keys already
in the table and runs only the rest.

Enumeration: the grid axes (``PATH=V1,V2,...``) form a cartesian product;
random axes (``PATH=LO:HI``, ``PATH=LO:HI:log``) draw ``samples`` values from
a seeded generator (integers when both bounds are integers); every random
sample is crossed with the grid, and every resulting point with every lever.
``workload.ep_ranks`` is a path like any other.

Lever semantics follow ``lever predict``: a lever point is the scenario with
the lever's changes, then the swept values; a swept path that a lever of the
sweep sets re-parameterises that lever, so the baseline point does not get it
(the baseline line stays the baseline, the lever line moves).

Seeds 0..N-1 are the same for every point: baseline and lever points at the
same swept values run on common random numbers.

Executors: ``local`` (a process pool, spawn context; one worker runs in
process) and ``ray`` (one Ray task per point, retried by Ray when a worker
dies; results already written are never lost because each finished point is
flushed to the table as soon as it arrives).
"""

from __future__ import annotations

import csv
import itertools
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from lever.calibration.pool import imap_unordered, ray_init
from lever.reports.progress import progress_bar
from lever.sim import levers as levers_mod
from lever.sim import scenario as scn_mod
from lever.sim.errors import UserError
from lever.sim.scenario import Overrides

BASELINE = "none"
STAT_COLS = ("p50_us", "p99_us", "mean_us")
TAIL_COLS = ("events", "wall_s", "error")


class SweepError(UserError):
    """Bad sweep input or an unusable results table; ``str()`` is the one-line message."""


# -- axes ---------------------------------------------------------------------------

@dataclass(frozen=True)
class GridAxis:
    path: str
    values: tuple[Any, ...]


@dataclass(frozen=True)
class RandomAxis:
    path: str
    lo: float
    hi: float
    log: bool = False
    integer: bool = False


def parse_grid(text: str) -> GridAxis:
    """``PATH=V1,V2,...`` (values as in ``--set``: TOML literals or bare strings)."""
    if "=" not in text:
        raise SweepError(f"--grid: '{text}': expected PATH=V1,V2,...")
    path, vals = text.split("=", 1)
    path = path.strip()
    items = [v.strip() for v in vals.split(",") if v.strip()]
    if not path or not items:
        raise SweepError(f"--grid: '{text}': expected PATH=V1,V2,...")
    return GridAxis(path, tuple(scn_mod.parse_value(v) for v in items))


def parse_random(text: str) -> RandomAxis:
    """``PATH=LO:HI`` (uniform) or ``PATH=LO:HI:log`` (log-uniform). ``integer`` (both bounds
    integers) is tentative: ``enumerate_points`` keeps it only for an integer field."""
    if "=" not in text:
        raise SweepError(f"--random: '{text}': expected PATH=LO:HI[:log]")
    path, rng = text.split("=", 1)
    parts = [p.strip() for p in rng.split(":")]
    if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] not in ("log", "lin")):
        raise SweepError(f"--random: '{text}': expected PATH=LO:HI[:log]")
    lo, hi = scn_mod.parse_value(parts[0]), scn_mod.parse_value(parts[1])
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in (lo, hi)):
        raise SweepError(f"--random: '{text}': LO and HI must be numbers")
    if not lo < hi:
        raise SweepError(f"--random: '{text}': LO must be below HI")
    log = len(parts) == 3 and parts[2] == "log"
    if log and lo <= 0:
        raise SweepError(f"--random: '{text}': log-uniform needs LO > 0")
    return RandomAxis(path.strip(), float(lo), float(hi), log,
                      isinstance(lo, int) and isinstance(hi, int))


# -- points -------------------------------------------------------------------------

@dataclass(frozen=True)
class Point:
    """One run: scenario + swept values + lever, on seeds 0..seeds-1."""

    scenario: str
    values: tuple[tuple[str, Any], ...]
    lever: str = BASELINE
    seeds: int = 1
    sets: tuple[tuple[str, Any], ...] = ()  # fixed overrides, applied before the swept values
    skip: tuple[str, ...] = field(default=(), compare=False)  # swept paths not applied (lever params)

    @property
    def key(self) -> str:
        blob = {"scenario": self.scenario, "values": [[p, v] for p, v in self.values],
                "lever": self.lever, "seeds": self.seeds, "sets": [[p, v] for p, v in self.sets]}
        return scn_mod.digest(blob)[:16]

    def applied_sets(self) -> dict[str, Any]:
        """The overrides this point runs with: the fixed ones, then the swept values."""
        return {**dict(self.sets), **{p: v for p, v in self.values if p not in self.skip}}

    def load(self):
        lev = [] if self.lever == BASELINE else [self.lever]
        return levers_mod.load_with_levers(self.scenario, lev, self.applied_sets())


def random_values(axes: Sequence[RandomAxis], samples: int, seed: int = 0) -> list[tuple[Any, ...]]:
    """``samples`` rows of values, one per random axis, from a seeded generator."""
    import numpy as np

    if not axes:
        return [()]
    rng = np.random.default_rng(seed)
    u = rng.random((samples, len(axes)))
    rows = []
    for r in u:
        row = []
        for a, x in zip(axes, r, strict=True):
            if a.log:
                v = math.exp(math.log(a.lo) + x * (math.log(a.hi) - math.log(a.lo)))
            else:
                v = a.lo + x * (a.hi - a.lo)
            row.append(int(min(a.hi, math.floor(v + 0.5))) if a.integer else float(v))
        rows.append(tuple(row))
    return rows


def enumerate_points(scenario: str, grid: Sequence[GridAxis] = (), random: Sequence[RandomAxis] = (),
                     samples: int = 0, levers: Sequence[str] = (), seeds: int = 1,
                     sets: Overrides | None = None, sample_seed: int = 0) -> list[Point]:
    """Every point of the sweep, in a stable order (random samples x grid x levers)."""
    paths = [a.path for a in random] + [a.path for a in grid]
    if len(set(paths)) != len(paths):
        raise SweepError("a path is swept twice")
    if random and samples < 1:
        raise SweepError("--random needs --samples N (N >= 1)")
    if random:  # integer draws only where the field itself is an integer
        base = levers_mod.load_with_levers(scenario, [], sets).model_dump(mode="python")
        random = [replace(a, integer=a.integer and _is_int(_lookup(base, a.path))) for a in random]
    lev_list = [BASELINE] + [lv for lv in dict.fromkeys(levers) if lv != BASELINE]
    lever_fields = {lv: set(levers_mod.load_lever(lv).set) for lv in lev_list if lv != BASELINE}
    any_lever_field = set().union(*lever_fields.values()) if lever_fields else set()
    out = []
    for rrow in random_values(random, samples, sample_seed):
        for grow in itertools.product(*(a.values for a in grid)):
            values = tuple(zip(paths, (*rrow, *grow), strict=True))
            for lv in lev_list:
                skip = tuple(p for p in paths if p in any_lever_field and lv == BASELINE)
                out.append(Point(scenario, values, lv, seeds, tuple((sets or {}).items()), skip))
    return out


def _lookup(d: dict, path: str) -> Any:
    for k in path.split("."):
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def validate_points(points: Sequence[Point]) -> dict[str, list[str]]:
    """Load every point's scenario up front (bad input fails before any run): key -> ops."""
    ops: dict[str, list[str]] = {}
    for p in points:
        try:
            ops[p.key] = list(p.load().ops)
        except scn_mod.ScenarioError as e:
            vals = ", ".join(f"{k}={v}" for k, v in p.values)
            raise SweepError(f"point ({vals}; lever {p.lever}): {e}") from None
    return ops


# -- running one point --------------------------------------------------------------

def run_point(point: Point) -> list[dict[str, Any]]:
    """Simulate one point: one row per op (a single error row if the model refuses it)."""
    from lever.sim.model import ModelError
    from lever.sim.results import simulate

    t0 = time.perf_counter()
    base = {"key": point.key, "scenario": point.scenario, "lever": point.lever, "seeds": point.seeds,
            **{p: v for p, v in point.values}}
    try:
        res = simulate(point.load(), seeds=point.seeds, with_critical_path=False)
    except ModelError as e:
        return [{**base, "op": "", "events": 0, "wall_s": round(time.perf_counter() - t0, 4),
                 "error": str(e) or type(e).__name__}]
    rows = []
    for op, s in res.ops.items():
        rows.append({**base, "op": op, **{c: getattr(s, c) for c in STAT_COLS}, "events": res.events,
                     "wall_s": res.wall_s, "error": ""})
    return rows


# -- the results table --------------------------------------------------------------

def columns(points: Sequence[Point]) -> list[str]:
    axes = [p for p, _ in points[0].values] if points else []
    return ["key", "scenario", "lever", "seeds", *axes, "op", *STAT_COLS, *TAIL_COLS]


def read_table(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    """Header and complete rows of a results CSV (a torn last line is dropped)."""
    if not path.is_file() or path.stat().st_size == 0:
        return [], []
    text = path.read_text()
    if not text.endswith("\n"):
        text = text[: text.rfind("\n") + 1]
    lines = text.splitlines(keepends=True)
    if not lines:
        return [], []
    reader = csv.DictReader(lines)
    header = list(reader.fieldnames or [])
    rows = [r for r in reader if None not in r and all(v is not None for v in r.values())]
    return header, rows


def finished_keys(rows: Iterable[dict[str, str]], ops_of: dict[str, list[str]]) -> set[str]:
    """Keys whose rows cover every op of their point (or that hold an error row)."""
    seen: dict[str, set[str]] = {}
    errored = set()
    for r in rows:
        seen.setdefault(r["key"], set()).add(r["op"])
        if r.get("error"):
            errored.add(r["key"])
    return {k for k, got in seen.items()
            if k in errored or (k in ops_of and set(ops_of[k]) <= got)}


class Table:
    """Append-only CSV writer that flushes every row; opening it resumes an existing table."""

    def __init__(self, path: Path, cols: list[str], ops_of: dict[str, list[str]]):
        self.path, self.cols = Path(path), cols
        header, rows = read_table(self.path)
        if header and header != cols:
            raise SweepError(f"{self.path}: columns {header} differ from this sweep's {cols}: "
                             "use another --out")
        self.done = finished_keys(rows, ops_of) if header else set()
        keep = [r for r in rows if r["key"] in self.done]
        if header and (len(keep) != len(rows) or not self.path.read_text().endswith("\n")):
            # drop torn lines and rows of half-written points before appending
            tmp = self.path.with_name(self.path.name + ".tmp")
            with tmp.open("w", newline="") as f:
                w = csv.DictWriter(f, cols)
                w.writeheader()
                w.writerows(keep)
            tmp.replace(self.path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = self.path.open("a", newline="")
        self._w = csv.DictWriter(self._f, cols, extrasaction="ignore")
        if not header:
            self._w.writeheader()
            self._f.flush()

    def write(self, rows: list[dict[str, Any]]) -> None:
        for r in rows:
            self._w.writerow({c: _cell(r.get(c, "")) for c in self.cols})
            self._f.flush()

    def close(self) -> None:
        self._f.close()


def _cell(v: Any) -> Any:
    return repr(v) if isinstance(v, float) else v


def run_sweep(points: Sequence[Point], out: Path, executor: str = "local", workers: int | None = None,
              address: str | None = None, runner: Callable[[Point], list[dict]] = run_point,
              progress: bool = True) -> dict[str, Any]:
    """Run the points not yet in ``out``; stream each finished point's rows into it."""
    ops_of = validate_points(points)
    if executor not in ("local", "ray"):
        raise SweepError(f"--executor: '{executor}': expected local or ray")
    if executor == "ray":  # connect before the table is touched: a missing Ray writes nothing
        ray_init(workers, address)
    table = Table(Path(out), columns(points), ops_of)
    todo = [p for p in points if p.key not in table.done]
    # a point listed twice (same key) runs once
    todo = list({p.key: p for p in todo}.values())
    t0 = time.perf_counter()
    n = 0
    try:
        with progress_bar(progress) as pr:
            task = pr.add_task("sweep", total=len(todo))
            for i, rows in imap_unordered(runner, todo, executor, workers, address):
                table.write(rows)
                table.done.add(todo[i].key)
                n += 1
                pr.advance(task)
    finally:
        table.close()
    return {"points": len(points), "skipped": len(points) - len(todo), "ran": n,
            "wall_s": round(time.perf_counter() - t0, 3), "out": str(out)}


# -- plot ---------------------------------------------------------------------------

def plot_table(csv_path: Path, out: Path, x: str | None = None, stat: str = "p50_us") -> None:
    """Latency against the swept axis ``x`` (default: the first), one line per lever (and per value
    of the other swept axes), one panel per op."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    header, rows = read_table(Path(csv_path))
    rows = [r for r in rows if not r.get("error")]
    axes = header[header.index("seeds") + 1: header.index("op")] if header else []
    if not axes:
        raise SweepError(f"{csv_path}: no swept axis to plot against")
    x = x or axes[0]
    if x not in axes:
        raise SweepError(f"--plot-x: '{x}' is not a swept axis ({', '.join(axes)})")
    others = [a for a in axes if a != x]
    ops = list(dict.fromkeys(r["op"] for r in rows))
    fig, axs = plt.subplots(1, max(1, len(ops)), figsize=(5.5 * max(1, len(ops)), 4), squeeze=False)
    for ax, op in zip(axs[0], ops, strict=False):
        lines: dict[str, list[tuple[Any, float]]] = {}
        for r in rows:
            if r["op"] != op:
                continue
            label = r["lever"] + "".join(f", {a}={r[a]}" for a in others)
            lines.setdefault(label, []).append((_num(r[x]), float(r[stat])))
        numeric = all(isinstance(v, float) for pts in lines.values() for v, _ in pts)
        for label, pts in sorted(lines.items()):
            pts.sort(key=lambda t: t[0] if numeric else str(t[0]))
            xs = [p[0] if numeric else str(p[0]) for p in pts]
            ax.plot(xs, [p[1] for p in pts], marker="o", label=label)
        ax.set_title(op)
        ax.set_xlabel(x)
        ax.set_ylabel(stat.replace("_us", " (us)"))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def _num(s: str) -> Any:
    try:
        return float(s)
    except ValueError:
        return s
