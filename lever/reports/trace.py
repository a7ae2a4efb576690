"""``--trace``: the Chrome trace-event file (Perfetto opens it) of seed 0 of every op."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lever.sim.engine import Trace


def write_trace(traces: list[tuple[str, Trace]], path: Path) -> None:
    """One Chrome trace file; each op's events in its own process group."""
    events = []
    for i, (op, tr) in enumerate(traces):
        for ev in tr.events:
            e = dict(ev)
            e["pid"] = e["pid"] + 10000 * i
            if e.get("name") == "process_name":
                e["args"] = {"name": f"{op}: {e['args']['name']}"}
            events.append(e)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ns"}))
    tmp.replace(path)
