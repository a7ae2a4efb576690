"""EP protocols: put counts from routing, signalling strategies, cached mode, tails."""

from __future__ import annotations

import pytest
from lever.sim import scenario
from lever.sim.model import simulate_op
from lever.sim.results import simulate, what_if_reruns
from lever.sim.routing import Routing

EP16 = "decode-ep16-efa-native"


def test_hybrid_puts_one_per_token_per_remote_node_v1_per_remote_token_expert():
    hyb = scenario.load(EP16)
    v1 = scenario.load(EP16, {"design.protocol": "v1-ll"})
    rt = Routing.for_scenario(hyb, 0)
    rpn = hyb.workload.ranks_per_node
    want_hyb = sum(
        sum(1 for m in nodes if m != s // rpn) for s in range(16) for nodes in rt.dst_nodes[s])
    want_v1 = sum(
        1 for s in range(16) for row in rt.topk[s] for e in row if rt.rank_of(int(e)) // rpn != s // rpn)
    got_hyb = simulate_op(hyb, "dispatch", 0).counters["messages_data"]
    got_v1 = simulate_op(v1, "dispatch", 0).counters["messages_data"]
    assert got_hyb == want_hyb
    assert got_v1 == want_v1
    # "about 128 per rank" and "about 1024 minus the intra-node share"
    assert 100 * 16 <= got_hyb <= 128 * 16
    assert 400 * 16 <= got_v1 <= 600 * 16


def _signal_wait(mode: str, fabric: str = "srd", extra: dict | None = None):
    scn = scenario.load(EP16, {"workload.tokens_per_rank": 64, "design.signal_mode": mode, "platform.fabric.mode": fabric, "design.cached": True, **(extra or {})})
    r = simulate_op(scn, "dispatch", 0)
    return r.ledger.busy.get("signal", 0.0), r.counters


def test_strong_signal_never_waits_flush_signal_waits_for_completions():
    waited_ordered, c_ord = _signal_wait("ordered", "rc")
    waited_flush, c_flush = _signal_wait("flush", "srd")
    assert waited_ordered == 0.0
    assert c_ord.get("ordering_violations", 0) == 0
    assert waited_flush > 0.0
    assert c_flush.get("ordering_violations", 0) == 0


def test_each_flushed_signal_is_posted_after_its_data_completed():
    scn = scenario.load(EP16, {"workload.tokens_per_rank": 64, "design.signal_mode": "flush", "design.cached": True})
    from lever.sim.engine import Ledger, Trace
    from lever.sim.model import World
    from lever.sim.protocols import run_protocol

    w = World(scn, "dispatch", 0, Ledger(), Trace(), Routing.for_scenario(scn, 0))
    posts: list = []
    orig = w.message

    def spy(src, dst, nbytes, tag, kind="data", value=1, seq=0):
        m = orig(src, dst, nbytes, tag, kind=kind, value=value, seq=seq)
        posts.append(m)
        return m

    w.message = spy  # type: ignore[method-assign]
    done = run_protocol(w)
    w.env.run()
    assert all(ev.triggered for ev in done)
    completed_at: dict = {}
    checked = 0
    for m in posts:
        if m.kind == "data":
            completed_at.setdefault((m.src, m.tag), []).append(m)
    for m in posts:
        if m.kind != "signal":
            continue
        data = [d for d in completed_at.get((m.src, m.tag), []) if d.t_post < m.t_post]
        assert len(data) >= m.value
        # every data write before the signal had its send completion before the signal was posted
        assert all(0 <= d.t_complete <= m.t_post for d in data)
        checked += 1
    assert checked > 0
    # with 'ordered' signalling the same check fails: signals leave before completions
    early = 0
    scn_o = scenario.load(EP16, {"workload.tokens_per_rank": 64, "design.signal_mode": "ordered", "design.cached": True})
    w = World(scn_o, "dispatch", 0, Ledger(), Trace(), Routing.for_scenario(scn_o, 0))
    posts.clear()
    orig = w.message
    w.message = spy  # type: ignore[method-assign]
    run_protocol(w)
    w.env.run()
    for m in posts:
        if m.kind == "signal":
            early += sum(1 for d in posts if d.kind == "data" and d.src == m.src and d.tag == m.tag
                         and d.t_post < m.t_post and d.t_complete > m.t_post)
    assert early > 0


@pytest.mark.parametrize("seed", [0, 1])
def test_unordered_counting_never_accepts_before_landing_ordered_on_srd_does(seed):
    chaos = {"platform.fabric.jitter.mean_ns": 20000, "platform.fabric.jitter.sigma": 1.5, "platform.fabric.loss_prob": 0.05, "platform.fabric.retransmit_timeout_ns": 30000, "design.scaleout_update_interval": 2}
    unordered = scenario.load(EP16, {"workload.tokens_per_rank": 64, "design.signal_mode": "unordered-counting", **chaos})
    ordered = scenario.load(EP16, {"workload.tokens_per_rank": 64, "design.signal_mode": "ordered", **chaos})
    for op in ("dispatch", "combine"):
        assert simulate_op(unordered, op, seed).counters.get("ordering_violations", 0) == 0
    # the same chaos makes an unflushed flag overtake its data: the check can fail
    assert simulate_op(ordered, "dispatch", seed).counters.get("ordering_violations", 0) > 0


def test_cached_dispatch_skips_count_exchange_and_waits_are_forwarder_poll_waits():
    base = scenario.load(EP16, {"workload.tokens_per_rank": 64})
    cached = scenario.load(EP16, {"workload.tokens_per_rank": 64, "design.cached": True})
    assert simulate_op(base, "dispatch", 0).counters.get("messages_notify", 0) > 0
    assert simulate_op(cached, "dispatch", 0).counters.get("messages_notify", 0) == 0
    res = simulate(cached, seeds=1, with_critical_path=False).to_json()
    prof = res["attribution"]["dispatch"]["profiler"]
    assert prof.get("poll_wait", 0) > 0.2, prof
    cp = what_if_reruns(cached, "dispatch", res["ops"]["dispatch"]["p50_us"], 1, ("poll_wait",))
    assert cp["poll_wait"] > 0.5, cp


def _expected_tail_signals(scn, interval: int) -> int:
    rt = Routing.for_scenario(scn, 0)
    C = scn.design.num_sms * scn.design.warps_per_sm
    rpn = scn.workload.ranks_per_node
    n_nodes = scn.workload.ep_ranks // rpn
    total = 0
    for s in range(scn.workload.ep_ranks):
        for c in range(C):
            for m in range(n_nodes):
                if m == s // rpn:
                    continue
                k = sum(1 for t in range(c, scn.workload.tokens_per_rank, C) if m in rt.dst_nodes[s][t])
                total += k // interval + (1 if (k % interval or k == 0) else 0)
    return total


def test_fewer_tail_signals_by_the_expected_factor():
    counts = {}
    for interval in (3, 6, 16):
        scn = scenario.load(EP16, {"design.cached": True, "design.scaleout_update_interval": interval})
        got = simulate_op(scn, "dispatch", 0).counters["messages_signal"]
        assert got == _expected_tail_signals(scn, interval)
        counts[interval] = got
    assert counts[3] > counts[6] > counts[16]


def test_v1_cached_dispatch_sends_no_counts_and_counts_immediates():
    sets = {"workload.tokens_per_rank": 32, "design.protocol": "v1-ll"}
    base = simulate_op(scenario.load(EP16, sets), "dispatch", 0)
    cached = simulate_op(scenario.load(EP16, {**sets, "design.cached": True}), "dispatch", 0)
    assert base.counters["messages_signal"] > 0
    assert cached.counters.get("messages_signal", 0) == 0
    assert cached.counters["messages_data"] == base.counters["messages_data"]
    assert cached.counters.get("ordering_violations", 0) == 0
    # without the count round trip (and its flush) the cached dispatch is faster on every rank
    assert max(cached.latency_us) < min(base.latency_us)
    # combine is not cached: counts still flow
    comb = simulate_op(scenario.load(EP16, {**sets, "design.cached": True}), "combine", 0)
    assert comb.counters["messages_signal"] > 0


def test_v1_with_fewer_owned_qps_than_channels_issues_from_one_channel_per_qp():
    """hw/ep's V1 kernels with owned QPs fewer than their channels (``c_issue``): the first
    ndata channels post every write and count, one data QP each and alone on it (no lock
    turn), and every channel still receives. The same routing's writes and counts go out,
    dealt over 4 channels instead of 16. The counts all go on the notify QP (hw/ep
    ``post_signals``), which the 4 issuing channels share: there they take turns in slot order,
    as every ``post_group`` does, whatever the ownership of the data QPs."""
    from lever.sim.engine import Ledger, Trace
    from lever.sim.model import World
    from lever.sim.protocols import run_protocol

    sets = {"design.protocol": "v1-ll", "workload.tokens_per_rank": 32, "design.num_sms": 8,
            "design.warps_per_sm": 2, "design.qps_per_call": 5, "design.notify_qp_reserved": True}
    shared = scenario.load(EP16, sets)
    owned = scenario.load(EP16, {**sets, "design.qp_ownership": "owned"})
    posters: dict[str, set] = {}
    busy: dict[str, dict] = {}
    sent: dict[str, int] = {}
    locks: dict[str, int] = {}
    for name, scn in (("shared", shared), ("owned", owned)):
        w = World(scn, "dispatch", 0, Ledger(), Trace(), Routing.for_scenario(scn, 0))
        chans: set = set()
        orig = w.port

        def spy(rank, channel, orig=orig, chans=chans):
            chans.add(channel)
            return orig(rank, channel)

        w.port = spy
        w.env.run(w.env.all_of(run_protocol(w)))
        posters[name], busy[name] = chans, dict(w.ledger.busy)
        sent[name] = w.ledger.counters["messages_data"]
        if name == "owned":
            assert w.issue_channels == 4 and w.channels == 16
            assert {w.qp_of(0, c).owners for c in range(4)} == {1}
            assert w.qps[0][0].owners == 4
            assert all(w._ports[(0, c)].turn is None for c in range(4))  # owned: no turn
            assert all(w._ports[(0, c, "signal")].turn is not None for c in range(4))  # QP 0: turns
            locks[name] = w.ledger.events.get("lock", 0)
            counts = w.ledger.counters["messages_signal"]
    assert posters["shared"] == set(range(16)) and posters["owned"] == set(range(4))
    assert sent["owned"] == sent["shared"] > 0
    # every count post takes QP 0's turn (a slot atomic each), no data post does
    assert busy["shared"].get("lock", 0.0) > busy["owned"].get("lock", 0.0) > 0.0
    assert locks["owned"] == counts > 0
    # V2 issues from every channel: owned needs a data QP per channel there
    with pytest.raises(Exception, match="needs a data QP per channel"):
        simulate_op(scenario.load(EP16, {**sets, "design.protocol": "v2-direct",
                                         "design.qp_ownership": "owned"}), "dispatch", 0)


@pytest.mark.parametrize("mode", ["flush", "imm-counting"])
def test_v1_counts_wait_for_a_grid_sync_only_where_writes_are_flushed_before_them(mode):
    """hw/ep's V1 dispatch meets at a rank barrier before its counts when it flushes (every
    warp's writes completed first), and sends each warp's counts as soon as its own writes are
    posted when the receiver counts write-with-immediate completions (no flush, no barrier:
    ``dispatch_rank``). Without the sync a warp done early sends its counts while another
    still writes tokens."""
    from lever.sim.engine import Ledger, Trace
    from lever.sim.model import World
    from lever.sim.protocols import run_protocol

    scn = scenario.load(EP16, {"design.protocol": "v1-ll", "workload.tokens_per_rank": 32,
                               "design.signal_mode": mode})
    w = World(scn, "dispatch", 0, Ledger(), Trace(), Routing.for_scenario(scn, 0))
    made: dict[str, list[float]] = {"data": [], "signal": []}
    orig = w.message

    def spy(src, dst, nbytes, tag, kind="data", value=1, seq=0, **kw):
        if src == 0 and kind in made:
            made[kind].append(w.env.now)
        return orig(src, dst, nbytes, tag, kind=kind, value=value, seq=seq, **kw)

    w.message = spy
    w.env.run(w.env.all_of(run_protocol(w)))
    assert made["data"] and made["signal"]
    first_count, last_write = min(made["signal"]), max(made["data"])
    if mode == "flush":
        assert first_count > last_write
    else:
        assert first_count < last_write
