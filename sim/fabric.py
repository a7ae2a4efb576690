"""The wire between NICs: SRD multipath (EFA) or RC single path in order (InfiniBand).

SRD sprays each packet over one of ``paths`` paths, each with its own base
latency, plus a per-packet jitter, so packets of one write and writes of one
queue arrive out of order. A lost data packet or a lost ACK makes the sender
retransmit after ``retransmit_timeout_ns``; the target drops duplicates by
packet id, so every byte lands exactly once. RC keeps one connection per
(source NIC, target NIC) first-in first-out: an arrival never overtakes an
earlier one, which is what makes "flag after data" safe on InfiniBand.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import simpy
from lever.sim.engine import Ledger, Rec, call_at
from lever.sim.params import FabricParams

if TYPE_CHECKING:
    from lever.sim.message import Message

_BATCH = 4096


class Draws:
    """Pre-drawn random numbers from one seeded generator (bulk draws are fast)."""

    def __init__(self, rng: np.random.Generator, fp: FabricParams) -> None:
        self.rng = rng
        self.fp = fp
        # array('d'): 8 bytes a draw rather than a float object each (1024 streams at EP256)
        self._u = array("d")
        self._j = array("d")

    def uniform(self) -> float:
        if not self._u:
            self._u = array("d", self.rng.random(_BATCH).tobytes())  # bytes: no per-item copy
        return self._u.pop()

    def jitter(self) -> float:
        if not self._j:
            j = self.fp.jitter
            m = j.mean_ns
            if j.distribution == "none" or m == 0:
                arr = np.zeros(_BATCH)
            elif j.distribution == "exponential":
                arr = self.rng.exponential(m, _BATCH)
            elif j.distribution == "lognormal":
                s = j.sigma
                arr = self.rng.lognormal(np.log(m) - s * s / 2, s, _BATCH)
            else:  # gamma with mean m and coefficient of variation sigma
                k = 1.0 / max(j.sigma, 1e-6) ** 2
                arr = self.rng.gamma(k, m / k, _BATCH)
            self._j = array("d", np.ascontiguousarray(arr, dtype=np.float64).tobytes())
        return self._j.pop()


class Fabric:
    """Moves packets and ACKs between NICs with the configured path model."""

    def __init__(self, env: simpy.Environment, fp: FabricParams, rng: np.random.Generator,
                 ledger: Ledger, seed_key: tuple[int, ...] = (0,)) -> None:
        self.env = env
        self.fp = fp
        self.ledger = ledger
        self.seed_key = seed_key
        # one random stream per sending NIC: a lever that reorders one NIC's packets
        # leaves every other NIC's draws (common random numbers) untouched
        self._streams: dict[int, Draws] = {}
        spread = fp.path_spread_ns
        # Python floats, not numpy's: the same doubles, but a numpy scalar here made every
        # arrival, landing, ACK and completion time downstream a numpy scalar too, and each
        # queue comparison and sum of one a call into numpy (a sixth of EP16's instructions)
        self.path_base = [
            max(0.0, fp.base_latency_ns + (spread * (2 * u - 1) if spread else 0.0))
            for u in rng.random(fp.paths).tolist()
        ]
        self._wire = ledger.factor("wire")  # ledger.cost("wire", x) is x * this
        self._rc = fp.mode == "rc"
        self.lossy = fp.loss_prob > 0  # else no draw decides a loss (the NIC's fast path)
        self._rc_last: dict[tuple[int, int], float] = {}
        # critical path: each connection's last arrival
        self._rc_rec: dict[tuple[int, int], Rec] = {}

    def stream(self, nic: int) -> Draws:
        d = self._streams.get(nic)
        if d is None:
            d = Draws(np.random.default_rng([*self.seed_key, 1000 + nic]), self.fp)
            self._streams[nic] = d
        return d

    def flight(self, nic: int) -> float:
        """One packet's (or ACK's) time through the fabric from ``nic``: path base + jitter."""
        dr = self._streams.get(nic)
        if dr is None:
            dr = self.stream(nic)
        if self._rc:
            base = self.path_base[0]
        else:
            paths = self.fp.paths
            u = dr._u  # Draws.uniform and .jitter inlined while their arrays hold draws
            base = self.path_base[int((u.pop() if u else dr.uniform()) * paths) % paths]
        j = dr._j
        return (base + (j.pop() if j else dr.jitter())) * self._wire

    def _lost(self, nic: int) -> bool:
        p = self.fp.loss_prob
        return p > 0 and self.stream(nic).uniform() < p

    def launch(self, msg: Message, k: int, depart: float, src_nic: int, dst_nic: int,
               deliver: Callable[[Message, int, int], None], rec: Rec | None = None) -> None:
        """Packet ``k`` of ``msg`` leaves ``src_nic`` at absolute time ``depart`` (``rec``: the
        segment ending at ``depart``, when the critical path is recorded)."""
        env = self.env
        path = self.ledger.path
        if self.fp.loss_prob > 0:
            data_lost = self._lost(src_nic)
            ack_lost = (not data_lost) and self._lost(src_nic)
        else:
            data_lost = ack_lost = False
        if data_lost or ack_lost:
            # no ACK within the timeout: the sender's SRD layer sends the packet again
            self.ledger.counters["retransmits"] += 1
            t_rt = depart + self.ledger.cost("wire", self.fp.retransmit_timeout_ns)
            if path is None:
                call_at(env, max(env.now, t_rt), self._resend, msg, k, src_nic, dst_nic, deliver)
            else:
                path.call_at(max(env.now, t_rt), (depart, t_rt, "wire", rec), self._resend, msg, k,
                             src_nic, dst_nic, deliver)
            if data_lost:
                return
        arrive = depart + self.flight(src_nic)
        if path is not None:
            rec = (depart, arrive, "wire", rec)
        if self._rc:
            key = (src_nic, dst_nic)
            last = self._rc_last.get(key, 0.0)
            if path is not None:  # held behind the connection's previous arrival
                if last > arrive:
                    rec = self._rc_rec[key]
                self._rc_rec[key] = rec
            arrive = max(arrive, last)
            self._rc_last[key] = arrive
        ack_ok = not ack_lost
        if path is None:
            call_at(env, max(env.now, arrive), deliver, msg, k, ack_ok)
        else:
            path.call_at(max(env.now, arrive), rec, deliver, msg, k, ack_ok)

    def _resend(self, msg: Message, k: int, src_nic: int, dst_nic: int, deliver) -> None:
        path = self.ledger.path
        self.launch(msg, k, self.env.now, src_nic, dst_nic, deliver,
                    None if path is None else path.cur)
