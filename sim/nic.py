"""The NIC: send queues, WQE processing, payload DMA, MTU segmentation, line-rate
serialisation, ACK collection and completion generation, and the ingress side
that lands packets in GPU memory.

One :class:`Nic` per physical device (``nics_per_gpu`` per GPU). A doorbell
hands the NIC the WQEs up to the producer index (:meth:`Nic.doorbell`); the
NIC parses them one at a time (per-WQE time and message-rate ceiling),
fetches the payload over PCIe and serialises packets onto its port. A WQE's
completion (CQE) is written ``completion_ns`` after its last packet is ACKed,
so completions come out of order whenever ACKs do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import simpy
from lever.sim.engine import (
    NORMAL,
    ROOT,
    Counter,
    Ledger,
    Lock,
    Rec,
    Trace,
    call_at,
)
from lever.sim.nic_delivery import DeliveryPool
from lever.sim.nic_host_engine import HostEngine
from lever.sim.params import NicParams, ReceiverParams

if TYPE_CHECKING:
    from lever.sim.context import Context
    from lever.sim.fabric import Draws, Fabric
    from lever.sim.message import Message


class QueuePair:
    """A send queue with its completion queue/counter, as the issuing GPU sees it.

    ``posted`` counts WQEs written, ``pending`` those held for a deferred
    (aggregated) doorbell, ``completions`` the CQEs the NIC wrote (a :class:`Counter` warps can wait
    on), ``consumed`` the CQEs a poller already read. ``lock`` serialises
    issuers that share the queue (and its doorbell order).
    """

    __slots__ = ("index", "rank", "nic", "posted", "rung", "completions", "consumed", "lock",
                 "pending", "owners")

    def __init__(self, env: simpy.Environment, index: int, rank: int, nic: Nic) -> None:
        self.index = index
        self.rank = rank
        self.nic = nic
        self.posted = 0
        self.rung = 0  # WQEs handed to the NIC by a doorbell (submitted)
        self.completions = Counter(env)
        self.consumed = 0
        self.lock = Lock(env, direct=True)  # the doorbell turn: FIFO, handed over at release
        self.pending: list[Message] = []
        self.owners = 0


class Nic:
    """One EFA (or ConnectX) device: egress engine plus ingress landing.

    The egress engine, DMA and port are pipelines in "free at" arithmetic
    rather than processes: a doorbell computes, in doorbell order, when each
    WQE is parsed, when its payload is fetched and when each packet leaves,
    and hands the packets to the fabric with their departure times. Only
    arrivals, visibility and completions are events.
    """

    def __init__(self, env: simpy.Environment, index: int, gpu: int, p: NicParams,
                 rp: ReceiverParams, fabric: Fabric, ledger: Ledger, trace: Trace) -> None:
        self.env = env
        self.index = index
        self.gpu = gpu
        self.p = p
        self.rp = rp
        self.fabric = fabric
        self.ledger = ledger
        self.trace = trace
        self.engine_free = 0.0
        self.tx_free = 0.0
        self.rx_free = 0.0
        # critical path: the segments that end at engine_free, tx_free and rx_free (a WQE or
        # packet queued behind them follows them), kept only when the path is recorded
        self.engine_rec: Rec = ROOT
        self.tx_rec: Rec = ROOT
        self.rx_rec: Rec = ROOT
        self.ns_per_byte = 8.0 / p.line_rate_gbps
        self.dma_ns_per_byte = 8.0 / p.dma_gbps
        self.wqe_ns = max(p.wqe_process_ns, 1e3 / p.max_msg_rate_mops)
        self._wqe_cost = self.wqe_ns * ledger.factor("nic")  # ledger.cost("nic", wqe_ns)
        self._mtu = p.mtu_bytes  # read per packet: plain attributes, not the model's fields
        self._hdr = p.header_bytes
        # the ledger's factors (ledger.cost(cat, x) is x times these; fixed for a run)
        self._f_nic = ledger.factor("nic")
        self._f_wire = ledger.factor("wire")
        self._land = rp.land_ns * self._f_nic  # ledger.cost("nic", rp.land_ns)
        self._vis = rp.visibility_ns * ledger.factor("visibility")
        self._counters = ledger.counters
        self._completion = p.completion_ns * self._f_nic  # a CQE after the last ACK
        self._draws: Draws | None = None  # this NIC's random stream (Fabric.stream), once used
        self.peers: list[Nic] = []  # filled by the model: global NIC table
        self.per_gpu = 1  # NICs per GPU, set by the model
        # CQEs this NIC writes into host memory on its engine (nic.host_cqe_write_ns): send CQEs
        # where the send CQ is in host memory, receive CQEs of write-with-immediate where the
        # receive CQ is (set by the model; 0: off the engine)
        self.send_cqe_engine_ns = 0.0
        self.recv_cqe_engine_ns = 0.0
        self.host_free = 0.0  # the host engine that writes them: its own serial timeline
        self.host_rec: Rec = ROOT
        # the emulated NIC's host engine as a loop of passes (nic.host_passes): doorbells and
        # host CQE writes queue for it (set by the model: make_host_engine)
        self.host: HostEngine | None = None
        # the emulated NIC's delivering warps (nic.deliver_warps): the packets this NIC sends
        # land when one of them has copied and fenced them
        self.delivery = DeliveryPool(p, self._f_nic) if p.deliver_warps else None

    # -- egress -----------------------------------------------------------
    def doorbell(self, msgs: list[Message]) -> None:
        """WQEs become visible to the NIC (the producer counter moved)."""
        led = self.ledger
        path = led.path
        now = self.env._now
        qp = msgs[0].qp if msgs else None
        if qp is not None:  # one doorbell rings one QP's WQEs
            qp.rung += len(msgs)
            if self.host is not None:
                # the host engine's next pass reads this doorbell and copies the QP's new WQEs
                # (once for every doorbell rung on it since its last read): parsed after that
                self.host.doorbell(qp, msgs)
                return
        if self.p.doorbell_process_ns and self.p.host_engine:
            # the host engine reads the doorbell and mirrors the new WQEs; the WQE engine parses
            # each once it is mirrored (and once it is free)
            self._on_host_engine(self.p.doorbell_process_ns)
            if self.host_free > self.engine_free:  # parsing waits for the mirror
                self.engine_free = self.host_free
                if path is not None:
                    self.engine_rec = self.host_rec
        elif self.p.doorbell_process_ns:  # once per doorbell, before its WQEs are parsed
            busy = self.engine_free > now
            start = max(self.engine_free, now)
            self.engine_free = max(self.engine_free, now) + led.cost("nic", self.p.doorbell_process_ns)
            if path is not None:
                self.engine_rec = (start, self.engine_free, "nic",
                                   self.engine_rec if busy else path.cur)
        self.parse(msgs)

    def make_host_engine(self, ctx: Context, claim: int) -> None:
        """Give this NIC its host engine as a loop of passes (``nic.host_passes``)."""
        self.host = HostEngine(ctx, self, claim)

    def parse(self, msgs: list[Message]) -> None:
        """The WQE engine parses ``msgs`` one after another from now (or once it is free) and
        sends each."""
        path = self.ledger.path
        now = self.env._now
        wqe_ns = self._wqe_cost
        rec = None
        traced = self.trace.enabled
        for msg in msgs:
            free = self.engine_free
            start = free if free > now else now  # max(engine_free, now)
            if path is not None:
                pred = self.engine_rec if free > now else path.cur
                rec = (start, start + wqe_ns, "nic", pred)
                self.engine_rec = rec
            self.engine_free = free = start + wqe_ns
            if traced:
                self.trace.span(f"nic{self.index}", "wqe engine", msg.kind, start, wqe_ns)
            self._transmit(msg, free, rec)

    def _transmit(self, msg: Message, t0: float, rec: Rec | None = None) -> None:
        """Fetch the payload and serialise the packets; ``rec`` is the WQE's parse segment.

        Each packet's flight is drawn here, from this NIC's stream, and its arrival queued
        (``Fabric.launch``). Lossless SRD (every full-size run) takes the fast path: the
        flight drawn and the arrival pushed inline, the same draws, instants, queue slots and
        critical-path segments as ``launch``."""
        p = self.p
        path = self.ledger.path
        mtu = p.mtu_bytes
        nbytes = msg.nbytes
        n = -(-nbytes // mtu)  # max(1, packets)
        if n < 1:
            n = 1
        msg.npkts = n
        inline = nbytes <= p.inline_bytes
        f_nic = self._f_nic
        f_wire = self._f_wire
        t_ready = t0 if inline else t0 + p.dma_read_ns * f_nic
        # same-index NIC on the target GPU (rails are matched, as on p5)
        dst_nic = self.peers[msg.dst * self.per_gpu + self.index % self.per_gpu]
        deliver = dst_nic.ingress
        fab = self.fabric
        env = self.env
        push = None if (fab.lossy or fab._rc) else getattr(env, "push", None)
        if push is not None:
            dr = self._draws
            if dr is None:
                dr = self._draws = fab.stream(self.index)
            bases = fab.path_base
            paths = len(bases)
            eid = env._eid
            now = env._now
        left = nbytes
        hdr = p.header_bytes
        ns_per_byte = self.ns_per_byte
        dma_ns_per_byte = self.dma_ns_per_byte
        tx = None
        for k in range(n):
            size = (mtu if left > mtu else left) if left > 0 else 0  # min(mtu, left)
            left -= size
            if not inline:
                t_ready += size * dma_ns_per_byte * f_nic
            tx_free = self.tx_free
            depart = ((tx_free if tx_free >= t_ready else t_ready)  # max(tx_free, t_ready)
                      + (size + hdr) * ns_per_byte * f_wire)
            if path is not None:  # behind the port's last packet, or behind its own fetch
                if tx_free > t_ready:
                    tx = (tx_free, depart, "wire", self.tx_rec)
                else:  # the fetch since the WQE was parsed: one segment, made only when waited on
                    tx = (t_ready, depart, "wire", rec if inline else (t0, t_ready, "nic", rec))
                self.tx_rec = tx
            self.tx_free = depart
            if push is None:
                fab.launch(msg, k, depart, self.index, dst_nic.index, deliver, tx)
                continue
            # Fabric.launch and Fabric.flight for lossless SRD, inline
            u = dr._u
            base = bases[int((u.pop() if u else dr.uniform()) * paths) % paths]
            j = dr._j
            arrive = depart + (base + (j.pop() if j else dr.jitter())) * f_wire
            # a call entry (engine.call_at's), run as the flight's segment when it is recorded
            push((arrive if arrive > now else now, NORMAL, next(eid),
                  deliver, (msg, k, True), None if path is None else (depart, arrive, "wire", tx)))

    # -- ingress ----------------------------------------------------------
    def ingress(self, msg: Message, k: int, ack_ok: bool) -> None:
        """Packet ``k`` arrived at this (target) NIC: drop duplicates, land it, ACK it."""
        env = self.env
        now = env._now
        path = self.ledger.path
        bit = 1 << k
        if msg.seen_pkts & bit:
            self._counters["duplicates_dropped"] += 1
            if ack_ok:
                msg.qp.nic.ack(msg, now + self.fabric.flight(self.index),
                               None if path is None else path.cur)
            return
        msg.seen_pkts |= bit
        mtu = self._mtu
        size = msg.nbytes - k * mtu
        if size > mtu:  # min(mtu, ...)
            size = mtu
        rx_free = self.rx_free
        busy = rx_free > now
        start = rx_free if busy else now  # max(rx_free, now)
        rx_free = self.rx_free = start + (size + self._hdr) * self.ns_per_byte * self._f_wire
        t_land = rx_free + self._land
        if self.delivery is not None:  # every NIC of a run has one, or none
            # the sender's delivering warps copy it, due at its arrival
            t_vis = msg.qp.nic.delivery.land(now, size) + self._land
            if t_vis > t_land:
                t_land = t_vis
        cnt = self._counters
        cnt["bytes_landed"] += size
        cnt["packets_landed"] += 1
        msg.landed += 1
        if ack_ok:  # Fabric.flight inline: the same draw
            fab = self.fabric
            dr = self._draws
            if dr is None:
                dr = self._draws = fab.stream(self.index)
            bases = fab.path_base
            if fab._rc:
                base = bases[0]
            else:
                u = dr._u
                paths = len(bases)
                base = bases[int((u.pop() if u else dr.uniform()) * paths) % paths]
            j = dr._j
            t_ack = t_land + (base + (j.pop() if j else dr.jitter())) * self._f_wire
        if path is None:
            if ack_ok:
                msg.qp.nic.ack(msg, t_ack)
        else:  # ingress serialisation behind the port's last packet, then landing
            self.rx_rec = (start, rx_free, "wire", self.rx_rec if busy else path.cur)
            land = (rx_free, t_land, "nic", self.rx_rec)
            if ack_ok:
                msg.qp.nic.ack(msg, t_ack, land)
        if msg.landed == msg.npkts:
            # land times are monotone at one port: this packet lands last
            vis = t_land + self._vis
            if msg.on_visible is not None:  # the receiver's own call at that instant
                if path is None:
                    call_at(env, vis, msg.on_visible, msg)
                else:
                    path.call_at(vis, (t_land, vis, "visibility", land), msg.on_visible, msg)

    # -- completions (sender side) ------------------------------------------
    def ack(self, msg: Message, t_arrive: float, sent: Rec | None = None) -> None:
        """An ACK for one packet of ``msg`` reaches this (sender) NIC at ``t_arrive``
        (``sent``: the segment it was sent at the end of, when the critical path is recorded)."""
        msg.acked += 1
        if t_arrive > msg.t_complete:
            msg.t_complete = t_arrive
            if sent is not None:  # the completion waits for the last ACK: its flight
                msg.ack_rec = (sent[1], t_arrive, "wire", sent)
        if msg.acked == msg.npkts:
            t = msg.t_complete + self._completion
            path = self.ledger.path
            done = self._complete if not self.send_cqe_engine_ns else self._send_cqe
            if path is None:
                call_at(self.env, t, done, msg)
            else:
                path.call_at(t, (msg.t_complete, t, "nic", msg.ack_rec), done, msg)

    def engine_write(self, ns: float, then, *args) -> None:
        """A CQE write into host memory: on the NIC's host engine where it has one
        (``nic.host_engine``: the emulated NIC's host-engine warp, apart from the warp that
        parses WQEs), else on the WQE engine. It starts when that engine is free (now at the
        earliest), takes ``ns``, and ``then(*args)`` runs when it is written."""
        led = self.ledger
        now = self.env.now
        path = led.path
        if self.host is not None:  # the engine's loop writes it on a later turn
            led.counters["nic_host_cqe_writes"] += 1
            self.host.cqe(ns, then, args)
            return
        if self.p.host_engine:
            end, rec = self._on_host_engine(ns)
        else:
            busy = self.engine_free > now
            start = self.engine_free if busy else now
            end = self.engine_free = start + led.cost("nic", ns)
            if path is not None:
                rec = self.engine_rec = (start, end, "nic", self.engine_rec if busy else path.cur)
        led.counters["nic_host_cqe_writes"] += 1
        if path is None:
            call_at(self.env, end, then, *args)
        else:
            path.call_at(end, rec, then, *args)

    def _on_host_engine(self, ns: float) -> tuple[float, Rec | None]:
        """Book ``ns`` of work on the host engine from now (behind what it has): its end, and
        its critical-path segment when the path is recorded."""
        led = self.ledger
        now = self.env.now
        path = led.path
        busy = self.host_free > now
        start = self.host_free if busy else now
        end = self.host_free = start + led.cost("nic", ns)
        if path is None:
            return end, None
        self.host_rec = (start, end, "nic", self.host_rec if busy else path.cur)
        return end, self.host_rec

    def _send_cqe(self, msg: Message) -> None:
        self.engine_write(self.send_cqe_engine_ns, self._complete, msg)

    def _complete(self, msg: Message) -> None:
        msg.t_complete = self.env._now
        msg.qp.completions.add(1)
        if msg.on_complete is not None:
            msg.on_complete(msg)
