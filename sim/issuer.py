"""The GPU issuer: a warp posting RDMA writes itself (native GPU-initiated path).

Per put, in the order the EFA-GDA post path does it: a credit check against
send-queue overflow (a completion poll: one read of the device's completion
counter where it has one, else of the CQ plus one read per CQE consumed), the
QP lock when the queue is shared, a slot reservation (one atomic per span of
``put_many_span`` WQEs), the WQE stores (64 B, or 128 B where inline data does
not fit beside the 32 B descriptor), then every ``doorbell_batch`` WQEs (at most the NIC's
``max_batch``) a fence, the 32-bit doorbell and a fence. A put_many span is
one post group: one credit check, one reservation, one doorbell for the span. With deferred
doorbell aggregation the fence+doorbell is paid once per
``deferred_doorbell_aggregation`` warps' worth of WQEs on the QP.

The profiler attribution counts the time spent here per category; the costs
are all scaled by the ledger so the what-if can zero them one by one, and each
is a segment of the warp's chain when the critical path is recorded (a wait
here, for a doorbell turn or a credit, is charged to whatever released it).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Any, Protocol

from lever.sim.engine import Counter, _running, call_at, hold, hold_at, succeed
from simpy.events import Event

if TYPE_CHECKING:
    from lever.sim.context import Context
    from lever.sim.message import Message
    from lever.sim.nic import QueuePair

Steps = Generator[Any, Any, None]
"""A SimPy process fragment: ``yield from port.post(msg)``."""


class Port(Protocol):
    """What a protocol may do with a warp's way out, native or proxy: post a write, ring
    what is still un-rung, and wait until everything it posted completed."""

    rank: int
    warp: int
    track: str
    posted: int
    done: Counter

    def post(self, msg: Message) -> Steps: ...

    def finish(self) -> Steps: ...

    def flush(self, cat: str = "signal") -> Steps: ...


def warp_track(warps_per_sm: int, warp: int) -> str:
    """A warp's trace track (``sm3.w1``): its SM and its place on it."""
    return f"sm{warp // warps_per_sm}.w{warp % warps_per_sm}"


class WarpPort:
    """What every posting warp shares, native or proxy: its counters, its
    trace track, and paying costs (counted for the profiler) or waits."""

    def __init__(self, ctx: Context, rank: int, warp: int) -> None:
        self.ctx = ctx
        self.env = ctx.env
        self.rank = rank
        self.warp = warp
        self.posted = 0
        self.done = Counter(self.env)
        self.track = warp_track(ctx.design.warps_per_sm, warp)
        self.proc = f"rank{rank}"

    def _pay(self, cat: str, ns: float, n: int = 1):
        t = self.ctx.ledger.issue(cat, ns, n)
        if t > 0:
            t0 = self.env._now
            yield self.ctx.hold(cat, t)
            self.ctx.trace.span(self.proc, self.track, cat, t0, t)

    def _hold_all(self, costs: list[tuple[str, float, int]]):
        """Book a run of back-to-back costs as one wait (spans and critical-path segments laid
        out in order): the event to yield, None when they sum to nothing. A plain call, so a
        put's first wait costs no generator of its own."""
        led = self.ctx.ledger
        issue = led.issue
        path = led.path
        env = self.env
        now = acc = env._now
        total = 0.0
        for cat, ns, n in costs:
            t = issue(cat, ns, n)
            if t > 0:
                if path is not None:  # one segment per category, back to back
                    path.cur = (acc, acc + t, cat, path.cur)
                    acc += t
                total += t
        if total <= 0:
            return None
        tr = self.ctx.trace
        if tr.enabled:  # the spans again, from the ledger's scale (costs are pure)
            acc = 0.0
            cost = led.cost
            for cat, ns, _n in costs:
                t = cost(cat, ns)
                if t > 0:
                    tr.span(self.proc, self.track, cat, now + acc, t)
                    acc += t
        return hold(env, total)

    def _pay_all(self, costs: list[tuple[str, float, int]]):
        """:meth:`_hold_all` as a process fragment."""
        ev = self._hold_all(costs)
        if ev is not None:
            yield ev

    def _wait(self, cat: str, ev):
        t0 = self.env._now
        yield ev
        dt = self.env._now - t0
        self.ctx.ledger.waited(cat, dt)
        self.ctx.trace.span(self.proc, self.track, cat, t0, dt)


class HostReadPath:
    """One GPU's read path to host memory (PCIe): every line a read requests leaves it
    ``gpu.host_read_line_ns`` after the one before, so polls of many warps at once queue
    while one warp's poll pays only its round trip. A read ends at the later of its round
    trip and its last line's turn ("free at" arithmetic: no event). Measured on an H200
    (h200-primitives-host-read): one lane per warp reading host memory does not queue up to
    128 warps; a warp reading 32 lines per poll does from 32 warps on (1.31 us at 16 warps,
    5.21 us at 128: about 1.27 ns per line)."""

    __slots__ = ("free", "reads_until", "spinners")

    def __init__(self) -> None:
        self.free = 0.0
        self.reads_until = 0.0  # when the last read issued so far is back
        # warps spinning on a host-memory line (a receive CQ, sim/recv_cq.py): one read out
        # at every instant, back to back from a phase: {owner: (phase, round trip)}
        self.spinners: dict[object, tuple[float, float]] = {}

    def spin(self, owner: object, phase: float, round_trip_ns: float) -> None:
        """``owner`` reads a host line back to back from ``phase`` on, until :meth:`unspin`."""
        self.spinners[owner] = (phase, round_trip_ns)

    def unspin(self, owner: object) -> None:
        self.spinners.pop(owner, None)

    def read(self, now: float, lines_ns: float, round_trip_ns: float) -> float:
        """The time from ``now`` until a read of ``lines_ns`` worth of lines is back."""
        start = self.free if self.free > now else now
        self.free = start + lines_ns
        end = self.free
        dt = round_trip_ns if now + round_trip_ns >= end else end - now
        self.in_flight_until(now + dt)
        return dt

    def in_flight_until(self, t: float) -> None:
        """A host read of this GPU is out until ``t`` (one that does not queue on the line
        path: a poll waiting for a shared CQ's lines, the emulated NIC engine's reads): the
        fences issued before then wait for it (:meth:`fence_ns`)."""
        if t > self.reads_until:
            self.reads_until = t

    def fence_ns(self, start: float, fence_ns: float) -> float:
        """A system fence issued at ``start``: its own cost, or until every host read in
        flight is back when that is later (``gpu.fence_waits_host_reads``), spinning
        pollers' reads included."""
        until = self.reads_until
        for phase, rt in self.spinners.values():  # each spinner's read out at ``start``
            if rt > 0 and start > phase:
                end = phase - ((phase - start) // rt) * rt  # phase + ceil((start - phase) / rt) * rt
                if end > until:
                    until = end
        wait = until - start
        return wait if wait > fence_ns else fence_ns


class CqReadQueue:
    """The polls of one CQ in host memory: every warp sharing the QP reads the same CQE
    lines from the same consumer index, and reads of the same lines are served one after
    another, ``nic.cq_shared_read_ns`` apart ("free at" arithmetic: no event). Measured on an
    H200: W warps reading the same 32 host lines pay about 155 ns more per extra warp
    (h200-primitives-host-read host_read_shared_w*); on the testbed, whose CQ lines the GPU
    itself writes, a poll waits for the whole round trip of the one before (the credit read
    grows 3.4 -> 6.4 -> 20.4 us at 2.7 -> 5.3 -> 10.7 warps per CQ, independent of the warps
    per GPU: calibration/data/testbed/credit-diag). Those averages include QP 0, where all 96
    warps post their counts at once after the flush barrier: split by QP on an H100
    (testbed/h100-713e7da) QP 0 reads in 88 us and the data QPs (12 warps a CQ) in 4.8 us."""

    __slots__ = ("free",)

    def __init__(self) -> None:
        self.free = 0.0

    def start(self, now: float, interval_ns: float) -> float:
        """When a poll issued at ``now`` is served; the next poll of this CQ is served
        ``interval_ns`` later at the earliest."""
        start = self.free if self.free > now else now
        self.free = start + interval_ns
        return start


class SlotTurn:
    """The doorbell turn of a shared QP, in slot order (``QpIssuer::turn`` in hw/ep, the
    ready-head of DeepEP's IBGDA submit, GIN's EFA-GDA post path): a warp reserves its slots
    (takes a ticket) before its credit check and WQE stores, and rings only when every group
    reserved before it has rung. A warp slowed between its reservation and its doorbell (a
    credit poll waiting its turn on the CQ, a fence) holds up every later group on the QP,
    though their own stores are done: doorbells of a QP ring one group at a time, in the
    order of reservation, not of readiness."""

    __slots__ = ("env", "next", "serving", "_waiting", "released", "due")

    def __init__(self, env) -> None:
        self.env = env
        self.next = 0       # the next ticket (post group) to hand out
        self.serving = 0    # the ticket whose doorbell may ring now
        self._waiting: dict[int, Event] = {}
        self.released = None  # the last ringer's segment when it passed the turn
        # (ticket, instant, segment): a ringer in its last wait passes the turn at that instant
        # with that segment running (set by _post_alone, read by the group after it)
        self.due: tuple | None = None

    def take(self) -> int:
        t = self.next
        self.next = t + 1
        return t

    def wait(self, ticket: int) -> Event | None:
        """None when ``ticket`` may ring now (no event), else the event granting it."""
        if self.serving == ticket:
            return None
        ev = Event(self.env)
        self._waiting[ticket] = ev
        return ev

    def passed(self, ticket: int) -> None:
        """``ticket`` rang: the next group's warp, if already waiting, rings now."""
        self.serving = ticket + 1
        self.released = _running(self.env)
        ev = self._waiting.pop(ticket + 1, None)
        if ev is not None:
            ev.rec = self.released  # its wait was released by this doorbell
            succeed(ev)


class NativePort(WarpPort):
    """One warp's view of its QP: post, ring, poll completions."""

    # a group whose slot turn is (or will be) its own when its fence issues waits once for the
    # fence, the ringing and the release (_post_alone); off: a wait for each, as it ran before
    # (the same instants; tests compare the two)
    fuse_turn = True

    def __init__(self, ctx: Context, rank: int, warp: int, qp: QueuePair, lazy: bool,
                 host: HostReadPath | None = None, cq: CqReadQueue | None = None,
                 turn: SlotTurn | None = None) -> None:
        super().__init__(ctx, rank, warp)
        self.qp = qp
        # several warps posting on one QP take turns whatever the design's ownership: owned data
        # QPs have one issuer each, but V1's counts on the notify QP come from every issuing
        # channel (hw/ep post_signals on QP 0, every post_group in slot order)
        self.shared = qp.owners > 1
        self.lazy = lazy
        self.pending: list[Message] = []
        self._since_check = 0
        self._span_left = 0
        g, nic = ctx.platform.gpu, ctx.platform.nic
        # the send completions are read from a completion counter (the device's own, or one the
        # NIC writes into GPU memory) or from the CQ itself; in host memory each read crosses PCIe
        self.counter = nic.hw_counters
        in_device = ctx.platform.send_completions_in_device_memory
        self.counter_read_ns = g.device_load_ns if in_device else g.pcie_read_ns
        # a poll of a CQ in host memory queues on the GPU's read path with every other warp's
        self.host = host if (not in_device and g.host_read_line_ns > 0) else None
        lines = ctx.design.credit_read_lines
        self.poll_lines_ns = lines * g.host_read_line_ns
        self.cqes_per_read = lines  # CQEs one poll reads (one per lane)
        # polls of this QP's CQ by the warps sharing it are served one after another
        self.cq = cq if (not in_device and nic.cq_shared_read_ns > 0) else None
        self.cq_interval_ns = nic.cq_shared_read_ns
        # a system fence waits for the GPU's host reads in flight: credit polls (above) and
        # warps spinning on a host-memory receive CQ (sim/recv_cq.py), wherever this CQ is
        spinners = ctx.design.recv_cq == "per-dest-qp"
        self.fence_host = (host if g.fence_waits_host_reads and (self.host is not None or spinners)
                           else None)
        # the fence after a doorbell: the release of the turn (or lock) at system scope, behind
        # the host reads in flight where the platform says so
        self.release_ns = g.fence_ns if g.turn_release_ns is None else g.turn_release_ns
        self.release_host = self.fence_host if g.release_waits_host_reads else None
        self.inline_bytes = nic.inline_bytes
        self.wqe_room = max(0, 64 - nic.wqe_meta_bytes)  # inline bytes beside the descriptor
        # fixed for the run: what post() would look up per put
        d = ctx.design
        self._credit = not lazy and ctx.ledger.on("credit_wait")
        self._agg = d.deferred_doorbell_aggregation
        self._agg_limit = min(d.deferred_doorbell_aggregation * d.doorbell_batch, nic.max_batch)
        self._limit = min(max(d.doorbell_batch, d.put_many_span), nic.max_batch)
        # doorbells of a shared QP in slot order (deferred aggregation hands its shared batch
        # to whichever warp fills it: a FIFO turn, qp.lock)
        # under aggregation with an every-post turn (hw/ep) each warp posts its own groups in
        # slot order and the pool rings inside the turn of the group that fills it
        self._agg_turn = self._agg > 1 and d.aggregation_turn == "every-post"
        self.turn = turn if (self.shared and ctx.ledger.on("lock") and (self._agg <= 1 or self._agg_turn)) else None
        self._ticket = -1  # the ticket of this warp's open post group
        # every write its own post group, rung in slot order (the shipped native designs:
        # doorbell_batch 1, no put_many span, no deferred aggregation): post() takes
        # _post_alone, the same steps in one frame
        self._alone = (self._limit == 1 and d.put_many_span == 1 and self._agg <= 1
                       and self.turn is not None and d.fences_per_doorbell >= 1
                       and not ctx.trace.enabled)
        self._check_every = d.credit_check_every
        # what _post_alone multiplies by, per put: the ledger's factors (fixed for a run), and
        # the slot-turn atomic and doorbell it pays after the turn, scaled (the same products)
        led = ctx.ledger
        self._f_credit = led.factor("credit_wait")
        self._f_wqe = led.factor("wqe")
        self._f_fence = led.factor("fence")
        self._ringing = (("lock", g.atomic_ns * led.factor("lock")),
                         ("doorbell", g.doorbell_ns * led.factor("doorbell")))

    # -- posting ----------------------------------------------------------------
    def post(self, msg: Message, limit: int | None = None) -> Steps:
        """Post one write (``yield from port.post(m)``): the steps of :meth:`_post_alone` where
        the write is a post group of its own, else :meth:`_post`."""
        if self._alone and (limit is None or limit == 1) and not self.pending:
            return self._post_alone(msg)
        return self._post(msg, limit)

    def _reserve(self) -> None:
        """Reserve the open post group's slots (take its ticket in the QP's slot turn) unless it
        has them: before its credit check, the kernel's order. One place for ``_post`` and
        ``_post_alone`` (the mutant ``doorbell-turn-when-ready`` edits it)."""
        if self._ticket < 0:
            self._ticket = self.turn.take()

    def _release_tail(self, nf: int, start: float) -> list[tuple[str, float, int]]:
        """The fences after a doorbell, before the slot turn (or the lock) passes: ``nf - 1``
        releases at system scope, ``gpu.turn_release_ns`` each; a warp handing an every-post
        turn on without ringing pays them too. A release at system scope is a system fence:
        where fences wait for the host reads in flight (``gpu.fence_waits_host_reads``) and
        ``gpu.release_waits_host_reads`` is on, the first one, issued at ``start``, waits for
        them too, inside the turn (measured by the turn_handoff primitives: the holder's
        st.release.sys 0.75 us alone, 2.7 / 9.3 / 33 us beside 8 / 32 / 96 warps reading host
        memory). The reads it sees are those issued by now (``start`` is at most the
        doorbell's stores later). One place for ``_ring`` and ``_post_alone`` (the mutant
        ``fence-after-doorbell-free`` edits it)."""
        if nf <= 1:
            return []
        rel = self.release_ns
        t = rel * (nf - 1)
        if self.release_host is not None:
            t += self.release_host.fence_ns(start, rel) - rel
        return [("fence", t, nf - 1)]

    def _release_after(self, nf: int, costs: list[tuple[str, float, int]]) -> list[tuple[str, float, int]]:
        """:meth:`_release_tail` for a release issued once ``costs``, paid from now, are paid
        (as the ledger scales them; worked out only where the release waits for reads)."""
        if self.release_host is None:
            return self._release_tail(nf, 0.0)
        cost = self.ctx.ledger.cost
        return self._release_tail(nf, self.env._now + sum(cost(cat, ns) for cat, ns, _n in costs))

    def _post_alone(self, msg: Message) -> Steps:
        """:meth:`_post` then :meth:`_ring` for a write that is its own post group on a QP with
        a slot turn, written out in one generator: the same costs, ledger sums (in the same
        order), critical-path segments, events and queue slots, without the three nested
        generators a put resumed through at each of its waits (a quarter of the model's time
        is this path). Never traced (``_alone`` is off when the trace is on)."""
        env = self.env
        g = self.ctx.platform.gpu
        led = self.ctx.ledger
        qp = self.qp
        msg.qp = qp
        msg.on_complete = self._completed
        msg.t_post = env._now
        turn = self.turn
        self._reserve()
        # the costs up to the fence, paid as _hold_all pays a list of them: each scaled and
        # summed into the ledger in order, a segment each on the path, one wait for their sum
        busy = led.busy
        counts = led.events
        path = led.path
        fused = False
        self._since_check += 1
        if self._credit and self._since_check >= self._check_every:
            self._since_check = 0
            read = self._credit_read()
            if self._room(1):  # no wait can follow the read: paid with the WQE stores
                fused = True
            else:
                yield from self._pay("credit_wait", read)
                yield from self._credit_wait(1)
        blocks = self.wqe_blocks(msg.nbytes)
        qp.posted += 1
        self.posted += 1
        acc = env._now
        total = 0.0
        if fused:
            t = read * self._f_credit
            busy["credit_wait"] += t
            counts["credit_wait"] += 1
            if t > 0:
                if path is not None:
                    path.cur = (acc, acc + t, "credit_wait", path.cur)
                    acc += t
                total += t
        f_wqe = self._f_wqe
        t = g.atomic_ns * f_wqe  # reserve the slot on the producer counter
        busy["wqe"] += t
        counts["wqe"] += 1 + blocks  # its count, and the stores' below (integers: one sum)
        if t > 0:
            if path is not None:
                path.cur = (acc, acc + t, "wqe", path.cur)
                acc += t
            total += t
        t = (g.wqe_build_ns + g.wqe_store_ns * blocks) * f_wqe
        busy["wqe"] += t
        if t > 0:
            if path is not None:
                path.cur = (acc, acc + t, "wqe", path.cur)
                acc += t
            total += t
        # _ring: the system fence after the stores (behind the host reads in flight, known
        # only when it issues: then the stores are paid first)
        f = g.fence_ns
        fh = self.fence_host
        if fh is not None:
            if total > 0:
                yield hold(env, total)
            acc = env._now
            total = 0.0
            f = fh.fence_ns(acc, f)
        t = f * self._f_fence
        busy["fence"] += t
        counts["fence"] += 1
        if t > 0:
            if path is not None:
                path.cur = (acc, acc + t, "fence", path.cur)
            total += t
        ticket = self._ticket
        if ticket < 0:  # not reserved before the stores: reserved now (as _ring does)
            ticket = turn.take()
        self._ticket = -1
        # The turn is this group's when its fence issues (every group reserved before it has
        # rung), or will be before the fence ends (the group before it is in its last wait,
        # passing the turn at a known instant): nothing another warp does meanwhile can hold
        # it, so the fence, the ringing and the release are one wait, the doorbell a call at
        # its instant. Only where the release's cost is fixed (it waits for no host reads
        # issued meanwhile).
        turn_free = False  # the turn is this group's by the fence's end, known now
        if total > 0 and self.release_host is None and self.fuse_turn:
            now = env._now + total  # where hold(env, total) would fire
            serving = turn.serving
            if serving == ticket:
                turn_free = True
                rel = turn.released
            elif serving == ticket - 1:
                due = turn.due
                if due is not None and due[0] == serving and due[1] < now:
                    turn_free = True
                    rel = due[2]  # what turn.released will be when it passes
        if not turn_free:
            if total > 0:
                yield hold(env, total)
            now = env._now
            ev = turn.wait(ticket)
            if ev is None:  # its turn already
                rel = turn.released
            else:  # the wait records what released it
                yield from self._wait("lock", ev)
                now = env._now
                rel = None
        # its turn with no wait for it: continue on the last ringer's chain if later
        if path is not None and rel is not None and rel[1] > path.cur[1]:
            path.cur = rel
        led.counters["doorbells"] += 1
        # _pay_ringing: slot-turn atomic and doorbell, then the fence after the doorbell
        acc = now
        total = 0.0
        for cat, t in self._ringing:  # led.issue(cat, ns, 1)
            busy[cat] += t
            counts[cat] += 1
            if t > 0:
                if path is not None:
                    path.cur = (acc, acc + t, cat, path.cur)
                    acc += t
                total += t
        rung = path.cur if path is not None else None  # the segment the doorbell ends
        after = 0.0
        tail = self._release_tail(self.ctx.design.fences_per_doorbell, now + total)
        scale = led.scale
        for cat, ns, n in tail:
            t = ns * scale.get(cat, 1.0)  # led.issue(cat, ns, n)
            busy[cat] += t
            counts[cat] += n
            if t > 0:
                after += t
        nic = qp.nic
        msgs = [msg]
        if turn_free or (total > 0 and after > 0):
            t_ring = now + total  # where hold(env, total) would fire
            if path is None:
                call_at(env, t_ring, nic.doorbell, msgs)
            else:
                path.call_at(t_ring, rung, nic.doorbell, msgs)
                if after > 0:
                    path.cur = (t_ring, t_ring + after, "fence", path.cur)
            end = t_ring + after
            turn.due = (ticket, end, path.cur if path is not None else None)
            yield hold_at(env, end)
        else:  # nothing to wait for on one side: as two separate payments
            if total > 0:
                yield hold(env, total)
            nic.doorbell(msgs)  # a posted MMIO store: the NIC sees it now
            if after > 0:
                acc = env._now
                if path is not None:
                    path.cur = (acc, acc + after, "fence", path.cur)
                turn.due = (ticket, acc + after, path.cur if path is not None else None)
                yield hold(env, after)
        turn.passed(ticket)  # after the fence that orders the doorbell before the turn word

    def _post(self, msg: Message, limit: int | None = None) -> Steps:
        """Post one write (generator: ``yield from port.post(m)``).

        Slot reservation is an atomic, so WQE stores and the fence after them
        run in parallel across warps; only the doorbell of a shared QP waits
        for its turn (slot order across CTAs: category ``lock``), then rings
        and fences. Costs with no wait between them are paid as one timeout.
        ``limit``: the post group's size for this write instead of the design's
        doorbell batch (signals gathered by ``design.signal_post_group``).
        """
        d, g = self.ctx.design, self.ctx.platform.gpu
        qp = self.qp
        msg.qp = qp
        msg.on_complete = self._completed
        msg.t_post = self.env._now
        span = d.put_many_span
        costs: list[tuple[str, float, int]] = []
        need = 0
        if limit is None:
            limit = self._limit
        if self.turn is not None and self._ticket < 0 and (
                self._span_left == 0 if span > 1 else len(self.pending) + 1 >= limit):
            self._reserve()
        if span > 1:
            # put_many: one credit check for the whole span, when its slots are reserved
            if self._span_left == 0 and self._credit:
                need = span
        else:
            # credit check: a completion poll before the post
            self._since_check += 1
            if self._credit and self._since_check >= d.credit_check_every:
                self._since_check = 0
                need = 1
        if need:
            read = self._credit_read()
            if self._room(need):  # no wait can follow the read: paid with the WQE stores
                costs.append(("credit_wait", read, 1))
            else:
                yield from self._pay("credit_wait", read)
                yield from self._credit_wait(need)
        if self._span_left == 0:
            costs.append(("wqe", g.atomic_ns, 1))  # reserve slots on the producer counter
            self._span_left = d.put_many_span
        self._span_left -= 1
        blocks = self.wqe_blocks(msg.nbytes)
        costs.append(("wqe", g.wqe_build_ns + g.wqe_store_ns * blocks, blocks))
        qp.posted += 1
        self.posted += 1
        if self._agg > 1 and self.turn is None:
            qp.pending.append(msg)
            batch = qp.pending if len(qp.pending) >= self._agg_limit else None
        else:
            self.pending.append(msg)
            # a span is one post group: written, fenced and rung once (as GIN's put path does)
            batch = self.pending if len(self.pending) >= limit else None
        if batch is None:
            ev = self._hold_all(costs)
            if ev is not None:
                yield ev
            return
        yield from self._ring(batch, costs)

    def wqe_blocks(self, nbytes: int) -> int:
        """64 B blocks of the WQE of an ``nbytes`` write: one, unless inline data does not fit
        beside the descriptor (EFA: 32 B inline in a 64 B WQE, a 128 B WQE beyond)."""
        if nbytes > self.inline_bytes or nbytes <= self.wqe_room:
            return 1
        return 1 + -(-(nbytes - self.wqe_room) // 64)

    def _ring(self, batch: list[Message], costs: list | None = None, final: bool = False):
        """Fence after the WQE stores, wait for the doorbell turn on a shared QP,
        ring (the producer index), fence: the NIC sees the batch. ``final``: the warp's last
        group, which rings the QP's aggregation pool whatever its size."""
        w, g, d = self.ctx, self.ctx.platform.gpu, self.ctx.design
        led = w.ledger
        costs = costs if costs is not None else []
        own = batch is self.pending  # this warp's group (else the QP's deferred batch)
        msgs = list(batch)
        batch.clear()
        nf = d.fences_per_doorbell
        agg_turn = self._agg_turn and self.turn is not None
        if agg_turn:  # a GPU-scope fence before the hand-off; the system fence is the ringer's
            costs.append(("fence", g.fence_gpu_ns, 1))
        elif nf:
            costs = yield from self._system_fence(costs)
        turn = self.turn
        if turn is not None and own:
            ev = self._hold_all(costs)
            if ev is not None:
                yield ev
            costs = []
            ticket = self._ticket
            if ticket < 0:  # a partial group rung at the end: reserved now
                ticket = turn.take()
            self._ticket = -1
            ev = turn.wait(ticket)
            if ev is None:  # its turn already: continue on the last ringer's chain if later
                path = led.path
                rel = turn.released
                if path is not None and rel is not None and rel[1] > path.cur[1]:
                    path.cur = rel
            else:
                yield from self._wait("lock", ev)
            costs.append(("lock", g.atomic_ns, 1))
            if agg_turn:
                pool = self.qp.pending
                pool.extend(msgs)
                if not pool or not (final or len(pool) >= self._agg_limit):
                    # hand the turn on without ringing: the turn word is released at the
                    # doorbell's scope all the same (hw/ep turn_pass: st.release.sys where the
                    # doorbell is host or BAR memory), and a release at system scope is a
                    # system fence before the store: the fence after a doorbell, paid per post
                    costs.extend(self._release_after(nf, costs))
                    ev = self._hold_all(costs)
                    if ev is not None:
                        yield ev
                    turn.passed(ticket)
                    return
                msgs = list(pool)
                pool.clear()
                if nf:  # the ringer's system fence covers every WQE of the pool, in the turn
                    costs = yield from self._system_fence(costs)
            costs.append(("doorbell", g.doorbell_ns, 1))
            led.counters["doorbells"] += 1
            tail = self._release_after(nf, costs)
            yield from self._pay_ringing(costs, tail, msgs)
            turn.passed(ticket)  # after the fence that orders the doorbell before the turn word
            return
        locked = self.shared and led.on("lock")
        if locked:
            ev = self._hold_all(costs)
            if ev is not None:
                yield ev
            costs = []
            lock = self.qp.lock
            if lock.take_if_free(self):  # a lone holder: no grant event, nothing to wait for
                req = self
                path = led.path
                rel = lock._released
                if path is not None and rel is not None and rel[1] > path.cur[1]:
                    path.cur = rel  # as a granted request's resume would take it
            else:
                req = lock.request()
                yield from self._wait("lock", req)
            costs.append(("lock", g.atomic_ns, 1))
        costs.append(("doorbell", g.doorbell_ns, 1))
        led.counters["doorbells"] += 1
        yield from self._pay_ringing(costs, self._release_after(nf, costs), msgs)
        if locked:
            lock.release(req)

    def _system_fence(self, costs: list[tuple[str, float, int]]):
        """``costs`` with a system fence after them. The fence's flush is ordered behind the
        host reads in flight when it issues (``gpu.fence_waits_host_reads``): known only then
        (reads other warps issue meanwhile count), so the costs before it are paid first."""
        f = self.ctx.platform.gpu.fence_ns
        if self.fence_host is not None:
            ev = self._hold_all(costs)
            if ev is not None:
                yield ev
            costs = []
            f = self.fence_host.fence_ns(self.env._now, f)
        costs.append(("fence", f, 1))
        return costs

    def _pay_ringing(self, costs: list[tuple[str, float, int]], tail: list[tuple[str, float, int]],
                     msgs: list[Message]):
        """Pay ``costs`` (up to the doorbell store), ring, then pay ``tail`` (the fence after
        the doorbell, still holding the turn) as one wait of the warp.

        The doorbell is a posted MMIO store: the NIC sees it when the store issues, at the
        end of ``costs``, and nothing the warp does depends on it. So the NIC's doorbell is a
        call scheduled for that instant (the queue slot the timeout ending ``costs`` would
        take, running as its critical-path segment) and the warp waits once, to the end of
        ``tail``: the same instants as paying the two apart, one process resume fewer."""
        led = self.ctx.ledger
        issue = led.issue
        path = led.path
        env = self.env
        now = env._now
        acc = now
        total = 0.0
        for cat, ns, n in costs:
            t = issue(cat, ns, n)
            if t > 0:
                if path is not None:
                    path.cur = (acc, acc + t, cat, path.cur)
                    acc += t
                total += t
        rung = path.cur if path is not None else None  # the segment the doorbell ends
        after = 0.0
        for cat, ns, n in tail:
            t = issue(cat, ns, n)
            if t > 0:
                after += t
        nic = self.qp.nic
        if total > 0 and after > 0:
            t_ring = now + total  # where hold(env, total) would fire
            if path is None:
                call_at(env, t_ring, nic.doorbell, msgs)
            else:
                path.call_at(t_ring, rung, nic.doorbell, msgs)
                acc = t_ring
                for cat, ns, _n in tail:  # the warp's own chain goes on through the tail
                    t = led.cost(cat, ns)
                    if t > 0:
                        path.cur = (acc, acc + t, cat, path.cur)
                        acc += t
            yield hold_at(env, t_ring + after)
        else:  # nothing to wait for on one side: as two separate payments
            if total > 0:
                yield hold(env, total)
            nic.doorbell(msgs)  # a posted MMIO store: the NIC sees it now
            if after > 0:
                if path is not None:
                    acc = env._now
                    for cat, ns, _n in tail:
                        t = led.cost(cat, ns)
                        if t > 0:
                            path.cur = (acc, acc + t, cat, path.cur)
                            acc += t
                yield hold(env, after)
        tr = self.ctx.trace
        if tr.enabled:  # the spans, from the ledger's scale (costs are pure)
            acc = now
            cost = led.cost
            for cat, ns, _n in costs + tail:
                t = cost(cat, ns)
                if t > 0:
                    tr.span(self.proc, self.track, cat, acc, t)
                    acc += t

    def finish(self):
        """End of this warp's puts: ring what is still un-rung (own or the QP's)."""
        if self._agg_turn and self.turn is not None:
            if self.pending or self.qp.pending:  # the last group rings the pool, in its turn
                yield from self._ring(self.pending, final=True)
            return
        if self.pending:
            yield from self._ring(self.pending)
        if self.qp.pending:
            yield from self._ring(self.qp.pending)

    def _credit_read(self) -> float:
        """The completion poll before a post: the unscaled time of its reads (a completion
        counter is one read; a CQ is read until a read finds no new CQE: one read, plus one
        per ``design.credit_read_lines`` CQEs it consumes). The CQEs it consumes are those
        written by now. Polls of a shared host-memory CQ wait their turn (``CqReadQueue``)."""
        qp = self.qp
        new = qp.completions.value - qp.consumed
        qp.consumed = qp.completions.value
        reads = 1 if self.counter else 1 + -(-new // self.cqes_per_read)
        return self._read_cq(reads)

    def _read_cq(self, reads: int) -> float:
        """``reads`` dependent reads of the completion counter or CQ, from now: the unscaled
        time until the last is back (its turn among the CQ's other pollers, its lines'
        turn on the GPU's host-read path, its round trip)."""
        now = self.env._now
        if self.cq is None:
            if self.host is not None:
                return self.host.read(now, reads * self.poll_lines_ns, self.counter_read_ns * reads)
            return self.counter_read_ns * reads
        t = now
        for _ in range(reads):
            t = self.cq.start(t, self.cq_interval_ns) + self.counter_read_ns
        # reads waiting for the CQ's lines are in flight (fences wait for them) but do not
        # hold the GPU's line queue, whose ns per line is small against the CQ's turn
        if self.host is not None:
            self.host.in_flight_until(t)
        return t - now

    def _room(self, need: int) -> bool:
        """Whether the send queue has room for ``need`` more WQEs by a margin no read can
        lose: one WQE for every other warp posting on this QP. Then the check after the
        read can not spin and the read is paid in one timeout with the WQE stores that
        follow it (no event between them). Deferred doorbells never fuse: the QP's
        pending list is shared, and appending to it at the read's start rather than its
        end would change which doorbell other warps' WQEs join.

        Approximation: the unfused check compares at the read's end, so it would also
        spin where the other warps posted more than one WQE each during this read and
        filled the queue to within ``need`` meanwhile (never at the shipped SQ depths;
        near a full SQ the unfused path runs)."""
        if self.ctx.design.deferred_doorbell_aggregation > 1:
            return False
        qp = self.qp
        return qp.posted - qp.completions.value + need + (qp.owners - 1) <= qp.nic.p.sq_depth

    def _credit_wait(self, need: int):
        """Spin while the SQ could overflow (after the read: the values at its end)."""
        qp = self.qp
        limit = qp.nic.p.sq_depth
        if qp.posted - qp.completions.value + need > limit:
            yield from self._wait("credit_wait", qp.completions.reach(qp.posted + need - limit))

    def _completed(self, msg: Message) -> None:
        self.done.add(1)

    def flush(self, cat: str = "signal"):
        """Wait until every WQE this warp posted has completed (send completions); with
        ``design.flush_scope = "qp"``, until the QP's completions equal the WQEs rung on it
        by any warp, compared live: a WQE another warp rings while this one waits moves the
        target, and the flush ends only at an instant the QP has nothing in flight."""
        yield from self.finish()
        if self.ctx.design.flush_scope == "qp":
            qp = self.qp
            done = qp.completions
            while done.value < qp.rung:
                yield from self._wait(cat, done.reach(qp.rung))
        elif self.done.value < self.posted:
            yield from self._wait(cat, self.done.reach(self.posted))
        yield from self._pay(cat, self._read_cq(1) if self.cq is not None else self.counter_read_ns)
        self.qp.consumed = self.qp.completions.value
