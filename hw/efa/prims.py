"""``lever hw primitives --nic efa``: GPU-posted primitives on a real EFA device, two ranks.

What runs (hw/efa/efa_kernels.cu, one GPU thread per rank posting on its own SRD QP,
WQEs built by hw/efa/wqe.h from the queried layout): rank 0 initiates, rank 1 answers;
one process per node under torchrun (``--nnodes 2 --nproc-per-node 1``), so every write
crosses the fabric.

| family | metric | what |
|---|---|---|
| write_rtt | efa_write_half_rtt_ns | 8 B RDMA write ping-pong, landing seen by polling the word; half the round trip |
| imm_rtt | efa_write_imm_half_rtt_ns | the same with write-with-immediate, landing seen as a receive CQE (unsolicited write receive) |
| completion | efa_send_completion_ns | post + doorbell until the send CQE is seen (host CQ through its GPU mapping) |
| cq_poll | efa_cq_poll_read_ns | one dependent read of a CQ entry through the GPU mapping of the host CQ |
| post | efa_wqe_store_ns, efa_wqe_fence_ns, efa_doorbell_ns, efa_post_total_ns | eight 8 B stores into the LLQ slot, the system fence, the doorbell store with a fence |
| msg_rate | efa_msg_rate_mops | back-to-back 8 B writes on one QP, a doorbell per max_batch WQEs, credits from the CQ |

Every family checks what it measured in the kernel (the values and immediates seen in
order, every completion's status 0, no CQE where none may be); a failed check is a
failed gate line and no numbers for that family. Nothing here has run on EFA yet.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from lever.hw.efa import device as efa_device
from lever.hw.efa import run as efa_run
from lever.hw.efa import wire
from lever.sim.errors import UserError

FAMILIES = ("write_rtt", "imm_rtt", "completion", "cq_poll", "post", "msg_rate")
"""In efa_kernels.h order (efa_gpu::Family)."""
INNER = {"write_rtt": 16, "imm_rtt": 16, "completion": 16, "cq_poll": 64, "post": 1, "msg_rate": 1024}
"""Operations per sample: each sample is their mean."""
ERRORS = {1: "a send completion did not come", 2: "a send completion had an error status",
          3: "the peer's write never landed", 4: "a ping word skipped a value",
          5: "no receive completion (write-with-immediate)", 6: "a receive completion with the wrong imm/flags/status",
          7: "a CQE appeared where none may", 8: "more WQEs outstanding than the SQ holds"}
SCRATCH_OFF = 4096
WINDOW = 1 << 21
TIMEOUT_NS = 2_000_000_000


def metrics_of(family: str, out: list[int], reps: int) -> dict[str, list[float]]:
    """A family's samples from the kernel's output words (rank 0's)."""
    if family == "post":
        cols = ("efa_wqe_store_ns", "efa_wqe_fence_ns", "efa_doorbell_ns", "efa_post_total_ns")
        return {c: [float(out[4 * r + i]) for r in range(reps)] for i, c in enumerate(cols)}
    if family == "msg_rate":  # picoseconds per message -> million messages per second
        return {"efa_msg_rate_mops": [1e6 / max(1, out[r]) for r in range(reps)]}
    name = {"write_rtt": "efa_write_half_rtt_ns", "imm_rtt": "efa_write_imm_half_rtt_ns",
            "completion": "efa_send_completion_ns", "cq_poll": "efa_cq_poll_read_ns"}[family]
    return {name: [float(v) for v in out[:reps]]}


def error_text(err: list[int]) -> str:
    code, a, b, c = (int(x) for x in err[:4])
    return f"{ERRORS.get(code, f'error {code}')} (at {a}, seen {b}, want/status {c})"


def efa_primitives_record(samples: dict[str, list[float]], checks: list, *, reps: int,
                          platform: dict[str, str], provenance: dict[str, Any], caps: dict[str, Any],
                          facts: dict[str, str], rdma_core: Any, nearest: list[str] | None = None) -> Any:
    """primitives.build_record's record, made an EFA one (nic, facts, id). ``nearest``: the
    EFA devices at the GPU's PCIe distance, of which the families used one (each posts on
    one QP: a second device would carry nothing), named in the notes."""
    from lever.calibration.records import parse_record
    from lever.hw import primitives as prim

    rec = prim.build_record(samples, checks, gpus=1, reps=reps, platform=platform, provenance=provenance)
    d = rec.model_dump(mode="json", exclude_none=True)
    info = {"device": caps.get("device_name", ""), "rdma_core": rdma_core, "caps": caps.get("caps", {}),
            "max_tx_batch": caps.get("max_tx_batch"), "max_rdma_size": caps.get("max_rdma_size"),
            "inline_buf_size": caps.get("inline_buf_size")}
    nic = efa_device.record_platform(info)["nic"] + (
        f"; EFA driver {facts.get('efa_driver') or '?'}; device_caps {int(caps.get('device_caps', 0)):#x}; "
        f"MR {caps.get('mr', '?')}")
    d["nic"] = "efa"
    d["id"] = f"efa-primitives-{facts.get('instance') or 'unknown'}-{provenance.get('date', '')[:10] or 'undated'}"
    d["what"]["design"] = "primitives over EFA (GPU-posted, two nodes)"
    d["what"]["platform"] = {**d["what"]["platform"], "nic": nic, "instance": facts.get("instance", "")}
    used = caps.get("device_name", "") or "?"
    others = [n for n in (nearest or []) if n != used]
    d["how"]["notes"] = ("rank 0 initiates, rank 1 answers, one process per node; one GPU thread posts on "
                         f"one SRD QP of one EFA device ({used}"
                         + (f"; also nearest the GPU, unused: {', '.join(others)}" if others else "")
                         + "); every sample is the mean over its batch (hw/efa/prims.py INNER); "
                         "the send CQ is the provider's host ring mapped for the GPU")
    d["provenance"]["source"] = "lever hw primitives --nic efa (hw/efa/efa_kernels.cu)"
    return parse_record(d, d["id"])


def main_efa_primitives(args: argparse.Namespace) -> int:
    from lever.calibration.records import RecordError, dump_record
    from lever.hw import ep
    from lever.hw import primitives as prim
    from lever.hw.device import require_cuda
    from lever.hw.primitives import Check

    pre = efa_run.preflight("lever hw primitives --nic efa")
    env = pre["torchrun"]
    if env["world_size"] != 2:
        raise UserError(f"lever hw primitives --nic efa: two ranks (one per node), the torchrun world has "
                        f"{env['world_size']}")
    if args.gpus != 1:
        raise UserError("--gpus: the EFA primitives use one GPU per rank")
    if not 20 <= args.reps <= 100000:
        raise UserError(f"--reps: {args.reps} is outside [20, 100000]")
    fams = FAMILIES if not args.only else tuple(f.strip() for f in args.only.split(",") if f.strip())
    bad = [f for f in fams if f not in FAMILIES]
    if bad:
        raise UserError(f"--only: {', '.join(bad)} not an EFA family ({', '.join(FAMILIES)})")
    efa_run.mask_gpu(env)
    torch = require_cuda()
    provenance = prim.collect_provenance([Path(sys.argv[0]).name, *sys.argv[1:]], allow_dirty=args.allow_dirty)
    from lever.hw import provenance as pv

    provenance["kernel_sha256"] = pv.sources_sha256(efa_run.kernel_files())
    facts = wire.host_facts()
    efa_ext = efa_run.load_efa_ext(pre["libs"])
    bdf = efa_run.gpu_bdf(torch)
    nearest = wire.nearest_devices(bdf, pre["devices"], local_rank=env["local_rank"])
    # one QP, so one device: the nearest (a rank's EP runs stripe over all of them)
    name = getattr(args, "efa_device", "") or wire.nearest_device(bdf, pre["devices"], local_rank=env["local_rank"])
    dist = efa_run.Dist(torch, env, 300.0)
    me, other = env["rank"], 1 - env["rank"]
    t = torch
    raw = t.zeros(2 * WINDOW, dtype=t.uint8, device="cuda:0")
    win = raw[(-raw.data_ptr()) % WINDOW:][:WINDOW]
    words = win[:1024].view(t.int64)  # ping [0..8), src [8..16)
    dev = None
    try:
        try:
            dev = efa_ext.Device(name, 1, win.data_ptr(), WINDOW, True, 0)
            caps = dict(dev.caps())
            depth = min(1024, int(caps["max_sq_wr"]))
            unsol = bool(caps["caps"].get("unsolicited_write_recv"))
            sq = dev.open_qp(depth, 1, depth, wire.QKEY, False)
            rx = dev.open_qp(32, 1, 4096, wire.QKEY, unsol)
        except RuntimeError as e:
            raise UserError(f"EFA device {name}: {' '.join(str(e).split())}") from None
        loc = dev.local()
        addr = {"rank": me, "world": 2, "gid": bytes(loc["gid"]).hex(), "qkey": wire.QKEY,
                "rkey": int(loc["rkey"]), "addr": int(loc["addr"]), "rx_qpns": [int(dev.qp_num(rx))],
                "plan": {"nrx": 1, "primitives": 1, "window": WINDOW}, "device": name}
        peers = wire.exchange(addr, dist.all_gather)
        try:
            wire.add_peers(dev, peers, 1)
            sq_lay, rx_lay = bytes(dev.fill_layout(sq, 0)), bytes(dev.fill_layout(rx, wire.FILL_NO_SQ_MAP))
        except RuntimeError as e:
            raise UserError(f"EFA device {name}: {' '.join(str(e).split())}") from None
        table = bytes(dev.peers())

        def gpu(b: bytes):
            return t.frombuffer(bytearray(b), dtype=t.uint8).to("cuda:0")

        g_sq, g_rx = gpu(sq_lay), gpu(rx_lay)
        g_peer = gpu(table[other * wire.PEER_BYTES:(other + 1) * wire.PEER_BYTES])
        st = t.zeros(16, dtype=t.int32, device="cuda:0")
        err = t.zeros(4, dtype=t.int32, device="cuda:0")
        out = t.zeros(4 * args.reps, dtype=t.int64, device="cuda:0")
        base_other = int(peers[other]["addr"])
        samples: dict[str, list[float]] = {}
        checks: list[Check] = []
        stream = t.cuda.Stream()
        for fam in fams:
            if fam == "imm_rtt" and not unsol:
                checks.append(Check(fam, False, "needs unsolicited write receive (device cap bit 4)"))
                continue
            fi = FAMILIES.index(fam)
            err.zero_()
            out.zero_()
            cfg = {"sq": g_sq.data_ptr(), "rx": g_rx.data_ptr(), "peer": g_peer.data_ptr(), "st": st.data_ptr(),
                   "ping": words.data_ptr(), "src": words.data_ptr() + 64, "out": out.data_ptr(),
                   "err": err.data_ptr(), "ping_remote": base_other, "scratch_remote": base_other + SCRATCH_OFF,
                   "initiator": int(me == 0), "reps": args.reps, "inner": INNER[fam], "timeout_ns": TIMEOUT_NS}
            t.cuda.synchronize()
            dist.barrier()
            t0 = time.perf_counter()
            rc = efa_ext.prim_launch(cfg, fi, stream.cuda_stream)
            stream.synchronize()
            e = err.cpu().tolist()
            mine = f"launch: {efa_ext.err_string(rc)}" if rc else (error_text(e) if e[0] else "")
            both = dist.all_gather(mine)
            bad_ranks = [f"rank {r}: {m}" for r, m in enumerate(both) if m]
            if bad_ranks:
                checks.append(Check(fam, False, "; ".join(bad_ranks)))
                print(f"[efa primitives] {fam}: FAILED: {'; '.join(bad_ranks)}", file=sys.stderr)
                continue
            if me == 0:
                samples.update(metrics_of(fam, out.cpu().tolist(), args.reps))
            checks.append(Check(fam, True, f"{args.reps} x {INNER[fam]} on both ranks: values, immediates and "
                                           "completion statuses as posted"))
            print(f"[efa primitives] {fam}: {time.perf_counter() - t0:.2f} s", file=sys.stderr)
        if me != 0:
            return 0 if all(c.passed for c in checks) else 1
        if not samples:
            raise UserError("every EFA family failed: " + "; ".join(c.detail for c in checks))
        try:
            rec = efa_primitives_record(samples, checks, reps=args.reps,
                                        platform=ep._platform_info(torch), provenance=provenance,
                                        caps=caps, facts=facts, rdma_core=pre["libs"].get("rdma_core"),
                                        nearest=nearest)
        except ValueError as e:
            raise RecordError(f"{args.out}: {e}") from None
        dump_record(rec, args.out)
        for k, d in sorted(rec.metrics.items()):
            print(f"{k:36s} {d.median:10.4g} {d.p10:10.4g} {d.p90:10.4g} {d.n:5d}")
        print(f"record {rec.id} -> {args.out} (gate {'passed' if rec.gate.passed else 'FAILED'})")
        return 0 if rec.gate.passed else 1
    finally:
        if dev is not None:
            dev.close()
        dist.close()
