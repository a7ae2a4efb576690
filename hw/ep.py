"""``lever hw ep``: DeepEP-style LL dispatch/combine (native or CPU proxy) over the emulated SRD NIC.

``--path native``: warps build WQEs, fence and ring doorbells themselves (doorbells of a
shared QP ring in slot order across CTAs). ``--path proxy``: the same kernels write 128 B
descriptors into pinned host rings; C++ proxy threads of the extension post the WQEs to the
same emulated NIC and write progress back where the GPU polls.

What runs (hw/ep/ep_kernels.cu): per GPU one cooperative launch per op whose
EP blocks build and post real 64-byte EFA TX WQEs, fence, ring doorbells and
poll CQEs, and whose NIC blocks emulate the SRD wire with the emulator's own
parameters (``hw/emulated_nic.toml``, hw/emulated_nic.py; never the model's
platform file, which is calibrated against these records). The send queue and
its doorbell sit in write-combined pinned host memory and the CQ in host memory
by default (``--sq``/``--cq``: as on p5/p5en, the GPU writes its WQEs over PCIe
and polls completions through PCIe; the NIC mirrors host SQs at its own cost).
The wire drops packets and ACKs (``--faults``), the NIC resends after its
timeout, the receiver discards duplicates, and a packet out of retries
completes its WQE with an error CQE. Puts to the rank itself are copied by the
issuing warp. Ranks are spread over the GPUs (EP2 on two H200s; more ranks per
GPU as virtual ranks; loopback on one GPU).

Why records look the way they do: ``nic = "emulated-srd"`` with the fabric
inside, so a record never passes for EFA; ``sim`` names the scenario, levers
and overrides that make the model simulate the same run; the gate says what
was checked on every run (outputs ``torch.equal`` the pure-PyTorch reference of
``hw/reference.py``, receiver-side stamps, no timeout, no bad CQE/WQE).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from lever.hw import reference as ref
from lever.hw.profiler import attribution as prof_attribution
from lever.hw.profiler import decode as prof_decode
from lever.hw.reference import Shape
from lever.sim.errors import UserError

HERE = Path(__file__).resolve().parent
PLATFORM = "platforms/emulated-nvlink"
DMSG, CMSG = 7504, 14400
NQ_MAX = 32
CQE_BYTES = 32
"""CQ entry stride of the emulated NIC: the 32-byte efa_io_rx_cdesc_ex of rdma-core v59's
extended CQ (what efadv_query_cq reports), as hw/ep/emu_nic.h publishes in its layouts."""
CQE_STATUS = {  # rdma-core efa_io_defs.h enum efa_io_comp_status (the ones the emulator writes or names)
    1: "EFA_IO_COMP_STATUS_FLUSHED",
    13: "EFA_IO_COMP_STATUS_LOCAL_ERROR_UNRESP_REMOTE (retries exhausted: no ACK from the remote)",
    15: "EFA_IO_COMP_STATUS_LOCAL_ERROR_UNREACH_REMOTE",
}
ERR_NAMES = {
    1: "dispatch receiver timed out waiting for a count flag",
    2: "receiver timed out counting receive completions (write-imm)",
    3: "combine receiver timed out waiting for a peer's flag",
    4: "issuer timed out waiting for send completions",
    5: "issuer timed out waiting for a shared QP's lock",
    6: "rank barrier timed out",
    7: "NIC agent timed out (EP blocks never finished)",
    8: "NIC parsed a malformed or stale WQE",
    9: "issuer read a CQE with bad status",
    10: "cross-GPU start barrier timed out",
    11: "NIC packet table overflow",
    12: "stopped by the host: its bounded wait for the kernels ran out",
    13: "issuer timed out waiting for its doorbell turn on a shared QP",
    14: "issuer timed out waiting for the proxy (ring space or completions)",
}
STAT_NAMES = ["stamp_bad_dispatch", "stamp_bad_combine", "packets", "retransmits", "wqes",
              "doorbells", "fences", "cqes", "rx_cqes", "locks", "credit_polls", "reordered", "turn_waits",
              "descriptors", "ring_polls", "nic_late_ns", "drops", "duplicates", "error_cqes",
              "nic_early_ns", "local_puts", "mirrored_wqes", "nic_claim_lag_ns", "nic_deliver_ns",
              "nic_scan_ns", "nic_copy_ns", "nic_fence_ns", "host_passes", "host_qp_copies",
              "host_read_ns", "host_copy_ns", "host_cqe_ns", "host_idle_ns", "nic_claim_load_ns"]
ST_WORDS = 34  # hw/ep/efa_emu.cuh ST_NUM


def cqe_status_name(st: int) -> str:
    """The name of an EFA completion status, as the error message gives it."""
    return f"status {st} ({CQE_STATUS.get(st, 'see efa_io_comp_status')})"



class EpError(RuntimeError):
    """A failed run: the message is the one-line diagnostic."""


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nic", choices=["emulated", "efa"], default="emulated",
                   help="emulated: the SRD NIC emulated on the GPU; efa: a real EFA device, one process "
                        "per GPU under torchrun (hw/efa/README.md; not yet run on a device)")
    p.add_argument("--efa-device", default="",
                   help="--nic efa: the EFA device(s) of this rank, NAME[,NAME...] (default: --efa-devices "
                        "of those nearest its GPU on PCIe)")
    p.add_argument("--efa-devices", default="all",
                   help="--nic efa: how many EFA devices a rank stripes its send QPs over, N or 'all' (default: "
                        "every device at its GPU's minimal PCIe distance: 2 on p5en, 4 on p5)")
    p.add_argument("--efa-inline-write", action="store_true",
                   help="--nic efa: send QPs with 128-byte WQEs whose small RDMA writes carry their payload "
                        "inline (rdma-core 63+; the emulated NIC: --emu-set wqe_size_bytes=128 "
                        "--emu-set inline_write_bytes=80)")
    p.add_argument("--efa-counters", action="store_true",
                   help="--nic efa: a completion counter per send QP, read for the send credit instead of "
                        "the CQ (rdma-core after 64, device cap COMP_CNTR; native path; the emulated NIC: "
                        "--emu-set send_completions=counter)")
    p.add_argument("--dist-timeout-s", type=float, default=300.0,
                   help="--nic efa: timeout of the torch.distributed (gloo) exchanges and barriers")
    p.add_argument("--path", choices=["native", "proxy"], default="native")
    p.add_argument("--protocol", choices=["v1-ll", "v2-direct", "v2-hybrid"], default="v1-ll",
                   help="v1-ll: DeepEP low-latency; v2-hybrid / v2-direct: DeepEP V2 over emulated "
                        "nodes (hw/ep_v2.py)")
    p.add_argument("--ranks-per-node", type=int, default=0,
                   help="V2: ranks per emulated node (0: ranks / 2, two nodes); ranks of a node talk "
                        "over NVLink, or within one GPU's memory when they share it")
    p.add_argument("--proxy-threads", type=int, default=0,
                   help="proxy path: host proxy threads (0: platform.proxy.threads)")
    p.add_argument("--ranks", type=int, default=2, help="EP ranks (spread over --gpus GPUs)")
    p.add_argument("--gpus", type=int, default=0, help="GPUs to use (0: min(ranks, visible))")
    p.add_argument("--faults", action="store_true",
                   help="drop packets and ACKs (hw/emulated_nic.toml faults_loss_prob): the NIC resends "
                        "after its timeout, the receiver discards duplicates")
    p.add_argument("--sq", choices=["host", "device"], default="",
                   help="native send queue + doorbell: write-combined pinned host memory (an LLQ BAR's "
                        "stand-in) or GPU memory (default: hw/emulated_nic.toml [placement])")
    p.add_argument("--cq", choices=["host", "device"], default="",
                   help="native send CQ: pinned host memory (polled through PCIe, as on p5/p5en) or GPU "
                        "memory (default: hw/emulated_nic.toml [placement])")
    p.add_argument("--rxcq", choices=["host", "device"], default="",
                   help="receive CQs (write-with-immediate completions): pinned host memory, written by "
                        "the NIC's host-facing engine and polled by the receivers through PCIe (as on "
                        "p5/p5en), or GPU memory (default: hw/emulated_nic.toml [placement])")
    p.add_argument("--emu-set", action="append", default=[], metavar="KEY=VALUE",
                   help="override one value of hw/emulated_nic.toml for this run (recorded)")
    p.add_argument("--outcome", default="",
                   help="write every variant's outcome (gate passed or the one-line failure) as JSON here")
    p.add_argument("--lever", default="", help="comma-separated lever names (scenarios/levers/)")
    p.add_argument("--set", action="append", default=[], metavar="PATH=VALUE",
                   help="scenario override (platform.fabric.*, design.*), recorded in the record")
    p.add_argument("--iters", type=int, default=60, help="timed iterations (>= 50 for records)")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--profile", type=int, default=4,
                   help="profiler: sample one post group in N (0: no profiled pass)")
    p.add_argument("--profile-iters", type=int, default=20)
    p.add_argument("--num-sms", type=int, default=0, help="EP blocks per rank (0: design.num_sms)")
    p.add_argument("--timeout-ms", type=float, default=200.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--unsafe-ordered", action="store_true",
                   help="negative test: flag right after the data (no flush); the gate must fail")
    p.add_argument("--variants", default="",
                   help="';'-separated lever sets to run in one process (e.g. ';lazy-completion-dispatch'); "
                        "records go to --out-dir")
    p.add_argument("--out-dir", default="", help="directory for --variants records")
    p.add_argument("--id-prefix", default="emu-ep")
    p.add_argument("--out", default="", help="record path to write (single run)")
    p.add_argument("--allow-dirty", action="store_true",
                   help="write records from a tree with uncommitted changes (recorded as dirty)")


# ----------------------------------------------------------------- configuration
def scenario_overrides(ranks: int, faults: bool, extra: Mapping[str, Any],
                       path: str = "native", loss_prob: float = 0.02) -> dict[str, Any]:
    """The model's view of this run: the emulated platform, V1 LL, every rank its own node;
    under --faults the model's wire loses what the emulator's does (``loss_prob``)."""
    ov: dict[str, Any] = {
        "workload.ep_ranks": ranks, "workload.gpus_per_node": 1, "workload.name": "decode",
        "design.name": "v1-ll-emulated", "design.protocol": "v1-ll", "design.signal_mode": "flush",
        "design.forward_warps_per_sm": 0,
        # the kernels' combine sends one flag per destination rank, polled by every warp
        # (ep_kernels.cu post_signals / combine_rank), not DeepEP LL's flag per expert
        "design.ll_combine_flags": "per-rank",
        # and deals its (expert, source) pairs' rows pair after pair (combine_rank), not side by
        # side as DeepEP LL's warp group per pair does
        "design.ll_combine_order": "in-turn",
        # write-with-immediate: a receive CQ per destination QP (local expert in dispatch,
        # token channel in combine), read by the warp receiving on it, one 16-byte CQE per
        # read (ep_kernels.cu dispatch_rank / combine_rank)
        "design.recv_cq": "per-dest-qp", "design.recv_cq_cqes_per_read": 1,
        # credit polls: the warp's 32 lanes read 32 send CQEs at once (cq_poll)
        "design.credit_read_lines": 32}
    if path == "proxy":
        ov["design.path"] = "proxy"
    if faults:
        ov["platform.fabric.loss_prob"] = loss_prob
    return {**ov, **extra}


def run_shape_overrides(num_sms: int, cq: str, nics_per_rank: int, scn,
                        rxcq: str = "host") -> dict[str, Any]:
    """What the command line changed about the run that the model must be told, so that the
    record's ``sim`` link reproduces this run: the EP blocks per rank (``--num-sms``), a send
    CQ in GPU memory (``--cq device``: credit reads are device loads), the receive CQs where
    they were when that is not where the send CQ is (``--rxcq``), the emulated NICs per
    rank (``--emu-set nics_per_rank``). A send queue in GPU memory (``--sq device``) changes
    store and fence costs the model has one value each for: such a record says where its
    queues were (``what.emulated_fabric``) and is not a calibration record."""
    ov: dict[str, Any] = {}
    if num_sms and num_sms != scn.design.num_sms:
        ov["design.num_sms"] = num_sms
    if cq == "device":
        ov["platform.gpu.completion_counter_in_device_memory"] = True
    if (rxcq == "device") != (cq == "device"):
        ov["platform.receiver.recv_cq_in_device_memory"] = rxcq == "device"
    if nics_per_rank != scn.platform.nic.nics_per_gpu:
        ov["platform.nic.nics_per_gpu"] = nics_per_rank
    return ov


HW_VARIANTS = {
    "deferred-doorbell-aggregation": "turn-per-post",
    "provider-batched-tail": "signals-in-one-doorbell",
    "write-imm-counting": "count-cqes-per-source",
}
"""The variant of a lever file (``[variants.NAME]``) that these kernels build, where the lever
has several readings: a record names it in ``sim.levers`` (``NAME@VARIANT``), so the model
is judged against what ran. The kernel flags still come from the lever's primary ``[set]``
(:func:`kernel_flags`); the variant says what the kernels do with them."""


def sim_levers(levers: list[str]) -> list[str]:
    """The record's ``sim.levers``: each lever with the variant the kernels build."""
    return [f"{n}@{HW_VARIANTS[n]}" if n in HW_VARIANTS else n for n in levers]


def load_scenario(ranks: int, faults: bool, extra: Mapping[str, Any], levers: list[str],
                  path: str = "native", loss_prob: float = 0.02):
    """The scenario the model runs for this variant: the levers' files, then the run's overrides."""
    from lever.sim.levers import all_levers, load_with_levers

    shipped = all_levers()
    for name in levers:
        if name not in shipped:
            raise EpError(f"--lever {name}: unknown lever (shipped: {', '.join(shipped)})")
    return load_with_levers(PLATFORM, levers, base=scenario_overrides(ranks, faults, extra, path, loss_prob),
                            base_source="lever hw ep")


def kernel_flags(scn, op: str, path: str, prof_period: int, unsafe: bool) -> dict[str, int]:
    """Design fields -> the kernels' run-time flags (hw/ep/efa_emu.cuh EpFlags)."""
    d, nic = scn.design, scn.platform.nic
    if d.signal_mode not in ("flush", "imm-counting", "ordered"):
        raise EpError(f"design.signal_mode {d.signal_mode!r}: the emulated kernels support flush, "
                      "imm-counting and (as a negative test) ordered")
    if d.qps_per_call > NQ_MAX:
        raise EpError(f"design.qps_per_call {d.qps_per_call} above the {NQ_MAX} QPs allocated per rank")
    lazy = d.lazy_completion_dispatch if op == "dispatch" else d.lazy_completion_combine
    return {
        "lazy": int(lazy), "credit_every": d.credit_check_every,
        "db_batch": min(d.doorbell_batch, 16), "span": min(d.put_many_span, 16),
        "owned": int(d.qp_ownership == "owned"), "notify_qp": int(d.notify_qp_reserved),
        "num_qps": d.qps_per_call,
        "agg": nic.max_batch if d.deferred_doorbell_aggregation > 1 else 0,
        "imm_counting": int(d.signal_mode == "imm-counting"),
        "ordered_unsafe": int(unsafe or d.signal_mode == "ordered"),
        "batched_tail": int(d.provider_batched_tail), "prof_period": prof_period,
        "proxy": int(path == "proxy"),
        # cached dispatch: reuse the layout handle, no count messages; the receiver counts
        # write-with-immediate receive completions against the handle's counts
        "cached": int(d.cached and op == "dispatch"),
    }


def refuse_platform_sets(extra: Mapping[str, Any]) -> None:
    """The emulator reads only hw/emulated_nic.toml: a --set platform.* would change the
    model's view of the run and not the run itself, so it is refused."""
    bad = sorted(k for k in extra if k.startswith("platform."))
    if bad:
        raise UserError(f"--set {bad[0]}: the emulated NIC does not read the model's platform; "
                        "use --emu-set KEY=VALUE (hw/emulated_nic.toml)")


def emulated_fabric_record(emu, faults: bool, sq: str, cq: str, rxcq: str = "host") -> dict[str, Any]:
    """What the record carries: every emulator value that ran, the file, the queue placement."""
    return {**emu.record(faults, sq, cq, rxcq),
            "wire": "NVLink peer stores between GPUs, loopback stores on one GPU; puts to the rank "
                    "itself copied by the issuing warp"}


# ----------------------------------------------------------------- statistics
def summarize(samples: list[float]) -> dict[str, Any]:
    """Median, p10/p90, mean, std, n and the samples (µs), as the record schema wants."""
    xs = sorted(samples)
    n = len(xs)
    if n == 0:
        raise EpError("no timed samples")

    def q(p: float) -> float:
        i = p * (n - 1)
        lo, hi = math.floor(i), math.ceil(i)
        return xs[lo] + (xs[hi] - xs[lo]) * (i - lo)

    mean = sum(xs) / n
    std = math.sqrt(sum((x - mean) ** 2 for x in xs) / max(1, n - 1))
    return {"median": round(q(0.5), 3), "p10": round(q(0.1), 3), "p90": round(q(0.9), 3),
            "mean": round(mean, 3), "std": round(std, 3), "n": n,
            "samples": [round(x, 3) for x in samples]}


def build_record(*, rid: str, path: str, ranks: int, gpus: int, levers: list[str],
                 sets: Mapping[str, Any], hidden: int, scn, lat: dict[str, list[float]], gate: dict[str, Any], attribution: dict | None,
                 samples: int | None, metrics: dict[str, dict], how: dict[str, Any],
                 platform_info: dict[str, str], command: str,
                 provenance: Mapping[str, Any] | None = None, emu=None, faults: bool = False,
                 sq: str = "host", cq: str = "host", rxcq: str = "host") -> dict[str, Any]:
    """Assemble and validate a run record (calibration/records.py). ``provenance`` is
    :func:`run_provenance` (a real run); without it only the revision is looked up."""
    from lever.calibration.records import SCHEMA_VERSION, parse_record
    from lever.hw import emulated_nic

    wl = scn.workload
    emu = emu or emulated_nic.load()
    rec = {
        "schema_version": SCHEMA_VERSION,
        "id": rid,
        "nic": "emulated-srd",
        "what": {
            "design": f"v1-ll {path} (DeepEP-style LL) over emulated SRD",
            "path": path, "protocol": "v1-ll", "levers": levers,
            "workload": {"ep_ranks": ranks, "nodes": ranks, "tokens_per_rank": wl.tokens_per_rank,
                         "hidden": hidden, "top_k": wl.top_k, "num_experts": wl.num_experts},
            "platform": platform_info,
            "emulated_fabric": emulated_fabric_record(emu, faults, sq, cq, rxcq) | {"gpus": gpus,
                                                                            "ranks_per_gpu": ranks // gpus},
        },
        "how": how,
        "sim": {"scenario": PLATFORM, "levers": sim_levers(levers), "set": dict(sets)},
        "latency_us": {op: summarize(v) for op, v in lat.items()},
        "gate": gate,
        "metrics": metrics,
        "provenance": {"source": "lever hw ep (hw/ep/ep_kernels.cu, emulated SRD NIC)",
                       "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
                       "git_rev": _git_rev(), "tool_version": "lever-efa 0.1.0", "command": command,
                       **(provenance or {})},
    }
    if attribution:
        rec["attribution"] = attribution
        rec["attribution_samples"] = samples
    parse_record(rec, rid)
    return rec


def kernel_sources() -> list[Path]:
    """The files the extension is built from: kernels, binding, the NIC layout/WQE headers."""
    return [*(HERE / "ep").glob("*"), *(HERE / "efa").glob("*.h"), HERE / "efa_io_defs.h"]


def kernel_sources_sha256() -> str:
    """sha256 over :func:`kernel_sources` (hw/provenance.py): names the device code that ran."""
    from lever.hw.provenance import sources_sha256

    return sources_sha256(kernel_sources())


def run_provenance(allow_dirty: bool) -> dict[str, Any]:
    """The provenance fields of this run's records, or a one-line UserError for a dirty or
    unknown tree (before any GPU work)."""
    from lever.hw import provenance as pv

    return {**pv.require_revision(allow_dirty), "kernel_sha256": kernel_sources_sha256(),
            "build_flags": pv.build_flags(), "gpu_topology": pv.gpu_topology()}


def _git_rev() -> str:
    """``$LEVER_GIT_REV`` when the tree was copied without .git (the device runner), else HEAD."""
    import os

    env = os.environ.get("LEVER_GIT_REV")
    if env:
        return env
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              cwd=HERE.parent, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


# ----------------------------------------------------------------- the device run
class Runner:
    """Owns the buffers of every rank and the per-GPU worlds; runs ops and the gate."""

    EXACT = False
    """Inputs whose combine sums are exact in BF16 (reference.make_inputs): V2 runs use them."""

    HOST_WAIT_GRACE_S = 5.0
    """Seconds the host waits for queued kernels beyond their own bound (:meth:`sync`)."""

    def __init__(self, torch, ext, shape: Shape, ranks: int, gpus: int, scn, seed: int,
                 num_sms: int, timeout_ms: float, path: str = "native", proxy_threads: int = 0,
                 emu=None, sq: str = "host", cq: str = "host", faults: bool = False,
                 rxcq: str = "") -> None:
        from lever.hw import emulated_nic

        self.t, self.ext, self.shape, self.R, self.G = torch, ext, shape, ranks, gpus
        self.emu = emu or emulated_nic.load()
        self.sq_host, self.cq_host, self.faults = sq == "host", cq == "host", faults
        self.rx_host = (rxcq or self.emu.rxcq) == "host"
        self.queued = 0  # ops launched since the last sync (bounds the host's wait)
        self.rpg = ranks // gpus
        d = scn.design
        self.nb = num_sms or d.num_sms
        self.warps = d.warps_per_sm
        if not 1 <= self.warps <= 8:
            raise EpError(f"design.warps_per_sm {self.warps}: the kernels take 1..8 warps per block")
        self.nics = self.emu.nics_per_rank
        # NIC blocks a rank: each emulated NIC served by blocks_per_nic_count blocks (SMs)
        self.nic_units = self.nics * int(self.emu.blocks_per_nic_count)
        # every warp of a NIC block delivers packets: 8 in the EP blocks' kernel, up to 16 in a
        # NIC kernel of its own (hw/emulated_nic.toml nic_kernel, nic_warps_count)
        self.nic_warps = int(self.emu.nic_warps_count)
        self.own_nic_kernel = self.emu.nic_kernel == "own"
        self.depth = self.emu.sq_depth
        # the device generation the emulated NIC plays (hw/emulated_nic.toml [nic]): WQE size,
        # inline RDMA writes, send credit from a completion counter
        self.wqe_bytes = int(self.emu.wqe_size_bytes)
        self.inline_write = int(self.emu.inline_write_bytes)
        self.counters = self.emu.send_completions == "counter"
        self.path = path
        self.ring_depth = scn.platform.proxy.ring_depth
        self.proxy_threads = proxy_threads or scn.platform.proxy.threads
        self.host: list[dict[str, int]] = []
        T, K, El = shape.tokens, shape.top_k, shape.experts_per_rank
        C = self.nb * self.warps
        self.C = C
        self.n_rxcq = max(El, C)
        need = max(ranks * T + ranks, K * math.ceil(T / C)) + 64
        self.rx_depth = 1 << (need - 1).bit_length()
        self.prof_cap = 1 << 17
        self.timeout_ns = int(timeout_ms * 1e6)
        self.inputs = ref.make_inputs(shape, seed, exact=self.EXACT)
        self.layouts = ref.dispatch_layout(shape, self.inputs)
        self.y = ref.make_expert_outputs(shape, self.layouts, seed + 1, exact=self.EXACT)
        self.ref_comb = ref.combine(shape, self.inputs, self.layouts, self.y)
        self.streams, self.bufs, self.gbufs, self.handles = [], [], [], []
        self.scn = scn
        self.seq = 0
        self.epoch = 0
        for g in range(gpus):
            for h in range(gpus):
                if g != h and ext.enable_peer(g, h) != 0:
                    raise EpError(f"GPU {g} can not enable peer access to GPU {h}")
        self._alloc()

    def dev(self, r: int) -> int:
        return r // self.rpg

    def _alloc(self) -> None:
        t, s = self.t, self.shape
        T, H, K, E, El, R = s.tokens, s.hidden, s.top_k, s.num_experts, s.experts_per_rank, self.R
        u8, i32, i64 = t.uint8, t.int32, t.int64
        for r in range(R):
            dv = f"cuda:{self.dev(r)}"

            def z(n: int, dt, dv: str = dv):
                return t.zeros(n, dtype=dt, device=dv)

            inp = self.inputs[r]
            b = {
                "x_fp8": inp["x_fp8"].to(dv), "x_scales": inp["scales"].to(dv),
                "topk": inp["topk"].to(dv), "topk_w": inp["topk_w"].to(dv),
                "send_buf": z(T * DMSG, u8), "comb_send": z(El * R * T * CMSG, u8),
                "sig_src": z(E + R, i64), "slot_tab": z(T * K, i32), "exp_count": z(E, i32),
                "out_src": z(El * R * T, i32), "out_count": z(El * R, i32),
                "comb_out": t.zeros(T, H, dtype=t.bfloat16, device=dv),
                "rx_head": z(self.n_rxcq, i32), "qps": z(NQ_MAX * 128, u8),
                # the NIC's device mirrors of host-memory SQs and their doorbells (native, proxy)
                "msq": z(NQ_MAX * self.depth * self.wqe_bytes, u8), "mdb": z(NQ_MAX * 32, i32),
                "pmsq": z(NQ_MAX * self.depth * self.wqe_bytes, u8), "pmdb": z(NQ_MAX * 32, i32),
                "nicqp": z(NQ_MAX * 128, u8), "loc_cnt": z(self.n_rxcq, i32),
                # the NIC's copies of inline payloads (per NIC, per in-flight WQE slot: NWQ 512) and
                # the send QPs' completion counters (count, errors), both emulated NIC state
                "nic_inl": z(self.nic_units * 512 * 128, u8), "cntr": z(NQ_MAX * 2, i64),
                "nic_wire": z(self.nics * 4, i64),
                "hcount": z(El * R, i32),
                "bar": z(4, i32), "prof": z(self.prof_cap * 8, i64), "prof_n": z(1, i32),
                # peer-visible
                "recv_x": z(El * R * T * DMSG, u8), "recv_cnt": z(El * R, i64),
                "comb_recv": z(T * K * CMSG, u8), "comb_flag": z(R, i64),
                "rx_tail": z(self.n_rxcq, i32),
            }
            if not self.rx_host:  # else pinned host memory (hostq_sizes)
                b["rxcq"] = z(self.n_rxcq * self.rx_depth * CQE_BYTES, u8)
            # the native queues: GPU memory, or pinned host memory (SQ + doorbell write-combined)
            for k, n, host in (("sq", NQ_MAX * self.depth * self.wqe_bytes, self.sq_host),
                               ("db", NQ_MAX * 32 * 4, self.sq_host),
                               ("cq", NQ_MAX * self.depth * CQE_BYTES, self.cq_host)):
                if not host:
                    b[k] = z(n, u8)
            # expert outputs at +16 of each combine message (zero-copy send buffer)
            cs = b["comb_send"].view(El, R, T, CMSG)
            cs[..., 16:16 + 2 * H] = self.y[r].view(t.uint8).reshape(El, R, T, 2 * H).to(dv)
            self.bufs.append(b)
        for g in range(self.G):
            dv = f"cuda:{g}"
            self.gbufs.append({"err": t.zeros(8, dtype=i32, device=dv), "stats": t.zeros(ST_WORDS, dtype=i64, device=dv),
                               "ep_done": t.zeros(1, dtype=i32, device=dv), "wbar": t.zeros(self.G, dtype=i64, device=dv)})
            with t.cuda.device(g):
                self.streams.append(t.cuda.Stream())
        self.hostq: list[dict[str, int]] = []
        for _ in range(R):
            self.hostq.append({k: self.ext.proxy_alloc(n, wc) for k, n, wc in self.hostq_sizes()})
        if self.path == "proxy":
            for _ in range(R):
                self.host.append({k: self.ext.proxy_alloc(n, k in ("psq", "pdb"))
                                  for k, n in self.host_sizes().items()})
        self.check_resident(self.ext.coop_max_blocks)
        self.t.cuda.synchronize()

    def check_resident(self, coop_max_blocks: Callable[[int, int, int], int]) -> None:
        """Refuse a launch whose blocks can not all be resident at once: the EP blocks and the NIC
        blocks spin on each other, so a block left waiting for an SM would hang the op. One kernel:
        every block against its co-resident count (``coop_max_blocks``, V1's or V2's). A NIC kernel
        of its own: each kernel against its own count, and both kernels' blocks against the SMs
        (each block fills its SM's registers, so two do not share one)."""
        ep, nic = self.rpg * self.nb, self.rpg * self.nic_units
        what = f"{ep + nic} blocks per GPU ({self.rpg} ranks x ({self.nb} EP + {self.nic_units} NIC))"
        if not self.own_nic_kernel:
            cap = coop_max_blocks(0, 32 * max(self.warps, self.nic_warps), self.stage_smem())
            if ep + nic > cap:
                raise EpError(f"{what} exceed the {cap} co-resident blocks: lower --num-sms or ranks per GPU")
            return
        ep_cap = coop_max_blocks(0, 32 * self.warps, 0)
        nic_cap, sms = self.ext.nic_max_blocks(0, 32 * self.nic_warps, self.stage_smem())
        if ep > ep_cap or nic > nic_cap or ep + nic > sms:
            raise EpError(f"{what}, the NIC blocks in a kernel of their own, exceed the {sms} SMs "
                          f"(EP kernel {ep_cap} co-resident, NIC kernel {nic_cap}): lower --num-sms or ranks per GPU")

    def stage_smem(self) -> int:
        """Dynamic shared memory a launch takes: the delivering warps' staging slices where the
        emulated NIC stages its copies (``nic_copy = "staged"`` or ``"bulk"``), else none (the kernels' own
        ``stage_smem``; the co-residency check must count it)."""
        from lever.hw.emulated_nic import COPIES

        if not COPIES[self.emu.nic_copy]:  # the kernels' Fabric::copy_staged
            return 0
        return self.nic_warps * int(self.ext.stage_bytes(self.nic_warps))

    def hostq_sizes(self) -> list[tuple[str, int, bool]]:
        """The queues that live in pinned host memory: (name, bytes, write-combined). The
        receive CQs are read by the GPU, so they are not write-combined."""
        out = []
        if self.sq_host:
            out += [("sq", NQ_MAX * self.depth * self.wqe_bytes, True), ("db", NQ_MAX * 32 * 4, True)]
        if self.cq_host:
            out.append(("cq", NQ_MAX * self.depth * CQE_BYTES, False))
        if getattr(self, "rx_host", False):
            out.append(("rxcq", self.n_rxcq * self.rx_depth * CQE_BYTES, False))
        return out

    def host_sizes(self) -> dict[str, int]:
        """Pinned host memory of the proxy path per rank (bytes)."""
        return {"pring": NQ_MAX * self.ring_depth * 128, "pstate": NQ_MAX * 16 * 8,
                "psq": NQ_MAX * self.depth * self.wqe_bytes, "pcq": NQ_MAX * self.depth * CQE_BYTES,
                "pdb": NQ_MAX * 32 * 4}

    def proxy_start(self, num_qps: int) -> int:
        """Zero the host rings/queues and start the proxy threads (returns the thread count)."""
        self.ext.proxy_stop()
        for h in self.host:
            for k, n in self.host_sizes().items():
                self.ext.host_zero(h[k], n)
        ranks = [dict(h, rank=r) for r, h in enumerate(self.host)]
        return self.ext.proxy_start(ranks, num_qps, self.ring_depth, self.depth, self.proxy_threads)

    def proxy_stop(self) -> dict[str, int]:
        return dict(self.ext.proxy_stop())

    def rebuild(self, scn, seed: int) -> None:
        """(Re)build the per-GPU worlds for this scenario's fabric; buffers and QP state are kept."""
        self.scn = scn
        self.handles = []
        s, R = self.shape, self.R
        peers = [{k: self.bufs[r][k].data_ptr() for k in ("recv_x", "recv_cnt", "comb_recv", "comb_flag", "rx_tail")}
                 | {"rxcq": self.hostq[r]["rxcq"] if self.rx_host else self.bufs[r]["rxcq"].data_ptr()}
                 for r in range(R)]
        wbar_peers = [gb["wbar"].data_ptr() for gb in self.gbufs]
        fab = self.emu.fabric_dict(seed, self.faults)
        for g in range(self.G):
            gb = self.gbufs[g]
            cfg = {"num_ranks": R, "ranks_per_gpu": self.rpg, "num_gpus": self.G, "T": s.tokens, "H": s.hidden,
                   "K": s.top_k, "E": s.num_experts, "E_local": s.experts_per_rank, "sq_depth": self.depth,
                   "rx_depth": self.rx_depth, "n_rxcq": self.n_rxcq, "ring_depth": self.ring_depth,
                   "ep_blocks_per_rank": self.nb, "ep_warps": self.warps, "nic_warps": self.nic_warps,
                   "nic_blocks": self.rpg * self.nic_units, "timeout_ns": self.timeout_ns, "prof_cap": self.prof_cap,
                   "sq_host": int(self.sq_host), "cq_host": int(self.cq_host), "rx_host": int(self.rx_host),
                   "wqe_size": self.wqe_bytes, "inline_write": self.inline_write, "counters": int(self.counters),
                   "err": gb["err"].data_ptr(), "stats": gb["stats"].data_ptr(),
                   "ep_done": gb["ep_done"].data_ptr(), "wbar": gb["wbar"].data_ptr()}
            locs = []
            for r in range(g * self.rpg, (g + 1) * self.rpg):
                m = {k: v.data_ptr() for k, v in self.bufs[r].items()}
                m["rank"] = r
                m.update(self.host[r] if self.host else {})
                m.update(self.hostq[r])
                locs.append(m)
            # the NIC tables: filled by the emulated NIC here (hw/ep/emu_nic.h); a real device's
            # come from its queue queries in the same byte form (hw/efa/device.py pack_layout)
            tables = self.ext.emulated_nic_tables(cfg, locs, peers)
            self.handles.append(self.ext.make_world(g, cfg, fab, locs, peers, wbar_peers, tables))

    # -- running
    def run_op(self, op: int, flags: dict[str, int], events: list | None) -> None:
        self.seq += 1
        for g in range(self.G):
            st = self.streams[g]
            rc = self.ext.launch_barrier(self.handles[g], self.seq, st.cuda_stream)
            if rc:
                raise EpError(f"GPU {g}: barrier launch failed: {self.ext.err_string(rc)}")
            if events is not None:
                events[g][0].record(st)
            rc = self.ext.launch_op(self.handles[g], op, self.epoch, flags, st.cuda_stream)
            if rc:
                raise EpError(f"GPU {g}: op launch failed: {self.ext.err_string(rc) if rc > 0 else rc}")
            if events is not None:
                events[g][1].record(st)

    def iteration(self, fd: dict, fc: dict, timed: bool) -> tuple[float, float] | None:
        t = self.t
        self.epoch += 1
        self.queued = getattr(self, "queued", 0) + 2  # a dispatch and a combine on every GPU
        evs = None
        out = []
        for op, fl in ((0, fd), (1, fc)):
            if timed:
                evs = []
                for g in range(self.G):
                    with t.cuda.device(g):
                        evs.append((t.cuda.Event(enable_timing=True), t.cuda.Event(enable_timing=True)))
            self.run_op(op, fl, evs)
            if timed:
                out.append(evs)
        if not timed:
            return None
        return tuple(out)  # type: ignore[return-value]

    def sync(self) -> None:
        """Wait for every GPU's queued kernels, bounded. An op kernel ends within twice the
        run's timeout (its NIC blocks raise ERR_TIMEOUT_NIC then), so the host waits the
        queued ops' bound plus ``HOST_WAIT_GRACE_S``; past it, it stops each stuck GPU's run
        from the host (``abort_world``: ERR_ABORTED in the error words, unless the run had
        an error of its own) and waits as long again. A kernel that still runs then ignores
        the abort word somewhere, and the run fails with that said, instead of hanging."""
        import time

        per_op_s = 2 * self.timeout_ns / 1e9
        grace = self.HOST_WAIT_GRACE_S
        deadline = time.monotonic() + max(1, getattr(self, "queued", 0)) * per_op_s + grace
        pending = list(range(self.G))
        stopped = False
        while pending:
            pending = [g for g in pending if not self.streams[g].query()]
            if not pending:
                break
            if time.monotonic() > deadline:
                if stopped:
                    g = pending[0]
                    seen = ""
                    if hasattr(self.ext, "peek_world"):  # what the stuck world says about itself
                        pk = dict(self.ext.peek_world(self.handles[g]))
                        st = dict(zip(STAT_NAMES, pk["stats"], strict=False))
                        seen = (f"; error words {list(pk['err'])}, packets {st.get('packets')}, error CQEs "
                                f"{st.get('error_cqes')}, drops {st.get('drops')}")
                    raise EpError(f"GPU {g}: the kernels did not stop within {per_op_s + grace:.1f} s of "
                                  f"the host's abort (a device wait that ignores the abort word){seen}")
                for g in pending:
                    self.ext.abort_world(self.handles[g], 12)
                stopped = True
                deadline = time.monotonic() + per_op_s + grace
            time.sleep(0.0005)
        for g in range(self.G):
            self.t.cuda.synchronize(g)
        self.queued = 0

    def check_errors(self) -> None:
        if getattr(self, "path", "native") == "proxy":  # the root cause first: a receiver may time out after
            pst = dict(self.ext.proxy_stats())
            if pst.get("bad_cqes"):
                raise EpError(f"proxy thread {pst.get('first_bad_thread', -1)} read an error CQE: "
                              f"{cqe_status_name(int(pst['first_bad_status']))} on rank "
                              f"{pst.get('first_bad_rank', -1)} QP {pst.get('first_bad_qp', -1)}, CQE "
                              f"{pst.get('first_bad_cqe', -1)} ({pst['bad_cqes']} error CQEs in all)")
        for g, gb in enumerate(self.gbufs):
            e = gb["err"].cpu().tolist()
            host = e[6] in (-1, 0xFFFFFFFF)  # raised by a host thread, not a block of the launch
            if e[0] == 9 and e[5] < 0 and not host:  # a completion counter's error count (no status)
                raise EpError(f"GPU {g}: issuer read {-e[5]} error completion(s) in the send completion counter "
                              f"of rank {e[1]} QP {e[2]} (count {e[3] & 0xFFFFFFFF}, credit wanted "
                              f"{e[4] & 0xFFFFFFFF}; block {e[6]}, warp {e[7]})")
            if e[0] == 9:  # an error CQE: name its status
                who, where = (f"proxy thread {e[7]}", "") if host else ("issuer", f" (block {e[6]}, warp {e[7]})")
                raise EpError(f"GPU {g}: {who} read an error CQE: {cqe_status_name(e[5])} on rank {e[1]} "
                              f"QP {e[2]}, CQE {e[3]}{where}")
            if e[0] == 12 and host:
                raise EpError(f"GPU {g}: {ERR_NAMES[12]} ({2 * self.timeout_ns / 1e9:.1f} s per queued op "
                              f"+ {self.HOST_WAIT_GRACE_S:.0f} s): the kernels stopped on the host's abort")
            if e[0]:
                what = ERR_NAMES.get(e[0], f"error {e[0]}")
                raise EpError(f"GPU {g}: {what}: rank {e[1]} (block {e[6]}, warp {e[7]}), "
                              f"expert/qp {e[2]}, counter {e[3]}, expected {e[4]}, aux {e[5]}")

    def stats(self) -> dict[str, int]:
        tot = [0] * ST_WORDS
        for gb in self.gbufs:
            for i, v in enumerate(gb["stats"].cpu().tolist()):
                tot[i] += v
        return {n: tot[i] for i, n in enumerate(STAT_NAMES)}

    def reset_state(self) -> None:
        """Zero every queue, counter and error word: a variant starts from a clean NIC, even
        after the previous one aborted (its QPs may hold un-consumed WQEs or a lock)."""
        self.sync()
        for b in self.bufs:
            for k in ("qps", "sq", "cq", "db", "msq", "mdb", "pmsq", "pmdb", "nicqp", "cntr",
                      "loc_cnt", "rx_head", "rx_tail", "rxcq", "recv_cnt", "comb_flag", "bar", "prof_n", "hcount"):
                if k in b:
                    b[k].zero_()
        for hq in self.hostq:
            for k, n, _ in self.hostq_sizes():
                self.ext.host_zero(hq[k], n)
        for gb in self.gbufs:
            gb["err"].zero_()
            gb["stats"].zero_()
        self.sync()

    def reset_stats(self) -> None:
        for gb in self.gbufs:
            gb["stats"].zero_()
        for b in self.bufs:
            b["prof_n"].zero_()

    def poison(self) -> None:
        for b in self.bufs:
            b["recv_x"].fill_(0xA5)
            b["out_src"].fill_(-7)
            b["out_count"].fill_(-7)
            b["comb_recv"].fill_(0x5A)
            b["comb_out"].fill_(-3.0)
        self.sync()

    def gate_check(self) -> list[str]:
        """Compare every rank's outputs with the reference; returns failure strings (empty: pass)."""
        fails = []
        for r in range(self.R):
            fails += self.gate_rank(r, self.bufs[r])
        return fails

    def gate_rank(self, r: int, b: dict) -> list[str]:
        """Rank ``r``'s outputs (its buffers ``b``) against the reference: failure strings."""
        t, s = self.t, self.shape
        El, R, T, H = s.experts_per_rank, self.R, s.tokens, s.hidden
        fails: list[str] = []
        lay = self.layouts[r]
        counts = b["out_count"].view(El, R).cpu()
        if not t.equal(counts, lay["counts"]):
            fails.append(f"rank {r}: dispatch counts differ")
            return fails
        src = b["out_src"].view(El, R, T).cpu()
        valid = t.arange(T)[None, None, :] < counts[:, :, None]
        if not t.equal(t.where(valid, src, -1), lay["src"]):
            fails.append(f"rank {r}: dispatch source indices differ")
        rx = b["recv_x"].view(El, R, T, DMSG).cpu()
        xr, scr = ref.dispatch_payload(s, self.inputs, lay)
        got_x = t.where(valid[..., None], rx[..., :H], 0)
        got_s = t.where(valid[..., None], rx[..., H:H + 4 * s.scales].contiguous().view(t.float32), 0)
        if not t.equal(got_x, xr):
            fails.append(f"rank {r}: dispatch FP8 payload differs")
        if not t.equal(got_s, scr):
            fails.append(f"rank {r}: dispatch scales differ")
        if not t.equal(b["comb_out"].cpu(), self.ref_comb[r]):
            n = int((b["comb_out"].cpu() != self.ref_comb[r]).sum())
            fails.append(f"rank {r}: combine output differs in {n} elements")
        return fails

    def op_latencies_us(self, evs: list) -> dict[str, list[float]]:
        """Per timed iteration and op, the time from the start barrier to the op's end (us): the
        slowest GPU's, as every rank has finished an op only when the slowest has."""
        lat: dict[str, list[float]] = {"dispatch": [], "combine": []}
        for it in evs:
            for op_i, op in enumerate(("dispatch", "combine")):
                lat[op].append(max(a.elapsed_time(b) for a, b in it[op_i]) * 1000.0)
        return lat

    def layout_note(self, proxy: bool) -> dict[str, int]:
        """The NIC layout rank 0's QP 0 was posted through (for the record's notes)."""
        return dict(self.ext.nic_layout(0, 0, proxy))

    def read_profile(self) -> list[dict]:
        rows = []
        for b in self.bufs:
            n = min(int(b["prof_n"].item()), self.prof_cap)
            if n:
                rows += prof_decode(b["prof"][: n * 8].view(n, 8).cpu().tolist())
        return rows


def _platform_info(torch) -> dict[str, str]:
    import platform as _pf

    drv = ""
    try:
        drv = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.split("\n")[0].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return {"gpu": torch.cuda.get_device_name(0), "nic": "emulated-srd (hw/ep NIC agent on the GPU)",
            "driver": drv, "cuda": str(torch.version.cuda), "torch": torch.__version__, "host": _pf.node()}


def load_ext():
    from lever.hw.build import load_extension

    return load_extension("lever_hw_ep", [HERE / "ep" / "ep_kernels.cu", HERE / "ep" / "binding.cpp"])


def run_variant(runner: Runner, scn, args, levers: list[str], sets: Mapping[str, Any], rid: str,
                platform_info: dict[str, str], unsafe: bool = False) -> dict[str, Any]:
    """Gate, warm-up, timed iterations, profiled pass; returns a validated record dict."""
    fd = kernel_flags(scn, "dispatch", args.path, 0, unsafe)
    fc = kernel_flags(scn, "combine", args.path, 0, unsafe)
    s = runner.shape
    bound = s.tokens * s.top_k + s.num_experts + runner.R
    for fl, op in ((fd, "dispatch"), (fc, "combine")):
        if fl["lazy"] and bound > runner.depth:
            raise EpError(f"lazy completion on {op} refused: up to {bound} WQEs per QP may exceed "
                          f"sq_depth {runner.depth}")
    n_proxy = 0
    if args.path == "proxy":
        n_proxy = runner.proxy_start(max(fd["num_qps"], fc["num_qps"]))
    try:
        return _run_variant(runner, scn, args, levers, sets, rid, platform_info, fd, fc, n_proxy)
    finally:
        if args.path == "proxy":
            runner.proxy_stop()


def _run_variant(runner: Runner, scn, args, levers: list[str], sets: Mapping[str, Any], rid: str,
                 platform_info: dict[str, str], fd: dict, fc: dict, n_proxy: int) -> dict[str, Any]:
    checks = []
    if fd["cached"]:
        # the layout handle: one full dispatch (counts exchanged) before the cached ones
        runner.iteration(dict(fd, cached=0), fc, False)
        runner.sync()
        runner.check_errors()
    # gate pass on poisoned outputs
    runner.poison()
    runner.reset_stats()
    runner.iteration(fd, fc, False)
    runner.sync()
    runner.check_errors()
    fails = runner.gate_check()
    st0 = runner.stats()
    if st0["stamp_bad_dispatch"] or st0["stamp_bad_combine"]:
        fails.append(f"receiver stamps: {st0['stamp_bad_dispatch']} dispatch and "
                     f"{st0['stamp_bad_combine']} combine messages without this epoch's stamp")
    if fails:
        raise EpError("gate failed: " + "; ".join(fails))
    checks += ["dispatch counts, source indices, FP8 payload and scales torch.equal the reference "
               "(poisoned buffers before the gate iteration)",
               "combine output torch.equal the reference (float32 k-order accumulation, BF16 RNE)",
               "receiver-side stamps (epoch, source, token, k) checked in-kernel on every message of every "
               "iteration: 0 bad",
               "signals sent only after the data's send completions (flush) or counted receive completions "
               "(write-imm); a send completion alone never counts as delivery",
               "every poll loop bounded; no timeout, no bad WQE/CQE on any run"]
    for _ in range(args.warmup):
        runner.iteration(fd, fc, False)
    runner.sync()
    runner.check_errors()
    runner.reset_stats()
    evs = [runner.iteration(fd, fc, True) for _ in range(args.iters)]
    runner.sync()
    runner.check_errors()
    st = runner.stats()
    if st["stamp_bad_dispatch"] or st["stamp_bad_combine"]:
        raise EpError(f"gate failed during timing: {st['stamp_bad_dispatch']}/{st['stamp_bad_combine']} "
                      "messages without this epoch's stamp")
    fails = runner.gate_check()  # the last timed iteration's outputs too
    if fails:
        raise EpError("gate failed on the last timed iteration: " + "; ".join(fails))
    lat = runner.op_latencies_us(evs)
    n_it = args.iters
    metrics: dict[str, dict] = {}
    for k in ("packets", "retransmits", "wqes", "doorbells", "fences", "cqes", "rx_cqes", "credit_polls",
              "reordered", "turn_waits", "descriptors", "ring_polls", "drops", "duplicates", "error_cqes",
              "local_puts", "mirrored_wqes"):
        metrics[f"{k}_per_iteration_count"] = {"median": round(st[k] / n_it, 3)}
    if st["packets"]:
        # how far the NIC agent delivers behind (and ahead of) its own schedule: emulator fidelity
        metrics["nic_late_per_packet_ns"] = {"median": round(st["nic_late_ns"] / st["packets"], 1)}
        metrics["nic_early_per_packet_ns"] = {"median": round(st["nic_early_ns"] / st["packets"], 1)}
        # what the lateness is made of: claimed this long after it could be (warps busy), then
        # this long from the claim to visible (the batch's copies and fence)
        metrics["nic_claim_lag_per_packet_ns"] = {"median": round(st["nic_claim_lag_ns"] / st["packets"], 1)}
        metrics["nic_deliver_per_packet_ns"] = {"median": round(st["nic_deliver_ns"] / st["packets"], 1)}
        # and the delivery's parts: the claim scan, the batch's copies, the fence after them
        # (none where the delivering warps did not time them: nic_part_timers = "off")
        if runner.emu.nic_part_timers == "on":
            for part in ("scan", "copy", "fence"):
                metrics[f"nic_{part}_per_packet_ns"] = {"median": round(st[f"nic_{part}_ns"] / st["packets"], 1)}
            # the claim's loads and due mask (the rest of the scan is its CAS rounds); 0 for
            # the table walk, whose loads and claims interleave
            metrics["nic_claim_load_per_packet_ns"] = {
                "median": round(st["nic_claim_load_ns"] / st["packets"], 1)}
    if st["host_passes"]:
        # the NIC's host-facing engine: how many QP mirror copies a pass makes and a WQE needs
        # (several WQEs of one QP rung between two passes share one copy), and what its time
        # costs: a doorbell-read pass, a QP's copy, a CQE pass that wrote (per CQE it wrote)
        metrics["host_passes_per_iteration_count"] = {"median": round(st["host_passes"] / n_it, 3)}
        metrics["host_qp_copies_per_iteration_count"] = {"median": round(st["host_qp_copies"] / n_it, 3)}
        metrics["host_read_per_pass_ns"] = {"median": round(st["host_read_ns"] / st["host_passes"], 1)}
        if st["host_qp_copies"]:
            metrics["host_copy_per_qp_copy_ns"] = {
                "median": round(st["host_copy_ns"] / st["host_qp_copies"], 1)}
        host_cqes = st["cqes"] + st["rx_cqes"]
        if host_cqes:
            metrics["host_cqe_pass_per_cqe_ns"] = {"median": round(st["host_cqe_ns"] / host_cqes, 1)}
        total = st["host_read_ns"] + st["host_copy_ns"] + st["host_cqe_ns"] + st["host_idle_ns"]
        for part in ("read", "copy", "cqe", "idle"):
            metrics[f"host_{part}_share_ratio"] = {"median": round(st[f"host_{part}_ns"] / max(1, total), 4)}
    if args.path == "proxy":
        pst = dict(runner.ext.proxy_stats())
        if pst.get("descriptors"):
            metrics["proxy_post_per_descriptor_ns"] = {"median": round(pst["post_ns"] / pst["descriptors"], 1)}
            metrics["proxy_descriptors_per_batch_count"] = {
                "median": round(pst["descriptors"] / max(1, pst["batches"]), 2)}
        metrics["proxy_threads_count"] = {"median": n_proxy}
    attribution = None
    samples = None
    if args.profile > 0:
        fdp = dict(fd, prof_period=args.profile)
        fcp = dict(fc, prof_period=args.profile)
        runner.reset_stats()
        pevs = [runner.iteration(fdp, fcp, True) for _ in range(args.profile_iters)]
        runner.sync()
        runner.check_errors()
        rows = runner.read_profile()
        metrics.update(post_chain_metrics(rows))
        attribution, samples = {}, 0
        plat = runner.op_latencies_us(pevs)
        for op in ("dispatch", "combine"):
            busy, put, n = prof_attribution(rows, op, args.profile)
            attribution[op] = busy
            samples += n
            for cat, v in put.items():
                metrics[f"{op}_putpath_{cat}_ratio"] = {"median": v}
            pl = sorted(plat[op])
            metrics[f"{op}_profiled_us"] = {"median": pl[len(pl) // 2], "n": len(pl)}
            metrics[f"{op}_profiler_overhead_ratio"] = {
                "median": round(max(0.0, pl[len(pl) // 2] / summarize(lat[op])["median"] - 1.0), 4)}
    gate = {"passed": True, "checks": checks,
            "detail": f"{runner.R} ranks on {runner.G} GPU(s); gate iteration + {args.warmup} warm-up + "
                      f"{args.iters} timed; packets {st['packets']}, dropped {st['drops']} (packets and "
                      f"ACKs), retransmitted {st['retransmits']}, duplicates discarded {st['duplicates']}, "
                      f"landed out of order {st['reordered']}, error CQEs {st['error_cqes']}, local puts "
                      f"{st['local_puts']}"}
    how = {"repetitions": args.iters, "warmup": args.warmup,
           "timer": "CUDA events around each op launch on every GPU after a cross-GPU start barrier; "
                    "per iteration the max over GPUs",
           "notes": f"{runner.nb} EP blocks x {runner.warps} warps per rank, {runner.nic_units} NIC blocks per rank ({runner.nics} NICs); "
                    f"SQ+doorbell in {'write-combined pinned host' if runner.sq_host else 'GPU'} memory, "
                    f"send CQ in {'pinned host' if runner.cq_host else 'GPU'} memory, receive CQs in "
                    f"{'pinned host memory (written by the NIC host engine, polled through PCIe)' if runner.rx_host else 'GPU memory'}; "
                    f"flags dispatch={json.dumps(fd)} combine={json.dumps(fc)}; NIC layout the kernels "
                    f"posted through (rank 0, QP 0; hw/ep/emu_nic.h): "
                    f"{json.dumps(runner.layout_note(args.path == 'proxy'))}"}
    return build_record(rid=rid, path=args.path, ranks=runner.R, gpus=runner.G, levers=levers, sets=sets, hidden=runner.shape.hidden,
                        scn=scn, lat=lat, gate=gate, attribution=attribution, samples=samples,
                        metrics=metrics, how=how, platform_info=platform_info,
                        command="lever hw ep " + " ".join(sys.argv[3:] if len(sys.argv) > 3 else []),
                        provenance=getattr(args, "provenance", None), emu=runner.emu, faults=runner.faults,
                        sq="host" if runner.sq_host else "device", cq="host" if runner.cq_host else "device",
                        rxcq="host" if runner.rx_host else "device")


def post_chain_metrics(rows: list[dict]) -> dict[str, dict]:
    """The primitive chain as the EP kernels pay it, from the sampled post groups: per WQE
    the stores + fence + doorbell (native) or descriptor stores + fence (proxy), and the credit
    check (CQ polls before a post); compared with ``lever hw primitives`` (wqe_fence_doorbell_*,
    pcie_read_rtt_ns / cq_seen_*)."""
    out: dict[str, dict] = {}
    for op in ("dispatch", "combine"):
        puts = [r for r in rows if r["kind"] == "put" and r["op"] == op and r["n"] > 0]
        n = sum(r["n"] for r in puts)
        if not n:
            continue
        chain = sum(r["wqe"] + r["fence"] + r.get("doorbell", 0) for r in puts)
        out[f"{op}_post_chain_per_wqe_ns"] = {"median": round(chain / n, 1), "n": len(puts)}
        single = [r for r in puts if r["n"] == 1]
        if single:  # B = 1 groups: one WQE, one fence, one doorbell (the primitive's shape)
            vals = sorted(r["wqe"] + r["fence"] + r.get("doorbell", 0) for r in single)
            out[f"{op}_post_chain_b1_ns"] = {"median": float(vals[len(vals) // 2]), "n": len(vals)}
        credit = [r["credit_wait"] for r in puts if r["credit_wait"] > 0]
        if credit:
            out[f"{op}_credit_check_per_wqe_ns"] = {"median": round(sum(credit) / n, 1), "n": len(credit)}
        polls = sum(r.get("polls", 0) for r in puts)
        if polls:  # how the credit time splits: reads per WQE, and the time of one read
            out[f"{op}_credit_reads_per_wqe_count"] = {"median": round(polls / n, 3), "n": len(puts)}
            out[f"{op}_credit_read_ns"] = {"median": round(sum(credit) / polls, 1), "n": polls}
        # the same split by QP: QP 0 (the notify QP where it is kept: every warp's count and flag
        # writes) against the data QPs, so a queue of many warps on one CQ shows where it is
        for tag, keep in (("qp0", lambda q: q == 0), ("dataqps", lambda q: q != 0)):
            sel = [r for r in puts if keep(r.get("qp", 0))]
            sp = sum(r.get("polls", 0) for r in sel)
            if sp:
                out[f"{op}_credit_read_{tag}_ns"] = {
                    "median": round(sum(r["credit_wait"] for r in sel) / sp, 1), "n": sp}
                out[f"{op}_wqes_{tag}_count"] = {"median": float(sum(r["n"] for r in sel)), "n": len(sel)}
    return out


def write_outcome(path: Path, outcomes: list[dict[str, Any]], args, emu, sq: str, cq: str, rc: int,
                  rxcq: str = "host") -> None:
    """Every variant's outcome as one JSON file (a failed gate writes no record: this file is
    what a negative control leaves, and what a CPU test checks once it is committed)."""
    doc = {"kind": "lever-hw-ep-outcome", "command": "lever hw ep " + " ".join(sys.argv[3:]),
           "exit_code": rc, "unsafe_ordered": bool(args.unsafe_ordered), "faults": bool(args.faults),
           "path": args.path, "sq": sq, "cq": cq, "rxcq": rxcq, "emulated_nic": emu.record(args.faults, sq, cq, rxcq),
           "provenance": dict(getattr(args, "provenance", None) or {}), "variants": outcomes}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)


def run_options(args: argparse.Namespace):
    """What V1's and V2's runs take from the command line alike: the lever sets to run (one,
    or ``--variants``, with the output they need), the ``--set`` overrides (no platform
    field: the emulator has its own file), the emulator's values with ``--emu-set``, the
    queue placement (send queue, send CQ, receive CQs) and the loss probability of this run."""
    from lever.hw import emulated_nic
    from lever.sim.scenario import parse_sets

    variants = [args.lever]
    if args.variants:
        variants = list(dict.fromkeys(v.strip() for v in args.variants.split(";")))
    if args.variants and not args.out_dir:
        raise UserError("--variants needs --out-dir")
    if not args.variants and not args.out:
        raise UserError("--out RECORD is required")
    extra = parse_sets(args.set)
    refuse_platform_sets(extra)
    emu = emulated_nic.load(overrides=emulated_nic.parse_emu_sets(args.emu_set))
    sq, cq, rxcq = args.sq or emu.sq, args.cq or emu.cq, getattr(args, "rxcq", "") or emu.rxcq
    return variants, extra, emu, (sq, cq, rxcq), emu.loss(args.faults)


def generation_tag(emu, path: str, v2: bool = False) -> str:
    """The record id's mark of the device generation the emulated NIC played, where it is not
    v59's: ``-wqe128`` (128-byte WQEs, inline writes of up to ``inline_write_bytes``: rdma-core
    v63), ``-cntr`` (send credit from a completion counter, after v64: the native path of V1 only;
    the proxy's host threads and V2's per-slot flushes read the CQ)."""
    tag = "-wqe128" if int(emu.wqe_size_bytes) == 128 else ""
    if emu.send_completions == "counter" and path == "native" and not v2:
        tag += "-cntr"
    return tag


def generation_overrides(emu, path: str) -> dict[str, Any]:
    """What the model must be told of the generation: a send completion counter is the model's
    ``nic.hw_counters`` (a counter the GPU reads in its own memory). The 128-byte WQE is not
    told: the model's ``NativePort.wqe_blocks`` costs a non-inline write one 64-byte block and
    an inline one by its payload, where these kernels write every WQE of a 128-byte ring whole
    (as the provider's LLQ copy does); such records carry ``-wqe128`` and their
    ``what.emulated_fabric`` says so."""
    if emu.send_completions == "counter" and path == "native":
        return {"platform.nic.hw_counters": True}
    return {}


def placement_tag(sq: str, cq: str, rxcq: str, path: str) -> str:
    """The record id's mark of queues placed away from the default (host memory everywhere,
    as on p5/p5en): ``-sqdev-cqhos`` for the native send queue and CQ, ``-rxdev`` for the
    receive CQs (any path)."""
    tag = "" if (sq, cq) == ("host", "host") or path == "proxy" else f"-sq{sq[:3]}-cq{cq[:3]}"
    return tag + ("-rxdev" if rxcq == "device" else "")


def main(args: argparse.Namespace) -> int:
    from lever.calibration.records import RecordError, dump_record, parse_record
    from lever.hw.device import require_cuda

    if args.nic == "efa":  # one rank per process over a real device: hw/efa/ep_run.py
        from lever.hw.efa.ep_run import main_efa

        return main_efa(args)
    for flag, on in (("--efa-inline-write", getattr(args, "efa_inline_write", False)),
                     ("--efa-counters", getattr(args, "efa_counters", False))):
        if on:
            raise UserError(f"{flag}: an EFA option (--nic efa); the emulated NIC plays that generation with "
                            "--emu-set wqe_size_bytes=128 --emu-set inline_write_bytes=80 / "
                            "--emu-set send_completions=counter")
    if getattr(args, "protocol", "v1-ll") != "v1-ll":
        from lever.hw.ep_v2 import main_v2

        return main_v2(args)
    torch = require_cuda()
    args.provenance = run_provenance(args.allow_dirty)
    if args.iters < 1 or args.warmup < 0:
        raise UserError("--iters must be >= 1 and --warmup >= 0")
    ngpu = torch.cuda.device_count()
    gpus = args.gpus or min(args.ranks, ngpu)
    if gpus > ngpu or args.ranks % gpus:
        raise UserError(f"--ranks {args.ranks} over --gpus {gpus}: needs a multiple of the GPUs "
                        f"({ngpu} visible)")
    variants, extra, emu, (sq, cq, rxcq), loss = run_options(args)
    outcomes: list[dict[str, Any]] = []
    try:
        base = load_scenario(args.ranks, args.faults, extra, [], args.path, loss)
        shape = Shape(num_ranks=args.ranks, tokens=base.workload.tokens_per_rank,
                      top_k=base.workload.top_k, num_experts=base.workload.num_experts)
        shape.check()
        ext = load_ext()
        runner = Runner(torch, ext, shape, args.ranks, gpus, base, args.seed, args.num_sms, args.timeout_ms,
                        args.path, args.proxy_threads, emu=emu, sq=sq, cq=cq, faults=args.faults, rxcq=rxcq)
        info = _platform_info(torch)
        rc = 0
        place = placement_tag(sq, cq, rxcq, args.path) + generation_tag(emu, args.path)
        for v in variants:
            levers = [x for x in v.split(",") if x]
            scn = load_scenario(args.ranks, args.faults, extra, levers, args.path, loss)
            runner.rebuild(scn, args.seed)
            runner.reset_state()
            sets = scenario_overrides(args.ranks, args.faults, extra, args.path, loss)
            if args.path == "proxy":  # the host threads that ran: the model's proxy.threads
                sets["platform.proxy.threads"] = runner.proxy_threads
            sets.update(run_shape_overrides(args.num_sms, cq, emu.nics_per_rank, base, rxcq))
            sets.update(generation_overrides(emu, args.path))
            tag = "-".join(levers) if levers else "baseline"
            rid = f"{args.id_prefix}{args.ranks}-{args.path}{place}-{tag}{'-faults' if args.faults else ''}"
            try:
                rec = run_variant(runner, scn, args, levers, sets, rid, info, args.unsafe_ordered)
            except EpError as e:
                print(f"lever: variant {tag}: {e}", file=sys.stderr)
                outcomes.append({"id": rid, "passed": False, "error": str(e)})
                rc = 1
                continue
            out = Path(args.out_dir) / f"{rid}.json" if args.variants else Path(args.out)
            dump_record(parse_record(rec, rid), out)
            outcomes.append({"id": rid, "passed": True, "record": out.name,
                             "dispatch_us": rec["latency_us"]["dispatch"]["median"],
                             "combine_us": rec["latency_us"]["combine"]["median"]})
            lat = rec["latency_us"]
            print(f"{rid}: dispatch {lat['dispatch']['median']:.1f} us (p10 {lat['dispatch']['p10']:.1f}, "
                  f"p90 {lat['dispatch']['p90']:.1f}), combine {lat['combine']['median']:.1f} us -> {out}")
        if args.outcome:
            write_outcome(Path(args.outcome), outcomes, args, emu, sq, cq, rc, rxcq)
        return rc
    except EpError as e:
        raise UserError(str(e)) from None
    except RecordError:
        raise
