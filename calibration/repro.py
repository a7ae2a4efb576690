"""How far one configuration's measured latency moves between processes of one device call:
the noise a measured lever delta carries beyond its own samples.

A lever delta is the median of one process's iterations minus the median of another's. The
bootstrap band of :func:`lever.calibration.compare.measured_delta` covers the iterations'
spread inside each process, not how far a whole process lands from the next one (clocks,
placement of blocks on SMs, the state the previous process left). The testbed measures the
latter directly: its device script runs the baseline again later in the same call
(``hw/run_testbed_on_device.sh`` step ``repeat``: ``testbed/emu-bed-ep-repeat-*``). Records
with the same ``sim`` link (scenario, set, levers) from the same git revision are repeats of
one configuration; their medians' sample standard deviation per op, pooled over every such
group of a NIC, is that NIC's run-to-run noise. A delta of two processes carries it twice
(in quadrature). A NIC with no repeats has none measured and gets none (``{}``): its bands
stay what the model says, which is reported, not assumed away.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

from lever.calibration.records import DATA_DIR, RunRecord, load_record

REPEAT_DIRS = ("", "testbed", "testbed/noise")
"""Where repeats live: the training records and the testbed's own records beside them (the
credit-diag folder holds copies of training records, so it is not read: a copy is no repeat)."""


def repeat_records(data: Path = DATA_DIR) -> list[RunRecord]:
    """Every non-superseded record of the folders repeats are looked for in."""
    out = []
    for sub in REPEAT_DIRS:
        for p in sorted((data / sub).glob("*.json") if sub else data.glob("*.json")):
            if p.name.endswith("-outcome.json"):
                continue
            r = load_record(p)
            if r.superseded_by is None and r.sim is not None and r.latency_us:
                out.append(r)
    return out


def _key(r: RunRecord) -> tuple:
    """One configuration: what ran (``what``: levers, the emulated NIC's settings and queue
    placements, which the model's ``sim`` link need not tell apart), how the model reproduces
    it, and the code revision."""
    assert r.sim is not None
    return (r.nic, json.dumps(r.what.model_dump(mode="json"), sort_keys=True), r.sim.scenario,
            json.dumps(r.sim.set, sort_keys=True), tuple(r.sim.levers), r.provenance.git_rev)


def run_noise(records: Iterable[RunRecord]) -> dict[str, dict[str, dict]]:
    """Per NIC and op: ``{"sd_us": pooled sd of a process's median, "dof": n, "groups": [ids]}``
    from the groups of repeated configurations among ``records``."""
    groups: dict[tuple, list[RunRecord]] = defaultdict(list)
    for r in records:
        if r.sim is not None and r.provenance.git_rev:
            groups[_key(r)].append(r)
    acc: dict[tuple[str, str], list] = defaultdict(lambda: [0.0, 0, []])  # sum sq dev, dof, ids
    for key, rs in groups.items():
        if len(rs) < 2:
            continue
        nic = key[0]
        for op in sorted({op for r in rs for op in r.latency_us}):
            xs = [r.latency_us[op].median for r in rs if op in r.latency_us]
            if len(xs) < 2:
                continue
            m = sum(xs) / len(xs)
            a = acc[(nic, op)]
            a[0] += sum((x - m) ** 2 for x in xs)
            a[1] += len(xs) - 1
            a[2].append(sorted(r.id for r in rs))
    out: dict[str, dict[str, dict]] = defaultdict(dict)
    for (nic, op), (ss, dof, ids) in sorted(acc.items()):
        out[nic][op] = {"sd_us": math.sqrt(ss / dof), "dof": dof, "groups": ids}
    return dict(out)


def delta_halfwidth(sd_us: float, dof: int | None = None) -> float:
    """The 90% half-width this noise adds to a delta of two processes' medians.

    With ``dof`` (the degrees of freedom the sd was estimated with) the quantile is Student's
    t, not the normal's: an sd from three runs is itself uncertain (t = 2.92 at 2 dof against
    1.645), and a band built on it as if it were exact is too narrow about one time in four.
    The pooled estimate gets closer to the normal quantile as repeats are added
    (1.86 at 8 dof), which is what more repeats buy."""
    from lever.calibration.compare import Z90

    q = Z90
    if dof is not None:
        if dof < 1:
            raise ValueError(f"run noise needs at least 1 degree of freedom, got {dof}")
        from scipy.stats import t

        q = float(t.ppf(0.95, dof))
    return q * math.sqrt(2.0) * sd_us
