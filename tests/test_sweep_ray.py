"""``lever sweep --executor ray``: the same table as the local pool; a dying worker loses nothing."""

from __future__ import annotations

import csv
import os
import sys
from functools import partial
from pathlib import Path

import pytest

from lever.reports import sweep as sw

ray = pytest.importorskip("ray")

SCN = "decode-ep16-efa-native"
TINY = {"workload.tokens_per_rank": 8}


@pytest.fixture(scope="module")
def local_ray():
    sw.ray_init(workers=2)
    yield ray
    ray.shutdown()


def norm(path: Path) -> dict:
    with path.open() as f:
        return {(r["key"], r["op"]): {k: v for k, v in r.items() if k != "wall_s"} for r in csv.DictReader(f)}


def pts():
    return sw.enumerate_points(SCN, [sw.parse_grid("workload.ep_ranks=8,16")],
                               levers=["lazy-completion-dispatch"], sets=TINY)


def die_once(marks: str, p: sw.Point) -> list[dict]:
    """Kill the worker process the first time it runs the EP16 lever point (a marker file says so)."""
    mark = Path(marks) / p.key
    if p.lever != "none" and dict(p.values)["workload.ep_ranks"] == 16 and not mark.exists():
        mark.write_text("died")
        os._exit(1)
    return sw.run_point(p)


def test_ray_table_equals_local_table(tmp_path, local_ray):
    local, remote = tmp_path / "local.csv", tmp_path / "ray.csv"
    sw.run_sweep(pts(), local, executor="local", workers=1, progress=False)
    s = sw.run_sweep(pts(), remote, executor="ray", workers=2, progress=False)
    assert s["ran"] == 4
    assert norm(remote) == norm(local) and len(norm(local)) == 8


def test_ray_retries_a_point_whose_worker_died(tmp_path, local_ray):
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the runner lives in this test
    marks = tmp_path / "marks"
    marks.mkdir()
    out, ref = tmp_path / "ray.csv", tmp_path / "ref.csv"
    s = sw.run_sweep(pts(), out, executor="ray", runner=partial(die_once, str(marks)), progress=False)
    assert len(list(marks.iterdir())) == 1                     # one worker did die mid-point
    assert s["ran"] == 4                                       # and Ray ran its point again
    sw.run_sweep(pts(), ref, executor="local", workers=1, progress=False)
    assert norm(out) == norm(ref)
