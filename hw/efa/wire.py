"""Wire a rank's EFA queues into the NIC tables the EP kernels take.

Why this module: the kernels reach their queues only through ``lever_efa_nic_layout``
tables and a ``lever_efa_peer`` table (hw/efa/nic_layout.h), in the byte form
``make_world`` (hw/ep/binding.cpp) takes from any NIC. On EFA, one process drives one
GPU (one rank, under torchrun), so what the emulated NIC fills for every rank at once
(``emulated_nic_tables``) is made here in three steps, each testable without a device:

1. :func:`open_queues`: per rank, on one EFA device, the receive QPs whose CQs take the
   write-with-immediate completions (``plan.recv``) and one barrier QP; then, for every
   variant afresh (:func:`open_send`), the SRD QPs the kernels post to (``plan.send``
   native or proxy send QPs), so each variant starts from an empty SQ and CQ the way the
   emulated NIC restarts. Peers never name a send QP (writes target receive QPs), so
   they can be replaced without a new exchange.
2. :func:`local_address` / :func:`exchange`: what every peer needs of this rank (GID,
   the receive QPs' numbers and qkey, the window's rkey and base, the virtual addresses
   of its peer-visible buffers), gathered over ``torch.distributed`` (any
   ``all_gather_object``), checked for one plan and one rank each.
3. :func:`peer_tables` / :func:`send_tables`: the AH of every peer (one per GID,
   ``add_peer``), then every queue's layout from its own query (``fill_layout``), packed
   as ``make_world`` wants: ``send``/``psend`` for the local rank, ``recv`` for every
   rank (only the local rank's have CQs the GPU polls; a remote rank's entry names its QP
   and nothing else, since no NIC block runs), and the peer table ``[rank][receive slot]``.

The endpoint object is the ``lever_hw_efa`` binding's ``Device`` (hw/efa/binding.cpp over
hw/efa/host.cpp) or, in tests, a fake answering from recorded query shapes: only the
:class:`Endpoints` methods are used. Nothing here imports torch or CUDA.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from lever.hw.efa import device as efa_device
from lever.sim.errors import UserError

NQ_MAX = 32
"""Send-QP slots per rank in the kernels' tables (hw/ep/efa_emu.cuh NQ_MAX)."""
LAYOUT_BYTES = 152
PEER_BYTES = 24
FILL_NO_SQ_MAP = 1
"""hw/efa/host.h LEVER_EFA_FILL_NO_SQ_MAP: a receive-only QP's SQ is not mapped for the GPU."""
QKEY = 0x11111111
"""qkey of every QP of this harness (an SRD qkey is checked against the destination QP's)."""
PEER_BUFFERS = ("recv_x", "recv_cnt", "comb_recv", "comb_flag")
"""A rank's buffers that peers' WQEs write, by their virtual addresses (hw/ep.py names)."""


class WireError(UserError):
    """The queues or the exchanged addresses can not make a world; ``str()`` is one line."""


class Endpoints(Protocol):
    """What wiring needs of one rank's EFA device (the binding's ``Device``)."""

    def caps(self) -> dict[str, Any]: ...
    def local(self) -> dict[str, Any]: ...  # lkey, rkey, addr, gid (16 bytes)
    def open_qp(self, sq_depth: int, rq_depth: int, cq_depth: int, qkey: int,
                unsolicited: bool) -> int: ...
    def qp_num(self, handle: int) -> int: ...
    def close_qp(self, handle: int) -> int: ...
    def add_peer(self, gid: bytes, qpn: int, qkey: int, rkey: int, addr: int) -> int: ...
    def num_ahs(self) -> int: ...
    def peers(self) -> bytes: ...
    def fill_layout(self, handle: int, flags: int) -> bytes: ...
    def close(self) -> int: ...


@dataclass(frozen=True)
class QueuePlan:
    """How many queues of each kind a rank opens, and how deep.

    ``send`` QPs back the first ``send`` of the kernels' ``NQ_MAX`` send slots; the
    remaining slots repeat QP 0's layout and are never posted to (a variant that needs
    more QPs than opened is refused by :func:`check_variant`). ``recv`` receive QPs back
    the ``nrx`` receive slots: ``nrx`` of them when a variant counts receive completions
    (write-with-immediate), else one shared by every slot (plain writes make no receive
    completion, so no slot's CQ is polled)."""

    send: int
    recv: int
    nrx: int
    sq_depth: int
    rx_depth: int
    proxy: bool = False
    unsolicited: bool = True

    def qps(self) -> int:
        """QPs (and CQs) a rank opens: send, receive and the barrier QP."""
        return self.send + self.recv + 1


def plan_queues(*, num_qps: int, imm: bool, nrx: int, sq_depth: int, rx_depth: int,
                proxy: bool, caps: Mapping[str, Any]) -> QueuePlan:
    """The queue plan for a run whose variants use up to ``num_qps`` send QPs and (``imm``)
    count receive completions, within what the device allows (one-line WireError)."""
    if not 1 <= num_qps <= NQ_MAX:
        raise WireError(f"design.qps_per_call {num_qps}: the kernels take 1..{NQ_MAX} send QPs")
    max_sq = int(caps.get("max_sq_wr") or 0)
    if max_sq and sq_depth > max_sq:
        raise WireError(f"SQ depth {sq_depth} above the device's max_sq_wr {max_sq}")
    max_cqe = int(caps.get("max_cqe") or 0)
    if max_cqe and max(sq_depth, rx_depth) > max_cqe:
        raise WireError(f"CQ depth {max(sq_depth, rx_depth)} above the device's max_cqe {max_cqe}")
    names = caps.get("caps", {})
    if imm and not names.get("unsolicited_write_recv", False):
        raise WireError("write-with-immediate counting needs unsolicited write receive (device cap "
                        "bit 4, rdma-core 52+): this device lacks it, and the kernels post no receives")
    if not names.get("rdma_write", False):
        raise WireError("the device lacks RDMA write (device cap bit 3)")
    plan = QueuePlan(send=num_qps, recv=nrx if imm else 1, nrx=nrx, sq_depth=sq_depth,
                     rx_depth=rx_depth, proxy=proxy, unsolicited=bool(names.get("unsolicited_write_recv")))
    for what, limit in (("max_qp", caps.get("max_qp")), ("max_cq", caps.get("max_cq"))):
        if limit and plan.qps() > int(limit):
            raise WireError(f"{plan.qps()} QPs per rank ({plan.send} send, {plan.recv} receive, 1 barrier) "
                            f"exceed the device's {what} {limit}")
    return plan


def check_variant(plan: QueuePlan, flags: Mapping[str, int], what: str) -> None:
    """A variant's kernel flags fit the opened queues (one-line WireError otherwise)."""
    if int(flags["num_qps"]) > plan.send:
        raise WireError(f"{what}: uses {flags['num_qps']} send QPs, {plan.send} were opened")
    if (flags.get("imm_counting") or flags.get("cached")) and plan.recv < plan.nrx:
        raise WireError(f"{what}: counts receive completions, but the receive slots share one QP")


@dataclass
class RankQueues:
    """The QP handles one rank opened (binding handles) and their numbers."""

    recv: list[int] = field(default_factory=list)
    barrier: int = -1
    send: list[int] = field(default_factory=list)
    qpn: dict[int, int] = field(default_factory=dict)


def open_queues(dev: Endpoints, plan: QueuePlan) -> RankQueues:
    """Open the receive QPs and the barrier QP on ``dev``. A failure leaves what was opened
    on ``dev``; its ``close()`` tears everything down."""
    q = RankQueues()
    for _ in range(plan.recv):
        q.recv.append(dev.open_qp(32, 1, plan.rx_depth, QKEY, plan.unsolicited))
    q.barrier = dev.open_qp(plan.sq_depth, 1, plan.sq_depth, QKEY, False)
    q.qpn.update({h: int(dev.qp_num(h)) for h in (*q.recv, q.barrier)})
    return q


def open_send(dev: Endpoints, plan: QueuePlan, q: RankQueues) -> list[int]:
    """Replace the rank's send QPs with ``plan.send`` fresh ones (the old ones closed first):
    every variant posts from producer count 0 on an empty CQ. Returns their handles."""
    for h in reversed(q.send):
        dev.close_qp(h)
        q.qpn.pop(h, None)
    q.send = [dev.open_qp(plan.sq_depth, 1, plan.sq_depth, QKEY, False) for _ in range(plan.send)]
    q.qpn.update({h: int(dev.qp_num(h)) for h in q.send})
    return q.send


def rx_qpns(plan: QueuePlan, q: RankQueues) -> list[int]:
    """The QP number behind each receive slot (shared when the plan has one receive QP)."""
    return [q.qpn[q.recv[i % len(q.recv)]] for i in range(plan.nrx)]


def local_address(dev: Endpoints, plan: QueuePlan, q: RankQueues, *, rank: int, world: int,
                  buffers: Mapping[str, int], barrier_words: int, fingerprint: Mapping[str, Any],
                  host: str = "") -> dict[str, Any]:
    """What every peer needs of this rank, JSON-ready (for ``all_gather_object``)."""
    loc = dev.local()
    gid = bytes(loc["gid"])
    if len(gid) != 16:
        raise WireError(f"rank {rank}: GID of {len(gid)} bytes, not 16")
    missing = [k for k in PEER_BUFFERS if k not in buffers]
    if missing:
        raise WireError(f"rank {rank}: peer-visible buffer {missing[0]} not in the window")
    return {"rank": rank, "world": world, "gid": gid.hex(), "qkey": QKEY, "rkey": int(loc["rkey"]),
            "addr": int(loc["addr"]), "rx_qpns": rx_qpns(plan, q),
            "buffers": {k: int(buffers[k]) for k in PEER_BUFFERS}, "barrier_words": int(barrier_words),
            "plan": {**asdict(plan), **dict(fingerprint)}, "device": str(dev.caps().get("device_name", "")),
            "host": host}


def exchange(addr: Mapping[str, Any], all_gather: Callable[[Any], list[Any]]) -> list[dict[str, Any]]:
    """Every rank's address, in rank order, from ``all_gather(addr)`` (one object per rank:
    ``torch.distributed.all_gather_object`` wrapped). One plan, one entry per rank, else a
    one-line WireError naming the first rank that differs."""
    got = [dict(a) for a in all_gather(dict(addr))]
    world = int(addr["world"])
    if len(got) != world:
        raise WireError(f"address exchange: {len(got)} ranks answered, the world has {world}")
    by_rank = sorted(got, key=lambda a: int(a["rank"]))
    ranks = [int(a["rank"]) for a in by_rank]
    if ranks != list(range(world)):
        raise WireError(f"address exchange: ranks {ranks}, want 0..{world - 1} once each")
    ref = addr["plan"]
    for a in by_rank:
        if a["plan"] != ref:
            diff = sorted(k for k in set(ref) | set(a["plan"]) if ref.get(k) != a["plan"].get(k))
            raise WireError(f"address exchange: rank {a['rank']} runs another plan ({diff[0]}: "
                            f"{a['plan'].get(diff[0])!r} here {ref.get(diff[0])!r})")
        if len(a["rx_qpns"]) != ref["nrx"]:
            raise WireError(f"address exchange: rank {a['rank']} sent {len(a['rx_qpns'])} receive QPNs")
        if len(bytes.fromhex(a["gid"])) != 16:
            raise WireError(f"address exchange: rank {a['rank']} sent a GID that is not 16 bytes")
    return by_rank


def add_peers(dev: Endpoints, peers: Sequence[Mapping[str, Any]], nrx: int) -> bytes:
    """Every peer queue on ``dev``, in the kernels' order ``[rank][receive slot]`` (the AH of
    a rank's GID is made once and shared); returns the peer table's bytes."""
    for r, a in enumerate(peers):
        gid = bytes.fromhex(a["gid"])
        for i in range(nrx):
            idx = dev.add_peer(gid, int(a["rx_qpns"][i]), int(a["qkey"]), int(a["rkey"]), int(a["addr"]))
            if idx != r * nrx + i:
                raise WireError(f"peer table: entry {idx} for rank {r} slot {i} (want {r * nrx + i})")
    blob = bytes(dev.peers())
    if len(blob) != len(peers) * nrx * PEER_BYTES:
        raise WireError(f"peer table: {len(blob)} bytes for {len(peers)} ranks x {nrx} slots")
    return blob


def remote_recv_layout(qpn: int, qkey: int) -> bytes:
    """A remote rank's receive slot as this rank's tables hold it: its QP number and qkey,
    no CQ (only the owner polls it; no NIC block runs on EFA)."""
    lay = {f[0]: 0 for f in efa_device.NicLayout._fields_}
    lay.update(version=efa_device.LAYOUT_VERSION, qp_num=qpn, qkey=qkey,
               sq_phase_first=efa_device.SQ_PHASE_FIRST_LAP, cq_phase_first=efa_device.CQ_PHASE_FIRST_LAP)
    return efa_device.pack_layout(lay)


def _layouts(dev: Endpoints, handles: Sequence[int], flags: int) -> list[bytes]:
    out = [bytes(dev.fill_layout(h, flags)) for h in handles]
    for b in out:
        if len(b) != LAYOUT_BYTES:
            raise WireError(f"fill_layout returned {len(b)} bytes, not {LAYOUT_BYTES}")
    return out


def peer_tables(dev: Endpoints, plan: QueuePlan, q: RankQueues, peers: Sequence[Mapping[str, Any]],
                rank: int) -> dict[str, bytes]:
    """What stays for the whole run: ``recv`` (``[ranks x nrx]`` layouts), ``peers`` (the
    peer table, AHs made here) and ``barrier`` (the barrier QP's layout)."""
    peer_blob = add_peers(dev, peers, plan.nrx)
    recv_own = _layouts(dev, q.recv, FILL_NO_SQ_MAP)
    (barrier,) = _layouts(dev, [q.barrier], 0)
    recv = []
    for r, a in enumerate(peers):
        for i in range(plan.nrx):
            if r == rank:
                recv.append(recv_own[i % len(recv_own)])
            else:
                recv.append(remote_recv_layout(int(a["rx_qpns"][i]), int(a["qkey"])))
    return {"recv": b"".join(recv), "peers": peer_blob, "barrier": barrier}


def send_tables(dev: Endpoints, plan: QueuePlan, q: RankQueues) -> dict[str, list[bytes]]:
    """The local rank's ``send`` and ``psend`` (``NQ_MAX`` layouts each, or empty psend), from
    the current send QPs. On the proxy path the host threads post on the proxy QPs and the
    GPU posts nothing: the native slots hold the same QPs' layouts (the kernels read them
    only on the native path), so no QP is opened twice."""
    send = _layouts(dev, q.send, 0)
    if len(send) != plan.send:
        raise WireError(f"{len(send)} send QPs open, the plan has {plan.send}")
    slots = b"".join(send[i] if i < len(send) else send[0] for i in range(NQ_MAX))
    return {"send": [slots], "psend": [slots if plan.proxy else b""]}


def build_tables(dev: Endpoints, plan: QueuePlan, q: RankQueues, peers: Sequence[Mapping[str, Any]],
                 rank: int) -> dict[str, Any]:
    """:func:`peer_tables` and :func:`send_tables` in one dict: ``make_world``'s tables (and
    ``barrier``, which make_world ignores)."""
    return {**peer_tables(dev, plan, q, peers, rank), **send_tables(dev, plan, q)}


def world_peers(peers: Sequence[Mapping[str, Any]]) -> list[dict[str, int]]:
    """``make_world``'s per-rank peer maps: the peer-visible buffers' virtual addresses (the
    kernels put ``raddr`` = these plus an offset into WQEs; the MR's iova is the window's
    address, so they are valid remote addresses). ``rx_tail`` is emulated-NIC state: 0."""
    return [{**{k: int(a["buffers"][k]) for k in PEER_BUFFERS}, "rx_tail": 0} for a in peers]


# ----------------------------------------------------------------- which device, which host
def efa_devices(sys_root: str | os.PathLike[str] = "/sys") -> dict[str, str]:
    """EFA devices by name -> their PCI device path (resolved), from
    ``/sys/class/infiniband/*/device``: those whose driver is ``efa``."""
    base = Path(sys_root) / "class" / "infiniband"
    out: dict[str, str] = {}
    if not base.is_dir():
        return out
    for d in sorted(base.iterdir()):
        drv = d / "device" / "driver"
        if drv.exists() and Path(os.path.realpath(drv)).name == "efa":
            out[d.name] = os.path.realpath(d / "device")
    return out


def _common_depth(a: str, b: str) -> int:
    n = 0
    for x, y in zip(Path(a).parts, Path(b).parts, strict=False):
        if x != y:
            break
        n += 1
    return n


def nearest_device(gpu_bdf: str, devices: Mapping[str, str], sys_root: str | os.PathLike[str] = "/sys",
                   local_rank: int = 0) -> str:
    """The EFA device closest to the GPU on the PCIe tree (longest shared sysfs path: the
    same switch first). Among equally close devices the ``local_rank``-th (sorted), so two
    GPUs under one switch do not share a device when it has two."""
    if not devices:
        raise WireError("no EFA device under /sys/class/infiniband (driver efa)")
    gpu = os.path.realpath(Path(sys_root) / "bus" / "pci" / "devices" / gpu_bdf.lower())
    depth = {n: _common_depth(gpu, p) for n, p in devices.items()}
    best = max(depth.values())
    near = sorted(n for n, d in depth.items() if d == best)
    return near[local_rank % len(near)] if best > 2 else sorted(devices)[local_rank % len(devices)]


def host_facts(sys_root: str | os.PathLike[str] = "/sys") -> dict[str, str]:
    """Instance type (DMI product name on Nitro instances) and the EFA kernel driver's version."""
    root = Path(sys_root)

    def read(rel: str) -> str:
        try:
            return (root / rel).read_text().strip()
        except OSError:
            return ""

    return {"instance": read("devices/virtual/dmi/id/product_name"),
            "efa_driver": read("module/efa/version")}


# ----------------------------------------------------------------- torchrun
def torchrun_env(env: Mapping[str, str] | None = None) -> dict[str, int]:
    """RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE of a torchrun process, or a one-line
    UserError: every EFA run is one process per GPU under torchrun."""
    e = os.environ if env is None else env
    missing = [k for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT") if not e.get(k)]
    if missing:
        raise UserError(f"--nic efa runs one process per GPU under torchrun: {missing[0]} is not set "
                        "(see hw/efa/README.md for the two-node command)")
    try:
        out = {k.lower(): int(e[k]) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
        out["local_world_size"] = int(e.get("LOCAL_WORLD_SIZE") or 1)
    except ValueError:
        raise UserError("--nic efa: RANK/WORLD_SIZE/LOCAL_RANK are not integers") from None
    if not 0 <= out["rank"] < out["world_size"]:
        raise UserError(f"--nic efa: RANK {out['rank']} outside WORLD_SIZE {out['world_size']}")
    return out
