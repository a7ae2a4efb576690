"""The emulated SRD NIC's own parameters (``hw/emulated_nic.toml``): wire, NIC, schedule, placement.

Why a file of its own: the emulator is the testbed the model is checked against. If it
read the model's platform file, calibrating the model would move the testbed with it and
the comparison would close on itself. So the emulator reads only this file (with
``--emu-set`` overrides recorded in each record), and the model's emulated platform
(``scenarios/platforms/emulated-nvlink.toml``) is fitted to the records it produces.

Plain Python (tomllib), no torch and no simpy: the CPU tests load it.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lever.sim.errors import UserError

PATH = Path(__file__).resolve().parent / "emulated_nic.toml"
JITTER_KINDS = {"none": 0, "exponential": 1, "lognormal": 2, "gamma": 3}
PLACEMENTS = ("host", "device")
FETCHERS = {"dedicated": 1, "shared": 0}
CLAIMS = {"mask": 1, "scan": 0, "edf": 2}
COPIES = {"one": 0, "staged": 1, "bulk": 2}
PART_TIMERS = {"on": 1, "off": 0}
FENCES = {"sc": 0, "release": 1}
SHARES = {"qps": 0, "table": 1, "wqes": 2, "lanes": 3}
NIC_KERNELS = {"shared": 0, "own": 1}
CLAIM_LOADS = {"volatile": 0, "wide": 1}

# key -> (section, type, lo, hi): the allowed range of every value (inclusive)
SCHEMA: dict[str, tuple[str, type, float, float]] = {
    "paths": ("wire", int, 1, 1024),
    "base_latency_ns": ("wire", float, 0.0, 1e7),
    "path_spread_ns": ("wire", float, 0.0, 1e7),
    "jitter_mean_ns": ("wire", float, 0.0, 1e7),
    "jitter_sigma": ("wire", float, 0.0, 10.0),
    "loss_prob": ("wire", float, 0.0, 1.0),
    "faults_loss_prob": ("wire", float, 0.0, 1.0),
    "retransmit_timeout_ns": ("wire", float, 1.0, 1e8),
    "max_retries_count": ("wire", int, 0, 64),
    "nics_per_rank": ("nic", int, 1, 8),
    "line_rate_gbps": ("nic", float, 0.1, 3200.0),
    "mtu_bytes": ("nic", int, 512, 65536),
    "wqe_process_ns": ("nic", float, 0.0, 1e7),
    "dma_read_ns": ("nic", float, 0.0, 1e7),
    "max_msg_rate_mops": ("nic", float, 0.01, 1e4),
    "completion_ns": ("nic", float, 0.0, 1e7),
    "recv_completion_ns": ("nic", float, 0.0, 1e7),
    "sq_depth": ("nic", int, 32, 65536),
    "max_batch": ("nic", int, 1, 64),
    "wqe_size_bytes": ("nic", int, 64, 128),
    "inline_write_bytes": ("nic", int, 0, 80),
    "deliver_lead_ns": ("schedule", float, 0.0, 1e6),
    "deliver_batch_count": ("schedule", int, 1, 32),
    "mirror_poll_gap_ns": ("schedule", float, 0.0, 1e6),
    "blocks_per_nic_count": ("schedule", int, 1, 4),
    "nic_warps_count": ("schedule", int, 1, 16),
}
STRINGS: dict[str, tuple[str, tuple[str, ...]]] = {
    "jitter_distribution": ("wire", tuple(JITTER_KINDS)),
    "sq": ("placement", PLACEMENTS),
    "cq": ("placement", PLACEMENTS),
    "rxcq": ("placement", PLACEMENTS),
    "nic_fetcher": ("schedule", tuple(FETCHERS)),
    "nic_claim": ("schedule", tuple(CLAIMS)),
    "nic_copy": ("schedule", tuple(COPIES)),
    "nic_part_timers": ("schedule", tuple(PART_TIMERS)),
    "nic_fence": ("schedule", tuple(FENCES)),
    "nic_share": ("schedule", tuple(SHARES)),
    "nic_claim_loads": ("schedule", tuple(CLAIM_LOADS)),
    "nic_kernel": ("schedule", tuple(NIC_KERNELS)),
    "send_completions": ("nic", ("cq", "counter")),
}


@dataclass(frozen=True)
class EmulatedNic:
    """The values one run of the emulator uses, with where each came from."""

    values: dict[str, Any]
    sources: dict[str, str] = field(default_factory=dict)
    path: str = str(PATH)

    def __getattr__(self, k: str) -> Any:
        try:
            return self.values[k]
        except KeyError:
            raise AttributeError(k) from None

    def loss(self, faults: bool) -> float:
        """The drop probability of every packet and ACK this run uses."""
        return float(self.values["faults_loss_prob"] if faults else self.values["loss_prob"])

    def fabric_dict(self, seed: int, faults: bool) -> dict[str, float]:
        """The binding's Fabric (hw/ep/efa_emu.cuh), all floats."""
        v = self.values
        return {
            "paths": v["paths"], "jitter_kind": JITTER_KINDS[v["jitter_distribution"]],
            "base_ns": v["base_latency_ns"], "spread_ns": v["path_spread_ns"],
            "jitter_mean_ns": v["jitter_mean_ns"], "jitter_sigma": v["jitter_sigma"],
            "loss_prob": self.loss(faults), "rto_ns": v["retransmit_timeout_ns"],
            "max_retries": v["max_retries_count"], "line_rate_gbps": v["line_rate_gbps"],
            "mtu": v["mtu_bytes"], "wqe_process_ns": v["wqe_process_ns"], "dma_read_ns": v["dma_read_ns"],
            "completion_ns": v["completion_ns"], "min_wqe_gap_ns": 1000.0 / v["max_msg_rate_mops"],
            "recv_completion_ns": v["recv_completion_ns"], "nics_per_rank": v["nics_per_rank"],
            "deliver_lead_ns": v["deliver_lead_ns"], "deliver_batch": v["deliver_batch_count"],
            "dedicated_fetcher": FETCHERS[v["nic_fetcher"]], "claim_mask": CLAIMS[v["nic_claim"]],
            "mirror_poll_gap_ns": v["mirror_poll_gap_ns"], "copy_staged": COPIES[v["nic_copy"]],
            "part_timers": PART_TIMERS[v["nic_part_timers"]], "fence_release": FENCES[v["nic_fence"]],
            "blocks_per_nic": v["blocks_per_nic_count"], "share_table": SHARES[v["nic_share"]],
            "claim_loads": CLAIM_LOADS[v["nic_claim_loads"]], "own_kernel": NIC_KERNELS[v["nic_kernel"]],
            "seed": float(seed + 1),
        }

    def record(self, faults: bool, sq: str, cq: str, rxcq: str | None = None) -> dict[str, Any]:
        """What a record carries in what.emulated_fabric: every value that ran, the file, and
        where the queues were (send queue, send CQ, receive CQs)."""
        return {"file": "hw/emulated_nic.toml" if Path(self.path) == PATH else self.path,
                "values": dict(sorted(self.values.items())), "loss_prob_used": self.loss(faults),
                "sq": sq, "cq": cq, "rxcq": rxcq or self.values["rxcq"]}


def _check(key: str, raw: Any, where: str) -> Any:
    if key in STRINGS:
        _, allowed = STRINGS[key]
        if raw not in allowed:
            raise UserError(f"{where}: {key} = {raw!r}: allowed {', '.join(allowed)}")
        return raw
    if key not in SCHEMA:
        raise UserError(f"{where}: unknown key {key!r} (known: {', '.join(sorted([*SCHEMA, *STRINGS]))})")
    _, typ, lo, hi = SCHEMA[key]
    try:
        if typ is int and (isinstance(raw, bool) or float(raw) != int(float(raw))):
            raise ValueError
        val = typ(raw) if typ is float else int(float(raw))
    except (TypeError, ValueError):
        raise UserError(f"{where}: {key} = {raw!r}: needs {typ.__name__}") from None
    if not lo <= val <= hi:
        raise UserError(f"{where}: {key} = {val}: outside [{lo}, {hi}]")
    return val


def load(path: str | Path = PATH, overrides: Mapping[str, Any] | None = None) -> EmulatedNic:
    """Read the file, check every value's type and range, apply ``overrides`` (--emu-set)."""
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise UserError(f"{p}: can not read the emulated NIC's parameters: {e}") from None
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for section, table in data.items():
        if not isinstance(table, dict):
            raise UserError(f"{p}: [{section}] must be a table")
        for key, entry in table.items():
            where = f"{p}: [{section}] {key}"
            if not isinstance(entry, dict) or "value" not in entry or "source" not in entry:
                raise UserError(f"{where}: needs {{ value = ..., source = \"...\" }}")
            want = SCHEMA.get(key, STRINGS.get(key, (None,)))[0]
            if want != section:
                raise UserError(f"{where}: belongs in [{want}]" if want else f"{where}: unknown key")
            values[key] = _check(key, entry["value"], where)
            sources[key] = str(entry["source"])
    missing = [k for k in [*SCHEMA, *STRINGS] if k not in values]
    if missing:
        raise UserError(f"{p}: missing {', '.join(missing)}")
    for key, raw in (overrides or {}).items():
        values[key] = _check(key, raw, "--emu-set")
        sources[key] = "--emu-set"
    # the device generations: 64-byte WQEs without inline writes (rdma-core v59), or 128-byte
    # WQEs whose RDMA writes carry up to 80 bytes inline (v63)
    if values["wqe_size_bytes"] not in (64, 128):
        raise UserError(f"{p}: wqe_size_bytes = {values['wqe_size_bytes']}: 64 or 128")
    if values["wqe_size_bytes"] == 64 and values["inline_write_bytes"]:
        raise UserError(f"{p}: inline_write_bytes = {values['inline_write_bytes']}: inline RDMA writes "
                        "need wqe_size_bytes = 128")
    # the one kernel that holds both roles runs at most 8 warps a block (255 registers a thread);
    # a NIC kernel of its own up to 16, and not as clusters sharing a table
    if values["nic_warps_count"] > 8 and values["nic_kernel"] != "own":
        raise UserError(f"{p}: nic_warps_count = {values['nic_warps_count']}: above 8 needs nic_kernel = \"own\"")
    if values["nic_kernel"] == "own" and values["blocks_per_nic_count"] > 1 and values["nic_share"] == "table":
        raise UserError(f"{p}: nic_kernel = \"own\": a NIC's blocks can not share a table (nic_share = \"qps\")")
    return EmulatedNic(values, sources, str(p))


def parse_emu_sets(items: list[str]) -> dict[str, str]:
    """``KEY=VALUE`` strings of --emu-set; values are checked by :func:`load`."""
    out: dict[str, str] = {}
    for it in items:
        k, sep, v = it.partition("=")
        if not sep or not k.strip():
            raise UserError(f"--emu-set {it!r}: needs KEY=VALUE")
        out[k.strip()] = v.strip()
    return out
