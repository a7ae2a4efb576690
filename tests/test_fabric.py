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
