"""``lever hw ep --nic efa``: the EP kernels of ``lever hw ep`` over a real EFA device.

What runs: the same kernels (hw/ep/ep_kernels.cu, V1 low-latency dispatch and combine,
native or CPU-proxy path) and the same gate as on the emulated NIC, one rank per process
and per GPU under torchrun, with no NIC blocks: the rank's EFA device is the wire. The
NIC tables the kernels post through come from the device's own queue queries
(hw/efa/wire.py over hw/efa/host.cpp), the peer table from an address exchange over
torch.distributed (gloo: control only), and every op starts after a cross-node barrier
posted by the GPU on its own QP (hw/efa/efa_kernels.cu) in place of the emulator's
NVLink one.

Why a runner of its own (:class:`EfaRunner`, a :class:`lever.hw.ep.Runner`): the
emulated runner owns every rank's buffers in one process; here a process owns one rank,
so the gate, the statistics, the profile and the per-iteration latency are gathered over
the world, and the buffers peers write (and the sources of every WQE) live in one GPU
window registered once (dma-buf first), addressed by their virtual addresses.

A rank stripes its send QPs over its EFA devices (every device at its GPU's minimal
PCIe distance by default, ``--efa-devices N|all``, or ``--efa-device A,B``): one binding
``Device`` per EFA device (its own context, PD and MR of the same window, so its own
lkey/rkey and AHs), send QP ``q`` on device ``q % n``, receive slot ``i`` on device
``i % n``, one peer table per device (hw/efa/wire.py says how a slot's device is chosen).

Records: ``nic = "efa"``, ``what.platform`` with the instance type, the EFA kernel
driver, rdma-core and the devices used with their capabilities, ``sim`` naming the
instance's platform with the rank's device count as ``nics_per_gpu`` and every rank its
own node for the network (the kernels send every token over EFA but the rank's own).
Rank 0 writes them. Nothing here has run on an EFA device yet (hw/efa/README.md).
"""

from __future__ import annotations

import argparse
import json
import platform as _pf
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from lever.hw import ep as v1
from lever.hw.efa import device as efa_device
from lever.hw.efa import run as efa_run
from lever.hw.efa import wire
from lever.sim.errors import UserError

WINDOW_ALIGN = 1 << 21
"""The window starts and ends on a 2 MiB boundary (dma-buf export wants pages; GPU pages are 2 MiB)."""
BUF_ALIGN = 4096
BARRIER_ERR = {1: "barrier: a send completion did not come", 2: "barrier: a send completion with an error",
               3: "barrier: a peer's barrier write never landed", 8: "barrier: SQ overrun"}
NIC_ONLY_METRICS = ("packets", "retransmits", "reordered", "drops", "duplicates", "error_cqes",
                    "mirrored_wqes")
"""Counters only the emulated NIC blocks keep: absent from an EFA record, not zero."""
PLATFORMS = {"p5.48xlarge": "platforms/p5", "p5e.48xlarge": "platforms/p5",
             "p5en.48xlarge": "platforms/p5en", "p6-b200.48xlarge": "platforms/p6-b200"}
"""The model's platform for an instance type (an unknown one: the uncalibrated EFA platform)."""


def model_platform(instance: str) -> str:
    return PLATFORMS.get(instance, "platforms/efa-p5")


def window_plan(shape: Any, ranks: int) -> list[tuple[str, int, str]]:
    """(name, elements, dtype) of the buffers in the registered window, in order: every
    source of a WQE and every buffer a peer writes, plus the barrier words."""
    T, H, K, E, El = shape.tokens, shape.hidden, shape.top_k, shape.num_experts, shape.experts_per_rank
    del H
    R = ranks
    return [("send_buf", T * v1.DMSG, "uint8"), ("comb_send", El * R * T * v1.CMSG, "uint8"),
            ("sig_src", E + R, "int64"), ("recv_x", El * R * T * v1.DMSG, "uint8"),
            ("recv_cnt", El * R, "int64"), ("comb_recv", T * K * v1.CMSG, "uint8"),
            ("comb_flag", R, "int64"), ("bwords", R, "int64"), ("bsrc", 1, "int64")]


def window_offsets(plan: list[tuple[str, int, str]]) -> tuple[dict[str, int], int]:
    """Byte offset of each buffer (4 KiB aligned) and the window's length (2 MiB multiple)."""
    size = {"uint8": 1, "int32": 4, "int64": 8}
    off, pos = {}, 0
    for name, n, dt in plan:
        off[name] = pos
        pos += -(-n * size[dt] // BUF_ALIGN) * BUF_ALIGN
    return off, -(-pos // WINDOW_ALIGN) * WINDOW_ALIGN


class EfaRunner(v1.Runner):
    """One rank of the EP harness on its EFA device (see the module docstring)."""

    def __init__(self, torch, ext, efa_ext, dist, env: Mapping[str, int], device_names: list[str], shape,
                 ranks: int, scn, seed: int, num_sms: int, timeout_ms: float, path: str, proxy_threads: int,
                 emu, needs: Mapping[str, Any]) -> None:
        self.efa_ext, self.dist, self.env = efa_ext, dist, env
        self.me = int(env["rank"])
        self.device_names = list(device_names) or [""]
        self.needs = dict(needs)
        self.efas: list[Any] = []  # one binding Device per EFA device (rail), in rail order
        super().__init__(torch, ext, shape, ranks, 1, scn, seed, num_sms, timeout_ms, path, proxy_threads,
                         emu=emu, sq="host", cq="host", faults=False)

    def dev(self, r: int) -> int:
        return 0  # the process sees its own GPU only (run.mask_gpu)

    def window_plan(self) -> list[tuple[str, int, str]]:
        """The buffers of the registered window (:func:`window_plan`; V2 adds its own)."""
        return window_plan(self.shape, self.R)

    def window_memory(self, nbytes: int):
        """The window's zeroed uint8 GPU memory (a torch allocation; V2: an exportable one)."""
        return self.t.zeros(nbytes, dtype=self.t.uint8, device="cuda:0")

    # ------------------------------------------------------------- memory and wiring
    def _alloc(self) -> None:
        t, s, R, me = self.t, self.shape, self.R, self.me
        T, H, K, E, El = s.tokens, s.hidden, s.top_k, s.num_experts, s.experts_per_rank
        self.rpg, self.nics = 1, 0  # one rank on this GPU, no emulated NIC blocks
        dv = "cuda:0"
        u8, i32, i64 = t.uint8, t.int32, t.int64
        plan = self.window_plan()
        self.win_off, self.win_len = window_offsets(plan)
        raw = self.window_memory(self.win_len + WINDOW_ALIGN)
        base = (-raw.data_ptr()) % WINDOW_ALIGN
        self.window_raw = raw
        self.window = raw[base:base + self.win_len]
        dtypes = {"uint8": u8, "int32": i32, "int64": i64}
        b: dict[str, Any] = {}
        for name, n, dt in plan:
            o = self.win_off[name]
            nbytes = n * {"uint8": 1, "int32": 4, "int64": 8}[dt]
            b[name] = self.window[o:o + nbytes].view(dtypes[dt])

        def z(n: int, dt):
            return t.zeros(n, dtype=dt, device=dv)

        inp = self.inputs[me]
        b.update({
            "x_fp8": inp["x_fp8"].to(dv), "x_scales": inp["scales"].to(dv),
            "topk": inp["topk"].to(dv), "topk_w": inp["topk_w"].to(dv),
            "slot_tab": z(T * K, i32), "exp_count": z(E, i32), "out_src": z(El * R * T, i32),
            "out_count": z(El * R, i32), "comb_out": t.zeros(T, H, dtype=t.bfloat16, device=dv),
            "rx_head": z(self.n_rxcq, i32), "qps": z(v1.NQ_MAX * 128, u8),
            # the emulated NIC's state: make_world wants it, nothing touches it without NIC blocks
            "nicqp": z(v1.NQ_MAX * 128, u8), "nic_rem": z(4 * v1.NQ_MAX * self.depth, i32),
            "nic_ackt": z(v1.NQ_MAX * self.depth, i64),
            "loc_cnt": z(self.n_rxcq, i32), "hcount": z(El * R, i32), "bar": z(4, i32),
            "prof": z(self.prof_cap * 8, i64), "prof_n": z(1, i32),
        })
        cs = b["comb_send"].view(El, R, T, v1.CMSG)
        cs[..., 16:16 + 2 * H] = self.y[me].view(u8).reshape(El, R, T, 2 * H).to(dv)
        self.bufs = [b]
        self.gbufs = [{"err": z(8, i32), "stats": z(v1.ST_WORDS, i64), "ep_done": z(1, i32),
                       "wbar": z(1, i64)}]
        self.streams = [t.cuda.Stream()]
        self.hostq = []
        self.host = []
        if self.path == "proxy":
            self.host.append({"pring": self.ext.proxy_alloc(v1.NQ_MAX * self.ring_depth * 128, False),
                              "pstate": self.ext.proxy_alloc(v1.NQ_MAX * 16 * 8, False)})
        cap = self.ext.coop_max_blocks(0, 32 * max(self.warps, self.nic_warps), 0)  # launch_op's block
        if self.nb > cap:
            raise v1.EpError(f"{self.nb} EP blocks exceed the {cap} co-resident blocks: lower --num-sms")
        self.barrier_state = z(16, i32)  # efa_gpu::QpState (64 bytes)
        self.barrier_err = z(4, i32)
        t.cuda.synchronize()
        self._wire()

    def _wire(self) -> None:
        """Open every device over the window (each registers it: its own MR, lkey, rkey), the
        receive and barrier QPs, exchange addresses, make the peer tables; the send QPs come
        per variant (:meth:`rebuild`). A failure closes what was opened, last device first."""
        base = self.window.data_ptr()
        try:
            for name in self.device_names:
                try:
                    self.efas.append(self.efa_ext.Device(name, 1, base, self.win_len, True, 0))
                except RuntimeError as e:
                    raise v1.EpError(f"EFA device {name or '(first)'}: {_line(e)}") from None
            self._wire_queues()
        except BaseException:
            wire.close_devices(self.efas)  # before the window they registered goes
            self.efas = []
            raise

    def _wire_queues(self) -> None:
        t, b = self.t, self.bufs[0]
        self.rail_caps = [dict(d.caps()) for d in self.efas]
        self.caps = wire.rail_caps(self.rail_caps)
        self.device_names = [str(c.get("device_name") or n) for c, n in zip(self.rail_caps, self.device_names,
                                                                            strict=True)]
        max_sq = int(self.caps["max_sq_wr"])
        self.depth = min(self.depth, 1 << (max_sq.bit_length() - 1) if max_sq > 0 else self.depth)
        if self.R - 1 >= self.depth:
            raise v1.EpError(f"{self.R} ranks: the barrier posts {self.R - 1} writes, the SQ holds {self.depth}")
        self.plan = wire.plan_queues(num_qps=int(self.needs["num_qps"]), imm=bool(self.needs["imm"]),
                                     nrx=self.n_rxcq, sq_depth=self.depth, rx_depth=self.rx_depth,
                                     proxy=self.path == "proxy", caps=self.caps, devices=len(self.efas),
                                     inline_write=bool(self.needs.get("inline_write")),
                                     send_counters=bool(self.needs.get("send_counters")))
        try:
            self.q = wire.open_queues(self.efas, self.plan)
        except RuntimeError as e:
            raise v1.EpError(f"opening the receive/barrier QPs: {_line(e)}") from None
        s = self.shape
        fp = {"tokens": s.tokens, "hidden": s.hidden, "top_k": s.top_k, "experts": s.num_experts,
              "window_bytes": self.win_len, "offsets": sorted(self.win_off.items())}
        addr = wire.local_address(self.efas, self.plan, self.q, rank=self.me, world=self.R,
                                  buffers={k: b[k].data_ptr() for k in wire.PEER_BUFFERS},
                                  barrier_words=b["bwords"].data_ptr(), fingerprint=fp, host=_pf.node())
        self.addrs = wire.exchange(addr, self.dist.all_gather)
        try:
            self.ptables = wire.peer_tables(self.efas, self.plan, self.q, self.addrs, self.me)
        except RuntimeError as e:
            raise v1.EpError(f"peer table / receive layouts: {_line(e)}") from None
        dv = "cuda:0"
        self.barrier_lay = t.frombuffer(bytearray(self.ptables["barrier"]), dtype=t.uint8).to(dv)
        # the barrier QP is on device 0: its writes go through device 0's peer table
        self.barrier_peers = t.frombuffer(bytearray(self.ptables["peers"][0]), dtype=t.uint8).to(dv)
        self.bcfg = {"lay": self.barrier_lay.data_ptr(), "peers": self.barrier_peers.data_ptr(),
                     "st": self.barrier_state.data_ptr(), "words": b["bwords"].data_ptr(),
                     "src": b["bsrc"].data_ptr(), "err": self.barrier_err.data_ptr(),
                     "words_off": self.win_off["bwords"], "rank": self.me, "ranks": self.R,
                     "nrx": self.plan.nrx, "timeout_ns": 10 * self.timeout_ns}
        self.send_layout0: dict[str, int] = {}

    def rebuild(self, scn, seed: int) -> None:
        """Fresh send QPs for this variant (an empty SQ and CQ), then its world."""
        self.scn = scn
        self.sync()
        self.dist.barrier()
        try:
            wire.open_send(self.efas, self.plan, self.q)
            st = wire.send_tables(self.efas, self.plan, self.q)
        except RuntimeError as e:
            raise v1.EpError(f"send QPs: {_line(e)}") from None
        lay0 = efa_device.NicLayout.from_buffer_copy(st["send"][0][:wire.LAYOUT_BYTES])
        if lay0.sq_num_entries != self.depth:
            raise v1.EpError(f"the device gave {lay0.sq_num_entries}-entry SQs for {self.depth} asked")
        self.send_layout0 = {n: int(getattr(lay0, n)) for n, _ in efa_device.NicLayout._fields_}
        s, R = self.shape, self.R
        gb = self.gbufs[0]
        cfg = {"num_ranks": R, "ranks_per_gpu": 1, "num_gpus": 1, "T": s.tokens, "H": s.hidden,
               "K": s.top_k, "E": s.num_experts, "E_local": s.experts_per_rank, "sq_depth": self.depth,
               "rx_depth": self.rx_depth, "n_rxcq": self.n_rxcq, "ring_depth": self.ring_depth,
               "ep_blocks_per_rank": self.nb, "ep_warps": self.warps, "nic_warps": self.nic_warps,
               "nic_blocks": 0, "timeout_ns": self.timeout_ns, "prof_cap": self.prof_cap,
               "sq_host": 0, "cq_host": 0, "err": gb["err"].data_ptr(), "stats": gb["stats"].data_ptr(),
               "ep_done": gb["ep_done"].data_ptr(), "wbar": gb["wbar"].data_ptr()}
        m = {k: v.data_ptr() for k, v in self.bufs[0].items()}
        m["rank"] = self.me
        m.update(self.host[0] if self.host else {})
        # one peer table per device; send_table points each send slot at its QP's device's
        tables = {"recv": self.ptables["recv"], "peers": self.ptables["peers"], **st}
        fab = self.emu.fabric_dict(seed, False)  # read by NIC blocks only: none run
        try:
            self.handles = [self.ext.make_world(0, cfg, fab, [m], wire.world_peers(self.addrs),
                                                [gb["wbar"].data_ptr()], tables)]
        except RuntimeError as e:  # lever_ep_check_nic refused the device's tables
            raise v1.EpError(f"rank {self.me}: {_line(e)}") from None

    def reset_state(self) -> None:
        """Zero the issuer state of the fresh send QPs and the per-op words, on every rank at
        once (no write in flight). The receive CQs and their consumer indices stay: the
        device's producer counts do too."""
        self.sync()
        self.dist.barrier()
        b = self.bufs[0]
        for k in ("qps", "nicqp", "nic_rem", "nic_ackt", "loc_cnt", "recv_cnt", "comb_flag", "bar",
                  "prof_n", "hcount"):
            b[k].zero_()
        for h in self.host:
            self.ext.host_zero(h["pring"], v1.NQ_MAX * self.ring_depth * 128)
            self.ext.host_zero(h["pstate"], v1.NQ_MAX * 16 * 8)
        self.gbufs[0]["err"].zero_()
        self.gbufs[0]["stats"].zero_()
        self.sync()
        self.dist.barrier()

    def proxy_start(self, num_qps: int) -> int:
        self.ext.proxy_stop()
        h = self.host[0]
        self.ext.host_zero(h["pring"], v1.NQ_MAX * self.ring_depth * 128)
        self.ext.host_zero(h["pstate"], v1.NQ_MAX * 16 * 8)
        return self.ext.proxy_start([dict(h, rank=self.me)], num_qps, self.ring_depth, self.depth,
                                    self.proxy_threads)

    # ------------------------------------------------------------- running
    def run_op(self, op: int, flags: dict[str, int], events: list | None) -> None:
        self.seq += 1
        st = self.streams[0]
        rc = self.ext.launch_barrier(self.handles[0], self.seq, st.cuda_stream)  # per-op words reset
        if rc:
            raise v1.EpError(f"rank {self.me}: reset launch failed: {self.ext.err_string(rc)}")
        rc = self.efa_ext.barrier_launch(self.bcfg, self.seq, st.cuda_stream)  # every rank reset
        if rc:
            raise v1.EpError(f"rank {self.me}: EFA barrier launch failed: {self.efa_ext.err_string(rc)}")
        if events is not None:
            events[0][0].record(st)
        rc = self._launch(op, flags, st)
        if rc:
            raise v1.EpError(f"rank {self.me}: {self.op_kind} launch failed: "
                             f"{self.ext.err_string(rc) if rc > 0 else rc}")
        if events is not None:
            events[0][1].record(st)

    op_kind = "op"
    """What a failed launch names (V2's runner: "V2 op")."""

    def _launch(self, op: int, flags: dict[str, int], st) -> int:
        """Launch one op on ``st`` after the reset and the cross-node barrier: its return code."""
        return self.ext.launch_op(self.handles[0], op, self.epoch, flags, st.cuda_stream)

    def check_errors(self) -> None:
        """Every rank's first error (kernels, barrier, proxy), gathered: all ranks raise alike."""
        msg = self.local_error()
        bad = [(r, m) for r, m in enumerate(self.dist.all_gather(msg)) if m]
        if bad:
            more = f" (and {len(bad) - 1} more ranks)" if len(bad) > 1 else ""
            raise v1.EpError(f"rank {bad[0][0]}: {bad[0][1]}{more}")

    def local_error(self) -> str | None:
        """This rank's first error (the kernels', then the barrier's), or None."""
        try:
            super().check_errors()
            e = self.barrier_err.cpu().tolist()
            if e[0]:
                return (f"{BARRIER_ERR.get(e[0], f'barrier error {e[0]}')} (peer {e[1]}, seen {e[2]}, "
                        f"want/status {e[3]})")
        except v1.EpError as err:
            return str(err)
        return None

    def gate_check(self) -> list[str]:
        fails: list[str] = []
        for part in self.dist.all_gather(self.gate_rank(self.me, self.bufs[0])):
            fails += part
        return fails

    def stats(self) -> dict[str, int]:
        tot: dict[str, int] = {}
        for st in self.dist.all_gather(super().stats()):
            for k, v in st.items():
                tot[k] = tot.get(k, 0) + int(v)
        return tot

    def read_profile(self) -> list[dict]:
        rows: list[dict] = []
        for part in self.dist.all_gather(super().read_profile()):
            rows += part
        return rows

    def op_latencies_us(self, evs: list) -> dict[str, list[float]]:
        """Per iteration and op, the slowest rank's time (an op ends when every rank's has)."""
        parts = self.dist.all_gather(super().op_latencies_us(evs))
        return {op: [max(p[op][i] for p in parts) for i in range(len(parts[0][op]))]
                for op in ("dispatch", "combine")}

    def layout_note(self, proxy: bool) -> dict[str, int]:
        keys = ("qp_num", "sq_entry_size", "sq_num_entries", "sq_max_batch", "sq_buffer_mem",
                "sq_doorbell_mem", "sq_phase_first", "cq_entry_size", "cq_num_entries", "cq_buffer_mem",
                "cq_phase_first", "qkey", "lkey", "num_peers")
        return {k: self.send_layout0.get(k, 0) for k in keys}

    def close(self) -> int:
        """Proxy threads, then the rdma objects of every device (the last device first, each
        in reverse order, host.cpp), before the window."""
        rc = 0
        if self.path == "proxy":
            self.ext.proxy_stop()
        try:
            self.sync()
        finally:
            if self.efas:
                rc = wire.close_devices(self.efas)
                self.efas = []
        return rc


def _line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def _devices_note(names: list[str], plan: wire.QueuePlan) -> str:
    if len(names) == 1:
        return f"one EFA device per rank ({names[0]})"
    rx = "receive slot i on device i % n" if plan.rx_per_slot else "a receive QP per device for every slot"
    return (f"{len(names)} EFA devices per rank ({', '.join(names)}; send QP q on device q % {len(names)}, "
            f"{rx}, a peer table per device)")


def efa_record(rec: dict[str, Any], *, runner: EfaRunner, facts: Mapping[str, str],
               platform_info: Mapping[str, str], path: str) -> dict[str, Any]:
    """The emulated-shaped record ``run_variant`` built, made an EFA record: the NIC and its
    facts instead of the emulated fabric, the instance's platform for the model, the
    emulated NIC's own counters dropped, the notes and gate detail of this run."""
    from lever.calibration.records import parse_record

    caps = runner.caps
    rdma = getattr(runner, "rdma_core", None)
    names = list(runner.device_names)
    info = {"device": "+".join(names), "rdma_core": rdma, "caps": caps.get("caps", {}),
            "max_tx_batch": caps.get("max_tx_batch"), "max_rdma_size": caps.get("max_rdma_size"),
            "inline_buf_size": caps.get("inline_buf_size")}
    nic = efa_device.record_platform(info)["nic"]
    nic += f"; EFA driver {facts.get('efa_driver') or '?'}; device_caps {int(caps.get('device_caps', 0)):#x}"
    nic += f"; MR {caps.get('mr', '?')}"
    out = json.loads(json.dumps(rec))
    out["nic"] = "efa"
    w = out["what"]
    w.pop("emulated_fabric", None)
    w["design"] = f"v1-ll {path} (DeepEP-style LL) over EFA SRD"
    w["workload"]["nodes"] = max(1, runner.R // max(1, int(runner.env.get("local_world_size", 1))))
    w["platform"] = {**{k: str(v) for k, v in platform_info.items()}, "nic": nic,
                     "instance": facts.get("instance", "")}
    out["sim"]["scenario"] = model_platform(facts.get("instance", ""))
    out["sim"]["set"].update({"platform.nic.nics_per_gpu": len(names),
                              "platform.nic.hw_counters": bool(runner.plan.send_counters),
                              "design.name": "v1-ll-hw-efa"})
    out["metrics"] = {k: v for k, v in out["metrics"].items()
                      if not k.startswith(NIC_ONLY_METRICS) and not k.startswith("nic_")}
    p = runner.plan
    out["how"]["notes"] = (
        f"{runner.nb} EP blocks x {runner.warps} warps per rank, no NIC blocks: {_devices_note(names, p)}; "
        f"{p.send} {'proxy' if path == 'proxy' else 'native'} send QPs "
        f"(fresh per variant), {p.recv} receive QP(s) behind {p.nrx} receive slots, 1 barrier QP; SQ "
        f"{runner.depth} x {128 if runner.plan.inline_write else 64} B in the device BAR (LLQ)"
        f"{', inline writes (v63)' if runner.plan.inline_write else ''}, doorbell in the BAR, send CQ in host "
        f"memory mapped for the GPU"
        f"{'; send credit from a completion counter per send QP (host page mapped for the GPU)' if runner.plan.send_counters else ''}"
        f"; start: a GPU-posted write to every peer's barrier word (hw/efa/efa_kernels.cu); "
        f"proxy counters (if any) are rank {runner.me}'s; flags "
        + out["how"]["notes"].split("; flags ", 1)[-1])
    out["how"]["timer"] = ("CUDA events around each op launch on every rank after the cross-node GPU "
                           "barrier; per iteration the max over ranks")
    out["gate"]["detail"] = (f"{runner.R} ranks over EFA, one per GPU; gate iteration + warm-up + timed "
                             "iterations; every check on every rank")
    out["provenance"]["source"] = "lever hw ep --nic efa (hw/ep/ep_kernels.cu over EFA, hw/efa)"
    return parse_record(out, out["id"]).model_dump(mode="json", exclude_none=True)


def efa_provenance(allow_dirty: bool) -> dict[str, Any]:
    """As :func:`lever.hw.ep.run_provenance`, the kernel hash over the EFA sources too."""
    from lever.hw import provenance as pv

    return {**pv.require_revision(allow_dirty),
            "kernel_sha256": pv.sources_sha256([*v1.kernel_sources(), *efa_run.kernel_files()]),
            "build_flags": pv.build_flags(), "gpu_topology": pv.gpu_topology()}


def refuse_emulator_options(args: argparse.Namespace) -> None:
    """Options of the emulated NIC that mean nothing on a real one: one line each."""
    for flag, on in (("--faults", args.faults), ("--sq", args.sq), ("--cq", args.cq),
                     ("--emu-set", args.emu_set), ("--gpus", args.gpus)):
        if on:
            raise UserError(f"{flag}: an emulated-NIC option; on EFA the device's queues and fabric are what "
                            "they are (one GPU per process)")


def variant_needs(args, variants: list[str], extra: Mapping[str, Any], loss: float,
                  load: Callable[[list[str]], Any] | None = None) -> dict[str, Any]:
    """The most send QPs any variant uses and whether any counts receive completions
    (``load``: the variant's scenario from its levers; V1's by default). V2 hybrid counts
    them on the proxy path too (its writes carry immediates: hw/ep/v2_kernels.cuh v2_mode)."""
    protocol = getattr(args, "protocol", "v1-ll") or "v1-ll"
    nq, imm = 1, False
    for v in variants:
        levers = [x for x in v.split(",") if x]
        scn = load(levers) if load else v1.load_scenario(args.ranks, False, extra, levers, args.path, loss)
        for op in ("dispatch", "combine"):
            f = v1.kernel_flags(scn, op, args.path, 0, args.unsafe_ordered)
            nq = max(nq, f["num_qps"])
            imm = imm or bool(f["imm_counting"] or f["cached"])
        imm = imm or (protocol == "v2-hybrid" and args.path == "proxy")
    return {"num_qps": nq, "imm": imm}


def main_efa(args: argparse.Namespace) -> int:
    """``lever hw ep --nic efa``; one process per GPU under torchrun; rank 0 writes."""
    from lever.calibration.records import dump_record, parse_record
    from lever.hw.device import require_cuda

    what = f"lever hw ep --nic efa --path {args.path}"
    pre = efa_run.preflight(what)
    # the newer device generations asked for: the loaded rdma-core must have them (one line, exit 2,
    # before CUDA); the device's own capability is checked when the queues are planned
    gen = {"inline_write": bool(getattr(args, "efa_inline_write", False)),
           "send_counters": bool(getattr(args, "efa_counters", False))}
    if gen["send_counters"] and args.path != "native":
        raise UserError(f"{what} --efa-counters: the proxy path's host threads poll the CQ (native path only)")
    efa_device.require_features(inline_write=gen["inline_write"], counters=gen["send_counters"],
                                version=pre["libs"].get("rdma_core"))
    protocol = getattr(args, "protocol", "v1-ll") or "v1-ll"
    v2 = protocol != "v1-ll"
    refuse_emulator_options(args)
    env = pre["torchrun"]
    if args.ranks != env["world_size"]:
        raise UserError(f"--ranks {args.ranks}: the torchrun world has {env['world_size']} processes "
                        "(one rank per process and GPU)")
    if args.iters < 1 or args.warmup < 0:
        raise UserError("--iters must be >= 1 and --warmup >= 0")
    node = None
    if v2:  # the node shape is torchrun's; what the V2 kernels can not run is refused here
        from lever.hw import ep_ipc

        node = ep_ipc.node_shape(env)
        rpn = int(getattr(args, "ranks_per_node", 0) or 0)
        if rpn and rpn != node.P:
            raise UserError(f"--ranks-per-node {rpn}: on EFA the ranks per node are torchrun's "
                            f"LOCAL_WORLD_SIZE ({node.P})")
    variants, extra, emu, _placement, loss = v1.run_options(args)  # (sq, cq, rxcq): host, on EFA

    def scenario(levers: list[str]):
        if node is not None:
            from lever.hw import ep_v2

            return ep_v2.load_scenario(protocol, args.path, args.ranks, node.P, False, extra, levers, loss)
        return v1.load_scenario(args.ranks, False, extra, levers, args.path, loss)

    if node is not None:  # the rank's GPU is cuda:0, the node's others visible for CUDA IPC
        ep_ipc.node_visible_devices(env)
    else:
        efa_run.mask_gpu(env)
    torch = require_cuda()
    args.provenance = efa_provenance(args.allow_dirty)
    try:
        needs = {**variant_needs(args, variants, extra, 0.0, scenario), **gen}
    except v1.EpError as e:
        raise UserError(str(e)) from None
    facts = wire.host_facts()
    efa_ext = efa_run.load_efa_ext(pre["libs"])
    ext = v1.load_ext()
    device_names = wire.choose_devices(args.efa_device, getattr(args, "efa_devices", "all"),
                                       lambda: efa_run.gpu_bdf(torch), pre["devices"], env["local_rank"])
    dist = efa_run.Dist(torch, env, args.dist_timeout_s)
    runner: EfaRunner | None = None
    outcomes: list[dict[str, Any]] = []
    rc = 0
    try:
        base = scenario([])
        shape = v1.Shape(num_ranks=args.ranks, tokens=base.workload.tokens_per_rank,
                         top_k=base.workload.top_k, num_experts=base.workload.num_experts)
        shape.check()
        if node is not None:
            from lever.hw.efa.ep_v2_run import EfaV2Runner

            runner = EfaV2Runner(torch, ext, efa_ext, dist, env, device_names, shape, args.ranks, base, args.seed,
                                 args.num_sms, args.timeout_ms, args.path, args.proxy_threads, emu, needs, node,
                                 protocol)
        else:
            runner = EfaRunner(torch, ext, efa_ext, dist, env, device_names, shape, args.ranks, base, args.seed,
                               args.num_sms, args.timeout_ms, args.path, args.proxy_threads, emu, needs)
        runner.rdma_core = pre["libs"].get("rdma_core")
        info = v1._platform_info(torch)

        def tag_of(v: str) -> str:
            return "-".join(x for x in v.split(",") if x) or "baseline"

        def rid_of(tag: str) -> str:
            if node is not None:
                return f"efa-{protocol}-n{node.N}x{node.P}-{args.path}-{tag}"
            return f"efa-ep{args.ranks}-{args.path}-{tag}"

        for i, v in enumerate(variants):
            levers = [x for x in v.split(",") if x]
            tag = tag_of(v)
            rid = rid_of(tag)
            try:
                scn = scenario(levers)
                if node is not None:
                    from lever.hw import ep_v2
                    from lever.hw.efa.ep_v2_run import efa_v2_record, v2_sets

                    runner.run = ep_v2.run_flags(scn, protocol, args.path)
                for op in ("dispatch", "combine"):
                    wire.check_variant(runner.plan, v1.kernel_flags(scn, op, args.path, 0, args.unsafe_ordered),
                                       f"variant {tag}")
                runner.rebuild(scn, args.seed)
                runner.reset_state()
                if node is not None:  # the V2 design whole, on the instance's platform
                    sets = v2_sets(base, protocol, args.path, args.ranks, node.P, extra)
                else:
                    sets = v1.scenario_overrides(args.ranks, False, extra, args.path, loss)
                if args.path == "proxy":
                    sets["platform.proxy.threads"] = runner.proxy_threads
                # --num-sms as the model must be told; the send CQ is host memory; the rank's devices
                sets.update(v1.run_shape_overrides(args.num_sms, "host", len(runner.device_names), base))
                rec = v1.run_variant(runner, scn, args, levers, sets, rid, info, args.unsafe_ordered)
                rec = efa_record(rec, runner=runner, facts=facts, platform_info=info, path=args.path)
                if node is not None:
                    rec = efa_v2_record(rec, runner=runner, protocol=protocol, path=args.path)
            except (v1.EpError, wire.WireError) as e:
                print(f"lever: rank {env['rank']}: variant {tag}: {e}", file=sys.stderr)
                outcomes.append({"id": rid, "passed": False, "error": str(e)})
                outcomes += [{"id": rid_of(tag_of(w)), "passed": False,
                              "error": "not run: an earlier variant failed (its QPs' state is unknown)"}
                             for w in variants[i + 1:]]
                rc = 1
                break
            lat = rec["latency_us"]
            if env["rank"] == 0:
                out = Path(args.out_dir) / f"{rid}.json" if args.variants else Path(args.out)
                dump_record(parse_record(rec, rid), out)
                outcomes.append({"id": rid, "passed": True, "record": out.name,
                                 "dispatch_us": lat["dispatch"]["median"], "combine_us": lat["combine"]["median"]})
                print(f"{rid}: dispatch {lat['dispatch']['median']:.1f} us (p10 {lat['dispatch']['p10']:.1f}, "
                      f"p90 {lat['dispatch']['p90']:.1f}), combine {lat['combine']['median']:.1f} us -> {out}")
        if args.outcome and env["rank"] == 0:
            v1.write_outcome(Path(args.outcome), outcomes, args, emu, "device", "host", rc)
        return rc
    except v1.EpError as e:
        raise UserError(f"rank {env['rank']}: {e}") from None
    finally:
        if runner is not None:
            runner.close()
        dist.close()

