"""Shared machinery of the model: waitable counters, the cost ledger, the trace sink,
and the recorder of the one-run critical path.

Nothing here is physical; the physical pieces (``issuer``, ``proxy``, ``nic``,
``fabric``, ``receiver``, ``nvlink``) are built from it.
"""

from __future__ import annotations

import heapq
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any

import simpy
from simpy.core import BoundClass, EmptySchedule, StopSimulation
from simpy.events import NORMAL, AllOf, Event, EventPriority, Process, Timeout

_heappush = heapq.heappush  # one global per push, not a global and an attribute

Rec = tuple[float, float, str, "Rec | None"]
"""One segment of simulated time on the critical path: ``(start, end, category,
predecessor)``, the predecessor being the segment whose end let this one start (a
plain tuple: one is made per cost, packet stage and landing, and tuples are the
cheapest object CPython builds)."""

ROOT: Rec = (0.0, 0.0, "", None)
"""Time 0: where every chain starts."""


def succeed(ev: Event) -> None:
    """``ev.succeed()`` for a wait the model triggers once and only once (a counter's
    waiter, a turn's grant): the same ``(now, NORMAL, id)`` entry SimPy's ``schedule`` pushes
    for it, without the frames of ``Event.succeed``, ``schedule`` and the queue's push (one
    such wake for about every tenth event at EP256)."""
    ev._ok = True
    ev._value = None
    env = ev.env
    try:
        push = env.push  # type: ignore[attr-defined]
    except AttributeError:  # SimPy's own environment
        _heappush(env._queue, (env._now, NORMAL, next(env._eid), ev))
        return
    push((env._now, NORMAL, next(env._eid), ev, None, None))


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
        # bumped on every change (a poller of many words): Counters, or anything with add(n)
        self.watchers: list[Any] | None = None

    def add(self, n: int = 1) -> None:
        self.value += n
        w = self._waiters
        if w and w[0][0] <= self.value:
            rec = _running(self.env)
            while w and w[0][0] <= self.value:
                ev = heapq.heappop(w)[2]
                if rec is not None:
                    ev.rec = rec  # what released the wait
                succeed(ev)
        if self.watchers:
            for c in self.watchers:
                c.add(1)

    def reach(self, n: int) -> simpy.Event:
        ev = Event(self.env)
        if self.value >= n:
            succeed(ev)
        else:
            self._seq += 1
            if self._waiters is None:
                self._waiters = []
            heapq.heappush(self._waiters, (n, self._seq, ev))
        return ev

    def watch(self, other: Any) -> None:
        """Bump ``other`` by one (``other.add(1)``) on every change of this counter."""
        if self.watchers is None:
            self.watchers = []
        self.watchers.append(other)


class Tally:
    """A count of writes whose every landing instant is booked ahead (:meth:`add_at`), and
    one waiter for the count they all reach (:meth:`reach`): an NVLink landing counted this
    way is arithmetic, not an event at its instant.

    A :class:`Counter` is a word a poller can read at any instant, so each increment is an
    event at its instant. A count that nothing reads until it is complete (a rank's tokens
    from one source, a token's partial rows at its forwarder) only needs the instant its
    last write lands: the latest booked instant, once the bookings reached the total. The
    waiter is released then, in the queue slot of an event scheduled when the total was
    booked (a landing at the same instant may run before or after it: a tie), and is charged
    to the segment of that last landing when the critical path is recorded. A booking past
    a waiter's total is a model error: the waiter would have been released too early.
    """

    __slots__ = ("env", "n", "t", "rec", "want", "ev")

    def __init__(self, env: simpy.Environment) -> None:
        self.env = env
        self.n = 0  # writes booked
        self.t = 0.0  # the latest booked instant
        self.rec: Rec | None = None  # its segment (critical path)
        self.want = 0  # the waiter's total (0: none waits)
        self.ev: Event | None = None

    def add_at(self, t: float, k: int = 1, rec: Rec | None = None) -> None:
        """``k`` writes land at instant ``t`` (now or later); ``rec``: the segment they land at
        the end of, when the critical path is recorded."""
        self.n += k
        if t >= self.t:  # a tie: the later booking is the one that releases
            self.t = t
            self.rec = rec
        if self.want:
            if self.n > self.want:
                raise RuntimeError(f"Tally: {self.n} writes booked for a total of {self.want}")
            if self.n == self.want:
                self.want = 0
                fire_at(self.env, self.ev, max(self.t, self.env._now), self.rec)

    def reach(self, total: int) -> Event | None:
        """The event to wait for until all ``total`` writes landed; None when they have."""
        env = self.env
        if self.n > total:
            raise RuntimeError(f"Tally: {self.n} writes booked for a total of {total}")
        if self.n == total:
            if self.t <= env._now:
                return None
            return event_at(env, self.t, self.rec)
        self.want = total
        self.ev = Event(env)
        return self.ev


def _fire(call: _Call) -> None:
    call.fn(*call.args)


_FIRE = (_fire,)


class _Call:
    """A plain callback on SimPy's own event queue: what ``env.timeout(d)`` with one
    callback appended does, as one slotted object with no callback list.

    ``Environment.step`` needs of a queued event only ``callbacks`` (which it
    sets to None) and ``_ok``. On a :class:`ModelEnvironment` a call is lighter still: a
    *call entry*, ``fn``, ``args`` and ``rec`` in the queue entry itself (see there; a packet
    in flight, a landing or a completion is one, some 70k pending at once at EP256), which
    the environment's ``step`` and :func:`run_events` run.
    """

    __slots__ = ("callbacks", "_ok", "_value", "fn", "args")

    def __init__(self, fn, args: tuple) -> None:
        self.callbacks = _FIRE
        self._ok = True
        self._value = None
        self.fn = fn
        self.args = args


class ModelEnvironment(simpy.Environment):
    """SimPy's environment with a two-level event queue: the same events popped in the same
    ``(time, priority, id)`` order as SimPy's one heap, cheaper when many are pending.

    At EP256 some 70k events are pending, most of them packets, ACKs and completions tens
    of microseconds away, while the events popped next are the next few hundred ns of
    warp work; in one heap every pop sifts through all of them (the single largest cost
    of the model at EP32, a sixth of its samples). Here time is cut into buckets of
    ``BUCKET_NS``: ``_queue`` (the heap SimPy pops from) holds the entries of the current
    bucket and earlier, and an entry due in a later bucket is appended, unsorted, to that
    bucket's list. When the heap runs empty, the earliest bucket is heapified into it.

    Why the order is SimPy's exactly: bucket ``b(t) = t // BUCKET_NS`` never decreases with
    ``t``. ``_bucket`` is the latest bucket moved into the heap (at first the clock's); an
    entry goes to the heap when ``b(t) <= _bucket``, to its bucket's list otherwise, and a
    list is moved only when the heap is empty, the earliest first (``_bucket`` becomes it).
    So every entry in the heap has a smaller bucket, hence an earlier time, than every
    entry left in the lists, and within the heap SimPy's own tuple order decides;
    ``tests/test_engine.py`` compares whole runs event by event.

    An entry is ``(time, priority, id, event, None, None)`` for an event, and
    ``(time, priority, id, fn, args, rec)`` for a *call entry*: ``fn(*args)`` run as segment
    ``rec`` of the critical path (None: not recorded, or the callee restores its own). The
    ids are unique, so entries compare as SimPy's ``(time, priority, id, event)`` do, on the
    first three items. The call is flat in the entry, not a tuple of its own in the event's
    place, because nearly every entry is one (a packet, a landing, a hold's end): one object
    fewer to build, free and reach through per event.
    """

    BUCKET_NS = 50.0  # fewest instructions at EP32 of 10-500 (callgrind): a heap of tens
    path: CriticalPath | None = None  # no recorder (PathEnvironment's own): a plain lookup, no miss

    def __init__(self, initial_time: float = 0) -> None:
        super().__init__(initial_time)
        # SimPy binds env.timeout, env.event... to the instance, but only those of the
        # instance's own class: bind the base class's too (else every call builds a method),
        # except what a subclass defines itself (PathEnvironment's process, all_of)
        own: set[str] = set()
        for c in type(self).__mro__:
            if c is simpy.Environment:
                break
            own |= set(c.__dict__)
        for name, obj in simpy.Environment.__dict__.items():
            if type(obj) is BoundClass and name not in own:
                setattr(self, name, getattr(self, name))
        self._far: dict[float, list] = {}
        self._far_keys: list[float] = []  # heap of the buckets with entries
        self._width = self.BUCKET_NS
        self._bucket = self._now // self._width  # the latest bucket moved into the heap
        self._edge = (self._bucket + 1) * self._width  # where the next bucket starts
        self.push = self._push_entry  # a bound method kept once: helpers look it up per entry
        self.daemons: list[Process] = []  # the pieces' endless loops (start_daemon), for close()

    def close(self) -> None:
        """The run is over: break the reference cycles it would leave, so that reference
        counting frees it at once.

        The methods bound above point back at the environment, and a daemon still waiting
        (a proxy thread's loop) and the event it waits on point at each other, its frame
        holding the pieces it works with: each such cycle made the whole finished run, its
        critical-path segments included, garbage that only the cyclic collector frees, a
        traversal of every object the run left (7 s after a recorded EP256 dispatch).
        Closing a daemon's generator runs no model code (the loops have no ``finally``);
        the environment is unusable afterwards.
        """
        for p in self.daemons:
            if not p.triggered:
                p._generator.close()
                p._target = None
        self.daemons = []
        for name, value in list(vars(self).items()):
            if getattr(value, "__self__", None) is self or name == "path":
                delattr(self, name)

    def _push_entry(self, entry: tuple) -> None:
        # t < (_bucket + 1) * width is t // width <= _bucket: floor division of floats is exact
        # (fmod is), and the bucket edges are whole multiples of the width
        t = entry[0]
        if t < self._edge:
            _heappush(self._queue, entry)
            return
        b = t // self._width
        lst = self._far.get(b)
        if lst is None:
            self._far[b] = [entry]
            _heappush(self._far_keys, b)
        else:
            lst.append(entry)

    def schedule(self, event, priority=NORMAL, delay=0) -> None:  # type: ignore[override]
        self._push_entry((self._now + delay, priority, next(self._eid), event, None, None))

    def refill(self) -> bool:
        """The heap ran empty: heapify the earliest bucket into it (False when none is left)."""
        if not self._far_keys:
            return False
        b = heapq.heappop(self._far_keys)
        self._bucket = b
        self._edge = (b + 1) * self._width
        lst = self._far.pop(b)
        q = self._queue
        q.extend(lst)  # the same list object: loops hold it
        heapq.heapify(q)
        return True

    def pending(self) -> int:
        """Entries queued, in the heap and the buckets (counted when asked: the depth
        sampler's, every few events, not a count kept at every push)."""
        return len(self._queue) + sum(map(len, self._far.values()))

    def peek(self) -> float:
        if not self._queue:
            self.refill()
        return self._queue[0][0] if self._queue else simpy.core.Infinity

    def step(self) -> None:
        """SimPy's ``Environment.step`` for this queue's entries: a call entry is run, an
        event's callbacks are (:func:`run_events` is the model's loop; this one serves
        ``env.run()``)."""
        if not self._queue and not self.refill():
            raise EmptySchedule()
        self._now, _, _, event, args, rec = heapq.heappop(self._queue)
        if args is not None:  # a call entry
            if rec is not None:
                self.path.cur = rec  # type: ignore[union-attr]
            event(*args)
            return
        callbacks, event.callbacks = event.callbacks, None
        try:
            for callback in callbacks:
                callback(event)
        except StopSimulation:
            # as SimPy does: the callbacks left run when the simulation resumes
            event.callbacks = callbacks[callbacks.index(callback) + 1 :]
            self.schedule(event, EventPriority(-1))
            raise
        if not event._ok and not hasattr(event, "_defused"):
            _raise_failed(event)


class _Hold:
    """What ``env.timeout(delay)`` is to the process that yields it, as one slotted object:
    the warp's own busy time (a cost paid, serialisation on a port).

    ``Environment.step`` needs of a queued event only ``callbacks`` and ``_ok``, and
    ``Process._resume`` only ``callbacks`` (to append itself) and ``_value``; a Timeout
    carries an attribute dict, its delay and environment besides. One is made per cost a
    warp pays, so the lighter one is cheaper to build, keep queued and free."""

    __slots__ = ("callbacks", "_ok", "_value")

    def __init__(self) -> None:
        self.callbacks: list = []
        self._ok = True
        self._value = None


class _Resumes:
    """What :func:`hold` gives the running process to yield on a :class:`ModelEnvironment`:
    its queue entry is a call entry of ``_wake(proc)`` rather than an event, so there
    is nothing to fire. :func:`_wake` knows it by identity; ``Process._resume`` (were it to see
    it) appends itself to ``callbacks``, here a ``deque(maxlen=0)``, which keeps nothing."""

    __slots__ = ()
    callbacks: deque = deque(maxlen=0)


_RESUMES = _Resumes()


def _wake(proc: Process) -> None:
    """A hold's end: resume ``proc`` as ``proc._resume`` resumes it with a finished timeout
    (SimPy's ``Process._resume``, and on a :class:`PathEnvironment` ``_PathProcess._resume``
    around it), in one frame.

    Half of the model's events are these. Through the process's own resume each cost two
    frames, a bound method made at the hold and another made to append to
    :data:`_RESUMES`'s callbacks: the same steps here, the same order, the same chain (a hold
    is the process's own segment, recorded before it yielded, so nothing releases it but
    its own ``rec``). Anything but a hold yielded next goes on as SimPy's loop would."""
    env = proc.env
    path = env.path
    if path is not None:
        path.cur = proc.rec
    env._active_proc = proc
    try:
        ev = proc._generator.send(None)
    except StopIteration as e:  # the process ended: it fires as an event of its own
        ev = None
        proc._ok = True
        proc._value = e.args[0] if e.args else None
        env.schedule(proc)
    except BaseException as e:  # it failed: as SimPy fails it
        ev = None
        proc._ok = False
        e.__traceback__ = e.__traceback__.tb_next  # type: ignore[union-attr]
        proc._value = e
        env.schedule(proc)
    else:
        if ev is not _RESUMES:
            try:
                cbs = ev.callbacks
            except AttributeError:
                raise RuntimeError(f'Invalid yield value "{ev}"') from None
            if cbs is None:  # processed already: SimPy's loop sends its value at once
                Process._resume(proc, ev)
                if path is not None:
                    proc.rec = path.cur
                return
            cbs.append(proc._resume)
    proc._target = ev
    env._active_proc = None
    if path is not None:
        proc.rec = path.cur


def hold(env: simpy.Environment, delay: float) -> _Hold | _Resumes:
    """An event for the running process to yield, firing ``delay`` ns from now in the queue
    slot ``env.timeout(delay)`` would take (the same ``(now + delay, NORMAL, id)`` entry,
    so the same order bit for bit: ``tests/test_engine.py``).

    On a :class:`ModelEnvironment`, inside a process, the entry is a call entry resuming that
    process (:func:`_wake`, run in the loop's fast path: what ``_Hold``'s one callback did,
    at the same slot), and what the process yields is :data:`_RESUMES`; half of the model's
    events are these. The process must yield it at once (every caller does: a cost it pays)."""
    if delay < 0:
        raise ValueError(f"negative delay {delay}")
    try:
        push = env.push  # type: ignore[attr-defined]
    except AttributeError:  # SimPy's own environment
        h = _Hold()
        heapq.heappush(env._queue, (env._now + delay, NORMAL, next(env._eid), h))
        return h
    proc = env._active_proc
    if proc is None:  # not yielded by a process: an event of its own
        h = _Hold()
        push((env._now + delay, NORMAL, next(env._eid), h, None, None))
        return h
    push((env._now + delay, NORMAL, next(env._eid), _wake, (proc,), None))
    return _RESUMES


def hold_at(env: simpy.Environment, t: float) -> _Hold | _Resumes:
    """:func:`hold` firing at the absolute instant ``t`` (not before now): the slot a
    timeout due at ``t`` takes, for a wait computed as an instant (``now + a + b`` summed
    as the separate waits would sum it)."""
    if t < env._now:
        raise ValueError(f"time {t} is before now ({env._now})")
    try:
        push = env.push  # type: ignore[attr-defined]
    except AttributeError:  # SimPy's own environment
        h = _Hold()
        heapq.heappush(env._queue, (t, NORMAL, next(env._eid), h))
        return h
    proc = env._active_proc
    if proc is None:
        h = _Hold()
        push((t, NORMAL, next(env._eid), h, None, None))
        return h
    push((t, NORMAL, next(env._eid), _wake, (proc,), None))
    return _RESUMES


def start_daemon(env: simpy.Environment, generator) -> Process:
    """Start a piece's endless loop (a proxy thread, a fabric worker): a process that is
    still waiting when the op ends, which ``ModelEnvironment.close`` stops so the run is
    freed at once."""
    p = env.process(generator)
    daemons = getattr(env, "daemons", None)  # a bare SimPy environment (a test's) keeps none
    if daemons is not None:
        daemons.append(p)
    return p


class Wakeup:
    """An idle loop's wait for its next piece of work (a host progress thread's, the emulated
    NIC's host engine): the loop yields :meth:`sleep` when a pass found nothing to do, and
    whatever brings work calls :meth:`kick`, which wakes it carrying the waker's
    critical-path segment, so the idle time is charged to the chain that ended it."""

    def __init__(self, env: simpy.Environment, ledger: Ledger) -> None:
        self.env = env
        self.ledger = ledger
        self._kick: Event | None = None

    def kick(self) -> None:
        if self._kick is not None and not self._kick.triggered:
            path = self.ledger.path
            if path is not None:
                self._kick.rec = path.cur  # the idle loop is woken by this (CQE, descriptor...)
            self._kick.succeed()

    def sleep(self) -> Event:
        """The event an idle pass yields: triggered by the next :meth:`kick`."""
        self._kick = self.env.event()
        return self._kick


def event_at(env: simpy.Environment, t: float, rec: Rec | None = None) -> Event:
    """An event that fires at the absolute instant ``t`` (not before now), in the queue slot a
    timeout due at ``t`` would take: what a process ending at ``t`` is to those waiting for it
    (an ``all_of``), for work computed without a process. ``rec``: the segment it ends, when
    the critical path is recorded (the ``rec`` a finished process carries)."""
    return fire_at(env, Event(env), t, rec)


def fire_at(env: simpy.Environment, ev: Event, t: float, rec: Rec | None = None) -> Event:
    """Schedule the pending event ``ev`` (a waiter yielded it already) to fire at instant ``t``
    (not before now): :func:`event_at` for an event made earlier."""
    if t < env._now:
        raise ValueError(f"time {t} is before now ({env._now})")
    ev._ok = True
    ev._value = None
    if rec is not None:
        ev.rec = rec
    try:
        push = env.push  # type: ignore[attr-defined]
    except AttributeError:  # SimPy's own environment
        heapq.heappush(env._queue, (t, NORMAL, next(env._eid), ev))
    else:
        push((t, NORMAL, next(env._eid), ev, None, None))
    return ev


def call_later(env: simpy.Environment, delay: float, fn, *args) -> None:
    """Run ``fn(*args)`` ``delay`` ns from now, in the queue's order: the same
    (time, priority, insertion) slot ``env.timeout(delay)`` would take, so
    results are the same bit for bit."""
    if delay < 0:
        raise ValueError(f"negative delay {delay}")
    try:
        push = env.push  # type: ignore[attr-defined]
    except AttributeError:  # SimPy's own environment
        env.schedule(_Call(fn, args), NORMAL, delay)
        return
    push((env._now + delay, NORMAL, next(env._eid), fn, args, None))


def call_at(env: simpy.Environment, t: float, fn, *args) -> None:
    """Run ``fn(*args)`` at the absolute time ``t`` (not before now), in the queue slot a
    ``Timeout`` due at ``t`` would take.

    A time computed as an absolute instant (an arrival clamped to the connection's last
    arrival, a landing, a completion) must be scheduled as that instant: as a delay,
    ``now + (t - now)`` can round one ulp away from ``t`` and let a later arrival overtake
    an earlier one. SimPy's ``Environment.schedule`` takes a delay only, so this pushes the
    same ``(time, priority, id, ...)`` entry it would push (SimPy 4.x queue layout,
    ``tests/test_engine.py`` checks the order against SimPy's own).
    """
    now = env._now
    if t < now:
        raise ValueError(f"time {t} is before now ({now})")
    try:
        push = env.push  # type: ignore[attr-defined]
    except AttributeError:  # SimPy's own environment
        heapq.heappush(env._queue, (t, NORMAL, next(env._eid), _Call(fn, args)))
        return
    push((t, NORMAL, next(env._eid), fn, args, None))


def run_events(env: simpy.Environment, limit: int = -1) -> int:
    """SimPy's ``Environment.step`` inlined in one loop: pop the next (time, priority, id,
    event), set the clock, run its callbacks, raise a failed event nobody defused.

    The same events in the same order as calling ``env.step()`` until the queue is
    empty (``tests/test_engine.py`` runs both side by side), without a method call and
    an ``EmptySchedule`` frame per event (a tenth of the model's time at EP16). The
    queue is read as ``env._queue`` (SimPy 4.x; a :class:`ModelEnvironment`'s entries and
    its call entries as described there); SimPy's own environment is stepped as it steps
    itself. ``limit`` >= 0 stops after that many events (the depth sampler's strides).
    Returns the number processed.
    """
    queue = env._queue
    pop = heapq.heappop
    n = 0
    refill = getattr(env, "refill", None)  # a ModelEnvironment's later buckets
    if refill is None:  # SimPy's own environment (tests, tools; never the model): its own step
        while n != limit and queue:
            env.step()
            n += 1
        return n
    path = env.path  # a PathEnvironment's recorder (None on a ModelEnvironment)
    while n != limit:
        if not queue and not refill():
            break
        env._now, _, _, event, args, rec = pop(queue)
        n += 1
        if args is not None:  # a call entry: event(*args), as the segment rec ends
            if rec is not None:
                path.cur = rec
            event(*args)
            continue
        callbacks, event.callbacks = event.callbacks, None
        for callback in callbacks:
            callback(event)
        if not event._ok and not hasattr(event, "_defused"):
            _raise_failed(event)
    return n


def _raise_failed(event: simpy.Event) -> None:
    """A failed event nobody defused: raise a copy of its exception (caused by it), as
    SimPy's ``Environment.step`` does."""
    exc = type(event._value)(*event._value.args)
    exc.__cause__ = event._value
    raise exc


class Lock:
    """A capacity-1 lock (a shared QP's doorbell turn) that schedules exactly the
    events ``simpy.Resource(env, 1)`` schedules, in the same order, without its
    put/get queue machinery (one lock cycle per doorbell of a shared QP).

    The grant is an event processed in turn: a request finding the lock free is
    granted at once; ``release`` frees it at once and, when a waiter is queued,
    schedules a hand-off event whose processing grants the oldest waiter, and a
    request arriving while a waiter is queued and the lock is free grants that
    waiter first (FIFO). With nobody queued the hand-off would do nothing and is
    not scheduled. Through ``request``/``release`` this is SimPy's exact sequence
    (``tests/test_engine.py`` runs both side by side); :meth:`take_if_free` is the
    event-free turn of a lone holder, and ``direct=True`` hands the turn to the oldest
    waiter at the release itself (what the issuer's doorbell turns use).
    """

    __slots__ = ("env", "holder", "_queue", "_released", "direct")

    def __init__(self, env: simpy.Environment, direct: bool = False) -> None:
        self.env = env
        # direct: a release grants the oldest waiter itself (its grant event is the one
        # event of the hand-off) rather than through a hand-off event processed after the
        # events queued for that instant: the same FIFO order and the same times, one event
        # fewer per contended turn; ties at that instant may resolve in another order
        self.direct = direct
        self.holder: object | None = None  # the granted request, or a take_if_free owner
        self._queue: deque[Event] = deque()
        self._released: Rec | None = None  # the last holder's segment when it let go

    def request(self) -> Event:
        ev = Event(self.env)
        self._queue.append(ev)
        if self.holder is None:
            self._grant()
        return ev

    def take_if_free(self, owner: object) -> bool:
        """Take the turn at once, with no grant event, when it is free and nobody waits:
        a single holder's hand-off, which no other warp can observe (no one is queued to
        be ordered against). ``owner`` then releases it (``release(owner)``). False, and
        nothing changes, when the caller must ``request()`` and wait its turn.

        The one difference from ``request()``: the caller goes on at once instead of
        after the events already queued for this instant (same times; ties among
        same-instant events may resolve in another order, deterministically)."""
        if self.holder is not None or self._queue:
            return False
        self.holder = owner
        return True

    def release(self, req: object) -> None:
        if self.holder is req:
            self.holder = None
        self._released = _running(self.env)
        if not self._queue:
            # nobody waits: the hand-off event would find no one to grant and do nothing
            # (a later request finding the lock free is granted by request() itself)
            return
        if self.direct:
            self._grant()
            return
        handoff = Event(self.env)
        handoff.callbacks.append(self._on_handoff)
        handoff.succeed()

    def _grant(self) -> None:
        ev = self._queue.popleft()
        self.holder = ev
        ev.rec = self._released  # a turn waited for is released by the previous holder
        succeed(ev)

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
    ``path`` is the critical-path recorder of the run when one is recorded (the
    pieces reach it here, as they reach the costs), else None.
    """

    scale: dict[str, float] = field(default_factory=dict)
    busy: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    events: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    counters: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    path: CriticalPath | None = None

    def cost(self, cat: str, ns: float) -> float:
        """Scaled cost of ``cat`` (no bookkeeping: for NIC/wire/receiver work)."""
        s = self.scale.get(cat, 1.0)
        return ns * s

    def factor(self, cat: str) -> float:
        """What :meth:`cost` multiplies ``cat`` by (fixed for a run: a piece may keep it)."""
        return self.scale.get(cat, 1.0)

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


# -- the one-run critical path ------------------------------------------------------------


def _running(env: simpy.Environment) -> Rec | None:
    """The segment of whatever runs now, or None when the run records no path."""
    path = getattr(env, "path", None)  # a plain simpy.Environment has none
    return path.cur if path is not None else None


class CriticalPath:
    """Records, as the model runs, what every piece of simulated time waited on, so the
    critical path of the op is read from this one run (:func:`walk`).

    ``cur`` is the segment whose end is "now" for the code running: the process's own
    last segment, the segment a scheduled call ends, or the segment that released the
    wait a process just left (when it ended later than the process's own). A timed
    piece of work appends a segment after ``cur``; a shared resource in "free at"
    arithmetic (the NIC's engine and port, an NVLink port, the receiving host thread)
    keeps the segment that ends at its free time, so a piece queued behind it follows
    that one. Recording only builds tuples: it schedules no event and draws no random
    number, so a recorded run is the same run bit for bit.
    """

    __slots__ = ("env", "cur")

    def __init__(self, env: simpy.Environment) -> None:
        self.env = env
        self.cur: Rec = ROOT

    def seg(self, cat: str, dt: float) -> None:
        """The running process spends ``dt`` on ``cat`` from now (before it yields the
        timeout): its own chain grows by that segment, ending where the timeout fires."""
        now = self.env._now
        self.cur = (now, now + dt, cat, self.cur)

    def later(self, cat: str, delay: float, fn, *args) -> None:
        """:func:`call_later`, the delay recorded as a segment of ``cat`` after ``cur``."""
        now = self.env._now
        self.call_later(delay, (now, now + delay, cat, self.cur), fn, *args)

    def call_later(self, delay: float, rec: Rec, fn, *args) -> None:
        """:func:`call_later` (the same queue slot), running ``fn`` as segment ``rec``."""
        if delay < 0:
            raise ValueError(f"negative delay {delay}")
        env = self.env
        env.push((env._now + delay, NORMAL, next(env._eid), fn, args, rec))

    def call_at(self, t: float, rec: Rec, fn, *args) -> None:
        """:func:`call_at` (the same queue slot), running ``fn`` as segment ``rec``."""
        env = self.env
        now = env._now
        if t < now:
            raise ValueError(f"time {t} is before now ({now})")
        env.push((t, NORMAL, next(env._eid), fn, args, rec))


class _PathProcess(Process):
    """A process that carries its chain across waits.

    ``rec`` is the process's own last segment (and, once it ended, the segment its end
    is: what an ``all_of`` of it waits for). On resuming, the event's ``rec`` (set by
    whatever released it: a counter increment, a lock's previous holder, a kick, the
    last process of an ``all_of``) takes over when it ended later than the process's
    own: the wait is then charged to the releasing chain; an instant release adds
    nothing.
    """

    def __init__(self, env: PathEnvironment, generator) -> None:
        self.rec: Rec = env.path.cur  # started by whatever runs now
        super().__init__(env, generator)

    def _resume(self, event: Event) -> None:
        path = self.env.path
        own = self.rec
        # a timeout is the process's own segment (recorded before it yielded); getattr, not
        # __dict__: on CPython 3.11 reading __dict__ builds one for every event
        t = type(event)
        rel = None if t is _Hold or t is Timeout else getattr(event, "rec", None)
        if rel is not None and rel[1] > own[1]:
            own = rel
        path.cur = own
        Process._resume(self, event)
        self.rec = path.cur


def _latest_rec(cond: AllOf) -> None:
    """An ``all_of`` is released by the event that ended last (the last warp's chain)."""
    best = None
    for ev in cond._events:
        r = getattr(ev, "rec", None)
        if r is not None and (best is None or r[1] > best[1]):
            best = r
    cond.rec = best


class PathEnvironment(ModelEnvironment):
    """A SimPy environment whose processes and ``all_of`` carry critical-path records.

    Used only when the path is recorded; scheduling is the same either way (same events,
    same order)."""

    def __init__(self) -> None:
        super().__init__()
        self.path = CriticalPath(self)

    def process(self, generator) -> Process:  # type: ignore[override]
        return _PathProcess(self, generator)

    def all_of(self, events) -> AllOf:  # type: ignore[override]
        cond = AllOf(self, events)
        cond.callbacks.append(_latest_rec)  # before the waiter's resume: registered first
        return cond


def walk(rec: Rec) -> tuple[dict[str, float], float]:
    """Walk a chain back to time 0: ns per category, and its largest gap.

    Each segment is charged ``end - predecessor's end``, so the entries sum to the
    chain's end (the rank's latency) up to floating-point rounding. The gap is the
    largest ``|start - predecessor's end|``: 0 up to rounding when every wait's release
    was recorded (tests check it; a gap is charged to the segment after it).
    """
    out: dict[str, float] = {}
    gap = 0.0
    pred = rec[3]
    while pred is not None:
        cat = rec[2]
        out[cat] = out.get(cat, 0.0) + (rec[1] - pred[1])
        g = abs(rec[0] - pred[1])
        if g > gap:
            gap = g
        rec = pred
        pred = rec[3]
    return out, gap


def rec_of(ev: Any) -> Rec | None:
    """The segment an event (a finished process) ended with, when the path was recorded."""
    return getattr(ev, "rec", None)
