"""EP protocols: compositions of the issuer, proxy, NIC, fabric and receiver pieces.

``v1-ll`` (one write per token-expert, counts per expert), ``v2-direct`` (one
write per token-rank, barrier) and ``v2-hybrid`` (one write per token-node,
tail signals, NVLink forward warps); ``pplx-a2a`` (pplx-garden: one bulk write per peer per
stage from a CPU worker, immediates counted). Each ``run(world)`` starts one process per
rank and returns the events whose values are the ranks' completion times (ns).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lever.sim.protocols import pplx_a2a, v1_ll, v2_direct, v2_hybrid

if TYPE_CHECKING:
    from lever.sim.model import World

PROTOCOLS = {"v1-ll": v1_ll.run, "v2-direct": v2_direct.run, "v2-hybrid": v2_hybrid.run,
             "pplx-a2a": pplx_a2a.run}


def run_protocol(world: World) -> list:
    return PROTOCOLS[world.design.protocol](world)
