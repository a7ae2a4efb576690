"""Validated parameters of the model: platform, workload and design.

Every quantity carries its unit in its name (``_ns``, ``_us``, ``_gbps``,
``_bytes``). A scenario is the composition of one of each; ``sim.scenario``
loads them from TOML files and reports bad input by file and field.

The platform is split along the physical pieces so a reader finds the
doorbell cost where the doorbell is: ``gpu`` (issuing warps and pollers),
``nic``, ``fabric``, ``receiver``, ``proxy`` (host threads), ``nvlink``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

CATEGORIES: tuple[str, ...] = (
    "wqe",
    "fence",
    "doorbell",
    "lock",
    "credit_wait",
    "proxy_queue",
    "proxy_post",
    "nic",
    "wire",
    "visibility",
    "poll_wait",
    "forward",
    "signal",
    "compute",
)
"""Attribution categories shared by ``sim`` and ``hw`` (docs/attributions.md).

``lock`` (waiting for a shared send queue or for its doorbell turn) and
``compute`` (token packing/reduction on the GPU) were added to the design's
list; names are stable once records use them.
"""


class Strict(BaseModel):
    """Base: unknown keys and non-finite numbers are errors, assignment is validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class GpuParams(Strict):
    """Costs paid by one issuing warp on the GPU (H200 microbenchmarks, campaign table)."""

    wqe_store_ns: float = Field(50.0, ge=0, description="64 B WQE as 8 posted MMIO stores")
    wqe_build_ns: float = Field(
        0.0, ge=0, description="building one WQE before its stores: the warp's dependent loads "
        "of the peer's address handle, keys and addresses from GPU memory (0: the words are "
        "already in registers, as in the store primitives)")
    fence_ns: float = Field(1400.0, ge=0, description="__threadfence_system after MMIO/host stores")
    doorbell_ns: float = Field(10.0, ge=0, description="one 32-bit posted MMIO store")
    pcie_read_ns: float = Field(1200.0, ge=0, description="dependent load from host memory / BAR")
    device_load_ns: float = Field(150.0, ge=0, description="dependent load, device memory")
    atomic_ns: float = Field(600.0, ge=0, description="device-scope atomic round trip (slot reservation, lock)")
    token_prep_ns: float = Field(200.0, ge=0, description="per-token pack/cast work of a warp before its put")
    reduce_ns_per_kib: float = Field(
        8.0, ge=0, description="one warp reducing BF16 rows: ns per KiB of input rows it reads "
        "(its loads are latency-bound; a reduction spread over W warps takes 1/W of it)")
    hbm_gbytes_per_s: float = Field(
        3350.0, gt=0, description="device-memory bandwidth: a reduction spread over many warps "
        "still reads every input row once, so it takes at least its bytes over this")
    poll_interval_ns: float = Field(200.0, ge=0, description="time between two polls of a spinning warp")
    completion_counter_in_device_memory: bool = Field(
        True, description="NIC writes its completion counter into GPU memory (else polled over PCIe)"
    )
    host_read_line_ns: float = Field(
        0.0, ge=0, description="the GPU's read path to host memory: ns per line requested (reads "
        "of many warps at once queue on it; 0: they never queue)")
    turn_release_ns: float | None = Field(
        None, ge=0, description="the system fence after a doorbell store, inside the QP's turn or "
        "lock: the release that orders the doorbell before the next warp's (hw/ep turn_pass: "
        "st.release.sys after a one-word store, no WQE stores of its own to drain); also what a "
        "warp that hands the turn on without ringing pays. None: gpu.fence_ns")
    fence_gpu_ns: float = Field(
        250.0, ge=0, description="a GPU-scope fence (__threadfence) after WQE stores: orders them "
        "before a hand-off to another warp of the GPU, not before the NIC sees them")
    fence_waits_host_reads: bool = Field(
        False, description="a system fence completes only once the host-memory reads this GPU "
        "has in flight when it issues are back (the fence's flush is ordered behind them), so "
        "fences slow down as credit polls of a host-memory CQ do")
    release_waits_host_reads: bool = Field(
        False, description="with fence_waits_host_reads: the release of a doorbell turn at "
        "system scope (the fence after the doorbell, hw/ep turn_pass: st.release.sys) waits for "
        "the host reads in flight too, inside the turn (measured: turn_handoff primitives, "
        "calibration/data/testbed/h100-6d9061d); on for the emulated NIC's platform (its joint fit's "
        "cost falls 2306 -> 1661 with nic.host_reads_in_flight), off on EFA and IB, whose "
        "records do not isolate it (README, Out-of-sample drift)")


class NicParams(Strict):
    """The EFA device (or ConnectX for the IB reference)."""

    nics_per_gpu: int = Field(4, ge=1)
    line_rate_gbps: float = Field(100.0, gt=0, description="per NIC")
    mtu_bytes: int = Field(8928, ge=256)
    wqe_process_ns: float = Field(300.0, ge=0, description="per-WQE fetch/parse by the NIC")
    doorbell_process_ns: float = Field(
        0.0, ge=0, description="per-doorbell NIC work (read the producer index, start a fetch "
        "of the new WQEs): amortised over a doorbell batch")
    max_msg_rate_mops: float = Field(10.0, gt=0, description="per-NIC message rate ceiling, M WQE/s")
    dma_read_ns: float = Field(900.0, ge=0, description="PCIe latency to start fetching the payload")
    dma_gbps: float = Field(400.0, gt=0, description="payload DMA bandwidth per NIC")
    sq_depth: int = Field(4096, ge=1, description="send-queue entries per QP")
    max_batch: int = Field(16, ge=1, description="doorbell must be rung at least every max_batch WQEs")
    completion_ns: float = Field(300.0, ge=0, description="CQE/counter write after the last ACK")
    host_engine: bool = Field(
        False, description="the NIC's host-memory work (reading the doorbell and mirroring new "
        "WQEs from a host-memory SQ: doorbell_process_ns; writing CQEs into host-memory CQs: "
        "host_cqe_write_ns) runs on an engine of its own, apart from the one parsing WQEs "
        "(the emulated NIC: a host-engine warp per NIC block, ep_kernels.cu nic_warp)")
    host_doorbell_read_ns: float = Field(
        0.0, ge=0, description="a pass of the host engine (nic.host_engine) over the doorbells it "
        "serves: one read of each host-memory doorbell, all at once (the emulated NIC's lanes, one "
        "PCIe round trip). A pass copies the new WQEs of every QP whose doorbell moved since the "
        "last: doorbells rung on one QP before the pass reads them share its copy. With this or "
        "host_mirror_copy_ns above 0 the host engine works in passes and doorbell_process_ns "
        "must be 0")
    host_mirror_copy_ns: float = Field(
        0.0, ge=0, description="the host engine copying the new WQEs of one QP whose doorbell a "
        "pass found moved into its device mirror (PCIe reads of the WQEs, a fence, the mirror's "
        "doorbell): once per moved QP per pass, however many WQEs were rung on it")
    host_mirror_copy_per_wqe_ns: float = Field(
        0.0, ge=0, description="a host-engine copy's further cost for each WQE it carries (its "
        "PCIe reads of the WQE): a copy of k WQEs costs host_mirror_copy_ns + k x this")
    host_reads_in_flight: bool = Field(
        False, description="the host engine's doorbell reads and WQE copies are host reads in "
        "flight of its GPU (it is warps of that GPU), so the GPU's system fences wait for them "
        "(with gpu.fence_waits_host_reads); on for the emulated NIC's platform, whose host "
        "engine this is (README, Out-of-sample drift)")
    host_cqes_per_pass: int = Field(
        2, ge=1, description="CQEs the host engine writes per turn of its loop at most, between "
        "two doorbell passes (the emulated NIC's claim batch, hw/emulated_nic.toml "
        "deliver_batch_count); only where it works in passes")
    host_cqe_write_ns: float = Field(
        0.0, ge=0, description="engine time per CQE the NIC writes into a CQ in host memory, "
        "send and receive alike, on its host engine (nic.host_engine), else on the serial engine "
        "that parses its WQEs (the emulated NIC's host-engine warp: a system-scope atomic on the "
        "CQ tail and a 16-byte store over PCIe); 0: CQE writes are DMA off the engine's path (a "
        "real NIC)")
    deliver_warps: int = Field(
        0, ge=0, description="warps of the sending NIC that land its packets, each claiming, "
        "copying and fencing a batch of due packets at a time (the emulated NIC: the NIC "
        "block's warps other than its host engine and WQE fetcher, sim/nic_delivery.py); 0: "
        "packets land by DMA as they arrive (a real NIC)")
    deliver_batch_count: int = Field(
        2, ge=1, description="due packets a delivering warp claims at once (nic.deliver_warps)")
    deliver_lead_ns: float = Field(
        0.0, ge=0, description="a delivering warp claims a packet this long before it is due")
    deliver_claim_ns: float = Field(
        0.0, ge=0, description="a delivering warp's claim of a batch: its walk of the packet table")
    deliver_copy_round_ns: float = Field(
        0.0, ge=0, description="a delivering warp's copy: one round of loads and stores of "
        "deliver_copy_round_bytes (a packet takes at least one)")
    deliver_copy_round_bytes: int = Field(
        8192, ge=16, description="bytes a delivering warp has in flight per round of its copy")
    deliver_fence_ns: float = Field(
        0.0, ge=0, description="the fence after a batch's copies, before its packets count as landed")
    inline_bytes: int = Field(32, ge=0, description="largest payload written inline into the WQE")
    wqe_meta_bytes: int = Field(
        32, ge=0, description="WQE descriptor before any inline data (EFA: efa_io_tx_meta_desc); "
        "a WQE is 64 B blocks: one, or more when inline data does not fit beside the descriptor")
    cq_shared_read_ns: float = Field(
        0.0, ge=0, description="polls of one host-memory CQ by several warps are served one "
        "after another, this far apart: each poll of the CQ waits until the one before it has "
        "been served (0: polls of one CQ overlap). Only where the GPU reads the CQ over PCIe")
    hw_counters: bool = Field(
        False, description="the device has completion counters (EFA on p5en and newer): a local "
        "completion counter and a remote-write counter that ticks once per inbound write")
    unsolicited_write_recv: bool = Field(
        False, description="a write-with-immediate consumes no posted receive (EFA capability, "
        "rdma-core 52+); without it every one consumes a receive WR the target must repost")
    header_bytes: int = Field(
        64, ge=0, description="per-packet wire overhead (SRD/transport headers and framing), "
        "serialised with the payload at egress and ingress")

    @property
    def host_passes(self) -> bool:
        """Whether the host engine reads doorbells in passes (host_doorbell_read_ns,
        host_mirror_copy_ns) instead of paying doorbell_process_ns per doorbell."""
        return self.host_engine and (self.host_doorbell_read_ns > 0 or self.host_mirror_copy_ns > 0)

    @model_validator(mode="after")
    def _one_doorbell_price(self) -> NicParams:
        if (self.host_doorbell_read_ns > 0 or self.host_mirror_copy_ns > 0) and not self.host_engine:
            raise ValueError("host_doorbell_read_ns and host_mirror_copy_ns price the host engine's "
                             "passes: they need host_engine = true")
        if self.host_passes and self.doorbell_process_ns > 0:
            raise ValueError("doorbell_process_ns must be 0 where the host engine reads doorbells "
                             "in passes (host_doorbell_read_ns, host_mirror_copy_ns price them)")
        return self


class JitterParams(Strict):
    """Per-packet latency added on top of a path's base latency."""

    distribution: Literal["none", "exponential", "lognormal", "gamma"] = "lognormal"
    mean_ns: float = Field(800.0, ge=0)
    sigma: float = Field(0.6, ge=0, description="lognormal shape / gamma 1/sqrt(k)")


class FabricParams(Strict):
    """SRD multipath (EFA) or RC single path in order (InfiniBand)."""

    mode: Literal["srd", "rc"] = "srd"
    paths: int = Field(16, ge=1, description="SRD paths a packet is sprayed over")
    base_latency_ns: float = Field(6000.0, ge=0, description="one-way, mean over paths")
    path_spread_ns: float = Field(1500.0, ge=0, description="paths' base latencies spread uniformly ±")
    jitter: JitterParams = Field(default_factory=JitterParams)
    loss_prob: float = Field(0.0, ge=0, le=0.5)
    retransmit_timeout_ns: float = Field(50000.0, ge=0)


class ReceiverParams(Strict):
    """Landing side: DMA writes, visibility to pollers, receive completions."""

    land_ns: float = Field(400.0, ge=0, description="PCIe write of a packet into GPU memory")
    visibility_ns: float = Field(700.0, ge=0, description="landed until visible to a polling SM")
    recv_completion_ns: float = Field(500.0, ge=0, description="receive CQE generation (write-imm)")
    cq_poll_ns: float = Field(
        300.0, ge=0, description="GPU work per receive CQE consumed (parse it, advance the "
        "consumer index), on top of the read of the CQ line it sits in")
    cqe_bytes: int = Field(32, ge=1, le=64, description="receive CQE size; a 64 B line holds 64 / this")
    rq_repost_ns: float = Field(
        100.0, ge=0, description="reposting one receive WR (a 16 B RQ entry and its doorbell) after "
        "a write-with-immediate consumed it, unless the QP has unsolicited write receive")
    recv_cq_in_device_memory: bool | None = Field(
        None, description="where the receive CQs of write-with-immediate sit: GPU memory (a read is "
        "a device load) or host memory polled through PCIe (p5/p5en, the testbed's default); None: "
        "where the send completions sit (gpu.completion_counter_in_device_memory)")


class ProxyParams(Strict):
    """CPU proxy: descriptor rings in pinned host memory, host progress threads."""

    threads: int = Field(1, ge=1)
    ring_depth: int = Field(32, ge=1, description="descriptors per (context, peer) queue")
    descriptor_store_ns: float = Field(60.0, ge=0, description="128 B descriptor to pinned memory")
    gpu_to_host_ns: float = Field(1000.0, ge=0, description="descriptor stored+fenced until host sees it")
    host_poll_ns: float = Field(100.0, ge=0, description="one host poll of one ring")
    host_post_ns: float = Field(900.0, ge=0, description="provider post of one write (fi_writemsg)")
    host_cq_poll_ns: float = Field(250.0, ge=0, description="host CQ read per completion")
    host_to_gpu_ns: float = Field(1000.0, ge=0, description="progress written until GPU sees it")
    stripe_rails: int = Field(
        4, ge=1, description="aws-ofi-nccl stripes one put over up to this many rails (NICs)"
    )
    stripe_min_bytes: int = Field(
        8192, ge=1, description="a put is cut in ceil(bytes / this) stripes, at most stripe_rails"
    )
    stripe_post_ns: float = Field(
        300.0, ge=0, description="host cost of each further stripe of one put (posted back to back)"
    )


class NvlinkParams(Strict):
    """Intra-node GPU-to-GPU: flags and copies (2x H200 measurements)."""

    flag_latency_ns: float = Field(615.0, ge=0, description="one-way; 1.23 us round trip measured")
    gbytes_per_s: float = Field(390.0, gt=0)
    self_copy_loads_in_flight: int = Field(
        0, ge=0, le=64, description="a put to the rank itself: 0, it rides the GPU's NVLink port "
        "like a peer's copy; N, the issuing warp copies it N 16-byte loads per lane at a time "
        "(steps of 512 x N bytes, each a dependent device load, gpu.device_load_ns), then a "
        "GPU-scope fence (gpu.fence_gpu_ns): hw/ep local_put's loop is 1")
    self_copy_step_ns: float | None = Field(
        None, ge=0, description="one step of that loop (its loads, then its stores issued), "
        "ns. None: gpu.device_load_ns, the unloaded dependent L2 load")


class Prior(Strict):
    """Log-normal prior on a free parameter: centre and relative width."""

    value: float
    rel_sigma: float = Field(0.5, gt=0)


class FreeParam(Strict):
    """A parameter calibration may move, within bounds."""

    lo: float = Field(gt=0)
    hi: float = Field(gt=0)
    prior: Prior | None = None

    @model_validator(mode="after")
    def _ordered(self) -> FreeParam:
        if not self.lo < self.hi:
            raise ValueError(f"lo ({self.lo}) must be below hi ({self.hi})")
        return self


class Calibrated(Strict):
    """What calibration wrote: estimates, covariance in log space, provenance."""

    names: list[str]
    log_mean: list[float]
    log_cov: list[list[float]]
    records: dict[str, str] = Field(default_factory=dict, description="record id -> sha256")
    date: str = ""
    git_rev: str = ""
    cost: float | None = None
    unidentifiable: list[str] = Field(default_factory=list)
    shared: list[str] = Field(default_factory=list, description="of ``names``, those a joint fit "
                              "tied across every platform of the GPU class (one value for all)")
    delta_discrepancy_us: float | None = Field(
        None, ge=0, description="the fit's typical miss on the lever deltas among its records "
        "(us, a normal's sd: lever.calibration.validate.delta_discrepancy); lever predict widens "
        "its bands by it, the model's own error, which parameter draws can not show")


SourceKind = Literal["measured", "published", "fitted", "assumed"]
"""Where a parameter's value comes from (docs/physics.md, "Parameter sources"):

- ``measured``: a primitive record of this project (``ref`` names the record and metric);
- ``published``: a public document (``ref`` names it: instance docs, a provider header);
- ``fitted``: written by ``lever calibrate`` (``ref`` names the records), inside a prior
  range that cites why;
- ``assumed``: a first value with no measurement or document behind it; ``rel_sigma`` says
  how far off it may be. Records that do not constrain it leave it there, and say so.

Whether a value is *shared* (one value for every platform of the same GPU class) is not a
kind: it is where the value is set, a ``scenarios/gpus/`` fragment the platform includes.
"""


class ParamSource(Strict):
    """The provenance of one parameter's value: kind, reference, 1-sigma relative uncertainty."""

    kind: SourceKind
    ref: str = Field(min_length=1, description="record id and metric, document, or why")
    rel_sigma: float | None = Field(
        None, gt=0, description="1-sigma relative uncertainty of the value (log scale)"
    )


class Platform(Strict):
    """The hardware: what a calibration fits."""

    name: str = "unnamed"
    description: str = ""
    nic_kind: Literal["efa", "ib", "emulated-srd", "any"] = Field(
        "any", description="the NIC of the records this platform may be calibrated on"
    )
    gpu_class: str = Field(
        "", description="GPUs of one class share their GPU-side costs (scenarios/gpus/CLASS.toml)"
    )
    gpu: GpuParams = Field(default_factory=GpuParams)
    nic: NicParams = Field(default_factory=NicParams)
    fabric: FabricParams = Field(default_factory=FabricParams)
    receiver: ReceiverParams = Field(default_factory=ReceiverParams)
    proxy: ProxyParams = Field(default_factory=ProxyParams)
    nvlink: NvlinkParams = Field(default_factory=NvlinkParams)
    free: dict[str, FreeParam] = Field(
        default_factory=dict, description="dotted path (e.g. gpu.fence_ns) -> bounds/prior"
    )
    sources: dict[str, ParamSource] = Field(
        default_factory=dict, description="dotted path -> where its value comes from"
    )
    calibrated: Calibrated | None = None

    @model_validator(mode="after")
    def _paths(self) -> Platform:
        for path in self.free:
            if parameter_value(self, path) is None:
                raise ValueError(f"free: '{path}' is not a numeric platform parameter")
        for path in self.sources:
            if not has_parameter(self, path):
                raise ValueError(f"sources: '{path}' is not a platform parameter")
        return self

    @property
    def send_completions_in_device_memory(self) -> bool:
        """The send completions a credit poll reads are in GPU memory: the NIC writes its
        counter or CQ there, or the device has completion counters (else: host memory, PCIe)."""
        return self.gpu.completion_counter_in_device_memory or self.nic.hw_counters

    @property
    def recv_cq_in_device_memory(self) -> bool:
        """Where the receive CQs sit: ``receiver.recv_cq_in_device_memory``, else where the
        NIC writes the send completions (``gpu.completion_counter_in_device_memory``)."""
        v = self.receiver.recv_cq_in_device_memory
        return self.gpu.completion_counter_in_device_memory if v is None else v

    def numeric_parameters(self) -> dict[str, float]:
        """Every numeric parameter by dotted path (``gpu.fence_ns`` -> value)."""
        out: dict[str, float] = {}
        for part in PLATFORM_PARTS:
            sub = getattr(self, part)
            for name, v in sub:
                if isinstance(v, BaseModel):
                    for n2, v2 in v:
                        if _is_number(v2):
                            out[f"{part}.{name}.{n2}"] = float(v2)
                elif _is_number(v):
                    out[f"{part}.{name}"] = float(v)
        return out


PLATFORM_PARTS: tuple[str, ...] = ("gpu", "nic", "fabric", "receiver", "proxy", "nvlink")
"""The physical pieces of a platform, in the order tables list them."""


def _is_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _leaf(plat: Platform, path: str) -> tuple[bool, object]:
    obj: object = plat
    keys = path.split(".")
    if keys[0] not in PLATFORM_PARTS:
        return False, None
    for k in keys:
        if not isinstance(obj, BaseModel) or k not in type(obj).model_fields:
            return False, None
        obj = getattr(obj, k)
    return not isinstance(obj, BaseModel), obj


def has_parameter(plat: Platform, path: str) -> bool:
    """Whether a dotted path names a parameter (a number, flag or choice) of the platform."""
    return _leaf(plat, path)[0]


def parameter_value(plat: Platform, path: str) -> float | None:
    """The numeric value at a dotted path (``gpu.fence_ns``), or None if there is none."""
    ok, obj = _leaf(plat, path)
    return float(obj) if ok and _is_number(obj) else None


class Workload(Strict):
    """The MoE layer at decode shape (docs/physics.md)."""

    name: str = "decode"
    ep_ranks: int = Field(16, ge=2)
    gpus_per_node: int = Field(8, ge=1)
    tokens_per_rank: int = Field(128, ge=1)
    top_k: int = Field(8, ge=1)
    num_experts: int = Field(256, ge=1)
    dispatch_bytes_per_token: int = Field(
        7504, ge=1, description="FP8 hidden 7168 + scales 224 + metadata 112, 16 B aligned"
    )
    combine_bytes_per_token: int = Field(14400, ge=1, description="BF16 hidden + top-k weights")
    routing: Literal["uniform", "file"] = "uniform"
    routing_file: str | None = None
    routing_seed_offset: int = Field(0, ge=0)

    @model_validator(mode="after")
    def _shape(self) -> Workload:
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k ({self.top_k}) exceeds num_experts ({self.num_experts})")
        if self.ep_ranks % self.gpus_per_node and self.ep_ranks > self.gpus_per_node:
            raise ValueError(
                f"ep_ranks ({self.ep_ranks}) must be a multiple of gpus_per_node ({self.gpus_per_node})"
            )
        if self.routing == "file" and not self.routing_file:
            raise ValueError("routing = 'file' needs routing_file")
        return self

    @property
    def ranks_per_node(self) -> int:
        return min(self.gpus_per_node, self.ep_ranks)


SignalMode = Literal["ordered", "flush", "imm-counting", "hw-counter", "unordered-counting"]


class ProxyDesign(Strict):
    """Which host proxy a proxy-path design runs, and how it is laid out (``[design.proxy]``).

    The proxy is software, so its shape belongs to the design; the CPU's costs stay the
    platform's (``platform.proxy``). ``gin-ofi`` is NCCL GIN's proxy over aws-ofi-nccl (the
    campaign's, ``sim/proxy.py``); ``uccl`` is UCCL-EP's (``sim/proxy_uccl.py``);
    ``pplx-worker`` is pplx-garden's fabric-lib worker (``sim/worker.py``, protocol
    ``pplx-a2a``)."""

    kind: Literal["gin-ofi", "uccl", "pplx-worker"] = Field(
        "gin-ofi", description="gin-ofi: NCCL GIN proxy + aws-ofi-nccl (rail striping); uccl: "
        "UCCL-EP proxy threads with FIFO channels; pplx-worker: pplx-garden's CPU worker")
    threads: int | None = Field(
        None, ge=1, description="host proxy threads per GPU, each with its own channels and "
        "queue pairs on both the send and the receive side (None: platform.proxy.threads)")
    channels_per_thread: int = Field(
        1, ge=1, description="uccl: command FIFOs (channels) each proxy thread polls")
    inflight_per_channel: int = Field(
        32, ge=1, description="uccl: commands of one FIFO posted but not yet completed, at most")
    drain_rings: bool = Field(
        False, description="gin-ofi: a host thread's pass takes every visible descriptor of a "
        "ring, writes their WQEs and rings each QP's doorbell once for them (the testbed's proxy "
        "thread, hw/ep/proxy_host.h post(); 1.8-2.4 descriptors a doorbell measured); False: one "
        "descriptor per ring per pass, a doorbell each (NCCL GIN's proxy progress)")


class Design(Strict):
    """How the kernels use the hardware: the thing a lever changes."""

    name: str = "baseline"
    path: Literal["native", "proxy"] = "native"
    protocol: Literal["v1-ll", "v2-direct", "v2-hybrid", "pplx-a2a"] = "v2-hybrid"
    cached: bool = Field(False, description="reuse the layout handle: no notify/count exchange")
    signal_mode_with_counters: SignalMode | None = Field(
        None, description="the signalling the design uses instead on a NIC with completion "
        "counters (NCCL GIN EFA-GDA: hw-counter on p5en and newer); None: signal_mode everywhere")
    signal_mode: SignalMode = Field(
        "flush",
        description=(
            "ordered: RC/strong signal right after data; flush: wait for the data's send "
            "completions then signal; imm-counting: write-with-immediate, receiver counts "
            "receive completions; hw-counter: NIC completion counters at the target; "
            "unordered-counting: in-band sub-part headers + weak SignalAdd"
        ),
    )
    num_sms: int = Field(24, ge=1, description="SMs (CTAs) the kernel runs on")
    warps_per_sm: int = Field(4, ge=1, description="data (scale-out) warps per SM = channels per SM")
    forward_warps_per_sm: int = Field(4, ge=0, description="hybrid: forward warps per SM")
    qps_allocated: int = Field(17, ge=1)
    qps_per_call: int = Field(9, ge=1, description="data QPs used per call (min(num_sms, 9) in V2)")
    notify_qp_reserved: bool = Field(True, description="QP 0 kept for notify warps")
    qp_ownership: Literal["shared-lock", "owned"] = "shared-lock"
    doorbell_batch: int = Field(1, ge=1, description="ring the doorbell every B WQEs")
    deferred_doorbell_aggregation: int = Field(
        1, ge=1, description="aggregate doorbells (and fences) across this many warps"
    )
    aggregation_turn: Literal["ringer", "every-post"] = Field(
        "ringer", description="deferred doorbell aggregation: only the warp that rings the QP's "
        "pool takes the doorbell turn (ringer), or every post group waits for the turn in slot "
        "order after a GPU-scope fence, and the ringer's system fence and doorbell are paid "
        "inside the turn (every-post: hw/ep's kernels)")
    fences_per_doorbell: int = Field(
        2, ge=0, description="system fences per doorbell: after the WQE stores and after the doorbell"
    )
    put_many_span: int = Field(1, ge=1, description="reserve this many SQ slots at once")
    credit_read_lines: int = Field(
        1, ge=1, description="lines (CQEs) one credit poll of the send CQ reads at once: the "
        "kernel's choice, not the GPU's (hw/ep cq_poll: the warp's 32 lanes read 32; one per "
        "poll where a completion counter or a single CQE is read)")
    flush_scope: Literal["warp", "qp"] = Field(
        "warp", description="native flush: what it waits for. warp: the send completions of "
        "the WQEs this warp posted (hw/ep's V2 flush, by SQ slot); qp: spin until every WQE "
        "rung on the warp's QP, by any warp sharing it, has completed, read live, so WQEs "
        "other warps ring meanwhile are waited for too (NCCL GIN's blocking flush: submitted "
        "== completed on the context's endpoints)")
    lazy_completion_dispatch: bool = False
    lazy_completion_combine: bool = False
    credit_check_every: int = Field(1, ge=1, description="puts between two credit checks when not lazy")
    scaleout_update_interval: int = Field(6, ge=1, description="hybrid: tokens per tail signal")
    start_barrier: bool = Field(
        False, description="hybrid: both ops open with a barrier before any data moves, an "
        "NVLink one among the node's ranks and, beside it, a scale-out one: a signal to every "
        "rail peer (same local index, other nodes) on the notify QP, then a wait for all of "
        "theirs (DeepEP V2 gpu_barrier at the start of hybrid_dispatch and hybrid_combine; "
        "hw/ep's V2 kernels have none)")
    notify_overlaps_data: bool = Field(
        False, description="hybrid dispatch: the notify warps exchange the counts while the "
        "scale-out warps send, which do not wait for them; the op ends when both are done "
        "(DeepEP V2: the notify warps of SM 0 beside the scale-out warps). False: the data "
        "waits for the exchange (hw/ep's V2 kernels)")
    provider_batched_tail: bool = Field(
        False, description="the provider/NIC batches the tail signal work instead of the kernel"
    )
    signal_post_group: int = Field(
        1, ge=1, description="native: signal WQEs a warp posts as one post group (one fence, "
        "doorbell turn and doorbell for up to this many, at most nic.max_batch); 1: every "
        "signal is rung at once")
    ll_intranode_nvlink: bool = Field(
        True, description="v1-ll: same-node peers over NVLink (False: pure RDMA, DeepEP LL's reference)"
    )
    ll_combine_flags: Literal["per-expert", "per-rank"] = Field(
        "per-expert", description="v1-ll combine: a flag per (expert, source rank) after its rows "
        "(DeepEP LL), or one flag per destination rank after all rows to it, which every "
        "receiving warp polls (the hw/ep kernels)")
    ll_combine_order: Literal["in-turn", "concurrent"] = Field(
        "in-turn", description="v1-ll combine: the order a rank's rows are dealt over its "
        "channels. in-turn: (expert, source) pair after pair, each pair's rows over the "
        "channels (the hw/ep kernels' combine_rank); concurrent: the pairs side by side, every "
        "pair's first row, then every pair's second... (DeepEP LL: a warp group per pair, all "
        "running at once), so a rank's writes go to every source at once, not to a few sources "
        "after another as every other rank also does")
    recv_cq: Literal["per-rail", "per-dest-qp"] = Field(
        "per-rail", description="imm-counting: one receive CQ per NIC of the rank, read as its CQEs "
        "arrive (a GIN context's CQ per device), or one per destination QP, each read only by the "
        "warp that receives on it, spinning on it while it waits (hw/ep: a QP per local expert in "
        "dispatch, per token channel in combine; counts travel as immediates on the same CQ)")
    recv_cq_cqes_per_read: int = Field(
        0, ge=0, description="receive CQEs one read of the CQ returns: 0, a 64 B line's worth "
        "(64 / receiver.cqe_bytes); 1: one entry per read (hw/ep: a 16-byte load at the consumer "
        "index)")
    notify_bytes: int = Field(64, ge=1)
    reduce_warps: int = Field(
        0, ge=0, description="warps that run a rank's final combine reduction together (DeepEP "
        "LL: every warp of every SM of the kernel); 0: the data channels")
    nvlink_chunk_tokens: int = Field(4, ge=1, description="hybrid: tokens a forward warp moves at once")
    proxy: ProxyDesign = Field(default_factory=ProxyDesign, description="the host proxy (path = proxy)")

    @model_validator(mode="after")
    def _qps(self) -> Design:
        if self.qps_per_call > self.qps_allocated:
            raise ValueError(
                f"qps_per_call ({self.qps_per_call}) exceeds qps_allocated ({self.qps_allocated})"
            )
        return self

    @model_validator(mode="after")
    def _proxy_kind(self) -> Design:
        """A proxy kind only on the proxy path; pplx-garden's worker runs its own protocol and
        counts immediates; UCCL-EP's proxy signals by counting immediates (its EFA build), by
        holding the count until the writes before it completed, or right after them."""
        kind = self.proxy.kind
        if kind != "gin-ofi" and self.path != "proxy":
            raise ValueError(f"proxy.kind = '{kind}' needs path = 'proxy'")
        if (kind == "pplx-worker") != (self.protocol == "pplx-a2a"):
            raise ValueError("protocol 'pplx-a2a' and proxy.kind 'pplx-worker' go together")
        if kind == "pplx-worker" and self.signal_mode != "imm-counting":
            raise ValueError("pplx-worker counts immediates: signal_mode must be 'imm-counting'")
        if kind == "uccl" and self.signal_mode not in ("imm-counting", "flush", "ordered"):
            raise ValueError("uccl: signal_mode must be 'imm-counting', 'flush' or 'ordered'")
        return self


class Scenario(Strict):
    """A runnable composition."""

    name: str = "scenario"
    description: str = ""
    platform: Platform
    workload: Workload
    design: Design
    seed: int = Field(0, ge=0)
    ops: list[Literal["dispatch", "combine"]] = Field(
        default_factory=lambda: ["dispatch", "combine"], min_length=1)

    @model_validator(mode="after")
    def _counters_exist(self) -> Scenario:
        d = self.design
        if d.signal_mode_with_counters is not None and self.platform.nic.hw_counters \
                and d.signal_mode != d.signal_mode_with_counters:
            # the design signals through the device's counters where the instance has them
            self.__dict__["design"] = d.model_copy(update={"signal_mode": d.signal_mode_with_counters})
        if self.design.signal_mode == "hw-counter" and not self.platform.nic.hw_counters:
            raise ValueError(
                f"design.signal_mode 'hw-counter' needs a NIC with completion counters "
                f"(platform {self.platform.name}: nic.hw_counters is false)")
        return self
