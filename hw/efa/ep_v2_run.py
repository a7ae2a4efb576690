"""``lever hw ep --nic efa --protocol v2-hybrid|v2-direct``: DeepEP V2 over a real EFA device.

What runs: the V2 kernels of the emulated runs (hw/ep/v2_kernels.cuh, unchanged) with one
rank per process and per GPU under torchrun, no NIC blocks, every RDMA write (scale-out
tokens, tails, notify counts, signals, combine rows) through the rank's EFA QPs as V1's
are (hw/efa/ep_run.py: the same wiring, barrier, gate gathering, records), and the node's
same-node traffic (forwarded tokens, arrival counters, combine partials and flags, the
closing node barrier) as stores through CUDA IPC mappings of the node peers' V2 buffers
(hw/ep_ipc.py over the binding's ``ipc_*`` calls, hw/ep/ipc.h).

How it differs from V1 over EFA (:class:`EfaV2Runner`, an :class:`EfaRunner`):

* the window is one exportable allocation (``ipc_alloc``) holding V1's window buffers and
  every V2 buffer of the rank (hw/ep_v2.py ``v2_buffer_plan``): it is registered with each
  EFA device (so every V2 RDMA source and target is in the MR, at iova = its address) and
  exported to the node (so node peers reach the same buffers by IPC);
* ``make_v2`` gets one address map per rank: the rank's own, its node peers' through their
  mappings, other nodes' ranks' own addresses (the kernels use those only as ``raddr``);
* the node shape is torchrun's (``LOCAL_WORLD_SIZE`` ranks per node, node ``r // P``), the
  rank's GPU is ``cuda:0`` with the node's other GPUs visible after it (IPC opens only a
  visible GPU's memory);
* teardown: proxy threads, the EFA devices (last first, each in reverse), then the IPC:
  mappings closed (last opened first), a barrier, the window freed.

Nothing here has run on an EFA device; the IPC path alone ran on one H200 if
hw/run_v2_ipc_on_device.sh's outcome says so (hw/efa/README.md).
"""

from __future__ import annotations

import platform as _pf
from collections.abc import Mapping
from typing import Any

from lever.hw import ep as v1
from lever.hw import ep_ipc, ep_v2
from lever.hw import reference as ref
from lever.hw.efa.ep_run import EfaRunner, window_plan


class EfaV2Runner(EfaRunner):
    """One V2 rank on its EFA device(s), its node peers reached through CUDA IPC."""

    EXACT = True

    def __init__(self, torch, ext, efa_ext, dist, env: Mapping[str, int], device_names: list[str], shape,
                 ranks: int, scn, seed: int, num_sms: int, timeout_ms: float, path: str, proxy_threads: int,
                 emu, needs: Mapping[str, Any], node: ep_ipc.NodeShape, protocol: str) -> None:
        d = scn.design
        self.protocol, self.node = protocol, node
        self.P, self.N = node.P, node.N
        self.so_warps = d.warps_per_sm
        self.fwd_warps = d.forward_warps_per_sm if protocol == "v2-hybrid" else 0
        self.ipc_base, self.ipc_len = 0, 0
        self.ipc_maps: ep_ipc.NodeMaps | None = None
        self.v2_tables: list[dict[str, int]] = []
        self.run = {"proto": ep_v2.PROTO[protocol], "interval": 1}
        super().__init__(torch, ext, efa_ext, dist, env, device_names, shape, ranks, scn, seed, num_sms,
                         timeout_ms, path, proxy_threads, emu, needs)

    # ------------------------------------------------------------- memory and wiring
    def _alloc(self) -> None:
        """V1's EFA window and wiring over an exportable window; any failure frees it (the
        mappings and EFA devices are closed by :meth:`_wire` first)."""
        try:
            super()._alloc()
        except BaseException:
            ep_ipc.release(None, self.ext, self.ipc_base, None)
            self.ipc_base = 0
            raise

    def _v2_prepare(self) -> None:
        """V2's geometry and references (what V2Runner.__init__ sets), before the window."""
        self.warps = self.so_warps + self.fwd_warps  # every EP block: scale-out + forward warps
        if not 1 <= self.warps <= 8:
            raise v1.EpError(f"warps_per_sm + forward_warps_per_sm = {self.warps}: the kernels take 1..8")
        g = ep_v2.v2_geometry(self.nb, self.so_warps, self.fwd_warps, self.n_rxcq, self.N, self.shape.tokens,
                              self.P)
        self.Cv, self.Fv, self.S, self.NW, self.tails = g["C"], g["F"], g["S"], g["NW"], g["tails"]
        cap = self.ext.coop_max_blocks_v2(0, 32 * max(self.warps, self.nic_warps))
        if self.nb > cap:
            raise v1.EpError(f"{self.nb} EP blocks exceed the {cap} co-resident V2 blocks: lower --num-sms")
        self.rlayouts = ref.rank_layout(self.shape, self.inputs)
        self.rows = ref.rank_rows(self.shape, self.inputs, self.layouts, self.y, self.rlayouts)

    def window_plan(self) -> list[tuple[str, int, str]]:
        """V1's window buffers, then every V2 buffer of the rank (``v2.`` names)."""
        self._v2_prepare()
        v2 = ep_v2.v2_buffer_plan(self.shape, self.R, self.P, self.N, self.Cv, self.S, self.NW, self.tails,
                                  self.depth)
        return [*window_plan(self.shape, self.R), *[(f"v2.{n}", k, dt) for n, k, dt in v2]]

    def window_memory(self, nbytes: int):
        """The window as one exportable allocation (its base is what the node maps)."""
        self.ipc_base = int(self.ext.ipc_alloc(nbytes, 0))
        self.ipc_len = nbytes
        return self.t.as_tensor(ep_ipc.CudaMemory(self.ipc_base, nbytes), device="cuda:0")

    def _wire(self) -> None:
        """The V2 buffers out of the window map, the IPC exchange, then V1's EFA wiring; a
        failure closes what was opened (EFA devices first, then the mappings)."""
        b = self.bufs[0]
        v2 = {k[3:]: b.pop(k) for k in list(b) if k.startswith("v2.")}
        R, T, H = self.R, self.shape.tokens, self.shape.hidden
        ci = v2["comb_in"].view(R, T, v1.CMSG)  # the rank's combine input rows (BF16 at +16)
        ci[..., 16:16 + 2 * H] = self.rows[self.me].view(self.t.uint8).reshape(R, T, 2 * H).to(ci.device)
        self.v2 = [v2]
        self.t.cuda.synchronize()
        try:
            self.v2_tables, self.ipc_maps, _ = ep_ipc.exchange(
                self.ext, self.dist.all_gather, self.node, self.me, base=self.ipc_base, length=self.ipc_len,
                buffers={k: v.data_ptr() for k, v in v2.items()}, host=_pf.node(), gpu=0)
            super()._wire()
        except BaseException:
            ep_ipc.release(self.ipc_maps, self.ext, 0, None)  # the window: freed by _alloc
            self.ipc_maps = None
            raise

    def rebuild(self, scn, seed: int) -> None:
        super().rebuild(scn, seed)
        cfg = {"P": self.P, "N": self.N, "C": self.Cv, "F": self.Fv, "so_warps": self.so_warps,
               "fwd_warps": self.fwd_warps, "S": self.S, "NW": self.NW, "tails": self.tails}
        self.ext.make_v2(self.handles[0], cfg, self.v2_tables)

    # ------------------------------------------------------------- running
    op_kind = "V2 op"

    def _launch(self, op: int, flags: dict[str, int], st) -> int:
        """V2's launch in place of V1's (EfaRunner.run_op: the reset, the barrier, the events)."""
        return self.ext.launch_v2(self.handles[0], op, self.epoch, flags, self.run, st.cuda_stream)

    def local_error(self) -> str | None:
        """The V2 codes first (hw/ep_v2.py V2_ERR_NAMES), then V1's and the barrier's."""
        e = self.gbufs[0]["err"].cpu().tolist()
        if e[0] in ep_v2.V2_ERR_NAMES:
            return (f"{ep_v2.V2_ERR_NAMES[e[0]]}: rank {e[1]} (block {e[6]}, warp {e[7]}), peer/stream/qp {e[2]}, "
                    f"counter {e[3]}, expected {e[4]}, aux {e[5]}")
        return super().local_error()

    def reset_state(self) -> None:
        super().reset_state()  # ends with every rank synchronised: no write in flight
        for k in ep_v2.V2_ZEROED:
            self.v2[0][k].zero_()
        self.sync()
        self.dist.barrier()

    def poison(self) -> None:
        super().poison()
        ep_v2.poison_v2(self.v2[0])
        self.sync()

    def gate_check(self) -> list[str]:
        mine = ep_v2.V2Runner.gate_v2_rank(self, self.me, self.v2[0], self.bufs[0]["comb_out"])
        fails: list[str] = []
        for part in self.dist.all_gather(mine):
            fails += part
        return fails

    def close(self) -> int:
        """V1's close (proxy threads, the EFA devices), then the IPC: this rank's mappings,
        a barrier (every rank closed its mappings of this window), the window freed."""
        rc = 0
        try:
            rc = super().close()
        finally:
            bad = ep_ipc.release(self.ipc_maps, self.ext, self.ipc_base, self.dist.barrier)
            self.ipc_maps, self.ipc_base = None, 0
        return rc or bad


def v2_sets(base_scn, protocol: str, path: str, ranks: int, P: int, extra: Mapping[str, Any]) -> dict[str, Any]:
    """What the model must be told of a V2 run on EFA, on top of the instance's platform
    scenario: the V2 design whole (its fields, as the design file set them), the run's
    ranks and ranks per node, --set last."""
    design = {f"design.{k}": v for k, v in base_scn.design.model_dump().items() if v is not None}
    return {**design, **ep_v2.scenario_overrides(protocol, path, ranks, P, False, extra)}


def efa_v2_record(rec: dict[str, Any], *, runner: EfaV2Runner, protocol: str, path: str) -> dict[str, Any]:
    """An EFA record (hw/efa/ep_run.py ``efa_record``) told what ran: V2, its node shape,
    the V2 gate, the V2 design on the instance's platform for the model."""
    from lever.calibration.records import parse_record

    nodes, P = runner.N, runner.P
    w = rec["what"]
    w["design"] = f"{protocol} {path} over EFA SRD, {nodes} nodes x {P} ranks (CUDA IPC within a node)"
    w["protocol"] = protocol
    w["workload"]["nodes"] = nodes
    rec["sim"]["set"]["design.name"] = f"{protocol}-{path}-hw-efa"
    rec["sim"]["set"]["workload.gpus_per_node"] = P
    rec["gate"]["checks"] = ep_v2.V2_CHECKS
    rec["gate"]["detail"] = (f"{runner.R} ranks over EFA, {nodes} nodes x {P} ranks, one per GPU; node peers "
                             "through CUDA IPC; every check on every rank")
    rec["how"]["notes"] += (f"; V2: {runner.Cv} scale-out channels, {runner.Fv} forward warps per rank, "
                            f"{runner.S} slots per stream, run flags {runner.run}; ranks per node {P} "
                            f"(LOCAL_WORLD_SIZE), node peers' V2 buffers mapped by CUDA IPC")
    rec["provenance"]["source"] = "lever hw ep --nic efa (hw/ep/v2_kernels.cuh over EFA, hw/efa, hw/ep_ipc.py)"
    return parse_record(rec, rec["id"]).model_dump(mode="json", exclude_none=True)
