"""One RDMA write as it travels: WQE at the sender, packets on the wire, bytes at the target."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lever.sim.engine import Ledger
    from lever.sim.issuer import WarpPort
    from lever.sim.nic import QueuePair
    from lever.sim.proxy import Ring
    from lever.sim.receiver import Receiver


# Kinds of write the target GPU polls itself, whatever the path or signalling mode: a count of
# the notify exchange, a barrier signal. They are visible when they land (no CQE, no proxy).
POLLED_KINDS = ("notify", "barrier")


class Message:
    """A posted write (data, count/flag signal or tail signal).

    ``tag`` names the receiver-side thing it feeds (e.g. ``("tok", src, ch)``);
    ``kind`` is data, signal, notify, barrier or a proxy stripe (whether a write carries an
    immediate follows from the world's signalling mode, not from the message);
    ``on_complete`` runs at the sender when its CQE is written (all packets
    ACKed); ``on_visible`` at the target when every byte is visible to a poller.
    """

    __slots__ = (
        "src", "dst", "nbytes", "tag", "kind", "value", "qp", "npkts",
        "landed", "acked", "seen_pkts", "t_post", "on_complete", "on_visible", "seq",
        "ring", "port", "host_done", "t_complete", "parent", "parts", "parts_done", "ack_rec",
        "rx_cq",
    )

    def __init__(
        self,
        src: int,
        dst: int,
        nbytes: int,
        tag: Any,
        kind: str = "data",
        value: int = 1,
    ) -> None:
        self.src = src
        self.dst = dst
        self.nbytes = nbytes
        self.tag = tag
        self.kind = kind
        self.value = value
        self.qp: QueuePair | None = None  # the send queue it was posted on
        self.npkts = 0
        self.landed = 0
        self.acked = 0
        self.seen_pkts = 0  # bit k: packet k landed (a retransmitted duplicate is dropped)
        self.t_post = 0.0
        self.t_complete = -1.0
        self.on_complete: Callable[[Message], None] | None = None
        self.on_visible: Callable[[Message], None] | None = None
        self.seq = 0
        self.ring: Ring | None = None  # proxy path: the descriptor ring it went through
        self.port: WarpPort | None = None  # proxy path: the warp told of its completion
        self.host_done = False
        self.parent: Message | None = None  # proxy path: the put this stripe belongs to
        self.parts = 1
        self.parts_done = 0
        self.ack_rec: Any = None  # critical path: the flight of the ACK that came last
        self.rx_cq = -1  # imm-counting per-dest-qp: the receive CQ it completes on (-1: by tag)


class Messages:
    """Makes every write of one op: counted once, and wired to its target's receiver.

    Handed to whatever posts writes (protocols, the proxy when it stripes a put), so
    no piece needs the world to make one."""

    def __init__(self, ledger: Ledger, receivers: Sequence[Receiver]) -> None:
        self.counters = ledger.counters
        self.receivers = receivers
        self._keys: dict[str, str] = {}  # kind -> its counter's name (made once, not per write)

    def new(self, src: int, dst: int, nbytes: int, tag: Any, kind: str = "data",
            value: int = 1, seq: int = 0) -> Message:
        m = Message(src, dst, nbytes, tag, kind, value)
        m.seq = seq
        m.on_visible = self.receivers[dst].on_visible
        key = self._keys.get(kind)
        if key is None:
            key = self._keys[kind] = "messages_" + kind
        self.counters[key] += 1
        if kind != "stripe":  # a stripe's bytes are its put's, counted once
            self.counters["bytes_sent"] += nbytes
        return m
