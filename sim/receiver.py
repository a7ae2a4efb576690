"""The receiving GPU: what a poller can know, and when.

Landed bytes become visible ``visibility_ns`` after the NIC's DMA write (the
NIC does that part). What a polling warp may *conclude* from memory depends on
the signalling strategy, and that is this module:

- ``ordered``/``flush``: the poller reads a flag or tail word. On RC (or after a
  flush) the data before it is known landed. On SRD a flag sent without a
  flush can overtake its data: consuming then is an *ordering violation*,
  which the model counts instead of hiding.
- ``imm-counting``: every data write carries an immediate; its receive CQE is
  written ``recv_completion_ns`` after landing and counted only when the thread
  owning that CQ consumed it, in order (``sim/recv_cq.py``: one read per line of
  CQEs, over PCIe where the CQ is in host memory, plus ``cq_poll_ns`` and the
  receive repost per CQE).
- ``hw-counter``: the NIC bumps a counter in GPU memory per landed write.
- ``unordered-counting``: in-band headers per sub-part plus a weak SignalAdd;
  a prefix of sub-parts is accepted only when every header in it is visible
  *and* the signal count reached it.
- proxy path: a host thread counts write-with-immediate completions and
  delivers signals in sequence order, writing them into GPU memory.

Every wait ends with the poll loop's granularity: the value is seen at the
next poll (uniform phase over ``poll_interval_ns``) plus one load.
"""

from __future__ import annotations

from collections import defaultdict
from functools import partial
from typing import TYPE_CHECKING, Any

from lever.sim.engine import ROOT, Counter, Rec, Tally, call_at, hold, hold_at
from lever.sim.message import POLLED_KINDS
from lever.sim.recv_cq import RecvCq

if TYPE_CHECKING:
    from lever.sim.context import Context
    from lever.sim.fabric import Draws
    from lever.sim.issuer import HostReadPath
    from lever.sim.message import Message
    from lever.sim.tags import Tag


class Receiver:
    """Receiver-side state of one rank: counters per tag, the host thread for proxy.

    ``mode`` is the signalling strategy in force for this op; ``polls`` the rank's
    own random stream for poll phases."""

    def __init__(self, ctx: Context, rank: int, mode: str, polls: Draws) -> None:
        self.ctx = ctx
        self.env = ctx.env
        self.rank = rank
        self.mode = mode
        self.proxy = ctx.design.path == "proxy"
        self.polls = polls
        # partial, not a lambda over self: no cycle through the receiver (World.close)
        counter = partial(Counter, self.env)
        self.data: dict[Tag, Counter] = defaultdict(counter)  # visible (truth)
        self.known: dict[Tag, Counter] = defaultdict(counter)  # a poller may conclude
        self.flags: dict[Tag, Counter] = defaultdict(counter)  # signal arrivals
        # NVLink writes counted to a total, booked ahead (engine.Tally): a wait with total=True
        self.tallies: dict[Tag, Tally] = defaultdict(partial(Tally, self.env))
        self._prefix: dict[Tag, set[int]] = defaultdict(set)  # unordered counting: visible seqs
        self._prefix_n: dict[Tag, int] = defaultdict(int)
        self._sig: dict[Tag, int] = defaultdict(int)  # unordered counting: SignalAdd total
        self._stripes: dict[int, int] = defaultdict(int)  # proxy: stripes arrived per put (id)
        self._host_counted: dict[Tag, int] = defaultdict(int)  # proxy: data writes the host counted
        # proxy: the rank's receiving host threads (as many as send: design.proxy.threads, else
        # platform.proxy.threads), each busy until its own time; a write is handled by the thread
        # owning the endpoint it came in on (the sending QP's index, as the sender spreads them)
        n = (ctx.design.proxy.threads or ctx.platform.proxy.threads) if self.proxy else 1
        self._host_busy_until = [0.0] * n
        self._host_rec: list[Rec] = [ROOT] * n  # critical path: each thread's last segment
        self._held: dict[Tag, list[int]] = defaultdict(list)  # proxy: signals awaiting their data
        # native imm-counting: one receive CQ per NIC (rail) of this rank, or per destination
        # QP (design.recv_cq), made when first used
        self.cqs: dict[int, RecvCq] = {}
        self._rails = ctx.platform.nic.nics_per_gpu
        self.per_qp = ctx.design.recv_cq == "per-dest-qp" and mode == "imm-counting" and not self.proxy
        self.host: HostReadPath | None = None  # the GPU's read path to host memory (World sets it)

    # -- arrivals ----------------------------------------------------------------
    def on_visible(self, msg: Message) -> None:
        """Called by the NIC when every byte of ``msg`` is visible in this GPU's memory."""
        ctx = self.ctx
        led = ctx.ledger
        tag = msg.tag
        if msg.kind in POLLED_KINDS:  # a word the GPU polls itself
            self.data[tag].add(1)
            self.known[tag].add(1)
            return
        if self.proxy:
            self._host_handle(msg)
            return
        if self.per_qp and msg.rx_cq >= 0:
            # a receive CQE on the CQ of the destination QP the write was sent to (a count
            # travels as an immediate on it too)
            if msg.kind == "data":
                self.data[tag].add(1)
            self._recv_cqe(msg, self.cq(msg.rx_cq).cqe, (tag, msg.kind == "data", msg.value))
            return
        if msg.kind == "data":
            self.data[tag].add(1)
            if self.mode == "imm-counting":  # a receive CQE on the CQ of the rail it came in on
                rail = msg.qp.nic.index % self._rails if msg.qp is not None else 0
                cq = self.cqs.get(rail)
                if cq is None:
                    cq = self.cqs[rail] = RecvCq(ctx, self._counted)
                self._recv_cqe(msg, cq.cqe, tag)
            elif self.mode == "hw-counter":
                ctx.later("signal", led.cost("signal", ctx.platform.nic.completion_ns), self._know, tag, 1)
            elif self.mode == "unordered-counting":
                self._prefix[tag].add(msg.seq)
                self._advance_prefix(tag)
            return
        # a signal (count/flag/tail) vouching for msg.value writes of tag: absolute for
        # ordered/flush, additive for unordered counting, only an arrival for imm/hw counting
        if self.mode == "unordered-counting":
            self._sig[tag] += msg.value
            self._advance_prefix(tag)
        elif self.mode in ("ordered", "flush"):
            k = self.known[tag]
            if msg.value > k.value:
                k.add(msg.value - k.value)
        self.flags[tag].add(1)

    def _recv_cqe(self, msg: Message, cqe, item) -> None:
        """The receive CQE of ``msg`` is generated ``recv_completion_ns`` after it became
        visible; where the NIC writes it into host memory on its engine (the sending NIC's,
        as the emulated NIC's host engine does), it waits for that engine too."""
        ctx = self.ctx
        dt = ctx.ledger.cost("signal", ctx.platform.receiver.recv_completion_ns)
        nic = msg.qp.nic if msg.qp is not None else None
        if nic is not None and nic.recv_cqe_engine_ns:
            ctx.later("signal", dt, nic.engine_write, nic.recv_cqe_engine_ns, cqe, item)
        else:
            ctx.later("signal", dt, cqe, item)

    def _know(self, tag, n: int) -> None:
        self.known[tag].add(n)

    def _counted(self, tag) -> None:
        """The CQ's owner consumed one receive CQE of ``tag``: the count moves."""
        self.known[tag].add(1)

    def cq(self, key: int) -> RecvCq:
        """The receive CQ of destination QP ``key`` (per-dest-qp), made when first used."""
        cq = self.cqs.get(key)
        if cq is None:
            cq = self.cqs[key] = RecvCq(self.ctx, self._consumed, spins=True, host=self.host)
        return cq

    def _consumed(self, item) -> None:
        """The owning warp consumed a receive CQE of a destination QP's CQ: a data write of
        ``tag`` counted, or a signal (a count as an immediate) arrived."""
        tag, is_data, _value = item
        if is_data:
            self.known[tag].add(1)
        else:
            self.flags[tag].add(1)

    def _advance_prefix(self, tag) -> None:
        seen = self._prefix[tag]
        p = self._prefix_n[tag]
        while p in seen:
            p += 1
        self._prefix_n[tag] = p
        k = self.known[tag]
        target = min(p, self._sig[tag])
        if target > k.value:
            k.add(target - k.value)

    def _host_handle(self, msg: Message) -> None:
        """Proxy path: the receiving host thread consumes one receive completion."""
        pp = self.ctx.platform.proxy
        led = self.ctx.ledger
        now = self.env.now
        path = led.path
        k = (msg.qp.index if msg.qp is not None else 0) % len(self._host_busy_until)
        busy = self._host_busy_until[k] > now
        start = max(now, self._host_busy_until[k])
        free = self._host_busy_until[k] = start + led.cost("proxy_post", pp.host_cq_poll_ns)
        done = free + led.cost("proxy_queue", pp.host_to_gpu_ns)
        tag = msg.tag
        if msg.kind == "stripe":  # one rail's part of a striped put: count until all arrived
            fn, args = self._host_stripe, (msg.parent,)
        elif msg.kind == "data":
            self.data[tag].add(1)
            fn, args = self._host_data, (tag,)
        else:
            fn, args = self._host_signal, (tag, msg.value)
        if path is None:
            call_at(self.env, done, fn, *args)
        else:  # the host thread's CQ read (behind its previous one), then the write to the GPU
            self._host_rec[k] = (start, free, "proxy_post", self._host_rec[k] if busy else path.cur)
            rec = (free, done, "proxy_queue", self._host_rec[k])
            path.call_at(done, rec, fn, *args)

    def _host_stripe(self, parent: Message) -> None:
        """The receiving host counts stripes per (peer, sequence); the put is there with the last."""
        key = id(parent)
        self._stripes[key] += 1
        if self._stripes[key] == parent.parts:
            del self._stripes[key]
            self.data[parent.tag].add(1)
            self._host_data(parent.tag)

    def _host_data(self, tag) -> None:
        self._host_counted[tag] += 1
        self._host_release(tag)

    def _host_signal(self, tag, value: int) -> None:
        self._held[tag].append(value)
        self._host_release(tag)

    def _host_release(self, tag) -> None:
        """Deliver held signals whose data all arrived (sequence order per stream)."""
        have = self._host_counted[tag]
        held = self._held[tag]
        k = self.known[tag]
        for v in sorted(held):
            if v <= have:
                if v > k.value:
                    k.add(v - k.value)
                self.flags[tag].add(1)
        self._held[tag] = [v for v in held if v > have]

    # -- polling -------------------------------------------------------------------
    def wait(self, tag, n: int, track: str, cat: str = "poll_wait", flags: int = 0,
             check: bool = True, then: tuple[str, float] | None = None, total: bool = False,
             spin: int = -1, pay_poll: bool = True):
        """A warp polls until it may conclude ``n`` writes of ``tag`` landed
        (and, with ``flags``, until that many signals of ``tag`` arrived).

        ``then = (category, ns)`` is the warp's own work right after the poll that sees it (a
        reduction of what landed): paid in the same wait as the poll, at the same instants,
        when the check at the poll's end can not fail (the writes are visible already, so they
        still are then); else after it, as a separate wait. ``total``: ``n`` is every write
        of ``tag`` there will be, NVLink writes booked ahead on ``tallies[tag]`` (landed when
        booked: nothing to check). ``spin``: the destination QP whose receive CQ this warp
        reads while it waits (per-dest-qp imm-counting: the count moves only as it does).
        ``pay_poll=False``: one of several words the warp's lanes poll at once (:meth:`wait_all`):
        it ends when the value is there, the poll that sees it paid once for all of them."""
        led, tr = self.ctx.ledger, self.ctx.trace
        env = self.env
        t0 = env._now
        if total:
            ev = self.tallies[tag].reach(n)
            if ev is not None:
                yield ev
            check = False
        else:
            k = self.known[tag]
            cq = None
            if spin >= 0 and self.per_qp and ((flags and self.flags[tag].value < flags) or k.value < n):
                cq = self.cq(spin)
                cq.spin_start()
            if flags and self.flags[tag].value < flags:
                yield self.flags[tag].reach(flags)
            if k.value < n:
                yield k.reach(n)
            if cq is not None:
                cq.spin_end()
        now = env._now
        led.waited(cat, now - t0)
        if not pay_poll:
            if tr.enabled:
                tr.span(f"rank{self.rank}", track, cat, t0, now - t0, tag=str(tag))
            return
        poll = led.issue(cat, self.poll_ns())  # the poll that sees it: ``poll_wait`` on the path
        path = led.path
        if path is not None:
            path.seg(cat, poll)
        if then is not None and (not check or self.data[tag].value >= n):
            work = led.issue(then[0], then[1])
            if path is not None:
                path.cur = (now + poll, now + poll + work, then[0], path.cur)
            yield hold_at(env, now + poll + work)  # the instant the two waits would end at
            if tr.enabled:
                tr.span(f"rank{self.rank}", track, cat, t0, now + poll - t0, tag=str(tag))
            return
        yield hold(env, poll)
        if tr.enabled:
            tr.span(f"rank{self.rank}", track, cat, t0, env._now - t0, tag=str(tag))
        if check:
            self.check(tag, n)
        if then is not None:
            yield self.ctx.busy(then[0], then[1])

    def wait_all(self, words: list[tuple[Any, int]], track: str, cat: str = "poll_wait",
                 flags: int = 0, spin: int = -1):
        """A warp polls several words at once, a lane each (hw/ep's receive loops: lane ``s``
        reads source ``s``'s count or flag; DeepEP LL gives each (source, expert) pair its own
        warp group): it goes on when the last of them is there, one poll after it, then
        consumes them all. ``words``: ``(tag, n)`` pairs, as :meth:`wait` takes one."""
        if not words:
            return
        for tag, n in words[:-1]:
            yield from self.wait(tag, n, track, cat, flags=flags, check=False, spin=spin, pay_poll=False)
        tag, n = words[-1]
        yield from self.wait(tag, n, track, cat, flags=flags, spin=spin)
        for tag, n in words[:-1]:
            self.check(tag, n)

    def poll_ns(self) -> float:
        """The poll loop's granularity after the awaited value changed: it is seen at the next
        poll (uniform phase over ``poll_interval_ns``) plus one load. (Consuming receive CQEs
        is the CQ owner's work, before the count moves: ``sim/recv_cq.py``.) Draws from the
        rank's own stream."""
        g = self.ctx.platform.gpu
        return g.poll_interval_ns * self.polls.uniform() + g.device_load_ns

    def check(self, tag, n: int) -> None:
        """Consuming ``n`` writes of ``tag``: count a violation if they are not all visible."""
        if self.data[tag].value < n:
            self.ctx.ledger.counters["ordering_violations"] += 1
