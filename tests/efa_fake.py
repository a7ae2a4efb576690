"""A fake of the ``lever_hw_efa`` binding's ``Device`` for the wiring tests (no EFA here).

Why: the wiring (hw/efa/wire.py, hw/efa/ep_run.py) talks to one rank's EFA device only
through the binding's ``Device`` methods. This fake answers them the way host.cpp does
on a real device, from the recorded v59 query shapes (tests/data/efa/query_v59.json):
QPs get increasing numbers, every queue's layout comes from ``layout_from_query`` on the
recorded ``query_wqs``/``query_cq`` answer (each QP's rings at its own addresses, mapped
for the GPU at a fixed offset), AHs are made once per peer GID, and every object is
logged when made and destroyed so the tests can check the order. A rank may have several
(``rail`` 0, 1, ...: the EFA devices next to its GPU): each has its own name, GID, lkey and
rkey, QP numbers and AH numbers, as two devices' contexts and PDs do.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lever.hw.efa import device as efa_device
from lever.hw.efa import rdma_core, wire

DATA = Path(__file__).resolve().parent / "data" / "efa"
GPU_MAP_OFFSET = 1 << 44
"""Where the fake 'cudaHostRegister' puts a host range for the GPU: host VA + this."""


def recorded() -> dict[str, Any]:
    return json.loads((DATA / "query_v59.json").read_text())


def _num(v: Any) -> int:
    return int(v, 0) if isinstance(v, str) else int(v)


class FakeDevice:
    """One rank's EFA device, as the binding's ``Device`` behaves (see module docstring)."""

    def __init__(self, rank: int, window: int = 0x7F3000000000, length: int = 1 << 30,
                 log: list[str] | None = None, max_qp: int = 256, caps_bits: int | None = None,
                 rail: int = 0, lib_features: dict[str, bool] | None = None) -> None:
        self.rec = recorded()
        self.rank, self.rail = rank, rail
        self.tag = str(rank) if rail == 0 else f"{rank}.{rail}"
        self.window, self.length = window, length
        self.log = log if log is not None else []
        self.gid = bytes([0xFE, 0x80] + [0] * 12 + [0x10 + rank, 0x01 + rail])
        dev = self.rec["efa_device_attr"]
        bits = dev["device_caps"] if caps_bits is None else caps_bits
        self._caps = {"device_name": f"rdmap{16 + rank}s{27 + rail}", "max_sq_wr": dev["max_sq_wr"],
                      "max_rq_wr": dev["max_rq_wr"], "inline_buf_size": dev["inline_buf_size"],
                      "device_caps": bits, "max_rdma_size": dev["max_rdma_size"], "max_qp": max_qp,
                      "max_cq": max_qp, "max_cqe": 32768, "max_tx_batch": 16, "mr": "dma-buf",
                      "caps": {n: bool(bits & b) for n, b in efa_device.CAP_BITS.items()},
                      # the library's generation: v59 (the recording's) unless a test says newer
                      "lib_features": dict({n: False for n in efa_device.FEATURES}, **(lib_features or {}))}
        self.qps: dict[int, dict[str, Any]] = {}
        self.next_qpn = self.rec["qp_num"] + 100 * rank + 1000 * rail
        self.ah_base = 3 + 100 * rail  # AH numbers are per device: make two devices' differ
        self.ahs: dict[bytes, int] = {}
        self.table: list[dict[str, int]] = []
        self.closed = False
        self.log.append(f"create device {self.tag}")

    def caps(self) -> dict[str, Any]:
        return dict(self._caps)

    def local(self) -> dict[str, Any]:
        return {"lkey": 0x00A100 + self.rank + 0x10000 * self.rail, "rkey": 0xC0FFEE00 + self.rank + 0x100 * self.rail,
                "addr": self.window,
                "gid": self.gid}

    def open_qp(self, sq_depth: int, rq_depth: int, cq_depth: int, qkey: int, unsolicited: bool,
                inline_write: bool = False, send_cntr: bool = False) -> int:
        assert not self.closed
        h = len(self.qps)
        qpn = self.next_qpn
        self.next_qpn += 1
        pow2 = 1 << (max(2, cq_depth) - 1).bit_length()
        self.qps[h] = {"qpn": qpn, "sq_depth": sq_depth, "cq_depth": pow2, "qkey": qkey,
                       "unsolicited": unsolicited, "open": True, "inline_write": inline_write,
                       "send_cntr": send_cntr}
        self.log.append(f"create qp {qpn}")
        return h

    def qp_num(self, h: int) -> int:
        return self.qps[h]["qpn"]

    def close_qp(self, h: int) -> int:
        q = self.qps[h]
        assert q["open"], "closed twice"
        q["open"] = False
        self.log.append(f"destroy qp {q['qpn']}")
        return 0

    def add_peer(self, gid: bytes, qpn: int, qkey: int, rkey: int, addr: int) -> int:
        gid = bytes(gid)
        if gid not in self.ahs:
            self.ahs[gid] = self.ah_base + len(self.ahs)
            self.log.append(f"create ah {self.ahs[gid]}")
        self.table.append({"ahn": self.ahs[gid], "remote_qpn": qpn, "remote_qkey": qkey, "rkey": rkey,
                           "remote_addr": addr})
        return len(self.table) - 1

    def num_ahs(self) -> int:
        return len(self.ahs)

    def peers(self) -> bytes:
        return efa_device.pack_peers(self.table)

    def fill_layout(self, h: int, flags: int) -> bytes:
        q = self.qps[h]
        assert q["open"], "layout of a closed QP"
        sq = dict(self.rec["wqs"]["sq"], num_entries=q["sq_depth"])
        cq = dict(self.rec["cq"], num_entries=q["cq_depth"])
        at = h * (1 << 20) + self.rail * (1 << 32)  # each QP's rings at their own addresses (and device's)
        sq["buffer_addr"] = _num(sq["buffer_addr"]) + at
        sq["doorbell_addr"] = _num(sq["doorbell_addr"]) + at
        cq["buffer_addr"] = _num(cq["buffer_addr"]) + at
        dev = self.rec["efa_device_attr"]
        no_sq = bool(flags & 1)
        newer: dict[str, Any] = {}
        if q["inline_write"]:  # v63: the inline-write flag makes the WQEs 128 bytes
            sq["entry_size"] = 128
            sq["max_batch"] = max(1, _num(sq["max_batch"]) // 2)
            newer["inline_write_size"] = efa_device.inline_write_size(dev["inline_buf_size"],
                                                                      dev.get("inline_buf_size_ex", 0))
        if q["send_cntr"]:  # after v64: a counter page per QP, mapped for the GPU
            page = 0x7F6000000000 + h * 4096 + self.rail * (1 << 32)
            newer.update(cntr_mem="host", send_cntr=page, send_cntr_dev=page + GPU_MAP_OFFSET,
                         send_err_cntr_dev=page + 8 + GPU_MAP_OFFSET)
        lay = efa_device.layout_from_query(
            {"sq": sq, "rq": self.rec["wqs"]["rq"]}, cq, qp_num=q["qpn"], qkey=q["qkey"],
            lkey=self.local()["lkey"], local_addr=self.window, inline_buf_size=dev["inline_buf_size"],
            max_rdma_size=dev["max_rdma_size"], device_caps=self._caps["device_caps"],
            sq_buffer_dev=0 if no_sq else sq["buffer_addr"] + GPU_MAP_OFFSET,
            sq_doorbell_dev=0 if no_sq else sq["doorbell_addr"] + GPU_MAP_OFFSET,
            cq_buffer_dev=cq["buffer_addr"] + GPU_MAP_OFFSET, num_peers=len(self.table), peers_mem="gpu",
            **newer)
        return efa_device.pack_layout(lay)

    def close(self) -> int:
        for h in sorted(self.qps, reverse=True):
            if self.qps[h]["open"]:
                self.close_qp(h)
        for gid in reversed(list(self.ahs)):
            self.log.append(f"destroy ah {self.ahs[gid]}")
        self.closed = True
        self.log.append(f"destroy device {self.tag}")
        return 0


def gather_world(addrs: list[dict[str, Any]]):
    """An ``all_gather`` over simulated ranks that already published ``addrs`` (any order)."""
    def all_gather(mine: dict[str, Any]) -> list[dict[str, Any]]:
        assert mine in addrs
        return [dict(a) for a in addrs]

    return all_gather


def wire_world(devs: list[list[Any]], plan: Any) -> tuple[list, list, list]:
    """The fake ranks ``devs`` ([rank][rail]) wired as a torchrun world would be: each opens
    its queues, publishes its address (its window's buffers a page apart), takes everyone's
    through the exchange, opens its send side and builds its tables: (queues, gathered
    addresses, tables), per rank."""
    R = len(devs)
    qs = [wire.open_queues(d, plan) for d in devs]
    addrs = []
    for r, (d, q) in enumerate(zip(devs, qs, strict=True)):
        win = d[0].window
        bufs = {k: win + 4096 * (i + 1) for i, k in enumerate(wire.PEER_BUFFERS)}
        addrs.append(wire.local_address(d, plan, q, rank=r, world=R, buffers=bufs, barrier_words=win,
                                        fingerprint={"tokens": 128}, host=f"node{r}"))
    gathered = [wire.exchange(a, gather_world(list(reversed(addrs)))) for a in addrs]
    tables = []
    for r, (d, q) in enumerate(zip(devs, qs, strict=True)):
        wire.open_send(d, plan, q)
        tables.append(wire.build_tables(d, plan, q, gathered[r], r))
    return qs, gathered, tables


def v59_headers() -> rdma_core.Headers:
    """rdma-core v59 headers, fetched once into the cache; the test is skipped only where PyPI
    can not be reached (for the fixtures of the tests that compile against them)."""
    import pytest

    try:
        return rdma_core.ensure_headers()
    except rdma_core.FetchError as e:
        if e.unreachable:
            pytest.skip(f"PyPI unreachable, so no rdma-core v59 headers: {e}")
        raise
