"""Mutation check of the model's tests: remove one physical mechanism of ``sim/``, see which
tests notice.

    python benchmarks/mutants.py [--mutants NAME,...] [--tests PATHS] [--all-kills]
                                 [--out benchmarks/mutants.md] [--list]

A test suite that only compares golden numbers fails on *any* change, so it can not tell a
mechanism that is checked from one that merely moves a number. Each mutant here is one
exact text edit of one file under ``sim/`` that removes (or breaks) one mechanism; a mutant
is *killed* when some test fails, and *golden-only* when the only failing test is
``tests/test_golden.py``: that mechanism has no behaviour test, only a frozen number.

The working tree is never touched. The script snapshots it once into a temporary folder
(uncommitted edits included, ``.git`` and build outputs left out), runs the selected tests
there unmutated (the *baseline*: tests that already fail are deselected afterwards and
reported), then for each mutant copies the snapshot, applies the edit (an error unless the
old text occurs exactly once) and runs the tests with ``PYTHONPATH`` and the working
directory on that copy, having checked that ``lever.sim`` imports from it. Copies are
removed at the end.

Tests run in stages, cheapest first, so a killed mutant costs seconds: the fast behaviour
files (``FAST``), then the rest of the selection with ``-x`` only if nothing was killed
yet, then ``tests/test_golden.py``. ``--all-kills`` runs the fast stage without ``-x`` to
list every killing test there, not just the first.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FAST = ("tests/test_physics.py", "tests/test_mechanisms.py", "tests/test_fabric.py",
        "tests/test_protocols.py", "tests/test_model.py", "tests/test_design_mechanisms.py")
GOLDEN = "tests/test_golden.py"
PYTEST = ("-q", "-p", "no:benchmark", "-n", "2", "-p", "mut_report", "--no-header")
SKIP = {".git", "__pycache__", ".pytest_cache", ".ruff_cache", "build", ".whl", ".gl",
        ".venv", "out"}


@dataclass(frozen=True)
class Mutant:
    """One mechanism removed: replace ``old`` (exactly once) by ``new`` in ``file``."""

    name: str
    file: str
    old: str
    new: str
    why: str


MUTANTS: tuple[Mutant, ...] = (
    # -- fabric ---------------------------------------------------------------------------
    Mutant("retransmit-timeout-free", "sim/fabric.py",
           't_rt = depart + self.ledger.cost("wire", self.fp.retransmit_timeout_ns)',
           "t_rt = depart", "a lost packet is resent at once: loss costs no timeout"),
    Mutant("ack-loss-never", "sim/fabric.py",
           "ack_lost = (not data_lost) and self._lost(src_nic)", "ack_lost = False",
           "ACKs are never lost: no duplicate copies"),
    Mutant("rc-fifo-removed", "sim/fabric.py",
           "            arrive = max(arrive, last)\n", "",
           "RC arrivals may overtake earlier ones on a connection"),
    # -- NIC egress -----------------------------------------------------------------------
    Mutant("egress-serialisation-removed", "sim/nic.py",
           "depart = ((tx_free if tx_free >= t_ready else t_ready)  # max(tx_free, t_ready)\n"
           "                      + (size + hdr) * ns_per_byte * f_wire)",
           "depart = t_ready", "packets leave as soon as fetched: no line rate on the egress port"),
    Mutant("dma-read-free", "sim/nic.py",
           "t_ready = t0 if inline else t0 + p.dma_read_ns * f_nic", "t_ready = t0",
           "a payload needs no PCIe read before it can leave"),
    Mutant("message-rate-ceiling-ignored", "sim/nic.py",
           "self.wqe_ns = max(p.wqe_process_ns, 1e3 / p.max_msg_rate_mops)",
           "self.wqe_ns = p.wqe_process_ns", "WQEs are parsed faster than max_msg_rate_mops"),
    Mutant("dma-bandwidth-free", "sim/nic.py",
           "t_ready += size * dma_ns_per_byte * f_nic", "pass",
           "the payload fetch takes no time however large (dma_gbps ignored)"),
    Mutant("no-mtu-segmentation", "sim/nic.py", "mtu = p.mtu_bytes\n",
           "mtu = max(p.mtu_bytes, msg.nbytes)\n", "a write leaves as one packet, whatever its size"),
    # -- NIC ingress and completions ------------------------------------------------------
    Mutant("ingress-serialisation-removed", "sim/nic.py",
           "rx_free = self.rx_free = start + (size + self._hdr) * self.ns_per_byte * self._f_wire",
           "rx_free = self.rx_free = now", "packets land on arrival: no line rate on the ingress port"),
    Mutant("duplicates-not-dropped", "sim/nic.py", "if msg.seen_pkts & bit:", "if False:",
           "a resent copy of a packet that had landed lands again"),
    Mutant("duplicate-not-acked", "sim/nic.py",
           "            if ack_ok:\n"
           "                msg.qp.nic.ack(msg, now + self.fabric.flight(self.index),\n"
           "                               None if path is None else path.cur)\n"
           "            return",
           "            return", "a dropped duplicate sends no ACK: a lost ACK is never repaired"),
    Mutant("visibility-zero", "sim/nic.py",
           "vis = t_land + self._vis", "vis = t_land",
           "landed bytes are visible to pollers at once (visibility_ns ignored)"),
    Mutant("visible-at-first-packet", "sim/nic.py", "if msg.landed == msg.npkts:",
           "if msg.landed == 1:", "a write is visible when its first packet landed"),
    Mutant("completion-zero", "sim/nic.py",
           "self._completion = p.completion_ns * self._f_nic",
           "self._completion = 0.0", "the CQE is written at the last ACK (completion_ns ignored)"),
    Mutant("completion-at-last-processed-ack", "sim/nic.py",
           "        if t_arrive > msg.t_complete:\n            msg.t_complete = t_arrive\n",
           "        if True:\n            msg.t_complete = t_arrive\n",
           "the CQE follows the ACK processed last, not the latest to arrive"),
    # -- native issuer ----------------------------------------------------------------------
    Mutant("doorbell-batch-ignored", "sim/issuer.py",
           "self._limit = min(max(d.doorbell_batch, d.put_many_span), nic.max_batch)",
           "self._limit = min(d.put_many_span, nic.max_batch)",
           "a doorbell per WQE whatever doorbell_batch"),
    Mutant("max-batch-cap-ignored", "sim/issuer.py",
           "self._limit = min(max(d.doorbell_batch, d.put_many_span), nic.max_batch)",
           "self._limit = max(d.doorbell_batch, d.put_many_span)",
           "doorbells may cover more than nic.max_batch WQEs"),
    Mutant("doorbell-lock-removed", "sim/issuer.py",
           "self.shared = qp.owners > 1\n",
           "self.shared = False\n",
           "warps sharing a QP ring their doorbells at once, no slot-order turn"),
    Mutant("fence-after-doorbell-free", "sim/issuer.py",
           "if nf <= 1:\n            return []\n        rel = self.release_ns",
           "return []\n        rel = self.release_ns",
           "the fences after the doorbell cost nothing and hold no turn"),
    Mutant("hand-off-release-free", "sim/issuer.py",
           "costs.extend(self._release_after(nf, costs))",
           "pass",
           "a warp handing an every-post turn on without ringing releases the turn word for free"),
    Mutant("turn-release-ignores-host-reads", "sim/issuer.py",
           "t += self.release_host.fence_ns(start, rel) - rel",
           "pass",
           "the release of a doorbell turn at system scope does not wait for the host reads in flight"),
    Mutant("wqe-build-free", "sim/issuer.py",
           "t = (g.wqe_build_ns + g.wqe_store_ns * blocks) * f_wqe",
           "t = g.wqe_store_ns * blocks * f_wqe",
           "a WQE posted alone costs only its stores, not the loads that build it"),
    Mutant("grouped-wqe-build-free", "sim/issuer.py",
           'costs.append(("wqe", g.wqe_build_ns + g.wqe_store_ns * blocks, blocks))',
           'costs.append(("wqe", g.wqe_store_ns * blocks, blocks))',
           "a WQE of a post group costs only its stores, not the loads that build it"),
    Mutant("host-engine-reads-not-in-flight", "sim/nic_host_engine.py",
           "r = self.reads\n        if r is not None:",
           "r = None\n        if r is not None:",
           "the emulated NIC's host-engine reads are not host reads in flight of its GPU"),
    Mutant("host-copy-per-wqe-free", "sim/nic_host_engine.py",
           'led.cost("nic", self._copy + self._copy_per_wqe * len(msgs))', 'led.cost("nic", self._copy)',
           "a host-engine copy costs the same however many WQEs it carries"),
    Mutant("delivering-warps-removed", "sim/nic.py",
           "if self.delivery is not None:  # every NIC", "if False:  # every NIC",
           "the emulated NIC's packets land a constant receiver.land_ns after ingress, whatever the load"),
    Mutant("delivery-batches-never-shared", "sim/nic_delivery.py",
           "if held[i] < self.batch and claimed[i] >= ready", "if False",
           "each due packet takes a delivering warp's claim and fence of its own"),
    Mutant("proxy-rings-never-drained", "sim/proxy.py",
           "self.drain = ctx.design.proxy.drain_rings", "self.drain = False",
           "the testbed's proxy thread takes one descriptor a ring a pass, a doorbell each"),
    Mutant("turn-release-is-the-fence", "sim/issuer.py",
           "self.release_ns = g.fence_ns if g.turn_release_ns is None else g.turn_release_ns",
           "self.release_ns = g.fence_ns",
           "the fence after a doorbell costs the fence after the WQE stores (gpu.turn_release_ns ignored)"),
    Mutant("deferred-aggregation-ignored", "sim/issuer.py",
           "if self._agg > 1 and self.turn is None:", "if False:",
           "each warp rings its own WQEs whatever deferred_doorbell_aggregation"),
    Mutant("put-many-credit-per-put", "sim/issuer.py",
           "if self._span_left == 0 and self._credit:", "if self._credit:",
           "a put_many span checks credits per put instead of once"),
    Mutant("credit-wait-removed", "sim/issuer.py",
           "if qp.posted - qp.completions.value + need > limit:", "if False:",
           "the credit check never blocks: the SQ can overflow"),
    Mutant("credit-read-per-cqe-free", "sim/issuer.py",
           "reads = 1 if self.counter else 1 + -(-new // self.cqes_per_read)", "reads = 1",
           "a credit check reads one word, however many CQEs it consumes"),
    Mutant("completion-counter-ignored", "sim/issuer.py",
           "reads = 1 if self.counter else 1 + -(-new // self.cqes_per_read)",
           "reads = 1 + -(-new // self.cqes_per_read)",
           "the device's completion counter is read like a CQ, one read per CQE"),
    Mutant("credit-poll-one-cqe-per-read", "sim/issuer.py",
           "self.cqes_per_read = lines  # CQEs one poll reads (one per lane)", "self.cqes_per_read = 1",
           "a poll reading 32 CQEs at once still pays one read per CQE consumed"),
    Mutant("cq-polls-overlap", "sim/issuer.py",
           "self.cq = cq if (not in_device and nic.cq_shared_read_ns > 0) else None",
           "self.cq = None",
           "warps sharing a QP poll its host-memory CQ at once, none waiting for the one before"),
    Mutant("fence-ignores-host-reads", "sim/issuer.py",
           "self.fence_host = (host if g.fence_waits_host_reads and (self.host is not None or spinners)",
           "self.fence_host = (None if g.fence_waits_host_reads and (self.host is not None or spinners)",
           "a system fence costs its own time whatever host reads are in flight"),
    Mutant("aggregation-turn-ringer-only", "sim/issuer.py",
           'self._agg_turn = self._agg > 1 and d.aggregation_turn == "every-post"',
           "self._agg_turn = False",
           "under deferred aggregation only the ringing warp takes the turn, whatever the design"),
    Mutant("doorbell-turn-when-ready", "sim/issuer.py",
           "            self._ticket = self.turn.take()\n",
           "            pass\n",
           "a shared QP's doorbell turn goes to whoever is ready first, not in slot order"),
    Mutant("counter-read-over-pcie", "sim/params.py",
           "return self.gpu.completion_counter_in_device_memory or self.nic.hw_counters",
           "return self.gpu.completion_counter_in_device_memory",
           "the device's completion counter is polled through PCIe like a host CQ"),
    Mutant("wqe-always-64-bytes", "sim/issuer.py",
           "        if nbytes > self.inline_bytes or nbytes <= self.wqe_room:\n            return 1\n",
           "        return 1\n", "inline data beyond 32 B still fits a 64 B WQE"),
    Mutant("flush-does-not-wait", "sim/issuer.py",
           "        if self.ctx.design.flush_scope == \"qp\":\n"
           "            qp = self.qp\n"
           "            done = qp.completions\n"
           "            while done.value < qp.rung:\n"
           "                yield from self._wait(cat, done.reach(qp.rung))\n"
           "        elif self.done.value < self.posted:\n"
           "            yield from self._wait(cat, self.done.reach(self.posted))\n",
           "",
           "flush returns before the send completions"),
    Mutant("flush-waits-for-own-writes-only", "sim/issuer.py",
           "        if self.ctx.design.flush_scope == \"qp\":\n",
           "        if False:\n",
           "a QP-scoped flush waits only for the warp's own writes, not the QP's"),
    Mutant("lazy-ignores-sq-bound", "sim/model.py",
           "if worst > self.platform.nic.sq_depth:", "if False:",
           "lazy completion is granted even when the SQ could overflow"),
    # -- receiver ---------------------------------------------------------------------------
    Mutant("lanes-poll-one-source-at-a-time", "sim/receiver.py",
           "            yield from self.wait(tag, n, track, cat, flags=flags, check=False, spin=spin, pay_poll=False)\n",
           "            yield from self.wait(tag, n, track, cat, flags=flags, check=False, spin=spin)\n",
           "a warp polling many sources' counts pays a poll for each, as if one after another"),
    Mutant("recv-completion-free", "sim/receiver.py",
           'dt = ctx.ledger.cost("signal", ctx.platform.receiver.recv_completion_ns)',
           "dt = 0.0", "immediate counting pays no receive-CQE latency"),
    Mutant("recv-cq-bypassed", "sim/receiver.py",
           "self._recv_cqe(msg, cq.cqe, tag)",
           "self._recv_cqe(msg, self._counted, tag)",
           "a receive CQE counts when written: no owner consumes the CQ"),
    Mutant("recv-cq-read-free", "sim/recv_cq.py",
           'dt = (start - now) + led.cost("signal", self.read_ns)', "dt = (start - now) + 0.0",
           "reading a line of the receive CQ costs nothing, also through PCIe"),
    Mutant("recv-cq-one-per-read", "sim/recv_cq.py",
           "n = min(len(self.queue), room)", "n = 1",
           "one receive CQE per read: CQEs sharing a line are not read together"),
    Mutant("recv-cq-whole-queue-per-read", "sim/recv_cq.py",
           "n = min(len(self.queue), room)", "n = len(self.queue)",
           "one read returns every written CQE, not one line of them"),
    Mutant("rq-repost-free", "sim/recv_cq.py",
           "(0.0 if nic.unsolicited_write_recv else rp.rq_repost_ns)", "0.0",
           "a write-with-immediate consumes no receive WR to repost"),
    Mutant("hw-counter-free", "sim/receiver.py",
           'ctx.later("signal", led.cost("signal", ctx.platform.nic.completion_ns), self._know, tag, 1)',
           'ctx.later("signal", 0.0, self._know, tag, 1)', "the NIC's arrival counter ticks with no completion latency"),
    Mutant("violation-check-removed", "sim/receiver.py",
           "        if self.data[tag].value < n:\n", "        if False:\n",
           "consuming writes that are not all visible goes uncounted"),
    Mutant("unordered-prefix-ignored", "sim/receiver.py",
           "target = min(p, self._sig[tag])", "target = self._sig[tag]",
           "unordered counting trusts the signal sum, not the visible prefix"),
    Mutant("poll-granularity-free", "sim/receiver.py",
           "return g.poll_interval_ns * self.polls.uniform() + g.device_load_ns",
           "return 0.0", "a poller sees a change at once, at no load cost"),
    Mutant("proxy-signal-not-held", "sim/receiver.py", "            if v <= have:",
           "            if True:", "the receiving host delivers a signal before its data"),
    Mutant("proxy-receive-on-one-thread", "sim/receiver.py",
           "k = (msg.qp.index if msg.qp is not None else 0) % len(self._host_busy_until)", "k = 0",
           "the GIN proxy's receive side is one serial host thread whatever proxy.threads says"),
    Mutant("proxy-stripe-counted-at-first", "sim/receiver.py",
           "if self._stripes[key] == parent.parts:", "if self._stripes[key] == 1:",
           "a striped put counts as arrived with its first stripe"),
    # -- proxy --------------------------------------------------------------------------------
    Mutant("proxy-ring-frees-out-of-order", "sim/proxy.py",
           "        while ring.inflight and ring.inflight[0].host_done:\n"
           "            ring.inflight.popleft()\n"
           "            freed += 1\n",
           "        ring.inflight.remove(msg)\n        freed = 1\n",
           "a completed descriptor frees its slot past an incomplete earlier one"),
    Mutant("proxy-ring-depth-ignored", "sim/proxy.py",
           "if ring.posted - ring.freed.value >= pp.ring_depth:", "if False:",
           "the GPU never waits for a full descriptor ring"),
    # -- NVLink --------------------------------------------------------------------------------
    Mutant("nvlink-port-not-shared", "sim/nvlink.py",
           "start = free if queued else now", "start = now",
           "copies from one GPU overlap instead of sharing its port"),
    Mutant("tally-released-at-last-booking", "sim/engine.py",
           "        if t >= self.t:  # a tie: the later booking is the one that releases\n",
           "        if True:\n",
           "a count booked ahead is complete at its last booking's instant, not its latest landing"),
    # -- protocols ----------------------------------------------------------------------------
    Mutant("final-reduce-hbm-floor-removed", "sim/protocols/common.py",
           "return max(g.reduce_ns_per_kib * kib / warps, kib * 1024.0 / g.hbm_gbytes_per_s)",
           "return g.reduce_ns_per_kib * kib / warps",
           "a reduction over many warps reads its rows faster than device memory delivers them"),
    Mutant("final-reduce-over-channels", "sim/protocols/common.py",
           "warps = w.design.reduce_warps or w.channels", "warps = w.channels",
           "the final reduction runs on the data channels whatever reduce_warps says"),
    Mutant("signal-group-ignored", "sim/protocols/common.py",
           "    if d.path == \"native\" and group > 1:\n", "    if False:\n",
           "signals are rung one by one whatever design.signal_post_group says"),
    Mutant("combine-per-rank-flags-ignored", "sim/protocols/v1_ll.py",
           'per_rank = not dispatch and w.design.ll_combine_flags == "per-rank"', "per_rank = False",
           "V1 LL combine sends and polls a flag per expert whatever ll_combine_flags says"),
    Mutant("host-reads-never-queue", "sim/issuer.py",
           "start = self.free if self.free > now else now\n        self.free = start + lines_ns",
           "start = now\n        self.free = start + lines_ns",
           "polls of many warps at once share no read path to host memory"),
    Mutant("nvlink-flag-not-ordered", "sim/nvlink.py",
           "lat = max(0.0, self.port_free[src] - now) + led.cost(",
           "lat = 0.0 * max(0.0, self.port_free[src] - now) + led.cost(",
           "an NVLink flag overtakes the stores queued before it"),
    # -- the designs' own proxies (tests/test_design_mechanisms.py) -----------------------------
    Mutant("uccl-receive-on-one-thread", "sim/proxy_uccl.py",
           "dst_thread = self.threads(msg.dst)[src_thread.index]",
           "dst_thread = self.threads(msg.dst)[0]",
           "UCCL-EP: every receive completion goes to thread 0, not the sender's thread index"),
    Mutant("uccl-fifo-not-by-expert", "sim/proxy_uccl.py",
           "if isinstance(tag, ExpertTag):", "if False:",
           "UCCL-EP: a write's FIFO follows its destination, not its expert"),
    Mutant("uccl-count-not-held", "sim/proxy_uccl.py",
           'if self.mode == "imm-counting" and self.arrived[msg.tag] < msg.value:', "if False:",
           "UCCL-EP: a count is applied on arrival, before the writes it covers"),
    Mutant("uccl-sender-barrier-removed", "sim/proxy_uccl.py",
           'elif self.mode == "flush" and self.completed[msg.tag] < self.sent[msg.tag]:',
           "elif False:", "UCCL-EP flush: a count is posted before its writes completed"),
    Mutant("pplx-flag-before-count", "sim/protocols/pplx_a2a.py",
           'yield worker.imm["combine"].reach(len(remote) * per)',
           'yield worker.imm["combine"].reach(0)',
           "pplx-garden: the combine flag is set without waiting for the immediates"),
    Mutant("pplx-dispatch-not-bulk", "sim/protocols/pplx_a2a.py",
           "worker.submit(_shard_peers(w, workers, r, remote, [pairs[r][p] * nbytes for p in remote],",
           "worker.submit(_shard_bytes(w, workers, r, remote, [pairs[r][p] * nbytes for p in remote],",
           "pplx-garden: a dispatch write is cut per NIC instead of one bulk write per peer"),
    # -- the testbed's receive CQs and CQE writes (tests/test_mechanisms.py) ---------------------
    Mutant("spinning-reads-unseen-by-fences", "sim/issuer.py",
           "        for phase, rt in self.spinners.values():  # each spinner's read out at ``start``",
           "        for phase, rt in ():  # each spinner's read out at ``start``",
           "a system fence does not wait for the read a spinning receive-CQ poller has out"),
    Mutant("dest-qp-cq-read-without-its-warp", "sim/recv_cq.py",
           "if not self.busy and (self.spinning or not self.spins):",
           "if not self.busy:",
           "a destination QP's receive CQ is read as CQEs arrive, not only while its warp waits"),
    Mutant("recv-cq-reads-a-line", "sim/recv_cq.py",
           "self.per_line = d.recv_cq_cqes_per_read or max(1, CQ_LINE_BYTES // rp.cqe_bytes)",
           "self.per_line = max(1, CQ_LINE_BYTES // rp.cqe_bytes)",
           "a receive CQ read returns a line of CQEs whatever recv_cq_cqes_per_read says"),
    Mutant("host-cqe-writes-off-the-engine", "sim/nic.py",
           "end = self.host_free = start + led.cost(\"nic\", ns)",
           "end = self.host_free = start",
           "work on the NIC's host engine (CQE writes into host memory, the doorbell's mirror) costs nothing"),
    Mutant("wqe-parsed-before-mirrored", "sim/nic.py",
           "if self.host_free > self.engine_free:  # parsing waits for the mirror",
           "if False:  # parsing waits for the mirror",
           "with a host engine, a WQE is parsed before the doorbell's mirror of it is done"),
)

# A pytest plugin for the runs: the controller (not the xdist workers) writes one JSON line
# per failed or errored test or collector, nodeids exact (they may hold spaces).
PLUGIN = '''
import json, os

_cfg = None


def pytest_configure(config):
    global _cfg
    _cfg = config


def _note(nodeid, what):
    if _cfg is None or hasattr(_cfg, "workerinput"):
        return
    with open(os.environ["MUT_REPORT"], "a") as f:
        f.write(json.dumps({"nodeid": nodeid, "what": what}) + "\\n")


def pytest_runtest_logreport(report):
    if report.failed:
        _note(report.nodeid, report.when)


def pytest_collectreport(report):
    if report.failed:
        _note(report.nodeid or "<collection>", "collect")
'''


class MutantError(RuntimeError):
    """A mutant that does not apply as written (the model's text changed)."""


@dataclass
class Outcome:
    """What the tests did to one mutant (or to the unmutated baseline)."""

    name: str
    killed: bool = False
    golden_only: bool = False
    behaviour_kills: list[str] = field(default_factory=list)  # failing tests outside golden
    golden: str = "not run"  # killed / survived / not run
    stages: list[str] = field(default_factory=list)  # "stage: N failed in S s"
    seconds: float = 0.0
    why: str = ""


def _copy_tree(src: Path, dst: Path) -> None:
    def ignore(folder: str, names: list[str]) -> set[str]:
        return {n for n in names if n in SKIP or n.endswith(".egg-info")}

    shutil.copytree(src, dst, ignore=ignore, symlinks=True)


def _env(tree: Path, report: Path, plugin_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tree), str(plugin_dir)])
    env["MUT_REPORT"] = str(report)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _check_imports(tree: Path, plugin_dir: Path) -> None:
    """``lever`` and ``lever.sim`` must come from the copy, not the editable install."""
    code = "import lever, lever.sim, lever.sim.nic as n; print(lever.sim.__file__); print(n.__file__)"
    r = subprocess.run([sys.executable, "-c", code], cwd=tree, capture_output=True, text=True,
                       env=_env(tree, tree / "unused", plugin_dir))
    paths = r.stdout.split()
    if r.returncode or not paths or not all(Path(p).resolve().is_relative_to(tree) for p in paths):
        raise SystemExit(f"lever.sim does not import from the copy {tree}: {r.stdout} {r.stderr}")


def _text(m: Mutant, tree: Path) -> str:
    """The file's text, after checking that the mutant's old text occurs in it exactly once."""
    path = tree / m.file
    text = path.read_text() if path.is_file() else ""
    n = text.count(m.old)
    if n != 1:
        raise MutantError(f"{m.name}: the old text occurs {n} times in {m.file}, not once")
    return text


def _apply(m: Mutant, tree: Path) -> None:
    path = tree / m.file
    new = _text(m, tree).replace(m.old, m.new)
    compile(new, str(path), "exec")  # a mutant must still be Python: a SyntaxError kills nothing
    path.write_text(new)


def _stages(tests: list[str], tree: Path) -> list[tuple[str, list[str]]]:
    """(stage name, pytest paths and options) for the selection, cheapest first."""

    def within(f: str) -> bool:
        return any(f == t or f.startswith(t.rstrip("/") + "/") for t in tests)

    fast = [f for f in FAST if within(f) and (tree / f).exists()]
    rest = [t for t in tests if t not in FAST and t != GOLDEN]
    out: list[tuple[str, list[str]]] = []
    if fast:
        out.append(("fast", fast))
    if rest:
        ignores = [f"--ignore={f}" for f in (*FAST, GOLDEN) if within(f)]
        out.append(("rest", rest + ignores))
    if within(GOLDEN):
        out.append(("golden", [GOLDEN]))
    return out


def _pytest(tree: Path, plugin_dir: Path, args: list[str], stop_first: bool,
            deselect: list[str], timeout: float) -> tuple[list[str], str, float]:
    """Run pytest in ``tree``: (failing nodeids, note, seconds)."""
    report = tree / ".mut_report.jsonl"
    report.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "pytest", *PYTEST, *(["-x"] if stop_first else []), *args]
    cmd += [f"--deselect={d}" for d in deselect]
    t0 = time.perf_counter()
    note = ""
    try:
        r = subprocess.run(cmd, cwd=tree, env=_env(tree, report, plugin_dir), capture_output=True,
                           text=True, timeout=timeout)
        rc = r.returncode
    except subprocess.TimeoutExpired:
        rc, note = -1, f"timed out after {timeout:.0f} s"
    dt = time.perf_counter() - t0
    failed: list[str] = []
    if report.exists():
        for line in report.read_text().splitlines():
            nid = json.loads(line)["nodeid"]
            if nid not in failed:
                failed.append(nid)
    if rc not in (0, 1, 5, -1) and not failed:  # pytest itself broke (usage, internal error)
        note = f"pytest exit {rc}: {(r.stdout + r.stderr)[-400:]}"
        failed.append(f"<pytest exit {rc}>")
    if rc == -1:
        failed.append("<timeout>")
    return failed, note, dt


def run_one(name: str, tree: Path, plugin_dir: Path, stages: list[tuple[str, list[str]]],
            deselect: list[str], all_kills: bool, timeout: float, baseline: bool = False,
            why: str = "") -> Outcome:
    """Run the stages on one tree; stop after the first stage outside golden that kills."""
    out = Outcome(name, why=why)
    t0 = time.perf_counter()
    for stage, args in stages:
        if stage == "rest" and out.behaviour_kills and not baseline:
            continue  # already killed by a behaviour test: the slow files add nothing
        stop = not baseline and not (all_kills and stage == "fast")
        failed, note, dt = _pytest(tree, plugin_dir, args, stop, deselect, timeout)
        out.stages.append(f"{stage}: {len(failed)} failed in {dt:.0f} s{'; ' + note if note else ''}")
        print(f"  {name} {out.stages[-1]}", file=sys.stderr, flush=True)
        if stage == "golden":
            out.golden = "killed" if failed else "survived"
        else:
            out.behaviour_kills += failed
    out.killed = bool(out.behaviour_kills) or out.golden == "killed"
    out.golden_only = out.golden == "killed" and not out.behaviour_kills
    out.seconds = round(time.perf_counter() - t0, 1)
    return out


def table_md(outcomes: list[Outcome], baseline: Outcome, command: str) -> str:
    rows = ["| mutant | killed | golden-only | golden kills | first killing tests |",
            "|---|---|---|---|---|"]
    for o in outcomes:
        first = ", ".join(f"`{k.split('::')[-1]}`" if "::" in k else f"`{k}`"
                          for k in o.behaviour_kills[:3])
        more = f" (+{len(o.behaviour_kills) - 3})" if len(o.behaviour_kills) > 3 else ""
        rows.append(f"| `{o.name}` | {'yes' if o.killed else '**no**'} | "
                    f"{'**yes**' if o.golden_only else 'no'} | {o.golden} | {first}{more} |")
    pre = [f"Command: `{command}`", ""]
    if baseline.behaviour_kills or baseline.golden == "killed":
        pre += ["Already failing without a mutant (deselected in the mutant runs): "
                + ", ".join(f"`{k}`" for k in baseline.behaviour_kills), ""]
    return "\n".join(pre + rows) + "\n"


def table_text(outcomes: list[Outcome]) -> str:
    w = max(len(o.name) for o in outcomes)
    lines = [f"{'mutant':<{w}}  killed  golden-only  golden    first killing tests"]
    for o in outcomes:
        first = ", ".join(k.split("::")[-1] for k in o.behaviour_kills[:3]) or "-"
        lines.append(f"{o.name:<{w}}  {'yes' if o.killed else 'NO':<6}  "
                     f"{'YES' if o.golden_only else 'no':<11}  {o.golden:<8}  {first}")
    return "\n".join(lines)


def _selected(names: str | None) -> list[Mutant]:
    if not names:
        return list(MUTANTS)
    by = {m.name: m for m in MUTANTS}
    want = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in want if n not in by]
    if unknown:
        raise SystemExit(f"unknown mutants: {', '.join(unknown)} (--list shows them)")
    return [by[n] for n in want]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mutants", help="comma-separated names (default: all)")
    ap.add_argument("--tests", nargs="+", default=["tests"],
                    help="test files or folders, relative to the repository (commas work too)")
    ap.add_argument("--all-kills", action="store_true",
                    help="run the fast stage without -x: every killing test there, not the first")
    ap.add_argument("--timeout", type=float, default=1200.0, help="seconds per pytest stage")
    ap.add_argument("--out", type=Path, help="write the table: .json, .md, or both without suffix")
    ap.add_argument("--list", action="store_true", help="print the mutants and exit")
    a = ap.parse_args(argv)
    mutants = _selected(a.mutants)
    if a.list:
        for m in mutants:
            print(f"{m.name:<34} {m.file:<26} {m.why}")
        return 0
    tests = [t.strip().rstrip("/") for arg in a.tests for t in arg.split(",") if t.strip()]
    command = " ".join(["python", "benchmarks/mutants.py", *(argv if argv is not None else sys.argv[1:])])
    work = Path(tempfile.mkdtemp(prefix="mut-"))
    try:
        plugin_dir = work / "plugin"
        plugin_dir.mkdir()
        (plugin_dir / "mut_report.py").write_text(PLUGIN)
        snap = work / "snapshot"
        _copy_tree(ROOT, snap)  # one snapshot: concurrent edits of the tree can not mix in
        for m in mutants:  # every edit must apply before anything runs
            _text(m, snap)
        stages = _stages(tests, snap)
        print(f"snapshot {snap}; stages: {stages}", file=sys.stderr, flush=True)
        _check_imports(snap, plugin_dir)
        base = run_one("baseline", snap, plugin_dir, stages, [], False, a.timeout, baseline=True)
        deselect = [k for k in base.behaviour_kills if not k.startswith("<")]
        if base.golden == "killed":
            print("warning: tests/test_golden.py fails without a mutant", file=sys.stderr)
        if any(k.startswith(f) for k in deselect for f in FAST):
            print(f"warning: fast tests fail without a mutant: {deselect}", file=sys.stderr)
        outcomes: list[Outcome] = []
        for m in mutants:
            tree = work / m.name
            _copy_tree(snap, tree)
            _apply(m, tree)
            _check_imports(tree, plugin_dir)
            outcomes.append(run_one(m.name, tree, plugin_dir, stages, deselect, a.all_kills,
                                    a.timeout, why=m.why))
            shutil.rmtree(tree)
        print(table_text(outcomes))
        if a.out:
            md = table_md(outcomes, base, command)
            js = {"command": command, "tests": tests, "baseline": asdict(base),
                  "mutants": [{**asdict(o), **{k: getattr(m, k) for k in ("file", "old", "new")}}
                              for o, m in zip(outcomes, mutants, strict=True)]}
            targets = [a.out] if a.out.suffix in (".json", ".md") else [
                a.out.with_suffix(".json"), a.out.with_suffix(".md")]
            for t in targets:
                t.write_text(json.dumps(js, indent=1) + "\n" if t.suffix == ".json" else md)
                print(f"wrote {t}", file=sys.stderr)
        survived = [o.name for o in outcomes if not o.killed or o.golden_only]
        return 1 if survived else 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
