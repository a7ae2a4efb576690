"""Plots behind every ``--plot``: a simulation's timeline and attributions, a prediction
judged against its measurement, a sensitivity ranking."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from lever.sim.params import CATEGORIES  # noqa: E402
from lever.sim.results import SimulationResult  # noqa: E402

COLORS = {c: plt.cm.tab20(i / len(CATEGORIES)) for i, c in enumerate(CATEGORIES)}


def plot_simulation(res: SimulationResult, path: Path, max_tracks: int = 40) -> None:
    """Per op: the timeline of seed 0 (its trace), the profiler shares, the critical path."""
    ops = list(res.ops)
    traces = res.traces
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
        att = res.attribution[op]
        prof = att.profiler
        ax = axes[row][1]
        cats = [c for c in CATEGORIES if prof.get(c, 0) > 0]
        ax.barh(cats, [prof[c] * 100 for c in cats], color=[COLORS[c] for c in cats])
        ax.set_xlabel("% of warp time")
        ax.set_title("profiler")
        ax = axes[row][2]
        cp = att.critical_path or {}
        cats = [c for c in CATEGORIES if c in cp]
        ax.barh(cats, [cp[c] for c in cats], color=[COLORS[c] for c in cats])
        ax.set_xlabel("us of p50 latency")
        ax.set_title("critical path")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_sensitivity(res: dict[str, Any], out) -> None:
    """One horizontal bar chart per op: the ranking score of every parameter."""
    ops = list(res["ops"])
    fig, axs = plt.subplots(1, max(1, len(ops)), figsize=(6 * max(1, len(ops)), 0.45 * len(res["space"]) + 1.5),
                            squeeze=False)
    for ax, op in zip(axs[0], ops, strict=False):
        rows = list(reversed(res["ops"][op]["ranking"]))
        err_key = "mu_star_conf_us" if res["method"] == "morris" else "ST_conf"
        conf = [r.get(err_key, 0.0) for r in rows]
        ax.barh([r["name"] for r in rows], [r["score"] for r in rows],
                xerr=[[min(c, max(r["score"], 0.0)) for c, r in zip(conf, rows, strict=True)], conf],
                color="tab:blue", alpha=0.8)
        if all(r["score"] == 0.0 for r in rows):
            ax.text(0.5, 0.5, "the delta does not move:\nevery effect is 0", ha="center", va="center",
                    transform=ax.transAxes, color="0.4")
        ax.set_title(f"{op}: delta {res['ops'][op]['delta_mean_us']:+.2f} us")
        ax.set_xlabel("mu* (us)" if res["method"] == "morris" else "total Sobol index ST")
        ax.grid(axis="x", alpha=0.3)
    fig.suptitle(f"sensitivity of {res['lever']} ({res['method']}, {res['evaluations']} samples)")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def plot_compare(res: dict[str, Any], path: str) -> None:
    """Predicted band vs measured delta with its band, one row per op."""
    ops = list(res["ops"])
    fig, ax = plt.subplots(figsize=(7, 1.2 + 0.9 * len(ops)))
    colors = {"validated": "tab:green", "refuted": "tab:red", "inconclusive": "tab:gray"}
    for i, op in enumerate(ops):
        r = res["ops"][op]
        plo, phi = r["predicted_band_us"]
        ax.barh(i, phi - plo, left=plo, height=0.5, color="tab:blue", alpha=0.3,
                label="predicted band" if i == 0 else None)
        ax.plot([r["predicted_delta_us"]], [i], "|", color="tab:blue", ms=18)
        mlo, mhi = r["measured_band_us"]
        xerr = None if mlo is None else [[r["measured_delta_us"] - mlo], [mhi - r["measured_delta_us"]]]
        ax.errorbar([r["measured_delta_us"]], [i], xerr=xerr, fmt="o", color=colors[r["verdict"]],
                    capsize=4, label=f"measured ({r['verdict']})")
    ax.axvline(0, color="k", lw=0.5)
    ax.set_yticks(range(len(ops)), ops)
    ax.set_xlabel("delta p50 (us), lever - baseline")
    ax.set_title(f"{res['lever']} on {res['baseline']}")
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_designs(rows: list[dict[str, Any]], path: Path) -> None:
    """Dispatch and combine p50 against EP size, one line per design."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), squeeze=False)
    for ax, op in zip(axes[0], ("dispatch", "combine"), strict=True):
        for d in sorted({r["design"] for r in rows}):
            pts = sorted((r["ep"], r[f"{op}_p50_us"]) for r in rows
                         if r["design"] == d and f"{op}_p50_us" in r)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=d)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("EP ranks")
        ax.set_ylabel(f"{op} p50 (us)")
        ax.set_title(op)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"designs on {rows[0]['platform'] if rows else ''}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
