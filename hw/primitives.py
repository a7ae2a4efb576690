"""``lever hw primitives``: microbenchmarks of the GPU-initiated networking primitives.

Runs the CUDA C++ kernels under ``hw/primitives/`` (built through
:func:`hw.build.load_extension`) and writes one :class:`calibration.records.RunRecord`
whose ``metrics`` are the measured distributions. ``--gpus 1`` runs the single-GPU
families, ``--gpus 2`` the ones that need two GPUs joined by NVLink. Every family
verifies what it measured in C++; a failed verification raises there and shows up
here as a failed gate check with no numbers for that family, never as a number.

The conversion from raw samples to a record (:func:`build_record`) is pure so it can
be tested without a GPU. torch is imported only inside :func:`main`.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import platform as _platform
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lever.calibration.records import (
    SCHEMA_VERSION,
    Distribution,
    RecordError,
    RunRecord,
    dump_record,
    parse_record,
)
from lever.sim.errors import UserError

SRC_DIR = Path(__file__).resolve().parent / "primitives"
EXTENSION = "lever_hw_primitives"

FAMILIES_1GPU = (
    "latency",
    "stores_fences",
    "wqe_doorbell",
    "cq_poll",
    "proxy_ring",
    "shared_queue",
    "host_read",
    "fence_reads",
    "warp_copy",
    "turn_handoff",
)
FAMILIES_2GPU = ("nvlink",)
WARMUP = 10
"""Warm-up batches (or launches) each kernel runs before it records samples."""

TIMER = (
    "clock64 per batch of operations, converted to ns with the (clock64, %globaltimer) pair of "
    "the same launch; bandwidths with CUDA events; shared-queue posts with %globaltimer"
)
NOTES = (
    "Each sample is the per-operation mean of one batch (or one launch) after warm-up. "
    "cq_seen_* are half of a ping-pong round trip. Fence metrics include their one store. "
    "'host' memory is pinned host memory over PCIe, the stand-in for a NIC BAR (no NIC here)."
)


@dataclass(frozen=True)
class Check:
    """The verification outcome of one family: passed, and what was checked or what failed."""

    family: str
    passed: bool
    detail: str


def sources() -> list[Path]:
    """Every source of the extension: the kernels, the host proxy, the binding."""
    return sorted(SRC_DIR.glob("*.cu")) + sorted(SRC_DIR.glob("*.cpp"))


def summarize(samples: Sequence[float], name: str = "metric") -> Distribution:
    """A distribution (median, p10, p90, mean, std, n, samples) of one metric's samples.

    Raises ValueError for an empty, non-finite or negative sample set: such a number
    means a broken measurement, and it must not reach a record.
    """
    import numpy as np

    if len(samples) == 0:
        raise ValueError(f"{name}: no samples")
    a = np.asarray(samples, dtype=float)
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name}: non-finite sample")
    if np.any(a < 0):
        raise ValueError(f"{name}: negative sample {float(a.min())}")
    p10, med, p90 = (float(x) for x in np.percentile(a, [10, 50, 90]))
    return Distribution(
        median=med,
        p10=p10,
        p90=p90,
        mean=float(a.mean()),
        std=float(a.std(ddof=1)) if a.size > 1 else 0.0,
        n=int(a.size),
        samples=[float(f"{x:.6g}") for x in a],
    )


def build_record(
    samples: Mapping[str, Sequence[float]],
    checks: Sequence[Check],
    *,
    gpus: int,
    reps: int,
    platform: Mapping[str, str],
    provenance: Mapping[str, Any],
    record_id: str | None = None,
) -> RunRecord:
    """Turn raw per-metric samples and the families' checks into a validated record.

    ``gate.passed`` is true only when there is at least one check and every check
    passed. Raises ValueError (a :class:`RecordError` for schema problems) for bad
    input, e.g. a metric name without a unit suffix or a non-finite sample.
    """
    if gpus not in (1, 2):
        raise ValueError(f"gpus must be 1 or 2, got {gpus}")
    metrics = {
        name: summarize(v, name).model_dump(exclude_none=True) for name, v in samples.items()
    }
    if not metrics:
        raise ValueError("no metric was measured (every family failed?)")
    passed = bool(checks) and all(c.passed for c in checks)
    failed = [c for c in checks if not c.passed]
    date = provenance.get("date", "")
    gpu_slug = re.sub(r"[^a-z0-9]+", "-", platform.get("gpu", "gpu").lower()).strip("-") or "gpu"
    data: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "id": record_id or f"{gpu_slug}-primitives-{gpus}gpu-{date[:10] or 'undated'}",
        "nic": "none",
        "what": {
            "design": "primitives",
            "platform": {k: str(v) for k, v in platform.items()},
        },
        "how": {"repetitions": reps, "warmup": WARMUP, "timer": TIMER, "notes": NOTES},
        "metrics": metrics,
        "gate": {
            "passed": passed,
            "checks": [f"{'PASS' if c.passed else 'FAIL'} {c.family}: {c.detail}" for c in checks],
            "detail": "; ".join(f"{c.family}: {c.detail}" for c in failed)
            if failed
            else "every family verified what it measured",
        },
        "provenance": {k: str(v) for k, v in provenance.items()},
    }
    return parse_record(data, f"<primitives record {gpus}gpu>")


# --------------------------------------------------------------------------- provenance


def _run(cmd: list[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def git_revision() -> str:
    """The 40-hex revision (hw/provenance.py), ``+dirty`` when the tree has local changes;
    "" when unknown. Real runs go through :func:`collect_provenance`, which refuses those."""
    from lever.hw.provenance import git_state

    rev, dirty, _ = git_state()
    return rev + ("+dirty" if rev and dirty else "")


def kernel_files() -> list[Path]:
    """What the extension is built from: :func:`sources` and the headers they include."""
    hw = SRC_DIR.parent
    return [*SRC_DIR.glob("*"), *(hw / "efa").glob("*.h"), hw / "efa_io_defs.h"]


def collect_platform(torch: Any, ext: Any, devices: Sequence[int]) -> dict[str, str]:
    """GPU, driver, CUDA and torch versions of the machine that ran."""
    names = [torch.cuda.get_device_name(d) for d in devices]
    drv_api, rt, _ = ext.cuda_versions()
    driver = ""
    if shutil.which("nvidia-smi"):
        driver = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
        driver = driver.splitlines()[0].strip() if driver else ""
    nvcc = _run(["nvcc", "--version"]).splitlines()
    return {
        "gpu": " + ".join(names) if len(set(names)) > 1 else f"{len(names)}x {names[0]}",
        "nic": "none",
        "driver": driver or f"CUDA driver API {drv_api}",
        "cuda": f"runtime {rt // 1000}.{rt % 1000 // 10}, driver API {drv_api // 1000}.{drv_api % 1000 // 10}"
        + (f", {nvcc[-1].strip()}" if nvcc else ""),
        "torch": str(torch.__version__),
        "host": _platform.node(),
    }


def collect_provenance(argv: Sequence[str], allow_dirty: bool | None = None) -> dict[str, Any]:
    """Where the numbers came from: this tool, its revision, the date, the command.

    ``allow_dirty`` given (a real run): the revision must be a clean 40-hex commit unless
    allowed (one-line UserError otherwise), and the kernel hash, build flags and GPU
    topology are recorded (hw/provenance.py). None: the revision as found (tests)."""
    from lever.hw import provenance as pv

    extra: dict[str, Any] = {"git_rev": git_revision()}
    if allow_dirty is not None:
        extra = {**pv.require_revision(allow_dirty), "kernel_sha256": pv.sources_sha256(kernel_files()),
                 "build_flags": pv.build_flags(), "gpu_topology": pv.gpu_topology()}
    try:
        from importlib.metadata import version

        tool = f"lever-efa {version('lever-efa')}"
    except Exception:  # noqa: BLE001 - not installed as a package: still a valid run
        tool = "lever-efa (source tree)"
    return {
        "source": "lever hw primitives (hw/primitives CUDA microbenchmarks)",
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "tool_version": tool,
        "command": " ".join(argv),
        **extra,
    }


# --------------------------------------------------------------------------- campaign table

CAMPAIGN_PRIMITIVES: dict[str, tuple[str, float, float]] = {
    "pcie_read_rtt_ns": ("dependent load, pinned host memory", 1150, 1250),
    "device_load_ns": ("dependent load, device memory, cached", 150, 150),
    "store_posted_host_ns": ("posted store, no fence", 5, 8),
    "fence_system_after_host_store_ns": ("store to host + __threadfence_system", 600, 1400),
    "fence_system_after_device_store_ns": ("store to device + __threadfence_system", 560, 590),
    "wqe_fence_doorbell_host_ns": ("64 B WQE to host ring + fence + doorbell", 1460, 1460),
    "wqe_doorbell_nofence_host_ns": ("64 B WQE to host ring + doorbell, no fence", 60, 60),
    "gpu_cpu_flag_rtt_ns": ("GPU<->CPU flag ping-pong (round trip)", 1900, 2500),
    "proxy_t1_fence1_desc_ns": ("1 warp -> 1 CPU thread ring, fence per descriptor", 2850, 2850),
    "nvlink_flag_rtt_ns": ("GPU<->GPU flag ping-pong over NVLink", 1230, 1230),
    "nvlink_copy_gbytes_per_s": ("peer copy over NVLink", 390, 390),
}
"""The campaign's H200 primitive table (docs/physics.md) as (what, low, high) per metric of this record."""


def design_comparison(rec: RunRecord) -> list[tuple[str, str, float, float, float, float]]:
    """Rows (metric, what, measured median, design low, design high, ratio to the range).

    The ratio is measured / nearest end of the design range (1.0 inside the range);
    Agreement is a ratio within [0.5, 2].
    """
    rows = []
    for name, (what, lo, hi) in CAMPAIGN_PRIMITIVES.items():
        if name not in rec.metrics:
            continue
        m = rec.metrics[name].median
        ratio = m / lo if m < lo else (m / hi if m > hi else 1.0)
        rows.append((name, what, m, lo, hi, ratio))
    return rows


# --------------------------------------------------------------------------- CLI


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="record path to write (JSON)")
    p.add_argument("--nic", choices=["emulated", "efa"], default="emulated",
                   help="emulated: the families below on GPU/host memory; efa: GPU-posted writes "
                        "between two nodes' EFA devices under torchrun (hw/efa/prims.py; not yet run on "
                        "a device)")
    p.add_argument("--efa-device", default="",
                   help="--nic efa: the EFA device to use (default: the nearest to the GPU on PCIe; the "
                        "families post on one QP, so one device, where lever hw ep stripes over all)")
    p.add_argument(
        "--gpus",
        type=int,
        choices=(1, 2),
        default=1,
        help="1: single-GPU families; 2: families that need two GPUs over NVLink (default 1)",
    )
    p.add_argument("--device", type=int, default=0, help="first CUDA device to use (default 0)")
    p.add_argument(
        "--reps", type=int, default=200, help="timed batches per metric after warm-up (20..100000)"
    )
    p.add_argument(
        "--only", default="", help="comma-separated families to run (default: all for --gpus)"
    )
    p.add_argument("--allow-dirty", action="store_true",
                   help="write the record from a tree with uncommitted changes (recorded as dirty)")


def load_primitives() -> Any:
    """Build (or reuse from the cache) and import the primitives extension."""
    from lever.hw.build import load_extension

    return load_extension(EXTENSION, sources())


def _families(args: argparse.Namespace) -> tuple[str, ...]:
    allowed = FAMILIES_1GPU if args.gpus == 1 else FAMILIES_2GPU
    if not args.only:
        return allowed
    chosen = tuple(f.strip() for f in args.only.split(",") if f.strip())
    bad = [f for f in chosen if f not in allowed]
    if bad:
        raise UserError(
            f"--only: {', '.join(bad)} not a family of --gpus {args.gpus} (allowed: {', '.join(allowed)})"
        )
    return chosen


def main(args: argparse.Namespace) -> int:
    from lever.hw.device import require_cuda

    if getattr(args, "nic", "emulated") == "efa":
        from lever.hw.efa.prims import main_efa_primitives

        return main_efa_primitives(args)
    if not 20 <= args.reps <= 100000:
        raise UserError(f"--reps: {args.reps} is outside [20, 100000]")
    families = _families(args)
    torch = require_cuda()
    provenance = collect_provenance([Path(sys.argv[0]).name, *sys.argv[1:]],
                                    allow_dirty=args.allow_dirty)
    have = torch.cuda.device_count()
    devices = list(range(args.device, args.device + args.gpus))
    if devices[-1] >= have:
        raise UserError(
            f"--gpus {args.gpus} --device {args.device} needs CUDA devices {devices}, found {have}"
        )

    ext = load_primitives()
    samples: dict[str, list[float]] = {}
    checks: list[Check] = []
    for fam in families:
        t0 = time.perf_counter()
        try:
            if fam == "nvlink":
                metrics, passed = ext.nvlink(devices[0], devices[1], args.reps)
            else:
                metrics, passed = getattr(ext, fam)(devices[0], args.reps)
        except RuntimeError as e:
            checks.append(Check(fam, False, str(e)))
            print(f"[primitives] {fam}: FAILED: {e}", file=sys.stderr)
            continue
        samples.update({k: list(v) for k, v in metrics.items()})
        checks.append(Check(fam, True, "; ".join(passed)))
        print(
            f"[primitives] {fam}: {len(metrics)} metrics in {time.perf_counter() - t0:.1f} s",
            file=sys.stderr,
        )

    if not samples:
        raise UserError("every family failed: " + "; ".join(c.detail for c in checks))
    try:
        rec = build_record(
            samples,
            checks,
            gpus=args.gpus,
            reps=args.reps,
            platform=collect_platform(torch, ext, devices),
            provenance=provenance,
        )
    except ValueError as e:
        raise RecordError(f"{args.out}: {e}") from None
    dump_record(rec, args.out)
    print(f"{'metric':44s} {'median':>10s} {'p10':>10s} {'p90':>10s} {'n':>5s}")
    for name, d in sorted(rec.metrics.items()):
        print(f"{name:44s} {d.median:10.4g} {d.p10:10.4g} {d.p90:10.4g} {d.n:5d}")
    rows = design_comparison(rec)
    if rows:
        print("\nagainst the campaign's primitive table (docs/physics.md) (ratio to the nearest end of its range):")
        for name, _what, m, lo, hi, ratio in rows:
            flag = "" if 0.5 <= ratio <= 2.0 else "  <-- outside 2x"
            print(f"  {name:40s} {m:9.4g} vs {lo:g}-{hi:g}  x{ratio:.2f}{flag}")
    print(f"\nrecord {rec.id} -> {args.out} (gate {'passed' if rec.gate.passed else 'FAILED'})")
    return 0 if rec.gate.passed else 1


def _standalone(argv: list[str] | None = None) -> int:
    """``python3 -m hw.primitives ...``: the same as ``lever hw primitives`` without the
    rest of the CLI (the GPU machine lacks the simulator's dependencies)."""

    p = argparse.ArgumentParser(
        prog="python3 -m hw.primitives", description=__doc__.splitlines()[0]
    )
    add_args(p)
    args = p.parse_args(argv)
    try:
        return main(args)
    except (UserError, RecordError) as e:
        print(f"lever: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(_standalone())
