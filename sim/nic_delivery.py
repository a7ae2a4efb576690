"""The emulated NIC's delivering warps: a packet lands when one of a few warps of the sending
NIC's block has claimed it, copied it and fenced the copy, not at a fixed time after its
schedule says it is due.

Why a pool and not a constant: the testbed's NIC block (``hw/ep/ep_kernels.cu`` ``nic_warp``)
gives its packets to the warps that are neither the host engine nor the WQE fetcher (six of
eight). A warp claims up to ``deliver_batch_count`` packets that are due within
``deliver_lead_ns`` (a walk of the packet table), copies each (``copy_packet``: 16-byte loads,
8 KiB in flight per warp, a round of loads per 8 KiB), then fences once and does the
bookkeeping. Measured per packet on an H200 and an H100 (docs/testbed.md, "Where the lateness
goes"; ``nic_{scan,copy,fence}_per_packet_ns``): the claim 1.6-1.8 us, the batch's copies
2.6-3.0 us for two 7.5 KiB packets, the fence 1.5-2.0 us; and a claim lag, waiting for a free
warp, of 0.7-9.8 us that grows with the load (one NIC a rank: 9.8 us). A constant landing
time (``receiver.land_ns``) carries the first three but not the lag. Off on the shipped
emulated platform (README, Leave one lever out): at its fitted 35 Gb/s line rate packets
leave 1.7 us apart and rarely queue for the warps, and the refit keeps that line rate.

"Free at" arithmetic, in the order packets become due (the order the model's arrivals run in):
a packet joins a batch a warp claimed at or after the packet could be claimed, while the batch
has room (its copy lengthens the batch; the batch's earlier packets keep the landing they were
given, one copy early), else the warp free first claims it, no earlier than its due time less
the lead. No events and no random draws: a scenario and seed give the same landings.

A real EFA device lands packets by DMA as they arrive: no EFA or IB platform has this pool
(``nic.deliver_warps = 0``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lever.sim.params import NicParams


class DeliveryPool:
    """One sending NIC's delivering warps (``nic.deliver_warps``): when each ends its batch,
    when it claimed that batch and how many packets it holds."""

    __slots__ = ("free", "claimed", "held", "batch", "lead", "claim", "round", "round_bytes",
                 "fence")

    def __init__(self, p: NicParams, f_nic: float) -> None:
        k = p.deliver_warps
        self.free = [0.0] * k  # when each warp's current batch is visible (fenced)
        self.claimed = [float("-inf")] * k  # when it claimed that batch
        self.held = [0] * k  # packets in it
        self.batch = p.deliver_batch_count
        self.lead = p.deliver_lead_ns
        # the warps' work is NIC time (ledger category "nic", scaled as the rest of it)
        self.claim = p.deliver_claim_ns * f_nic
        self.round = p.deliver_copy_round_ns * f_nic
        self.round_bytes = p.deliver_copy_round_bytes
        self.fence = p.deliver_fence_ns * f_nic

    def _copy(self, size: int) -> float:
        """A warp's copy of one packet: a round of loads and stores per ``round_bytes``."""
        rounds = -(-size // self.round_bytes)
        return (rounds if rounds > 1 else 1) * self.round

    def land(self, due: float, size: int) -> float:
        """When a packet of ``size`` bytes, due (on the wire's schedule) at ``due``, is visible
        at its target."""
        ready = due - self.lead  # the earliest a warp claims it
        free, claimed, held = self.free, self.claimed, self.held
        copy = self._copy(size)
        # a batch claimed once the packet was claimable, with room: the packet is in it
        join = -1
        for i in range(len(free)):
            if held[i] < self.batch and claimed[i] >= ready and (join < 0 or claimed[i] < claimed[join]):
                join = i
        if join >= 0:
            held[join] += 1
            free[join] += copy
            return free[join]
        i = min(range(len(free)), key=free.__getitem__)  # the warp free first (lowest index on ties)
        start = free[i] if free[i] > ready else ready
        claimed[i] = start
        held[i] = 1
        free[i] = start + self.claim + copy + self.fence
        return free[i]
