"""From a ``lever hw primitives`` record to the model's issue-side platform parameters.

:func:`platform_params_from_record` returns dotted paths into
:class:`sim.params.Platform` (e.g. ``gpu.fence_ns``) with values in the parameter's
unit, taken from metric medians. Calibration uses them as priors; the record's
spread (p10/p90) says how tight. Only parameters whose metrics are in the record are
returned, so a 1-GPU record and a 2-GPU record map to disjoint sets that can be
merged. Every mapping and the reasoning behind it is in :data:`MAPPING_NOTES`.

Why the WQE path is decomposed from one family: the model charges a WQE post as
``wqe_store_ns + fence_ns + doorbell_ns``; taking all three from the same ring
benchmark (stores only / + doorbell / + fence + doorbell, B = 1) makes their sum equal
the measured per-WQE cost exactly, instead of mixing fences measured after one store
with WQE stores measured elsewhere.
"""

from __future__ import annotations

from collections.abc import Callable

from lever.calibration.records import RunRecord

Metric = Callable[[str], float]

MAPPING_NOTES: dict[str, str] = {
    "gpu.wqe_store_ns": (
        "wqe_store_host_ns: 64 B WQE as 8 x 8 B posted stores into a ring in pinned host memory, "
        "no fence, steady state. Host memory over PCIe is the stand-in for the NIC's LLQ BAR "
        "(both are posted writes leaving the GPU); the device-memory ring is the lower bound."
    ),
    "gpu.doorbell_ns": (
        "wqe_doorbell_nofence_host_ns - wqe_store_host_ns (clamped at 0): what one 4-byte doorbell "
        "store adds to a WQE post when no fence sits between them."
    ),
    "gpu.fence_ns": (
        "wqe_fence_doorbell_host_ns - wqe_doorbell_nofence_host_ns (clamped at 0): the "
        "__threadfence_system after a WQE's 8 host stores, as the native post path pays it; "
        "so wqe_store + fence + doorbell equals the measured B=1 post cost."
    ),
    "gpu.pcie_read_ns": "pcie_read_rtt_ns: one dependent ld.relaxed.sys from pinned host memory.",
    "gpu.device_load_ns": "device_load_ns: dependent ld.cg over an L2-resident 512 KiB buffer.",
    "gpu.atomic_ns": "atomic_device_ns: dependent device-scope atomicAdd on one word (slot reservation).",
    "proxy.descriptor_store_ns": (
        "proxy_descriptor_store_ns: one warp-wide 128 B descriptor store into the pinned ring, "
        "no fence, steady state."
    ),
    "proxy.host_to_gpu_ns": (
        "pcie_read_rtt_ns: a GPU polling pinned memory samples it once per read round trip; a "
        "host write landing at a uniformly random time is seen on average half a round trip "
        "later by the read in flight's successor, plus half a round trip for that read to "
        "return: one read round trip."
    ),
    "proxy.gpu_to_host_ns": (
        "proxy_desc_rtt_ns - pcie_read_rtt_ns (clamped at 0): the hand-off round trip "
        "(descriptor + release-store of the producer index, host checks the descriptor and "
        "publishes its consumer index, GPU sees it) minus the host->GPU leg above; it keeps the "
        "store, the system fence and the host's check."
    ),
    "nvlink.flag_latency_ns": (
        "nvlink_flag_rtt_ns / 2: one-way of a relaxed flag ping-pong over NVLink (the model's "
        "flags carry no fence; the fence is charged where data is published)."
    ),
    "nvlink.gbytes_per_s": "nvlink_copy_gbytes_per_s: cudaMemcpyPeerAsync of 256 MiB GPU0 -> GPU1.",
}
"""Parameter path -> where its value comes from and why."""


def _rules() -> dict[str, tuple[tuple[str, ...], Callable[[Metric], float]]]:
    """Parameter path -> (metrics it needs, how to compute it from metric medians)."""
    return {
        "gpu.wqe_store_ns": (("wqe_store_host_ns",), lambda m: m("wqe_store_host_ns")),
        "gpu.doorbell_ns": (
            ("wqe_doorbell_nofence_host_ns", "wqe_store_host_ns"),
            lambda m: max(0.0, m("wqe_doorbell_nofence_host_ns") - m("wqe_store_host_ns")),
        ),
        "gpu.fence_ns": (
            ("wqe_fence_doorbell_host_ns", "wqe_doorbell_nofence_host_ns"),
            lambda m: max(0.0, m("wqe_fence_doorbell_host_ns") - m("wqe_doorbell_nofence_host_ns")),
        ),
        "gpu.pcie_read_ns": (("pcie_read_rtt_ns",), lambda m: m("pcie_read_rtt_ns")),
        "gpu.device_load_ns": (("device_load_ns",), lambda m: m("device_load_ns")),
        "gpu.atomic_ns": (("atomic_device_ns",), lambda m: m("atomic_device_ns")),
        "proxy.descriptor_store_ns": (
            ("proxy_descriptor_store_ns",),
            lambda m: m("proxy_descriptor_store_ns"),
        ),
        "proxy.host_to_gpu_ns": (("pcie_read_rtt_ns",), lambda m: m("pcie_read_rtt_ns")),
        "proxy.gpu_to_host_ns": (
            ("proxy_desc_rtt_ns", "pcie_read_rtt_ns"),
            lambda m: max(0.0, m("proxy_desc_rtt_ns") - m("pcie_read_rtt_ns")),
        ),
        "nvlink.flag_latency_ns": (
            ("nvlink_flag_rtt_ns",),
            lambda m: m("nvlink_flag_rtt_ns") / 2.0,
        ),
        "nvlink.gbytes_per_s": (
            ("nvlink_copy_gbytes_per_s",),
            lambda m: m("nvlink_copy_gbytes_per_s"),
        ),
    }


def platform_params_from_record(rec: RunRecord) -> dict[str, float]:
    """Issue-side platform parameters (dotted path -> value) from a primitives record.

    Uses metric medians. A parameter is present only when every metric it needs is
    in the record. Raises ValueError for a record that is not a primitives record or
    whose gate failed: numbers from a failed verification are not priors.
    """
    if rec.what.design != "primitives":
        raise ValueError(f"record {rec.id}: design is '{rec.what.design}', not 'primitives'")
    if rec.gate.passed is not True:
        raise ValueError(f"record {rec.id}: gate did not pass ({rec.gate.detail})")

    def m(name: str) -> float:
        return float(rec.metrics[name].median)

    out: dict[str, float] = {}
    for path, (needs, fn) in _rules().items():
        if all(n in rec.metrics for n in needs):
            out[path] = fn(m)
    return out
