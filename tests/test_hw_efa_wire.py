"""The EFA path connected to the harness (issue 18), up to the device, without an EFA device.

Why these tests: nothing here has an EFA device, so what the wiring does before and
around the device is proven on fakes. A world of simulated ranks, each with a fake
device answering from the recorded v59 query shapes (tests/efa_fake.py), goes through
the same steps a torchrun world does: the queue plan, the receive/barrier QPs, the
address exchange (any all_gather), the peer table (one AH per peer GID), the layouts,
the per-variant send QPs; the tables come out in make_world's byte form and say what
each rank must reach. Records of an EFA run are built from an emulated-shaped one and
must validate and link the instance's platform. Every ``--nic efa`` entry stops with one
line naming what is missing (library, device, torchrun, rank count) and writes nothing.
The compiled side (binding, kernels, the tables through the kernels' entry) is in
tests/test_hw_efa.py and tests/test_hw_nic_layout.py.
"""

from __future__ import annotations

import argparse
import ctypes
import os
from pathlib import Path
from typing import Any

import pytest
from lever.hw.efa import device as efa_device
from lever.hw.efa import run as efa_run
from lever.hw.efa import wire
from lever.hw.efa.wire import QueuePlan, WireError
from lever.sim.errors import UserError

from tests.efa_fake import GPU_MAP_OFFSET, FakeDevice, gather_world, wire_world

CAPS = FakeDevice(0).caps()


def _plan(**kw: Any) -> QueuePlan:
    args = dict(num_qps=3, imm=False, nrx=4, sq_depth=1024, rx_depth=4096, proxy=False, caps=CAPS)
    args.update(kw)
    return wire.plan_queues(**args)


def _lay(blob: bytes, i: int = 0) -> efa_device.NicLayout:
    return efa_device.NicLayout.from_buffer_copy(blob[i * wire.LAYOUT_BYTES:(i + 1) * wire.LAYOUT_BYTES])


def _peer(blob: bytes, i: int) -> efa_device.NicPeer:
    return efa_device.NicPeer.from_buffer_copy(blob[i * wire.PEER_BYTES:(i + 1) * wire.PEER_BYTES])


def world(R: int = 3, ndev: int = 1, **plan_kw: Any):
    """R simulated ranks wired as a torchrun world would be, each over ``ndev`` EFA devices
    (one log per rank, shared by its devices): (devices [rank][rail], plan, queues, gathered
    addresses, tables)."""
    plan = _plan(devices=ndev, **plan_kw)
    devs = []
    for r in range(R):
        log: list[str] = []
        devs.append([FakeDevice(r, window=0x7F3000000000 + (r << 32), rail=e, log=log) for e in range(ndev)])
    qs, gathered, tables = wire_world(devs, plan)
    return devs, plan, qs, gathered, tables


# ============================================================ the queue plan
def test_plan_shares_one_receive_qp_unless_receive_completions_are_counted():
    assert _plan(imm=False).recv == 1 and _plan(imm=True).recv == 4
    assert _plan(num_qps=9, imm=True).qps() == 9 + 4 + 1


@pytest.mark.parametrize("kw, msg", [
    ({"num_qps": 33}, "the kernels take 1..32 send QPs"),
    ({"sq_depth": 8192}, "above the device's max_sq_wr 4096"),
    ({"rx_depth": 65536}, "above the device's max_cqe 32768"),
    ({"imm": True, "caps": {**CAPS, "caps": {**CAPS["caps"], "unsolicited_write_recv": False}}},
     "needs unsolicited write receive"),
    ({"caps": {**CAPS, "caps": {**CAPS["caps"], "rdma_write": False}}}, "lacks RDMA write"),
    ({"imm": True, "nrx": 250, "caps": {**CAPS, "max_qp": 128}}, "exceed the device's max_qp 128"),
])
def test_plan_refuses_what_the_device_can_not_do(kw, msg):
    with pytest.raises(WireError) as ei:
        _plan(**kw)
    assert msg in str(ei.value) and "\n" not in str(ei.value)


def test_a_variant_needing_more_than_was_opened_is_refused():
    plan = _plan(num_qps=3, imm=False)
    wire.check_variant(plan, {"num_qps": 3, "imm_counting": 0, "cached": 0}, "v")
    with pytest.raises(WireError, match="uses 4 send QPs, 3 were opened"):
        wire.check_variant(plan, {"num_qps": 4, "imm_counting": 0, "cached": 0}, "v")
    with pytest.raises(WireError, match="receive slots share one QP"):
        wire.check_variant(plan, {"num_qps": 1, "imm_counting": 1, "cached": 0}, "v")


# ============================================================ exchange and tables
def test_world_tables_name_every_peer_queue_and_the_local_rings():
    R, nrx = 3, 4
    devs, plan, qs, gathered, tables = world(R, imm=True)
    for r in range(R):
        t, d, q = tables[r], devs[r][0], qs[r]
        # one AH per peer GID (self included), shared by that rank's receive slots
        assert d.num_ahs() == R
        assert len(t["peers"]) == 1 and len(t["peers"][0]) == R * nrx * wire.PEER_BYTES
        for pr in range(R):
            for i in range(nrx):
                e = _peer(t["peers"][0], pr * nrx + i)
                assert e.remote_qpn == qs[pr].qpn[qs[pr].recv[i]]  # the peer's receive QP i
                assert e.rkey == devs[pr][0].local()["rkey"] and e.remote_addr == devs[pr][0].window
                assert e.ahn == d.ahs[devs[pr][0].gid] and e.remote_qkey == wire.QKEY
        # own receive slots: their CQ mapped for the GPU, their SQ not (never posted)
        for i in range(nrx):
            own = _lay(t["recv"], r * nrx + i)
            assert own.qp_num == q.qpn[q.recv[i]] and own.cq_buffer_dev == own.cq_buffer + GPU_MAP_OFFSET
            assert own.sq_buffer_dev == 0 and own.cq_entry_size == 32 and own.cq_num_entries == 4096
        # a remote rank's slot names its QP and nothing the GPU could poll
        rem = _lay(t["recv"], ((r + 1) % R) * nrx + 1)
        assert rem.qp_num == qs[(r + 1) % R].qpn[qs[(r + 1) % R].recv[1]]
        assert rem.cq_buffer == rem.cq_buffer_dev == rem.sq_buffer == 0 and rem.version == efa_device.LAYOUT_VERSION
        # send: plan.send real QPs, the other slots repeat slot 0; the GPU addresses are mapped
        slots = [_lay(t["send"][0], i) for i in range(wire.NQ_MAX)]
        assert [s.qp_num for s in slots[:3]] == [q.qpn[h] for h in q.send]
        assert len({s.qp_num for s in slots[:3]}) == 3 and all(s.qp_num == slots[0].qp_num for s in slots[3:])
        for s in slots[:3]:
            assert s.sq_buffer_dev == s.sq_buffer + GPU_MAP_OFFSET
            assert s.sq_doorbell_dev == s.sq_doorbell + GPU_MAP_OFFSET
            assert s.num_peers == R * nrx and s.lkey == d.local()["lkey"] and s.local_addr == d.window
        assert t["psend"] == [b""] and t["send_table"] == [[0] * wire.NQ_MAX]
        assert _lay(t["barrier"]).qp_num == q.qpn[q.barrier]
    peers = wire.world_peers(gathered[0])
    assert [p["recv_x"] for p in peers] == [d[0].window + 4096 for d in devs]
    assert all(p["rx_tail"] == 0 for p in peers)


def test_without_receive_counting_every_slot_is_one_qp():
    R, nrx = 2, 4
    devs, plan, qs, gathered, tables = world(R, imm=False)
    for r in range(R):
        qpns = {_peer(tables[r]["peers"][0], 1 * nrx + i).remote_qpn for i in range(nrx)}
        assert qpns == {qs[1].qpn[qs[1].recv[0]]}
        own = {_lay(tables[r]["recv"], r * nrx + i).qp_num for i in range(nrx)}
        assert own == {qs[r].qpn[qs[r].recv[0]]}


def test_proxy_path_posts_on_the_same_qps_it_names():
    devs, plan, qs, gathered, tables = world(2, proxy=True)
    t = tables[0]
    assert t["psend"] == t["send"] and len(t["send"][0]) == wire.NQ_MAX * wire.LAYOUT_BYTES
    opened = [ln for ln in devs[0][0].log if ln.startswith("create qp")]
    assert len(opened) == plan.send + plan.recv + 1  # no QP opened twice


def test_send_qps_are_replaced_per_variant_and_peers_keep_theirs():
    devs, plan, qs, gathered, tables = world(2)
    d, q = devs[0][0], qs[0]
    old, recv_before = list(q.send), [q.qpn[h] for h in q.recv]
    n = len(d.log)
    wire.open_send(devs[0], plan, q)
    tail = d.log[n:]
    assert tail[:3] == [f"destroy qp {d.qps[h.handle]['qpn']}" for h in reversed(old)]  # old first, newest first
    assert all(ln.startswith("create qp") for ln in tail[3:]) and len(tail) == 6
    assert [q.qpn[h] for h in q.recv] == recv_before
    st = wire.send_tables(devs[0], plan, q)
    assert [_lay(st["send"][0], i).qp_num for i in range(3)] == [q.qpn[h] for h in q.send]
    assert not set(q.send) & set(old)


def test_exchange_refuses_a_world_that_does_not_fit():
    R = 3
    devs = [FakeDevice(r) for r in range(R)]
    plan = _plan()
    addrs = []
    for r, d in enumerate(devs):
        q = wire.open_queues([d], plan)
        addrs.append(wire.local_address([d], plan, q, rank=r, world=R,
                                        buffers={k: 1 for k in wire.PEER_BUFFERS}, barrier_words=0,
                                        fingerprint={"tokens": 128}))

    def ex(mutate):
        got = [dict(a) for a in addrs]
        mutate(got)
        return wire.exchange(addrs[0], lambda mine: got)

    assert [a["rank"] for a in ex(lambda g: g.reverse())] == [0, 1, 2]
    cases = [
        (lambda g: g.pop(), "2 ranks answered, the world has 3"),
        (lambda g: g[2].update(rank=1), "ranks [0, 1, 1], want 0..2 once each"),
        (lambda g: g[1].update(plan={**g[1]["plan"], "tokens": 64}), "rank 1 runs another plan (tokens: 64"),
        (lambda g: g[2].update(rails=[{**g[2]["rails"][0], "gid": "00ff"}]), "rank 2 sent a GID that is not 16 bytes"),
        (lambda g: g[1].update(rx_qpns=[1]), "rank 1 sent 1 receive QPNs"),
    ]
    for mutate, msg in cases:
        with pytest.raises(WireError) as ei:
            ex(mutate)
        assert msg in str(ei.value) and "\n" not in str(ei.value), str(ei.value)
    with pytest.raises(WireError, match="peer-visible buffer recv_cnt not in the window"):
        wire.local_address([devs[0]], plan, wire.open_queues([devs[0]], plan), rank=0, world=R,
                           buffers={"recv_x": 1}, barrier_words=0, fingerprint={})


def test_teardown_after_the_wiring_is_reverse_order():
    devs, plan, qs, gathered, tables = world(2)
    d = devs[0][0]
    assert wire.close_devices(devs[0]) == 0
    made = [ln.split(" ", 1)[1] for ln in d.log if ln.startswith("create ")]
    gone = [ln.split(" ", 1)[1] for ln in d.log if ln.startswith("destroy ")]
    # the QPs and AHs still open go newest first, the device last; nothing stays
    live = [m for m in made if m not in gone[: len(gone)]]
    assert not live
    assert gone[-1] == "device 0"
    assert gone.index(f"qp {qs[0].qpn[qs[0].recv[0]]}") > gone.index(f"qp {qs[0].qpn[qs[0].barrier]}")


# ============================================================ a rank over several EFA devices
def _rail_of_qpn(devs_r: list[FakeDevice], qpn: int) -> int:
    """The device (rail) of a rank whose QP has this number."""
    (rail,) = [d.rail for d in devs_r for q in d.qps.values() if q["qpn"] == qpn]
    return rail


@pytest.mark.parametrize("imm", [False, True])
def test_send_qps_are_striped_over_the_devices_each_with_its_keys_and_its_peer_table(imm):
    """QP q on device q % 2: its layout's lkey is that device's MR's, its send_table entry
    names that device's peer table, whose AHs were made on that device (an AH belongs to a
    PD); every device has a table of its own."""
    R, nrx, ndev = 3, 4, 2
    devs, plan, qs, gathered, tables = world(R, ndev=ndev, imm=imm)
    assert plan.devices == 2 and plan.send == 3
    for r in range(R):
        t, q, d = tables[r], qs[r], devs[r]
        assert [h.rail for h in q.send] == [0, 1, 0]
        slots = [_lay(t["send"][0], i) for i in range(wire.NQ_MAX)]
        for i, s in enumerate(slots[:plan.send]):
            rail = i % ndev
            assert _rail_of_qpn(d, s.qp_num) == rail
            assert s.lkey == d[rail].local()["lkey"] and s.num_peers == R * nrx
            assert s.sq_buffer_dev == s.sq_buffer + GPU_MAP_OFFSET
        assert len({s.lkey for s in slots[:plan.send]}) == 2
        assert t["send_table"] == [[0, 1, 0] + [0] * (wire.NQ_MAX - 3)]  # unused slots repeat slot 0
        assert len(t["peers"]) == ndev and t["peers"][0] != t["peers"][1]
        for rail in range(ndev):
            assert len(t["peers"][rail]) == R * nrx * wire.PEER_BYTES
            own_ahs = set(d[rail].ahs.values())
            for pr in range(R):
                for i in range(nrx):
                    e = _peer(t["peers"][rail], pr * nrx + i)
                    # the peer's device this entry writes through: the same rail where it holds a
                    # QP for the slot (plain writes: always), else the slot's own rail i % 2
                    want = (i % ndev) if imm else rail
                    dst = devs[pr][want]
                    assert e.ahn in own_ahs and e.ahn == d[rail].ahs[dst.gid]
                    assert e.rkey == dst.local()["rkey"] and e.remote_addr == dst.window
                    assert _rail_of_qpn(devs[pr], e.remote_qpn) == want
        # the barrier QP is on rail 0 and posts through rail 0's table
        assert q.barrier.rail == 0 and _rail_of_qpn(d, _lay(t["barrier"]).qp_num) == 0


def test_receive_slots_are_dealt_over_the_devices():
    """With a receive QP per slot (write-imm counting) slot i's QP is on device i % 2 and its
    CQ is what the kernels poll; without, each device has one receive QP for every slot, so
    a sender's device d reaches the receiver's device d (rails match)."""
    R, nrx = 2, 4
    devs, plan, qs, gathered, tables = world(R, ndev=2, imm=True)
    assert plan.recv == nrx and [h.rail for h in qs[0].recv] == [0, 1, 0, 1]
    for r in range(R):
        for i in range(nrx):
            own = _lay(tables[r]["recv"], r * nrx + i)
            assert _rail_of_qpn(devs[r], own.qp_num) == i % 2 and own.cq_buffer_dev
            assert own.qp_num == gathered[r][r]["rx_qpns"][i]
    a = gathered[0][1]
    assert [rl["rx_qpns"][1] is None for rl in a["rails"]] == [True, False]
    assert a["devices"] == ["rdmap17s27", "rdmap17s28"] and a["device"] == "rdmap17s27"
    # AHs: a device that writes every slot makes one per peer device it reaches
    assert devs[0][0].num_ahs() == devs[0][1].num_ahs() == 2 * R
    devs, plan, qs, gathered, tables = world(R, ndev=2, imm=False)
    assert plan.recv == 2 and [h.rail for h in qs[0].recv] == [0, 1]
    assert devs[0][0].num_ahs() == devs[0][1].num_ahs() == R  # rail-matched: one peer device each
    opened = [ln for ln in devs[0][0].log if ln.startswith("create qp")]
    assert len(opened) == plan.qps() == 3 + 2 + 1


def test_the_plan_counts_queues_per_device():
    plan = _plan(num_qps=9, imm=True, nrx=4, devices=2)
    assert plan.qps_on(0) == (5, 2, 1) and plan.qps_on(1) == (4, 2, 0)
    with pytest.raises(WireError) as ei:
        _plan(num_qps=9, imm=True, nrx=250, devices=2, caps={**CAPS, "max_qp": 128})
    assert str(ei.value) == ("131 QPs on device 0 of 2 (5 send, 125 receive, 1 barrier) exceed the "
                             "device's max_qp 128")
    _plan(num_qps=9, imm=True, nrx=200, devices=2, caps={**CAPS, "max_qp": 128})  # 100 + 5 + 1 each
    with pytest.raises(WireError, match="receive slots share one QP"):
        wire.check_variant(_plan(nrx=1, devices=2), {"num_qps": 1, "imm_counting": 1, "cached": 0}, "v")
    wire.check_variant(_plan(nrx=1, devices=1), {"num_qps": 1, "imm_counting": 1, "cached": 0}, "v")
    with pytest.raises(WireError, match="2 EFA devices open, the plan stripes over 1"):
        wire.open_queues([FakeDevice(0), FakeDevice(0, rail=1)], _plan())


def test_devices_of_another_kind_or_count_are_refused_in_one_line():
    a, b = FakeDevice(0), FakeDevice(0, rail=1)
    assert wire.rail_caps([a.caps(), {**b.caps(), "max_qp": 64}])["max_qp"] == 64
    with pytest.raises(WireError) as ei:
        wire.rail_caps([a.caps(), {**b.caps(), "device_caps": 0x0F}])
    assert str(ei.value) == ("EFA devices rdmap16s27 and rdmap16s28 differ in device_caps (31, 15): a rank "
                             "stripes over devices of one kind")
    # a world where rank 1 drives one device and the others two
    R = 3
    plans = {n: _plan(devices=n) for n in (1, 2)}
    addrs = []
    for r in range(R):
        n = 1 if r == 1 else 2
        d = [FakeDevice(r, rail=e) for e in range(n)]
        q = wire.open_queues(d, plans[n])
        addrs.append(wire.local_address(d, plans[n], q, rank=r, world=R, buffers={k: 1 for k in wire.PEER_BUFFERS},
                                        barrier_words=0, fingerprint={}))
    with pytest.raises(WireError) as ei:
        wire.exchange(addrs[0], gather_world(addrs))
    assert str(ei.value) == ("address exchange: rank 1 drives 1 EFA device(s), rank 0 2: every rank must "
                             "stripe over as many (--efa-devices)")
    # a rank whose slot's own device names no QP for it
    bad = [dict(a) for a in addrs if a["rank"] != 1]
    bad.insert(1, {**addrs[0], "rank": 1, "rails": [addrs[0]["rails"][0], {**addrs[0]["rails"][1],
                                                                           "rx_qpns": [None] * 4}]})
    with pytest.raises(WireError, match="rank 1 has no QP for receive slot 1 on its device 1"):
        wire.exchange(addrs[0], lambda mine: bad)


def test_teardown_covers_every_device_in_reverse_order():
    """The last device opened goes first, each in the reverse of its build, the first device
    last; a device whose close raises does not keep the others open."""
    devs, plan, qs, gathered, tables = world(2, ndev=2, imm=True)
    log = devs[0][0].log
    n = len(log)
    assert wire.close_devices(devs[0]) == 0
    tail = log[n:]
    d1, d0 = tail.index("destroy device 0.1"), tail.index("destroy device 0")
    assert d0 == len(tail) - 1 and d1 < d0
    assert all(ln.startswith("destroy") for ln in tail)
    # every QP and AH of device 1 before any of device 0
    q1 = {f"destroy qp {q['qpn']}" for q in devs[0][1].qps.values()}
    q0 = {f"destroy qp {q['qpn']}" for q in devs[0][0].qps.values()}
    assert max(tail.index(x) for x in q1) < d1 < min(tail.index(x) for x in q0)
    made = [ln.split(" ", 1)[1] for ln in log if ln.startswith("create ")]
    gone = [ln.split(" ", 1)[1] for ln in log if ln.startswith("destroy ")]
    assert sorted(made) == sorted(gone)  # nothing stays on either device

    class Fails(FakeDevice):
        def close(self) -> int:
            super().close()
            raise RuntimeError("ibv_close_device failed")

    log2: list[str] = []
    pair = [FakeDevice(5, log=log2), Fails(5, rail=1, log=log2)]
    assert wire.close_devices(pair) == -1 and log2[-1] == "destroy device 5" and pair[0].closed


# ============================================================ which device, which host, torchrun
def _sysfs(tmp: Path) -> Path:
    """A sysfs with a GPU and EFA devices under two PCIe switches, and a non-EFA device."""
    root = tmp / "sys"
    pci = root / "devices" / "pci0000:00"
    sw = {"a": pci / "0000:00:01.0" / "0000:10:00.0", "b": pci / "0000:00:02.0" / "0000:20:00.0"}
    devs = {"gpu0": sw["a"] / "0000:11:00.0", "gpu1": sw["b"] / "0000:21:00.0",
            "rdmap17s0": sw["a"] / "0000:12:00.0", "rdmap18s0": sw["a"] / "0000:13:00.0",
            "rdmap33s0": sw["b"] / "0000:22:00.0", "mlx5_0": pci / "0000:00:03.0"}
    drivers = root / "bus" / "pci" / "drivers"
    for name, path in devs.items():
        path.mkdir(parents=True)
        drv = "efa" if name.startswith("rdmap") else ("nvidia" if name.startswith("gpu") else "mlx5_core")
        (drivers / drv).mkdir(parents=True, exist_ok=True)
        os.symlink(drivers / drv, path / "driver")
        if not name.startswith("gpu"):
            ib = root / "class" / "infiniband" / name
            ib.mkdir(parents=True)
            os.symlink(path, ib / "device")
    bus = root / "bus" / "pci" / "devices"
    bus.mkdir(parents=True)
    os.symlink(devs["gpu0"], bus / "0000:11:00.0")
    os.symlink(devs["gpu1"], bus / "0000:21:00.0")
    (root / "devices" / "virtual" / "dmi" / "id").mkdir(parents=True)
    (root / "devices" / "virtual" / "dmi" / "id" / "product_name").write_text("p5en.48xlarge\n")
    (root / "module" / "efa").mkdir(parents=True)
    (root / "module" / "efa" / "version").write_text("2.13.0g\n")
    return root


def test_efa_devices_and_the_nearest_one(tmp_path):
    root = _sysfs(tmp_path)
    devs = wire.efa_devices(root)
    assert sorted(devs) == ["rdmap17s0", "rdmap18s0", "rdmap33s0"]  # not mlx5_0
    assert wire.nearest_device("0000:11:00.0", devs, root) == "rdmap17s0"
    assert wire.nearest_device("0000:11:00.0", devs, root, local_rank=1) == "rdmap18s0"
    assert wire.nearest_device("0000:21:00.0", devs, root) == "rdmap33s0"
    with pytest.raises(WireError, match="no EFA device"):
        wire.nearest_device("0000:11:00.0", {}, root)
    # every device at the minimal distance (the same switch), or N of them, spread by local rank
    assert wire.nearest_devices("0000:11:00.0", devs, root) == ["rdmap17s0", "rdmap18s0"]
    assert wire.nearest_devices("0000:21:00.0", devs, root) == ["rdmap33s0"]
    assert wire.nearest_devices("0000:11:00.0", devs, root, local_rank=1, count=1) == ["rdmap18s0"]
    assert wire.nearest_devices("0000:11:00.0", devs, root, local_rank=1, count=2) == ["rdmap17s0", "rdmap18s0"]
    with pytest.raises(WireError) as ei:
        wire.nearest_devices("0000:11:00.0", devs, root, count=3)
    assert str(ei.value) == ("--efa-devices 3: the GPU 0000:11:00.0 has 2 EFA device(s) at its PCIe distance "
                             "(rdmap17s0, rdmap18s0)")
    # the options: names as given (each an EFA device here), else the count or all nearest
    bdf = lambda: "0000:11:00.0"  # noqa: E731
    assert wire.choose_devices("", "all", bdf, devs, 0, root) == ["rdmap17s0", "rdmap18s0"]
    assert wire.choose_devices("", "1", bdf, devs, 0, root) == ["rdmap17s0"]
    assert wire.choose_devices("rdmap33s0,rdmap17s0", "all", lambda: 1 / 0, devs, 0, root) == ["rdmap33s0",
                                                                                               "rdmap17s0"]
    with pytest.raises(WireError, match="--efa-device mlx5_0: not an EFA device here"):
        wire.choose_devices("mlx5_0", "all", bdf, devs, 0, root)
    with pytest.raises(UserError, match="--efa-devices two: a number of EFA devices per rank, or 'all'"):
        wire.parse_device_count("two")
    with pytest.raises(UserError, match="at least one"):
        wire.parse_device_count("0")
    assert wire.host_facts(root) == {"instance": "p5en.48xlarge", "efa_driver": "2.13.0g"}
    assert wire.host_facts(tmp_path / "nothing") == {"instance": "", "efa_driver": ""}


TORCHRUN = {"RANK": "1", "WORLD_SIZE": "16", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "8",
            "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}


def test_torchrun_env_and_its_one_line_errors():
    assert wire.torchrun_env(TORCHRUN) == {"rank": 1, "world_size": 16, "local_rank": 1, "local_world_size": 8}
    for k, msg in (("RANK", "RANK is not set"), ("MASTER_ADDR", "MASTER_ADDR is not set")):
        env = {x: v for x, v in TORCHRUN.items() if x != k}
        with pytest.raises(UserError, match=msg):
            wire.torchrun_env(env)
    with pytest.raises(UserError, match="RANK 16 outside WORLD_SIZE 16"):
        wire.torchrun_env({**TORCHRUN, "RANK": "16"})


def test_mask_gpu_keeps_the_local_ranks_gpu():
    e: dict[str, str] = {}
    assert efa_run.mask_gpu({"local_rank": 3}, e) == "3" and e["CUDA_VISIBLE_DEVICES"] == "3"
    e = {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}
    assert efa_run.mask_gpu({"local_rank": 2}, e) == "6" and e["CUDA_VISIBLE_DEVICES"] == "6"
    with pytest.raises(UserError, match="LOCAL_RANK 4 but CUDA_VISIBLE_DEVICES lists 4 GPUs"):
        efa_run.mask_gpu({"local_rank": 4}, {"CUDA_VISIBLE_DEVICES": "0,1,2,3"})


def _libs_ok() -> dict[str, Any]:
    return {"rdma_core": 59, "paths": {"libibverbs.so.1": "/opt/x/libibverbs.so.1.14.59.0",
                                       "libefa.so.1": None}}


def test_preflight_names_what_is_missing(tmp_path):
    root = _sysfs(tmp_path)
    pre = efa_run.preflight("lever hw ep", env=TORCHRUN, sys_root=root, check=_libs_ok)
    assert sorted(pre["devices"]) == ["rdmap17s0", "rdmap18s0", "rdmap33s0"] and pre["torchrun"]["rank"] == 1
    with pytest.raises(UserError) as ei:
        efa_run.preflight("lever hw ep", env={}, sys_root=root, check=_libs_ok)
    assert str(ei.value).startswith("lever hw ep: --nic efa runs one process per GPU under torchrun: RANK")
    bare = tmp_path / "bare"
    (bare / "class" / "infiniband" / "mlx5_0").mkdir(parents=True)
    with pytest.raises(UserError) as ei:
        efa_run.preflight("lever hw ep", env=TORCHRUN, sys_root=bare, check=_libs_ok)
    assert str(ei.value) == ("no EFA device: no device of the efa driver under /sys/class/infiniband "
                             "(found: mlx5_0)")

    def too_old():
        raise UserError("rdma-core 44 is too old for efadv_query_qp_wqs (needs 59)")

    with pytest.raises(UserError, match="^rdma-core 44 is too old"):
        efa_run.preflight("lever hw ep", env=TORCHRUN, sys_root=root, check=too_old)
    assert efa_run.link_flags(_libs_ok()) == ["/opt/x/libibverbs.so.1.14.59.0", "-Wl,-rpath,/opt/x",
                                              "-l:libefa.so.1"]


def test_loaded_library_path_from_the_maps():
    maps = "7f00-7f01 r-xp 0 08:01 1 /usr/lib/x86_64-linux-gnu/libefa.so.1.4.59.0\n"
    assert efa_device.loaded_path("libefa.so.1", maps) == "/usr/lib/x86_64-linux-gnu/libefa.so.1.4.59.0"
    assert efa_device.loaded_path("libibverbs.so.1", maps) is None


# ============================================================ the commands, before CUDA
def _ep_args(*argv: str) -> argparse.Namespace:
    from lever.hw import ep

    p = argparse.ArgumentParser()
    ep.add_args(p)
    return p.parse_args(["--nic", "efa", *argv])


@pytest.mark.parametrize("argv, msg", [
    (["--protocol", "v2-hybrid", "--ranks", "16", "--ranks-per-node", "4", "--out", "r.json"],
     "--ranks-per-node 4: on EFA the ranks per node are torchrun's LOCAL_WORLD_SIZE (8)"),
    (["--faults", "--out", "r.json"], "--faults: an emulated-NIC option"),
    (["--emu-set", "wire.paths=4", "--out", "r.json"], "--emu-set: an emulated-NIC option"),
    (["--ranks", "2", "--out", "r.json"], "--ranks 2: the torchrun world has 16 processes"),
    (["--ranks", "16"], "--out RECORD is required"),
    (["--ranks", "16", "--set", "platform.fabric.paths=4", "--out", "r.json"],
     "--set platform.fabric.paths: the emulated NIC does not read the model's platform"),
])
def test_ep_on_efa_refuses_before_cuda_with_one_line(monkeypatch, tmp_path, argv, msg):
    from lever.hw.efa import ep_run

    monkeypatch.setattr(efa_run, "preflight", lambda what: {"libs": _libs_ok(), "devices": {"rdmap17s0": "/x"},
                                                             "torchrun": wire.torchrun_env(TORCHRUN)})

    def no_cuda():
        raise AssertionError("CUDA reached")

    monkeypatch.setattr("lever.hw.device.require_cuda", no_cuda)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError) as ei:
        ep_run.main_efa(_ep_args(*argv))
    assert msg in str(ei.value) and "\n" not in str(ei.value)
    assert not list(tmp_path.iterdir())  # nothing written


def test_primitives_on_efa_need_two_ranks(monkeypatch, tmp_path):
    from lever.hw import primitives as prim

    monkeypatch.setattr(efa_run, "preflight", lambda what: {"libs": _libs_ok(), "devices": {"rdmap17s0": "/x"},
                                                             "torchrun": wire.torchrun_env(TORCHRUN)})
    p = argparse.ArgumentParser()
    prim.add_args(p)
    with pytest.raises(UserError, match="two ranks \\(one per node\\), the torchrun world has 16"):
        prim.main(p.parse_args(["--nic", "efa", "--out", str(tmp_path / "p.json")]))
    two = {**TORCHRUN, "WORLD_SIZE": "2"}
    monkeypatch.setattr(efa_run, "preflight", lambda what: {"libs": _libs_ok(), "devices": {"rdmap17s0": "/x"},
                                                             "torchrun": wire.torchrun_env(two)})
    with pytest.raises(UserError, match="--only: latency not an EFA family"):
        prim.main(p.parse_args(["--nic", "efa", "--only", "latency", "--out", str(tmp_path / "p.json")]))
    assert not list(tmp_path.iterdir())


def test_variant_needs_cover_every_lever_set():
    from lever.hw.efa import ep_run

    args = _ep_args("--ranks", "16", "--out", "r.json")
    assert ep_run.variant_needs(args, [""], {}, 0.0) == {"num_qps": 9, "imm": False}
    got = ep_run.variant_needs(args, ["", "write-imm-counting", "qp17-ownership"], {}, 0.0)
    assert got["imm"] is True and got["num_qps"] >= 9


# ============================================================ the window
def test_window_holds_every_source_and_peer_buffer_aligned():
    from lever.hw.efa import ep_run
    from lever.hw.reference import Shape

    shape = Shape(num_ranks=16, tokens=128, top_k=8, num_experts=256)
    plan = ep_run.window_plan(shape, 16)
    off, length = ep_run.window_offsets(plan)
    names = [n for n, _, _ in plan]
    assert set(wire.PEER_BUFFERS) <= set(names) and {"send_buf", "comb_send", "sig_src", "bwords"} <= set(names)
    assert length % ep_run.WINDOW_ALIGN == 0 and all(v % ep_run.BUF_ALIGN == 0 for v in off.values())
    ends = sorted((off[n], off[n] + k * (8 if dt == "int64" else 1)) for n, k, dt in plan)
    assert all(a[1] <= b[0] for a, b in zip(ends, ends[1:], strict=False)) and ends[-1][1] <= length


# ============================================================ records of an EFA run
class _FakeRunner:
    caps = {**CAPS, "device_name": "rdmap17s0"}
    device_names = ["rdmap17s0"]
    R, me, nb, warps, depth = 16, 0, 24, 4, 1024
    env = {"local_world_size": 8}
    plan = QueuePlan(send=9, recv=1, nrx=96, sq_depth=1024, rx_depth=4096)
    rdma_core = 59


class _FakeRunner2(_FakeRunner):
    device_names = ["rdmap17s0", "rdmap18s0"]
    plan = QueuePlan(send=9, recv=2, nrx=96, sq_depth=1024, rx_depth=4096, devices=2)


def _emulated_shaped(path: str = "native") -> dict[str, Any]:
    from lever.hw.ep import build_record, load_scenario, scenario_overrides

    scn = load_scenario(16, False, {}, [], path)
    return build_record(rid="efa-ep16-native-baseline", path=path, ranks=16, gpus=1, levers=[],
                        sets=scenario_overrides(16, False, {}, path), hidden=7168, scn=scn,
                        lat={"dispatch": [100.0 + i for i in range(60)], "combine": [200.0] * 60},
                        gate={"passed": True, "checks": ["x"], "detail": "packets 0"}, attribution=None,
                        samples=None, metrics={"packets_per_iteration_count": {"median": 0.0},
                                               "wqes_per_iteration_count": {"median": 99.0},
                                               "nic_late_per_packet_ns": {"median": 0.0}},
                        how={"repetitions": 60, "warmup": 10, "notes": "24 EP blocks; flags dispatch={} x"},
                        platform_info={"gpu": "NVIDIA H200"}, command="lever hw ep --nic efa")


def test_efa_record_carries_the_device_and_links_the_instance_platform():
    from lever.calibration.records import parse_record
    from lever.hw.efa.ep_run import efa_record

    rec = efa_record(_emulated_shaped(), runner=_FakeRunner(), path="native",
                     facts={"instance": "p5en.48xlarge", "efa_driver": "2.13.0g"},
                     platform_info={"gpu": "NVIDIA H200", "driver": "570.1", "cuda": "12.8", "torch": "2.7",
                                    "host": "ip-10"})
    r = parse_record(rec)
    assert r.nic == "efa" and r.what.emulated_fabric is None
    assert r.what.platform.instance == "p5en.48xlarge"
    nic = r.what.platform.nic
    assert nic.startswith("EFA rdmap17s0 (rdma-core 59;") and "EFA driver 2.13.0g" in nic
    assert "device_caps 0x1f" in nic and "max_tx_batch 16" in nic and "MR dma-buf" in nic
    assert r.what.workload.nodes == 2 and r.what.workload.ep_ranks == 16
    assert set(r.metrics) == {"wqes_per_iteration_count"}  # the emulated NIC's counters are gone
    assert "over EFA" in r.what.design and "flags dispatch={} x" in r.how.notes
    assert r.sim.scenario == "platforms/p5en"
    scn = r.sim.load()  # the model can simulate what ran
    assert scn.platform.nic.nics_per_gpu == 1 and scn.workload.ep_ranks == 16
    assert scn.workload.gpus_per_node == 1 and scn.design.signal_mode == "flush"


def test_efa_record_lists_the_devices_a_rank_striped_over():
    from lever.calibration.records import parse_record
    from lever.hw.efa.ep_run import efa_record

    rec = efa_record(_emulated_shaped(), runner=_FakeRunner2(), path="native",
                     facts={"instance": "p5en.48xlarge", "efa_driver": "2.13.0g"},
                     platform_info={"gpu": "NVIDIA H200"})
    r = parse_record(rec)
    assert r.what.platform.nic.startswith("EFA rdmap17s0+rdmap18s0 (rdma-core 59;")
    assert ("2 EFA devices per rank (rdmap17s0, rdmap18s0; send QP q on device q % 2, a receive QP per "
            "device for every slot, a peer table per device)") in r.how.notes
    assert r.sim.set["platform.nic.nics_per_gpu"] == 2
    assert r.sim.load().platform.nic.nics_per_gpu == 2  # what p5en has: the model stripes QPs alike


def test_efa_record_on_an_unknown_instance_uses_the_uncalibrated_efa_platform():
    from lever.calibration.records import parse_record
    from lever.hw.efa.ep_run import efa_record

    rec = efa_record(_emulated_shaped("proxy"), runner=_FakeRunner(), path="proxy", facts={},
                     platform_info={"gpu": "H100"})
    r = parse_record(rec)
    assert r.sim.scenario == "platforms/efa-p5" and r.what.path == "proxy"
    r.sim.load()


def test_efa_primitives_record_and_its_metrics():
    from lever.hw.efa import prims
    from lever.hw.primitives import Check

    out = list(range(1, 4 * 20 + 1))
    m = prims.metrics_of("post", out, 20)
    assert m["efa_wqe_store_ns"][:2] == [1.0, 5.0] and m["efa_post_total_ns"][0] == 4.0
    assert prims.metrics_of("msg_rate", [250_000] * 20, 20)["efa_msg_rate_mops"][0] == pytest.approx(4.0)
    assert list(prims.metrics_of("write_rtt", out, 20)) == ["efa_write_half_rtt_ns"]
    assert prims.error_text([3, 7, 1, 2]) == "the peer's write never landed (at 7, seen 1, want/status 2)"
    samples = {**m, "efa_write_half_rtt_ns": [2500.0 + i for i in range(20)]}
    checks = [Check("post", True, "ok"), Check("imm_rtt", False, "rank 1: no receive completion")]
    rec = prims.efa_primitives_record(samples, checks, reps=20, platform={"gpu": "H200"},
                                      provenance={"source": "x", "date": "2026-11-01T00:00:00"},
                                      caps=_FakeRunner.caps, facts={"instance": "p5en.48xlarge"}, rdma_core=59)
    assert rec.nic == "efa" and rec.id == "efa-primitives-p5en.48xlarge-2026-11-01"
    assert rec.what.platform.instance == "p5en.48xlarge" and not rec.gate.passed
    assert "FAIL imm_rtt: rank 1: no receive completion" in rec.gate.checks


def test_layout_mirror_sizes():
    assert ctypes.sizeof(efa_device.NicLayout) == wire.LAYOUT_BYTES
    assert ctypes.sizeof(efa_device.NicPeer) == wire.PEER_BYTES


# ============================================================ the runner's world-wide steps
class _Dist:
    """A world of two: this rank's object, then the other rank's canned answer."""

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)
        self.calls: list[Any] = []

    def all_gather(self, obj: Any) -> list[Any]:
        self.calls.append(obj)
        return [obj, self.answers.pop(0)]

    def barrier(self) -> None:
        self.calls.append("barrier")


def _runner(dist: _Dist):
    import torch
    from lever.hw.efa.ep_run import EfaRunner

    r = object.__new__(EfaRunner)  # the world-wide steps only: no GPU, no device
    r.t, r.dist, r.me, r.R, r.G, r.path = torch, dist, 0, 2, 1, "native"
    r.gbufs = [{"err": torch.zeros(8, dtype=torch.int32), "stats": torch.zeros(24, dtype=torch.int64)}]
    r.barrier_err = torch.zeros(4, dtype=torch.int32)
    return r


class _Ev:
    def __init__(self, ms: float) -> None:
        self.ms = ms

    def elapsed_time(self, other: _Ev) -> float:
        return other.ms - self.ms


def test_runner_latency_is_the_slowest_ranks_and_stats_sum_over_ranks():
    pytest.importorskip("torch")
    other = {"dispatch": [0.5, 9.0], "combine": [2.0, 0.1]}
    r = _runner(_Dist(other))
    evs = [((( _Ev(0.0), _Ev(0.001)),), ((_Ev(0.0), _Ev(0.003)),)),
           (((_Ev(0.0), _Ev(0.002)),), ((_Ev(0.0), _Ev(0.004)),))]
    lat = r.op_latencies_us(evs)
    assert lat == {"dispatch": [pytest.approx(1.0), 9.0], "combine": [pytest.approx(3.0), pytest.approx(4.0)]}
    r = _runner(_Dist({"wqes": 5, "stamp_bad_dispatch": 1}))
    r.gbufs[0]["stats"][4] = 7  # wqes
    st = r.stats()
    assert st["wqes"] == 12 and st["stamp_bad_dispatch"] == 1


def test_runner_errors_and_gate_failures_of_any_rank_stop_every_rank():
    pytest.importorskip("torch")
    from lever.hw.ep import EpError

    r = _runner(_Dist(None))
    r.check_errors()  # nobody failed
    r = _runner(_Dist("GPU 0: rank barrier timed out: rank 1"))
    with pytest.raises(EpError, match="^rank 1: GPU 0: rank barrier timed out"):
        r.check_errors()
    r = _runner(_Dist(None))
    r.barrier_err[0], r.barrier_err[1] = 3, 1
    with pytest.raises(EpError, match="^rank 0: barrier: a peer's barrier write never landed \\(peer 1"):
        r.check_errors()
    r = _runner(_Dist(["rank 1: combine output differs in 3 elements"]))
    r.gate_rank = lambda rank, b: []
    r.bufs = [{}]
    assert r.gate_check() == ["rank 1: combine output differs in 3 elements"]


def test_runner_opens_one_device_per_rail_and_closes_all_on_every_exit():
    """EfaRunner._wire: one binding Device per EFA device over the same window; a device that
    fails to open, or wiring that fails after, closes those opened (the last first); close()
    closes every device after the proxy threads."""
    from lever.hw.efa.ep_run import EfaRunner
    from lever.hw.ep import EpError

    log: list[str] = []
    opened: list[tuple[str, int, int]] = []

    class EfaExt:
        def __init__(self, fail: str = "") -> None:
            self.fail = fail

        def Device(self, name, port, window, length, dmabuf, gpu):  # noqa: N802 (the binding's name)
            if name == self.fail:
                raise RuntimeError("ibv_open_device failed:\n  no such device")
            opened.append((name, window, length))
            return FakeDevice(0, window=window, rail=len(opened) - 1, log=log)

    class Win:
        def data_ptr(self) -> int:
            return 0x7F3000000000

    def runner(fail: str = "") -> EfaRunner:
        r = object.__new__(EfaRunner)
        r.efa_ext, r.window, r.win_len = EfaExt(fail), Win(), 1 << 21
        r.device_names, r.efas, r.path = ["rdmap17s0", "rdmap18s0"], [], "native"
        r.sync = lambda: None
        return r

    r = runner(fail="rdmap18s0")
    with pytest.raises(EpError, match="^EFA device rdmap18s0: ibv_open_device failed: no such device$"):
        r._wire()
    assert log == ["create device 0", "destroy device 0"] and r.efas == []
    log.clear()
    opened.clear()
    r = runner()

    def broken() -> None:
        raise WireError("address exchange: rank 1 drives 1 EFA device(s), rank 0 2")

    r._wire_queues = broken
    with pytest.raises(WireError):
        r._wire()
    assert [o[0] for o in opened] == ["rdmap17s0", "rdmap18s0"] and {o[1:] for o in opened} == {(0x7F3000000000, 1 << 21)}
    assert log == ["create device 0", "create device 0.1", "destroy device 0.1", "destroy device 0"]
    log.clear()
    opened.clear()
    r = runner()
    r._wire_queues = lambda: None
    r._wire()
    assert len(r.efas) == 2
    assert r.close() == 0 and log[-2:] == ["destroy device 0.1", "destroy device 0"] and r.efas == []


def test_every_op_starts_after_the_local_reset_and_the_cross_node_barrier():
    """The order that makes a start barrier across nodes: the rank's per-op words reset,
    then the GPU-posted barrier every rank must pass, then the op (events around the op)."""
    calls: list[tuple] = []

    class Ext:
        def launch_barrier(self, h, seq, stream):
            calls.append(("reset", seq))
            return 0

        def launch_op(self, h, op, epoch, flags, stream):
            calls.append(("op", op))
            return 0

    class EfaExt:
        def barrier_launch(self, cfg, seq, stream):
            calls.append(("efa-barrier", seq, cfg["rank"]))
            return 0

    class Ev:
        def __init__(self, name):
            self.name = name

        def record(self, st):
            calls.append(("event", self.name))

    from lever.hw.efa.ep_run import EfaRunner

    r = object.__new__(EfaRunner)
    r.ext, r.efa_ext, r.seq, r.epoch, r.me = Ext(), EfaExt(), 4, 1, 0
    r.handles, r.bcfg = [7], {"rank": 0}
    r.streams = [type("S", (), {"cuda_stream": 0})()]
    r.run_op(1, {}, [[Ev("start"), Ev("end")]])
    assert calls == [("reset", 5), ("efa-barrier", 5, 0), ("event", "start"), ("op", 1), ("event", "end")]
