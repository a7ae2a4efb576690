"""``lever hw ep --protocol v2-hybrid|v2-direct``: DeepEP V2 over the emulated SRD NIC, on emulated nodes.

What runs (hw/ep/v2_kernels.cuh, in the same extension and launch shape as V1 LL): per GPU
one cooperative launch per op; EP blocks hold the design's scale-out warps (channels) and,
in hybrid mode, its forward warps; NIC blocks are V1's emulated NIC, unchanged. Every RDMA
write goes through V1's issuer (native WQEs and doorbells, or the proxy's rings), so the
V1 levers act on V2 the same way, plus the V2 ones (``design.scaleout_update_interval``,
``cached``).

Nodes are emulated: ``--ranks-per-node P`` groups ranks ``r // P`` into nodes; ranks of one
node reach each other with peer stores (NVLink) or plain stores where they share a GPU, so
2 nodes x 2 ranks run on one H200 and the same code spreads over more GPUs where present.

Why records look the way they do: ``sim`` names the V2 scenario file of the design that ran
(``scenarios/emu-v2-*.toml``: the emulated platform, uncalibrated, and the campaign's design
file) with ``ep_ranks`` and ``gpus_per_node`` = ranks per node, so ``lever calibrate`` and
``lever compare`` simulate the same run. The gate is V1's with V2's layout: every rank's
tokens, per source in token order, ``torch.equal`` the reference (hw/reference.py
rank_layout / rank_payload), their per-expert view equals V1's layout, and the combine output
``torch.equal`` V1's reference combine on exact inputs (weights k/8, integer expert outputs:
every partial sum exact, so node-first reduction gives V1's bits).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lever.hw import ep as v1
from lever.hw import reference as ref
from lever.hw.reference import Shape
from lever.sim.errors import UserError

SCENARIOS = {("v2-hybrid", "native"): "emu-v2-hybrid-native", ("v2-hybrid", "proxy"): "emu-v2-hybrid-proxy",
             ("v2-direct", "native"): "emu-v2-direct-native", ("v2-direct", "proxy"): "emu-v2-direct-native"}
"""The model's scenario of each (protocol, path): scenarios/emu-v2-*.toml (direct proxy: the
direct design with design.path = proxy, as no campaign design file exists for it)."""
PROTO = {"v2-hybrid": 1, "v2-direct": 2}
V2_ERR_NAMES = {
    20: "V2 rank waited for the count exchange (notify)",
    21: "V2 forward warp waited for its streams' tails / receive completions",
    22: "V2 rank waited for its tokens (forwarded, NVLink or direct signal)",
    23: "V2 scale-out warp waited for its own WQEs' send completions (flush before a tail)",
    24: "V2 forward warp waited for a combine row of its node",
    25: "V2 source waited for combine rows / signals",
    26: "V2 closing node barrier timed out",
    27: "V2 signal carried another count than the layout",
}
MAX_RANKS = 16
SCALEOUT_TAIL_MAX = 0x7FFF


def ranks_per_node(ranks: int, rpn: int) -> int:
    """``--ranks-per-node`` (0: two nodes), checked against ``--ranks``."""
    p = rpn or max(1, ranks // 2)
    if ranks % p or not 1 <= ranks <= MAX_RANKS:
        raise UserError(f"--ranks {ranks} with --ranks-per-node {p}: V2 needs 1..{MAX_RANKS} ranks, "
                        "a multiple of the ranks per node")
    return p


def scenario_overrides(protocol: str, path: str, ranks: int, rpn: int, faults: bool,
                       extra: Mapping[str, Any], loss_prob: float = 0.02) -> dict[str, Any]:
    """The model's view of this run on top of its scenario file: ranks, ranks per node (the
    model's gpus_per_node: one emulated node is one model node), the emulator's loss under
    --faults (``loss_prob``, hw/emulated_nic.toml), --set."""
    ov: dict[str, Any] = {"workload.ep_ranks": ranks, "workload.gpus_per_node": rpn, "workload.name": "decode"}
    if protocol == "v2-direct" and path == "proxy":
        ov["design.path"] = "proxy"
    if faults:
        ov["platform.fabric.loss_prob"] = loss_prob
    return {**ov, **extra}


def load_scenario(protocol: str, path: str, ranks: int, rpn: int, faults: bool, extra: Mapping[str, Any],
                  levers: list[str], loss_prob: float = 0.02):
    """The scenario the model runs for this variant: the V2 scenario, the run, then the levers."""
    from lever.sim.levers import all_levers, load_with_levers

    shipped = all_levers()
    for name in levers:
        if name not in shipped:
            raise v1.EpError(f"--lever {name}: unknown lever (shipped: {', '.join(shipped)})")
    return load_with_levers(SCENARIOS[(protocol, path)], levers,
                            base=scenario_overrides(protocol, path, ranks, rpn, faults, extra, loss_prob),
                            base_source="lever hw ep")


def run_flags(scn, protocol: str, path: str) -> dict[str, int]:
    """The V2 launch's own flags (hw/ep/v2.h V2Run); refuses what the kernels do not build."""
    d = scn.design
    if d.protocol != protocol:
        raise v1.EpError(f"design.protocol {d.protocol!r}: this run is {protocol}")
    if d.path != path:
        raise v1.EpError(f"design.path {d.path!r}: this run is --path {path}")
    if protocol == "v2-direct" and d.signal_mode == "imm-counting":
        raise v1.EpError("design.signal_mode 'imm-counting': not built for v2-direct on the emulated NIC "
                         "(v2-hybrid has it)")
    if d.provider_batched_tail:
        raise v1.EpError("design.provider_batched_tail: not built for V2 on the emulated NIC (its tails are "
                         "posted by the scale-out warps)")
    if not 1 <= d.scaleout_update_interval <= SCALEOUT_TAIL_MAX:
        raise v1.EpError(f"design.scaleout_update_interval {d.scaleout_update_interval}: 1..{SCALEOUT_TAIL_MAX}")
    return {"proto": PROTO[protocol], "interval": d.scaleout_update_interval}


V2_ZEROED = ("arrived", "expect", "so_tail", "so_notify", "sig", "part_flag", "comb_flag", "comb_sig", "nbar",
             "arr_base", "wqe_done", "h_socnt", "h_expect")
"""The V2 words zeroed before every variant (:meth:`V2Runner.reset_state`)."""


def v2_geometry(nb: int, so_warps: int, fwd_warps: int, n_rxcq: int, N: int, tokens: int, P: int) -> dict[str, int]:
    """Channels C, forward warps F, slots per stream S, notify words NW and tail words of a
    run (hw/ep/v2.h V2World), or the EpError of what the kernels do not take."""
    C, F = nb * so_warps, nb * fwd_warps
    if C > n_rxcq:
        raise v1.EpError(f"{C} channels exceed the {n_rxcq} receive queues")
    if F and (N - 1) * math.ceil(C / F) > 32:
        raise v1.EpError("a forward warp would poll more than 32 streams: more forward warps or fewer nodes")
    S = math.ceil(tokens / C)
    if S > 64:
        raise v1.EpError(f"{S} tokens per (node, channel) stream: the forward warps track at most 64 "
                         "(more channels)")
    return {"C": C, "F": F, "S": S, "NW": 4 * math.ceil((C + P) / 4), "tails": tokens + 2}


def v2_buffer_plan(s: Shape, R: int, P: int, N: int, C: int, S: int, NW: int, tails: int,
                   sq_depth: int) -> list[tuple[str, int, str]]:
    """(name, elements, dtype) of one rank's V2 buffers (hw/ep/v2.h V2Rank), in order."""
    T = s.tokens
    return [("final_x", R * T * v1.DMSG, "uint8"), ("arrived", R, "int32"), ("expect", R, "int64"),
            ("so_recv", N * C * S * v1.DMSG, "uint8"), ("so_tail", N * C, "int64"), ("so_notify", N * NW, "int32"),
            ("sig", R, "int64"), ("part", R * T * P * v1.CMSG, "uint8"), ("part_flag", R * T * P, "int64"),
            ("comb_rows", T * R * v1.CMSG, "uint8"), ("comb_flag", T * R, "int64"), ("comb_sig", R, "int64"),
            ("nbar", P, "int64"), ("slot", T * R, "int32"), ("cnt", R, "int32"), ("socnt", C * N, "int32"),
            ("h_socnt", N * C, "int32"), ("h_expect", R, "int32"), ("arr_base", R, "int32"),
            ("out_src", R * T, "int32"), ("out_cnt", R, "int32"), ("comb_in", R * T * v1.CMSG, "uint8"),
            ("comb_send", R * T * v1.CMSG, "uint8"), ("tail_src", C * N * tails, "int64"),
            ("notify_src", N * NW, "int32"), ("sig_src", 2 * R, "int64"), ("wqe_done", v1.NQ_MAX * sq_depth, "int32")]


# ----------------------------------------------------------------- the device run
class V2Runner(v1.Runner):
    """V1's runner (NIC queues, peer access, proxy threads, timing) plus the V2 buffers."""

    EXACT = True

    def __init__(self, torch, ext, shape: Shape, ranks: int, gpus: int, scn, seed: int, num_sms: int,
                 timeout_ms: float, path: str, proxy_threads: int, rpn: int, protocol: str, emu=None,
                 sq: str = "host", cq: str = "host", faults: bool = False, rxcq: str = "") -> None:
        d = scn.design
        self.protocol = protocol
        self.P, self.N = rpn, ranks // rpn
        self.so_warps = d.warps_per_sm
        self.fwd_warps = d.forward_warps_per_sm if protocol == "v2-hybrid" else 0
        super().__init__(torch, ext, shape, ranks, gpus, scn, seed, num_sms, timeout_ms, path, proxy_threads,
                         emu=emu, sq=sq, cq=cq, faults=faults, rxcq=rxcq)
        self.warps = self.so_warps + self.fwd_warps  # every EP block: scale-out + forward warps
        if not 1 <= self.warps <= 8:
            raise v1.EpError(f"warps_per_sm + forward_warps_per_sm = {self.warps}: the kernels take 1..8")
        g = v2_geometry(self.nb, self.so_warps, self.fwd_warps, self.n_rxcq, self.N, shape.tokens, self.P)
        self.Cv, self.Fv, self.S, self.NW, self.tails = g["C"], g["F"], g["S"], g["NW"], g["tails"]
        self.check_resident(ext.coop_max_blocks_v2)
        self.rlayouts = ref.rank_layout(shape, self.inputs)
        self.rows = ref.rank_rows(shape, self.inputs, self.layouts, self.y, self.rlayouts)
        self.run = {"proto": PROTO[protocol], "interval": 1}
        self._alloc_v2()

    def _alloc_v2(self) -> None:
        t, s = self.t, self.shape
        T, H, R, P, N, C = s.tokens, s.hidden, self.R, self.P, self.N, self.Cv
        u8, i32, i64 = t.uint8, t.int32, t.int64
        self.v2 = []
        for r in range(R):
            dv = f"cuda:{self.dev(r)}"

            def z(n: int, dt, dv: str = dv):
                return t.zeros(n, dtype=dt, device=dv)

            b = {name: z(n, {"uint8": u8, "int32": i32, "int64": i64}[dt])
                 for name, n, dt in v2_buffer_plan(s, R, P, N, C, self.S, self.NW, self.tails, self.depth)}
            # the rank's combine input rows at its V2 buffer positions (BF16 at +16)
            ci = b["comb_in"].view(R, T, v1.CMSG)
            ci[..., 16:16 + 2 * H] = self.rows[r].view(t.uint8).reshape(R, T, 2 * H).to(dv)
            self.v2.append(b)
        self.t.cuda.synchronize()

    def rebuild(self, scn, seed: int) -> None:
        super().rebuild(scn, seed)
        tables = [{k: v.data_ptr() for k, v in b.items()} for b in self.v2]
        cfg = {"P": self.P, "N": self.N, "C": self.Cv, "F": self.Fv, "so_warps": self.so_warps,
               "fwd_warps": self.fwd_warps, "S": self.S, "NW": self.NW, "tails": self.tails}
        for h in self.handles:
            self.ext.make_v2(h, cfg, tables)

    def run_op(self, op: int, flags: dict[str, int], events: list | None) -> None:
        self.seq += 1
        for g in range(self.G):
            st = self.streams[g]
            rc = self.ext.launch_barrier(self.handles[g], self.seq, st.cuda_stream)
            if rc:
                raise v1.EpError(f"GPU {g}: barrier launch failed: {self.ext.err_string(rc)}")
            if events is not None:
                events[g][0].record(st)
            rc = self.ext.launch_v2(self.handles[g], op, self.epoch, flags, self.run, st.cuda_stream)
            if rc:
                raise v1.EpError(f"GPU {g}: V2 op launch failed: {self.ext.err_string(rc) if rc > 0 else rc}")
            if events is not None:
                events[g][1].record(st)

    def check_errors(self) -> None:
        """V1's diagnostics (error CQEs named, the proxy's first), then the V2 codes."""
        for g, gb in enumerate(self.gbufs):
            e = gb["err"].cpu().tolist()
            if e[0] in V2_ERR_NAMES:
                raise v1.EpError(f"GPU {g}: {V2_ERR_NAMES[e[0]]}: rank {e[1]} (block {e[6]}, warp {e[7]}), "
                                 f"peer/stream/qp {e[2]}, counter {e[3]}, expected {e[4]}, aux {e[5]}")
        super().check_errors()

    def reset_state(self) -> None:
        super().reset_state()
        for b in self.v2:
            for k in V2_ZEROED:
                b[k].zero_()
        self.sync()

    def poison(self) -> None:
        super().poison()
        for b in self.v2:
            poison_v2(b)
        self.sync()

    def gate_check(self) -> list[str]:
        """Every rank's V2 outputs against the reference (hw/reference.py), V1's per-expert
        view of them, and the combine output against V1's reference."""
        fails = []
        for r in range(self.R):
            fails += self.gate_v2_rank(r, self.v2[r], self.bufs[r]["comb_out"])
        return fails

    def gate_v2_rank(self, r: int, b: dict, comb_out) -> list[str]:
        """Rank ``r``'s V2 outputs (its V2 buffers ``b``, its combine output): failure strings.
        (The EFA runner calls it for its own rank and gathers the world's.)"""
        t, s = self.t, self.shape
        R, T, H = self.R, s.tokens, s.hidden
        fails: list[str] = []
        lay = self.rlayouts[r]
        counts = b["out_cnt"].cpu()
        if not t.equal(counts, lay["counts"]):
            return [f"rank {r}: tokens per source differ"]
        src = b["out_src"].view(R, T).cpu()
        valid = t.arange(T)[None, :] < counts[:, None]
        src = t.where(valid, src, -1)
        if not t.equal(src, lay["src"]):
            return [f"rank {r}: token indices differ"]
        view = ref.expert_view(s, self.inputs, r, src, counts)
        if not (t.equal(view["counts"], self.layouts[r]["counts"]) and t.equal(view["src"], self.layouts[r]["src"])):
            fails.append(f"rank {r}: the per-expert view differs from V1's layout")
        fx = b["final_x"].view(R, T, v1.DMSG).cpu()
        xr, scr = ref.rank_payload(s, self.inputs, lay)
        got_x = t.where(valid[..., None], fx[..., :H], 0)
        got_s = t.where(valid[..., None], fx[..., H:H + 4 * s.scales].contiguous().view(t.float32), 0)
        if not t.equal(got_x, xr):
            fails.append(f"rank {r}: FP8 payload differs")
        if not t.equal(got_s, scr):
            fails.append(f"rank {r}: scales differ")
        out = comb_out.cpu()
        if not t.equal(out, self.ref_comb[r]):
            fails.append(f"rank {r}: combine output differs in {int((out != self.ref_comb[r]).sum())} elements")
        return fails


def poison_v2(b: dict) -> None:
    """What the gate iteration must overwrite in one rank's V2 buffers."""
    b["final_x"].fill_(0xA5)
    b["out_src"].fill_(-7)
    b["out_cnt"].fill_(-7)
    b["comb_rows"].fill_(0x5A)


V2_CHECKS = [
    "every rank's tokens per source, token indices, FP8 payload and scales torch.equal the reference "
    "(reference.rank_layout/rank_payload; poisoned buffers before the gate iteration), and their "
    "per-expert view equals V1's layout (reference.expert_view)",
    "combine output torch.equal V1's reference combine on exact inputs (weights k/8, integer expert "
    "outputs: node-first float32 sums with BF16 partials are exact)",
    "receiver-side stamps (epoch, source, token, slot) checked in-kernel on every token and row of every "
    "iteration: 0 bad",
    "tails / signals only after the writer's own send completions (flush, per SQ slot), or counted "
    "write-with-immediate receive completions (imm, proxy); a send completion alone never counts as delivery",
    "signal counts equal to the layout's; every poll loop bounded; no timeout, no bad WQE/CQE on any run",
]


def main_v2(args: argparse.Namespace) -> int:
    from lever.calibration.records import dump_record, parse_record
    from lever.hw.device import require_cuda

    if args.nic == "efa":  # one process per rank under torchrun: hw/efa/ep_run.py, hw/efa/ep_v2_run.py
        from lever.hw.efa.ep_run import main_efa

        return main_efa(args)
    if args.iters < 1 or args.warmup < 0:
        raise UserError("--iters must be >= 1 and --warmup >= 0")
    rpn = ranks_per_node(args.ranks, args.ranks_per_node)
    variants, extra, emu, (sq, cq, rxcq), loss = v1.run_options(args)
    torch = require_cuda()
    args.provenance = v1.run_provenance(args.allow_dirty)
    ngpu = torch.cuda.device_count()
    gpus = args.gpus or min(args.ranks, ngpu)
    if gpus > ngpu or args.ranks % gpus:
        raise UserError(f"--ranks {args.ranks} over --gpus {gpus}: needs a multiple of the GPUs ({ngpu} visible)")
    prefix = args.id_prefix if args.id_prefix != "emu-ep" else f"emu-{args.protocol}"
    try:
        base = load_scenario(args.protocol, args.path, args.ranks, rpn, args.faults, extra, [], loss)
        shape = Shape(num_ranks=args.ranks, tokens=base.workload.tokens_per_rank, top_k=base.workload.top_k,
                      num_experts=base.workload.num_experts)
        shape.check()
        ext = v1.load_ext()
        runner = V2Runner(torch, ext, shape, args.ranks, gpus, base, args.seed, args.num_sms, args.timeout_ms,
                          args.path, args.proxy_threads, rpn, args.protocol, emu=emu, sq=sq, cq=cq,
                          faults=args.faults, rxcq=rxcq)
        info = v1._platform_info(torch)
        rc = 0
        place = v1.placement_tag(sq, cq, rxcq, args.path) + v1.generation_tag(emu, args.path, v2=True)
        for v in variants:
            levers = [x for x in v.split(",") if x]
            tag = "-".join(levers) if levers else "baseline"
            rid = (f"{prefix}-n{runner.N}x{rpn}-{args.path}{place}-{tag}{'-faults' if args.faults else ''}"
                   f"{'-unsafe-ordered' if args.unsafe_ordered else ''}")
            try:
                scn = load_scenario(args.protocol, args.path, args.ranks, rpn, args.faults, extra, levers, loss)
                runner.run = run_flags(scn, args.protocol, args.path)
                runner.rebuild(scn, args.seed)
                runner.reset_state()
                sets = scenario_overrides(args.protocol, args.path, args.ranks, rpn, args.faults, extra, loss)
                if args.path == "proxy":  # the host threads that ran: the model's proxy.threads
                    sets["platform.proxy.threads"] = runner.proxy_threads
                rec = v1.run_variant(runner, scn, args, levers, sets, rid, info, args.unsafe_ordered)
                rec = v2_record(rec, args.protocol, args.path, rpn, runner, scn, levers, sets)
            except v1.EpError as e:
                print(f"lever: variant {tag}: {e}", file=sys.stderr)
                rc = 1
                continue
            out = Path(args.out_dir) / f"{rid}.json" if args.variants else Path(args.out)
            dump_record(parse_record(rec, rid), out)
            lat = rec["latency_us"]
            print(f"{rid}: dispatch {lat['dispatch']['median']:.1f} us (p10 {lat['dispatch']['p10']:.1f}, "
                  f"p90 {lat['dispatch']['p90']:.1f}), combine {lat['combine']['median']:.1f} us, "
                  f"retransmits {rec['metrics'].get('retransmits_per_iteration_count', {}).get('median')} "
                  f"per iteration -> {out}")
        return rc
    except v1.EpError as e:
        raise UserError(str(e)) from None


def v2_record(rec: dict[str, Any], protocol: str, path: str, rpn: int, runner: V2Runner, scn,
              levers: list[str], sets: Mapping[str, Any]) -> dict[str, Any]:
    """V1's record of the run, told what ran: the V2 protocol, nodes, the model's V2 scenario."""
    from lever.calibration.records import parse_record

    nodes = runner.R // rpn
    rec["what"]["design"] = f"{protocol} {path} ({scn.design.name}) over emulated SRD, {nodes} nodes x {rpn} ranks"
    rec["what"]["protocol"] = protocol
    rec["what"]["workload"]["nodes"] = nodes
    rec["what"]["emulated_fabric"]["ranks_per_node"] = rpn
    # levers with several readings name the one the (shared) issuer builds, as V1's records do
    rec["sim"] = {"scenario": SCENARIOS[(protocol, path)], "levers": v1.sim_levers(levers), "set": dict(sets)}
    rec["gate"]["checks"] = V2_CHECKS
    rec["how"]["notes"] += (f"; V2: {runner.Cv} scale-out channels, {runner.Fv} forward warps per rank, "
                            f"{runner.S} slots per stream, run flags {runner.run}")
    rec["provenance"]["source"] = "lever hw ep (hw/ep/v2_kernels.cuh, emulated SRD NIC)"
    parse_record(rec, rec["id"])
    return rec
