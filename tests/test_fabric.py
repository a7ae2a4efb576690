"""The wire's ordering promises: RC delivers one connection's packets in launch order; SRD does not."""

from __future__ import annotations

import numpy as np
import simpy
from lever.sim.engine import Ledger
from lever.sim.fabric import Fabric
from lever.sim.message import Message
from lever.sim.model import simulate_op
from lever.sim.params import FabricParams, JitterParams
from lever.sim.scenario import load


def _burst(mode: str, n: int = 400) -> list[int]:
    """A dense burst on one connection: packet i leaves at a jittered instant, launched at a
    later 'now' each time, so an RC arrival is often clamped to the one before it."""
    env = simpy.Environment()
    fp = FabricParams(mode=mode, paths=8, base_latency_ns=5000.0, path_spread_ns=1500.0,
                      jitter=JitterParams(distribution="exponential", mean_ns=3000.0))
    fab = Fabric(env, fp, np.random.default_rng(1), Ledger())
    order: list[int] = []
    rng = np.random.default_rng(2)

    def sender():
        t = 0.0
        for i in range(n):
            gap = float(rng.uniform(0.0, 3.7))  # irrational-ish gaps: sums that round
            yield env.timeout(gap)
            t = env.now
            fab.launch(Message(0, 1, 64, i), 0, t, 0, 1, lambda m, _k, _ok: order.append(m.tag))

    env.process(sender())
    env.run()
    return order


def test_rc_keeps_launch_order_on_a_dense_burst():
    order = _burst("rc")
    assert order == sorted(order) and len(order) == 400


def test_srd_reorders_the_same_burst():
    order = _burst("srd")
    assert order != sorted(order) and sorted(order) == list(range(400))


def test_rc_flag_after_data_holds_with_zero_fence_cost():
    """Ordered signals on RC, no fence cost, cached V2 hybrid: a flag never overtakes its data
    (an arrival scheduled as ``now + (t - now)`` used to round one ulp before an earlier one)."""
    scn = load("decode-ep16-efa-native", {
        "workload.tokens_per_rank": 64, "design.signal_mode": "ordered",
        "platform.fabric.mode": "rc", "design.cached": True, "platform.gpu.fence_ns": 0.0})
    for op in ("dispatch", "combine"):
        r = simulate_op(scn, op, 0)
        assert r.counters.get("ordering_violations", 0) == 0, op
    # the same without RC is unsafe, and the model says so
    srd = load("decode-ep16-efa-native", {
        "workload.tokens_per_rank": 64, "design.signal_mode": "ordered", "design.cached": True,
        "platform.gpu.fence_ns": 0.0})
    assert simulate_op(srd, "dispatch", 0).counters.get("ordering_violations", 0) > 0


def test_the_per_packet_header_is_serialised_with_the_payload():
    """``nic.header_bytes`` is paid per packet at egress and ingress: on a wire-bound case more
    header bytes per packet mean a later landing, in proportion to the packets sent."""
    base = {"workload.ep_ranks": 2, "workload.gpus_per_node": 1, "workload.tokens_per_rank": 64,
            "platform.nic.line_rate_gbps": 5.0, "platform.fabric.jitter.distribution": "none"}
    lat = {}
    for hdr in (0, 64, 2048):
        scn = load("decode-ep16-efa-native", {**base, "platform.nic.header_bytes": hdr})
        lat[hdr] = simulate_op(scn, "dispatch", 0)
    assert lat[0].latency_us[0] < lat[64].latency_us[0] < lat[2048].latency_us[0]
    pkts = lat[64].counters["packets_landed"]
    # each extra header byte is serialised once per packet on the sending port: the last landing
    # moves by about (extra bytes / line rate) x the packets one port carries (2 ranks, 4 NICs)
    per_pkt_us = (2048 - 64) * 8 / 5.0 / 1e3
    expect = per_pkt_us * pkts / (2 * 4)
    gain_us = max(lat[2048].latency_us) - max(lat[64].latency_us)
    assert 0.5 * expect < gain_us < 2 * expect, (gain_us, expect)
