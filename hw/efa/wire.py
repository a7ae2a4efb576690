"""Wire a rank's EFA queues into the NIC tables the EP kernels take.

Why this module: the kernels reach their queues only through ``lever_efa_nic_layout``
tables and a ``lever_efa_peer`` table (hw/efa/nic_layout.h), in the byte form
``make_world`` (hw/ep/binding.cpp) takes from any NIC. On EFA, one process drives one
GPU (one rank, under torchrun), so what the emulated NIC fills for every rank at once
(``emulated_nic_tables``) is made here in three steps, each testable without a device:

1. :func:`open_queues`: per rank, over its EFA devices (the rails: every device at its
   GPU's minimal PCIe distance by default, :func:`nearest_devices`), the receive QPs whose
   CQs take the write-with-immediate completions (``plan.recv``: slot ``i`` on device
   ``i % devices``) and one barrier QP; then, for every variant afresh
   (:func:`open_send`), the SRD QPs the kernels post to (``plan.send`` native or proxy
   send QPs, QP ``q`` on device ``q % devices``), so each variant starts from an empty SQ
   and CQ the way the emulated NIC restarts. Peers never name a send QP (writes target
   receive QPs), so they can be replaced without a new exchange.
2. :func:`local_address` / :func:`exchange`: what every peer needs of this rank (per
   device its GID, the window MR's rkey and the receive QPs it holds; the qkey, the
   window's base, the virtual addresses of its peer-visible buffers), gathered over
   ``torch.distributed`` (any ``all_gather_object``), checked for one plan, one rank each
   and as many devices on every rank.
3. :func:`peer_tables` / :func:`send_tables`: per device, the AH of every peer device
   it writes to (one per GID, ``add_peer``: an AH belongs to the device's PD, so every
   device has its own peer table ``[rank][receive slot]``), then every queue's layout
   from its own query (``fill_layout``: a send QP's lkey is its device's MR's), packed as
   ``make_world`` wants: ``send``/``psend`` for the local rank with ``send_table`` (the
   peer table each send slot's layout points at: its device's), ``recv`` for every rank
   (only the local rank's have CQs the GPU polls; a remote rank's entry names its QP and
   nothing else, since no NIC block runs), and ``peers`` (the tables, in device order).

The kernels do not know about devices: a send QP's layout carries its device's lkey and
points at its device's peer table, and the kernels index that table by the destination
rank and receive slot they chose. Which of the peer's devices a slot is written through
is decided when the table is made (:func:`peer_entry`): the same device index where the
peer holds a QP for the slot there (always, for plain writes: every device has a receive
QP standing for every slot), else the slot's own device.

The endpoint objects are the ``lever_hw_efa`` binding's ``Device`` (hw/efa/binding.cpp
over hw/efa/host.cpp), one per EFA device, or, in tests, fakes answering from recorded
query shapes: only the :class:`Endpoints` methods are used. Nothing here imports torch
or CUDA.
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
LAYOUT_BYTES = 200
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
                unsolicited: bool, **newer: Any) -> int: ...  # inline_write, send_cntr (v63, after v64)
    def qp_num(self, handle: int) -> int: ...
    def close_qp(self, handle: int) -> int: ...
    def add_peer(self, gid: bytes, qpn: int, qkey: int, rkey: int, addr: int) -> int: ...
    def num_ahs(self) -> int: ...
    def peers(self) -> bytes: ...
    def fill_layout(self, handle: int, flags: int) -> bytes: ...
    def close(self) -> int: ...


@dataclass(frozen=True)
class QueuePlan:
    """How many queues of each kind a rank opens, how deep, and over how many EFA devices.

    ``send`` QPs back the first ``send`` of the kernels' ``NQ_MAX`` send slots; the
    remaining slots repeat QP 0's layout and are never posted to (a variant that needs
    more QPs than opened is refused by :func:`check_variant`). Send QP ``q`` lives on
    device (rail) ``q % devices``: the kernels spread their puts over the QPs, so the
    QPs' striping is the rails' (the model puts QP ``q`` on NIC ``q % nics_per_gpu`` too).

    Receive slots: with ``rx_per_slot`` (a variant counts receive completions, i.e.
    write-with-immediate) slot ``i`` has its own receive QP, on rail ``i % devices``,
    whose CQ the kernels poll: ``recv`` = ``nrx``. Without it every rail has one receive
    QP that stands for every slot (plain writes make no receive completion, so no slot's
    CQ is polled): ``recv`` = ``devices``. The barrier QP is on rail 0."""

    send: int
    recv: int
    nrx: int
    sq_depth: int
    rx_depth: int
    proxy: bool = False
    unsolicited: bool = True
    devices: int = 1
    rx_per_slot: bool = False
    # the device generation the send QPs are made for: 128-byte WQEs whose RDMA writes may go
    # inline (rdma-core v63), a completion counter per send QP that the kernels read for their
    # credit instead of the CQ (after v64)
    inline_write: bool = False
    send_counters: bool = False

    def qps(self) -> int:
        """QPs (and CQs) a rank opens over all its devices: send, receive and the barrier QP."""
        return self.send + self.recv + 1

    def send_rail(self, q: int) -> int:
        """The device of send QP ``q``."""
        return q % self.devices

    def slot_rail(self, i: int) -> int:
        """The device of receive slot ``i``'s own QP (rails match a sender QP on device
        ``d`` to the receiver's device ``d`` when the slot's rail is ``d``)."""
        return i % self.devices

    def qps_on(self, rail: int) -> tuple[int, int, int]:
        """(send, receive, barrier) QPs on one device."""
        send = len(range(rail, self.send, self.devices))
        recv = len(range(rail, self.nrx, self.devices)) if self.rx_per_slot else 1
        return send, recv, int(rail == 0)


def plan_queues(*, num_qps: int, imm: bool, nrx: int, sq_depth: int, rx_depth: int,
                proxy: bool, caps: Mapping[str, Any], devices: int = 1, inline_write: bool = False,
                send_counters: bool = False) -> QueuePlan:
    """The queue plan for a run whose variants use up to ``num_qps`` send QPs and (``imm``)
    count receive completions, striped over ``devices`` EFA devices of one kind (``caps``:
    theirs, :func:`rail_caps`), within what each device allows (one-line WireError).
    ``inline_write`` / ``send_counters``: the send QPs with 128-byte WQEs and inline writes
    (the library must be v63+) / with completion counters (after v64, device cap COMP_CNTR);
    the proxy's host threads poll the CQ, so counters are native-path only."""
    if not 1 <= num_qps <= NQ_MAX:
        raise WireError(f"design.qps_per_call {num_qps}: the kernels take 1..{NQ_MAX} send QPs")
    if not 1 <= devices <= NQ_MAX:
        raise WireError(f"{devices} EFA devices per rank: 1..{NQ_MAX} (a send QP per device at least)")
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
    lib = caps.get("lib_features") or {}
    if inline_write and not lib.get("wqe128_inline_write", False):
        raise WireError("128-byte WQEs with inline writes need rdma-core 63 (libefa's efadv_get_max_sq_depth): "
                        "the loaded library lacks it")
    if send_counters and not lib.get("comp_cntr", False):
        raise WireError("completion counters need an rdma-core release after 64 (efadv_create_comp_cntr, "
                        "ibv_qp_attach_comp_cntr): the loaded library lacks them")
    if send_counters and not names.get("comp_cntr", False):
        raise WireError("completion counters: the device lacks COMP_CNTR (device cap bit 6)")
    if send_counters and proxy:
        raise WireError("completion counters: the proxy path's host threads poll the CQ (native path only)")
    plan = QueuePlan(send=num_qps, recv=nrx if imm else devices, nrx=nrx, sq_depth=sq_depth,
                     rx_depth=rx_depth, proxy=proxy, unsolicited=bool(names.get("unsolicited_write_recv")),
                     devices=devices, rx_per_slot=bool(imm), inline_write=bool(inline_write),
                     send_counters=bool(send_counters))
    for what, limit in (("max_qp", caps.get("max_qp")), ("max_cq", caps.get("max_cq"))):
        for rail in range(devices):
            s, r, b = plan.qps_on(rail)
            if limit and s + r + b > int(limit):
                where = "per rank" if devices == 1 else f"on device {rail} of {devices}"
                raise WireError(f"{s + r + b} QPs {where} ({s} send, {r} receive, {b} barrier) "
                                f"exceed the device's {what} {limit}")
    return plan


RAIL_CAPS = ("max_sq_wr", "max_cqe", "device_caps", "max_rdma_size", "inline_buf_size", "max_tx_batch",
             "inline_buf_size_ex")
"""What the devices a rank stripes over must agree on: one plan and one layout shape serve all."""


def rail_caps(caps: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The capabilities a plan over these devices may assume: the first device's, with the
    smallest ``max_qp``/``max_cq`` of all; devices that differ in what the layouts or the
    plan depend on (:data:`RAIL_CAPS`) are refused in one line (a rank stripes over devices
    of one kind, as the two or four next to a p5en/p5 GPU are)."""
    if not caps:
        raise WireError("no EFA device opened")
    first = dict(caps[0])
    for c in caps[1:]:
        for k in RAIL_CAPS:
            if c.get(k) != first.get(k):
                raise WireError(f"EFA devices {first.get('device_name', '?')} and {c.get('device_name', '?')} "
                                f"differ in {k} ({first.get(k)!r}, {c.get(k)!r}): a rank stripes over "
                                "devices of one kind")
    for k in ("max_qp", "max_cq"):
        vals = [int(c[k]) for c in caps if c.get(k)]
        if vals:
            first[k] = min(vals)
    return first


def check_variant(plan: QueuePlan, flags: Mapping[str, int], what: str) -> None:
    """A variant's kernel flags fit the opened queues (one-line WireError otherwise)."""
    if int(flags["num_qps"]) > plan.send:
        raise WireError(f"{what}: uses {flags['num_qps']} send QPs, {plan.send} were opened")
    own = plan.rx_per_slot or (plan.nrx == 1 and plan.devices == 1)
    if (flags.get("imm_counting") or flags.get("cached")) and not own:
        raise WireError(f"{what}: counts receive completions, but the receive slots share one QP "
                        "(per device)")


@dataclass(frozen=True)
class Qp:
    """One QP of a rank: the device (rail, an index into the rank's devices) it lives on
    and the binding's handle there (handles are per device)."""

    rail: int
    handle: int


@dataclass
class RankQueues:
    """The QPs one rank opened over its devices and their numbers."""

    recv: list[Qp] = field(default_factory=list)
    barrier: Qp = Qp(0, -1)
    send: list[Qp] = field(default_factory=list)
    qpn: dict[Qp, int] = field(default_factory=dict)


def _check_devices(devs: Sequence[Endpoints], plan: QueuePlan) -> None:
    if len(devs) != plan.devices:
        raise WireError(f"{len(devs)} EFA devices open, the plan stripes over {plan.devices}")


def _open(devs: Sequence[Endpoints], rail: int, sq: int, cq: int, unsolicited: bool) -> Qp:
    return Qp(rail, int(devs[rail].open_qp(sq, 1, cq, QKEY, unsolicited)))


def open_queues(devs: Sequence[Endpoints], plan: QueuePlan) -> RankQueues:
    """Open the receive QPs (slot ``i``'s on rail ``i % devices``, or one per rail) and the
    barrier QP (rail 0). A failure leaves what was opened on its device; closing every
    device (:func:`close_devices`) tears everything down."""
    _check_devices(devs, plan)
    q = RankQueues()
    rails = [plan.slot_rail(i) for i in range(plan.nrx)] if plan.rx_per_slot else list(range(plan.devices))
    for rail in rails:
        q.recv.append(_open(devs, rail, 32, plan.rx_depth, plan.unsolicited))
    q.barrier = _open(devs, 0, plan.sq_depth, plan.sq_depth, False)
    q.qpn.update({h: int(devs[h.rail].qp_num(h.handle)) for h in (*q.recv, q.barrier)})
    return q


def open_send(devs: Sequence[Endpoints], plan: QueuePlan, q: RankQueues) -> list[Qp]:
    """Replace the rank's send QPs with ``plan.send`` fresh ones (the old ones closed first,
    newest first), QP ``q`` on rail ``q % devices``: every variant posts from producer
    count 0 on an empty CQ. Returns them."""
    _check_devices(devs, plan)
    for h in reversed(q.send):
        devs[h.rail].close_qp(h.handle)
        q.qpn.pop(h, None)
    q.send = []
    newer = {k: True for k, on in (("inline_write", plan.inline_write), ("send_cntr", plan.send_counters)) if on}
    for i in range(plan.send):
        rail = plan.send_rail(i)
        q.send.append(Qp(rail, int(devs[rail].open_qp(plan.sq_depth, 1, plan.sq_depth, QKEY, False, **newer))))
    q.qpn.update({h: int(devs[h.rail].qp_num(h.handle)) for h in q.send})
    return q.send


def close_devices(devs: Sequence[Endpoints]) -> int:
    """Close every device, the last opened first (each tears down its own objects in
    reverse, host.cpp); every device is closed even when one fails. Returns the first
    non-zero rc."""
    rc = 0
    for d in reversed(list(devs)):
        try:
            r = int(d.close())
        except Exception:  # the others must still go
            r = -1
        rc = rc or r
    return rc


def rx_qpns(plan: QueuePlan, q: RankQueues) -> list[int]:
    """The QP number behind each receive slot: its own QP, or (receive slots sharing)
    rail ``i % devices``'s one receive QP."""
    if plan.rx_per_slot:
        return [q.qpn[q.recv[i]] for i in range(plan.nrx)]
    return [q.qpn[q.recv[plan.slot_rail(i) % len(q.recv)]] for i in range(plan.nrx)]


def rail_rx_qpns(plan: QueuePlan, q: RankQueues, rail: int) -> list[int | None]:
    """Per receive slot, the QP on ``rail`` a peer may write it through (None: the slot's
    QP is on another rail). Shared receive QPs serve every slot on their rail."""
    if plan.rx_per_slot:
        return [q.qpn[q.recv[i]] if q.recv[i].rail == rail else None for i in range(plan.nrx)]
    (mine,) = [h for h in q.recv if h.rail == rail]
    return [q.qpn[mine]] * plan.nrx


def local_address(devs: Sequence[Endpoints], plan: QueuePlan, q: RankQueues, *, rank: int, world: int,
                  buffers: Mapping[str, int], barrier_words: int, fingerprint: Mapping[str, Any],
                  host: str = "") -> dict[str, Any]:
    """What every peer needs of this rank, JSON-ready (for ``all_gather_object``): per
    device (``rails``) its GID, its window MR's rkey and the receive QPs it holds; at the
    top the first device's and the slots' owners (what a one-device peer reads)."""
    _check_devices(devs, plan)
    rails = []
    addr0 = None
    for e, d in enumerate(devs):
        loc = d.local()
        gid = bytes(loc["gid"])
        name = str(d.caps().get("device_name", ""))
        if len(gid) != 16:
            raise WireError(f"rank {rank}: GID of {len(gid)} bytes, not 16 ({name or f'device {e}'})")
        if addr0 is None:
            addr0 = int(loc["addr"])
        elif int(loc["addr"]) != addr0:
            raise WireError(f"rank {rank}: device {name} registered the window at {int(loc['addr']):#x}, "
                            f"device 0 at {addr0:#x}")
        rails.append({"name": name, "gid": gid.hex(), "rkey": int(loc["rkey"]),
                      "rx_qpns": rail_rx_qpns(plan, q, e)})
    missing = [k for k in PEER_BUFFERS if k not in buffers]
    if missing:
        raise WireError(f"rank {rank}: peer-visible buffer {missing[0]} not in the window")
    return {"rank": rank, "world": world, "gid": rails[0]["gid"], "qkey": QKEY, "rkey": rails[0]["rkey"],
            "addr": int(addr0 or 0), "rx_qpns": rx_qpns(plan, q), "rails": rails,
            "buffers": {k: int(buffers[k]) for k in PEER_BUFFERS}, "barrier_words": int(barrier_words),
            "plan": {**asdict(plan), **dict(fingerprint)}, "device": rails[0]["name"],
            "devices": [r["name"] for r in rails], "host": host}


def rails_of(a: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A peer's devices as it published them (one, from the top-level fields, for an
    address without ``rails``)."""
    return [dict(r) for r in a.get("rails") or [{"name": a.get("device", ""), "gid": a["gid"],
                                                  "rkey": a["rkey"], "rx_qpns": a["rx_qpns"]}]]


def exchange(addr: Mapping[str, Any], all_gather: Callable[[Any], list[Any]]) -> list[dict[str, Any]]:
    """Every rank's address, in rank order, from ``all_gather(addr)`` (one object per rank:
    ``torch.distributed.all_gather_object`` wrapped). One plan, one entry per rank, as many
    devices on every rank, each naming a QP for every receive slot it owns, else a
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
    nd = len(rails_of(addr))
    for a in by_rank:
        rails = rails_of(a)
        if len(rails) != nd:
            raise WireError(f"address exchange: rank {a['rank']} drives {len(rails)} EFA device(s), rank "
                            f"{addr['rank']} {nd}: every rank must stripe over as many (--efa-devices)")
        if a["plan"] != ref:
            diff = sorted(k for k in set(ref) | set(a["plan"]) if ref.get(k) != a["plan"].get(k))
            raise WireError(f"address exchange: rank {a['rank']} runs another plan ({diff[0]}: "
                            f"{a['plan'].get(diff[0])!r} here {ref.get(diff[0])!r})")
        if len(a["rx_qpns"]) != ref["nrx"]:
            raise WireError(f"address exchange: rank {a['rank']} sent {len(a['rx_qpns'])} receive QPNs")
        for e, r in enumerate(rails):
            if len(bytes.fromhex(r["gid"])) != 16:
                raise WireError(f"address exchange: rank {a['rank']} sent a GID that is not 16 bytes"
                                + (f" (device {e})" if nd > 1 else ""))
            if len(r["rx_qpns"]) != ref["nrx"]:
                raise WireError(f"address exchange: rank {a['rank']} device {e} sent {len(r['rx_qpns'])} "
                                "receive QPNs")
        for i in range(ref["nrx"]):
            if rails[i % nd]["rx_qpns"][i] is None:
                raise WireError(f"address exchange: rank {a['rank']} has no QP for receive slot {i} on "
                                f"its device {i % nd}")
    return by_rank


def peer_entry(a: Mapping[str, Any], rail: int, slot: int) -> tuple[int, dict[str, Any]]:
    """Which of peer ``a``'s devices this rank's device ``rail`` writes receive slot
    ``slot`` through, and that device's address: its own device ``rail`` when that holds a
    QP for the slot (rail-matched: always with shared receive QPs, for every ``devices``-th
    slot with a QP per slot), else the slot's owner ``slot % devices`` (the EFA fabric
    connects any device to any device). The kernels pick the slot (``[rank][slot]``), not
    the device: the peer table of each device makes the choice."""
    rails = rails_of(a)
    e = rail if rail < len(rails) and rails[rail]["rx_qpns"][slot] is not None else slot % len(rails)
    return e, rails[e]


def add_peers(dev: Endpoints, peers: Sequence[Mapping[str, Any]], nrx: int, rail: int = 0) -> bytes:
    """Every peer queue on ``dev`` (the rank's device ``rail``), in the kernels' order
    ``[rank][receive slot]``: the AH (on this device's PD) of the peer device's GID, made
    once per GID and shared, that device's QP for the slot and its rkey (:func:`peer_entry`).
    Returns the peer table's bytes."""
    for r, a in enumerate(peers):
        for i in range(nrx):
            _e, pr = peer_entry(a, rail, i)
            idx = dev.add_peer(bytes.fromhex(pr["gid"]), int(pr["rx_qpns"][i]), int(a["qkey"]), int(pr["rkey"]),
                               int(a["addr"]))
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


def _layouts(devs: Sequence[Endpoints], qps: Sequence[Qp], flags: int) -> list[bytes]:
    out = [bytes(devs[h.rail].fill_layout(h.handle, flags)) for h in qps]
    for b in out:
        if len(b) != LAYOUT_BYTES:
            raise WireError(f"fill_layout returned {len(b)} bytes, not {LAYOUT_BYTES}")
    return out


def peer_tables(devs: Sequence[Endpoints], plan: QueuePlan, q: RankQueues, peers: Sequence[Mapping[str, Any]],
                rank: int) -> dict[str, Any]:
    """What stays for the whole run: ``recv`` (``[ranks x nrx]`` layouts), ``peers`` (one
    peer table per device, in the rank's device order, its AHs made on that device: an AH
    belongs to a PD) and ``barrier`` (the barrier QP's layout, rail 0: it posts through
    ``peers[0]``)."""
    _check_devices(devs, plan)
    tables = [add_peers(d, peers, plan.nrx, rail) for rail, d in enumerate(devs)]
    recv_own = _layouts(devs, q.recv, FILL_NO_SQ_MAP)
    (barrier,) = _layouts(devs, [q.barrier], 0)
    own = list(range(plan.nrx)) if plan.rx_per_slot else [plan.slot_rail(i) for i in range(plan.nrx)]
    recv = []
    for r, a in enumerate(peers):
        for i in range(plan.nrx):
            if r == rank:
                recv.append(recv_own[own[i] % len(recv_own)])
            else:
                recv.append(remote_recv_layout(int(a["rx_qpns"][i]), int(a["qkey"])))
    return {"recv": b"".join(recv), "peers": tables, "barrier": barrier}


def send_tables(devs: Sequence[Endpoints], plan: QueuePlan, q: RankQueues) -> dict[str, list[Any]]:
    """The local rank's ``send`` and ``psend`` (``NQ_MAX`` layouts each, or empty psend) and
    ``send_table`` (per slot, the device whose peer table its layout must point at: the
    one its QP lives on, whose PD holds the AHs and whose MR gave the layout's lkey), from
    the current send QPs. On the proxy path the host threads post on the proxy QPs and the
    GPU posts nothing: the native slots hold the same QPs' layouts (the kernels read them
    only on the native path), so no QP is opened twice."""
    send = _layouts(devs, q.send, 0)
    if len(send) != plan.send:
        raise WireError(f"{len(send)} send QPs open, the plan has {plan.send}")
    slots = b"".join(send[i] if i < len(send) else send[0] for i in range(NQ_MAX))
    table = [q.send[i].rail if i < len(q.send) else q.send[0].rail for i in range(NQ_MAX)]
    return {"send": [slots], "psend": [slots if plan.proxy else b""], "send_table": [table]}


def build_tables(devs: Sequence[Endpoints], plan: QueuePlan, q: RankQueues,
                 peers: Sequence[Mapping[str, Any]], rank: int) -> dict[str, Any]:
    """:func:`peer_tables` and :func:`send_tables` in one dict: ``make_world``'s tables (and
    ``barrier``, which make_world ignores)."""
    return {**peer_tables(devs, plan, q, peers, rank), **send_tables(devs, plan, q)}


def world_peers(peers: Sequence[Mapping[str, Any]]) -> list[dict[str, int]]:
    """``make_world``'s per-rank peer maps: the peer-visible buffers' virtual addresses (the
    kernels put ``raddr`` = these plus an offset into WQEs; every device's MR has the
    window's address as iova, so they are valid remote addresses with any of its rkeys).
    ``rx_tail`` is emulated-NIC state: 0."""
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


def _near(gpu_bdf: str, devices: Mapping[str, str], sys_root: str | os.PathLike[str]) -> tuple[list[str], bool]:
    """The EFA devices at the GPU's minimal PCIe distance (longest shared sysfs path: the
    same switch first), sorted, and whether that distance means anything (they share more
    than the root of the tree with the GPU)."""
    if not devices:
        raise WireError("no EFA device under /sys/class/infiniband (driver efa)")
    gpu = os.path.realpath(Path(sys_root) / "bus" / "pci" / "devices" / gpu_bdf.lower())
    depth = {n: _common_depth(gpu, p) for n, p in devices.items()}
    best = max(depth.values())
    if best <= 2:
        return sorted(devices), False
    return sorted(n for n, d in depth.items() if d == best), True


def nearest_devices(gpu_bdf: str, devices: Mapping[str, str], sys_root: str | os.PathLike[str] = "/sys",
                    local_rank: int = 0, count: int | None = None) -> list[str]:
    """The EFA devices a rank stripes its send QPs over: ``count`` of those at its GPU's
    minimal PCIe distance, or every one of them (``count`` None: what aws-ofi-nccl's
    multi-rail uses, a p5en GPU's two devices, a p5 GPU's four). When GPUs share a switch
    and ``count`` is given, the ``local_rank``-th group of ``count`` (cyclic) is taken, so
    two GPUs under one switch do not share a device while it has enough. Where no device
    is nearer than the PCIe root (no topology to go by), ``count`` None means one device
    (the ``local_rank``-th), never all of the node's. Asking for more devices than are at
    that distance is a one-line WireError."""
    near, topo = _near(gpu_bdf, devices, sys_root)
    n = (len(near) if topo else 1) if count is None else int(count)
    if n < 1:
        raise WireError(f"--efa-devices {count}: at least one EFA device per rank")
    if n > len(near):
        where = "at its PCIe distance" if topo else "on this node"
        raise WireError(f"--efa-devices {n}: the GPU {gpu_bdf} has {len(near)} EFA device(s) {where} "
                        f"({', '.join(near)})")
    start = (local_rank * n) % len(near)
    return [near[(start + i) % len(near)] for i in range(n)]


def nearest_device(gpu_bdf: str, devices: Mapping[str, str], sys_root: str | os.PathLike[str] = "/sys",
                   local_rank: int = 0) -> str:
    """The one EFA device closest to the GPU on the PCIe tree (:func:`nearest_devices` with
    one device: among equally close devices the ``local_rank``-th, sorted)."""
    return nearest_devices(gpu_bdf, devices, sys_root, local_rank, count=1)[0]


def parse_device_count(text: str) -> int | None:
    """``--efa-devices``: ``all`` (None: every device nearest the GPU) or a count >= 1."""
    t = str(text).strip().lower()
    if t in ("", "all"):
        return None
    try:
        n = int(t)
    except ValueError:
        raise UserError(f"--efa-devices {text}: a number of EFA devices per rank, or 'all'") from None
    if n < 1:
        raise UserError(f"--efa-devices {text}: at least one EFA device per rank")
    return n


def choose_devices(names: str, count: str, gpu_bdf: Callable[[], str], devices: Mapping[str, str],
                   local_rank: int, sys_root: str | os.PathLike[str] = "/sys") -> list[str]:
    """The rank's EFA devices: ``names`` (``--efa-device A[,B...]``, each an EFA device of
    this node) as given, else :func:`nearest_devices` with ``count`` (``--efa-devices``).
    ``gpu_bdf`` is only asked when the topology decides."""
    given = [n.strip() for n in str(names or "").split(",") if n.strip()]
    if given:
        unknown = [n for n in given if n not in devices]
        if unknown:
            raise WireError(f"--efa-device {unknown[0]}: not an EFA device here ({', '.join(sorted(devices))})")
        if len(set(given)) != len(given):
            raise WireError(f"--efa-device {names}: a device named twice")
        return given
    return nearest_devices(gpu_bdf(), devices, sys_root, local_rank, parse_device_count(count))


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
