"""``--plot``: the timeline of seed 0 beside the two attributions of each op."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from lever.sim.params import CATEGORIES  # noqa: E402

COLORS = {c: plt.cm.tab20(i / len(CATEGORIES)) for i, c in enumerate(CATEGORIES)}


def plot_simulation(res: dict, traces: list, path: Path, max_tracks: int = 40) -> None:
    ops = list(res["ops"])
    fig, axes = plt.subplots(len(ops), 3, figsize=(18, 4.5 * len(ops)), squeeze=False,
                             gridspec_kw={"width_ratios": [3, 1, 1]})
    for row, op in enumerate(ops):
        ax = axes[row][0]
        tr = dict(traces).get(op)
        names: dict[tuple[int, int], str] = {}
        spans = []
        if tr is not None:
            for e in tr.events:
                if e["ph"] == "M" and e["name"] == "thread_name":
                    names[(e["pid"], e["tid"])] = e["args"]["name"]
                elif e["ph"] == "X":
                    spans.append(e)
        tracks = sorted({(e["pid"], e["tid"]) for e in spans})[:max_tracks]
        ypos = {k: i for i, k in enumerate(tracks)}
        for e in spans:
            k = (e["pid"], e["tid"])
            if k in ypos:
                ax.barh(ypos[k], e["dur"], left=e["ts"], height=0.8,
                        color=COLORS.get(e["name"], "grey"))
        ax.set_yticks(range(len(tracks)), [names.get(k, str(k)) for k in tracks], fontsize=6)
        ax.set_xlabel("time (us)")
        ax.set_title(f"{op}: timeline, seed 0 (first {max_tracks} tracks)")
        att = res["attribution"][op]
        prof = att["profiler"]
        ax = axes[row][1]
        cats = [c for c in CATEGORIES if prof.get(c, 0) > 0]
        ax.barh(cats, [prof[c] * 100 for c in cats], color=[COLORS[c] for c in cats])
        ax.set_xlabel("% of warp time")
        ax.set_title("profiler")
        ax = axes[row][2]
        cp = att.get("critical_path", {})
        cats = [c for c in CATEGORIES if c in cp]
        ax.barh(cats, [cp[c] for c in cats], color=[COLORS[c] for c in cats])
        ax.set_xlabel("us of p50 latency")
        ax.set_title("critical path")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
