"""Shared machinery of the model: waitable counters, the cost ledger, the trace sink.

Nothing here is physical; the physical pieces (``issuer``, ``proxy``, ``nic``,
``fabric``, ``receiver``, ``nvlink``) are built from it.
"""

from __future__ import annotations

import heapq
from collections import defaultdict, deque
from dataclasses import dataclass, field

import simpy
from simpy.events import NORMAL, Event


class Counter:
    """A monotone counter processes can wait on (``yield c.reach(n)``).

    Models a word in memory that a NIC, a proxy or a peer increments and a
    poller watches: the wait fires at the simulated instant the value reaches
    the threshold. Polling granularity is added by the poller, not here.
    """

    __slots__ = ("env", "value", "_waiters", "_seq", "watchers")

    def __init__(self, env: simpy.Environment, value: int = 0) -> None:
        self.env = env
        self.value = value
        # both made on first use: most counters (one per tag per rank) never get a waiter
        self._waiters: list[tuple[int, int, simpy.Event]] | None = None
        self._seq = 0
        self.watchers: list[Counter] | None = None  # bumped on every change (a poller of many words)

    def add(self, n: int = 1) -> None:
        self.value += n
        w = self._waiters
        while w and w[0][0] <= self.value:
            heapq.heappop(w)[2].succeed()
        if self.watchers:
            for c in self.watchers:
                c.add(1)

    def reach(self, n: int) -> simpy.Event:
        ev = Event(self.env)
        if self.value >= n:
            ev.succeed()
        else:
            self._seq += 1
            if self._waiters is None:
                self._waiters = []
            heapq.heappush(self._waiters, (n, self._seq, ev))
        return ev

    def watch(self, other: Counter) -> None:
        """Bump ``other`` by one on every change of this counter."""
        if self.watchers is None:
            self.watchers = []
        self.watchers.append(other)


def _fire(call: _Call) -> None:
    call.fn(*call.args)


_FIRE = (_fire,)


class _Call:
    """A plain callback on SimPy's event queue: what ``env.timeout(d)`` with one
    callback appended does, as one slotted object with no callback list.

    ``Environment.step`` needs of a queued event only ``callbacks`` (which it
    sets to None) and ``_ok``. A packet in flight, a landing or a completion is
    one of these; at EP256 some 70k are pending at once, and the lighter entry
    costs less to keep and to pop (benchmarks/sim_speed.py).
    """

    __slots__ = ("callbacks", "_ok", "_value", "fn", "args")

    def __init__(self, fn, args: tuple) -> None:
        self.callbacks = _FIRE
        self._ok = True
        self._value = None
        self.fn = fn
        self.args = args


def call_later(env: simpy.Environment, delay: float, fn, *args) -> None:
    """Run ``fn(*args)`` ``delay`` ns from now, in the queue's order: the same
    (time, priority, insertion) slot ``env.timeout(delay)`` would take, so
    results are the same bit for bit."""
    if delay < 0:
        raise ValueError(f"negative delay {delay}")
    env.schedule(_Call(fn, args), NORMAL, delay)


def call_at(env: simpy.Environment, t: float, fn, *args) -> None:
    """Run ``fn(*args)`` at the absolute time ``t`` (not before now), in the queue slot a
    ``Timeout`` due at ``t`` would take.

    A time computed as an absolute instant (an arrival clamped to the connection's last
    arrival, a landing, a completion) must be scheduled as that instant: as a delay,
    ``now + (t - now)`` can round one ulp away from ``t`` and let a later arrival overtake
    an earlier one. SimPy's ``Environment.schedule`` takes a delay only, so this pushes the
    same ``(time, priority, id, event)`` entry it would push (SimPy 4.x queue layout,
    ``tests/test_engine.py`` checks the order against SimPy's own).
    """
    now = env._now
    if t < now:
        raise ValueError(f"time {t} is before now ({now})")
    heapq.heappush(env._queue, (t, NORMAL, next(env._eid), _Call(fn, args)))


class Lock:
    """A capacity-1 lock (a shared QP's doorbell turn) that schedules exactly the
    events ``simpy.Resource(env, 1)`` schedules, in the same order, without its
    put/get queue machinery (one lock cycle per doorbell of a shared QP).

    The grant is an event processed in turn: a request finding the lock free is
    granted at once; ``release`` frees it at once and schedules a hand-off event
    whose processing grants the oldest waiter, and a request arriving while a
    waiter is queued and the lock is free grants that waiter first (FIFO).
    Keeping SimPy's exact sequence keeps every result bit for bit
    (``tests/test_engine.py`` runs both side by side).
    """

    __slots__ = ("env", "holder", "_queue")

    def __init__(self, env: simpy.Environment) -> None:
        self.env = env
        self.holder: Event | None = None
        self._queue: deque[Event] = deque()

    def request(self) -> Event:
        ev = Event(self.env)
        self._queue.append(ev)
        if self.holder is None:
            self._grant()
        return ev

    def release(self, req: Event) -> None:
        if self.holder is req:
            self.holder = None
        handoff = Event(self.env)
        handoff.callbacks.append(self._on_handoff)
        handoff.succeed()

    def _grant(self) -> None:
        ev = self._queue.popleft()
        self.holder = ev
        ev.succeed()

    def _on_handoff(self, _ev: Event) -> None:
        if self.holder is None and self._queue:
            self._grant()


@dataclass
class Ledger:
    """Where simulated time goes.

    ``busy[cat]`` sums the time the *issuing warps* spend per category: what a
    sampling profiler on those warps would see (the profiler attribution).
    ``scale[cat]`` multiplies every cost of a category; setting one to 0 is how
    the critical-path attribution asks "what if this cost were free".
    ``events[cat]`` counts occurrences (doorbells rung, fences, signals...).
    """

    scale: dict[str, float] = field(default_factory=dict)
    busy: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    events: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    counters: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def cost(self, cat: str, ns: float) -> float:
        """Scaled cost of ``cat`` (no bookkeeping: for NIC/wire/receiver work)."""
        s = self.scale.get(cat, 1.0)
        return ns * s

    def on(self, cat: str) -> bool:
        """False when the category is zeroed: waits of that kind are skipped."""
        return self.scale.get(cat, 1.0) != 0.0

    def issue(self, cat: str, ns: float, n: int = 1) -> float:
        """Cost paid on an issuing warp: counted for the profiler."""
        t = ns * self.scale.get(cat, 1.0)
        self.busy[cat] += t
        self.events[cat] += n
        return t

    def waited(self, cat: str, ns: float) -> None:
        """Time an issuing warp spent blocked on ``cat`` (lock, credit, flush...)."""
        if ns > 0:
            self.busy[cat] += ns


class Trace:
    """Chrome trace-event sink (Perfetto opens it). Disabled unless asked for."""

    def __init__(self, enabled: bool = False) -> None:
        self.enabled = enabled
        self.events: list[dict] = []
        self._tids: dict[tuple[str, str], int] = {}

    def span(self, proc: str, track: str, name: str, start_ns: float, dur_ns: float, **args) -> None:
        if not self.enabled or dur_ns <= 0:
            return
        pid, tid = self._ids(proc, track)
        self.events.append(
            {"ph": "X", "pid": pid, "tid": tid, "name": name, "ts": start_ns / 1e3,
             "dur": dur_ns / 1e3, "args": args}
        )

    def _ids(self, proc: str, track: str) -> tuple[int, int]:
        key = (proc, track)
        if key not in self._tids:
            self._tids[key] = len(self._tids) + 1
            pid = self._pid(proc)
            self.events.append({"ph": "M", "name": "thread_name", "pid": pid,
                                "tid": self._tids[key], "args": {"name": track}})
        return self._pid(proc), self._tids[key]

    def _pid(self, proc: str) -> int:
        key = (proc, "")
        if key not in self._tids:
            self._tids[key] = len(self._tids) + 1
            self.events.append({"ph": "M", "name": "process_name", "pid": self._tids[key],
                                "args": {"name": proc}})
        return self._tids[key]
