"""The engine's light pieces against the SimPy pieces they replace: same event
order, so the model's results stay the same bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import simpy
from lever.sim.engine import Lock, ModelEnvironment, call_at, call_later


def _lock_trace(make_lock, seed: int) -> list[tuple]:
    """Warps contending for one lock with hold times that are often zero or equal,
    so grants and hand-offs meet other events at the same instant."""
    env = simpy.Environment()
    lock = make_lock(env)
    rng = np.random.default_rng(seed)
    log: list[tuple] = []

    def warp(i: int):
        for k in range(12):
            yield env.timeout(float(rng.choice([0.0, 1.0, 2.0, 2.5])))
            req = lock.request()
            yield req
            log.append((env.now, "got", i, k))
            hold = float(rng.choice([0.0, 0.0, 1.0, 3.0]))
            if hold:
                yield env.timeout(hold)
            lock.release(req)
            yield env.timeout(0.0)  # same instant: before or after the hand-off's grant?
            log.append((env.now, "rel", i, k))

    def bystander():  # plain timeouts landing on the same instants
        for k in range(40):
            yield env.timeout(1.0)
            log.append((env.now, "tick", -1, k))

    for i in range(6):
        env.process(warp(i))
    env.process(bystander())
    env.run()
    return log


@pytest.mark.parametrize("seed", range(5))
def test_lock_orders_like_a_simpy_resource(seed: int) -> None:
    mine = _lock_trace(Lock, seed)
    ref = _lock_trace(lambda env: simpy.Resource(env, capacity=1), seed)
    assert mine == ref
    assert sum(1 for e in mine if e[1] == "got") == 6 * 12


def _call_trace(use_call_later: bool, absolute: bool = False) -> list[tuple]:
    env = simpy.Environment()
    log: list[tuple] = []

    def note(tag):
        log.append((env.now, tag))

    def proc():
        for k in range(30):
            step = env.timeout(0.5)  # queued first: a tie at 0.5 goes to it
            d = [0.0, 1.0, 0.5][k % 3]
            if absolute:
                call_at(env, env.now + d, note, ("cb", k))
            elif use_call_later:
                call_later(env, d, note, ("cb", k))
            else:
                ev = env.timeout(d)
                ev.callbacks.append(lambda _e, k=k: note(("cb", k)))
            yield step
            note(("proc", k))

    env.process(proc())
    env.run()
    return log


def test_call_later_takes_the_slot_of_a_timeout() -> None:
    assert _call_trace(True) == _call_trace(False)
    with pytest.raises(ValueError):
        call_later(simpy.Environment(), -1.0, print)


def test_call_at_takes_the_slot_of_a_timeout_due_then() -> None:
    # delays 0, 0.5, 1 are exact in binary: now + d is the same instant either way
    assert _call_trace(True, absolute=True) == _call_trace(False)
    env = simpy.Environment(initial_time=5.0)
    with pytest.raises(ValueError):
        call_at(env, 4.0, print)


def test_call_at_fires_at_the_instant_given_where_a_delay_rounds_off() -> None:
    """``now + (t - now)`` is not always ``t`` in floating point; ``call_at`` is exact."""
    rng = np.random.default_rng(3)
    for _ in range(10_000):
        now, t = sorted(rng.uniform(1e4, 1e6, 2))
        if now + (t - now) != t:
            break
    else:
        pytest.fail("no rounding case found")
    env = simpy.Environment(initial_time=float(now))
    seen: list[float] = []
    call_at(env, float(t), lambda: seen.append(env.now))
    env.run()
    assert seen == [float(t)]


# -- the inlined event loop -------------------------------------------------------------------

def _mixed_trace(run, env_cls: type = simpy.Environment) -> list[tuple]:
    """Processes, timeouts, plain calls, a lock and a defused failure meeting on the same
    instants: the log of who ran when, under ``run(env)`` on an ``env_cls``."""
    env = env_cls()
    lock = Lock(env)
    log: list[tuple] = []
    rng = np.random.default_rng(7)
    delays = [float(x) for x in rng.choice([0.0, 0.5, 1.0], 400)]

    def note(tag):
        log.append((env.now, tag))

    def warp(i: int):
        for k in range(20):
            yield env.timeout(delays[i * 20 + k])
            call_later(env, delays[(i * 20 + k + 7) % 400], note, ("cb", i, k))
            req = lock.request()
            yield req
            note(("got", i, k))
            lock.release(req)
            if k == 10:
                bad = env.event()
                bad.fail(RuntimeError("caught"))
                try:
                    yield bad
                except RuntimeError:
                    note(("caught", i))

    for i in range(5):
        env.process(warp(i))
    n = run(env)
    log.append(("events", n))
    return log


def _step_loop(env: simpy.Environment) -> int:
    n = 0
    try:
        while True:
            env.step()
            n += 1
    except simpy.core.EmptySchedule:
        return n


def test_run_events_processes_what_step_does_in_the_same_order() -> None:
    from lever.sim.engine import run_events

    ref = _mixed_trace(_step_loop)
    assert sum(1 for e in ref[:-1] if e[1][0] == "caught") == 5 and ref[-1][1] > 300
    # the model's environment (its own queue and call entries) steps as SimPy's does, and its
    # inlined loop runs the same sequence, whole and in strides (the depth sampler's)
    assert _mixed_trace(_step_loop, ModelEnvironment) == ref
    assert _mixed_trace(run_events, ModelEnvironment) == ref
    assert _mixed_trace(lambda env: sum(iter(lambda: run_events(env, 7), 0)), ModelEnvironment) == ref
    assert _mixed_trace(run_events) == ref  # SimPy's own environment, stepped


def test_run_events_raises_a_failure_nobody_defused() -> None:
    from lever.sim.engine import run_events

    env = simpy.Environment()
    env.event().fail(ValueError("lost"))
    with pytest.raises(ValueError, match="lost"):
        run_events(env)
    # the model's environment, through its inlined loop and through its own step (env.run)
    for run in (run_events, lambda e: e.run()):
        env = ModelEnvironment()
        env.event().fail(ValueError("lost"))
        with pytest.raises(ValueError, match="lost"):
            run(env)


# -- the lone holder's turn -----------------------------------------------------------------

def test_a_release_with_nobody_waiting_schedules_nothing() -> None:
    env = simpy.Environment()
    lock = Lock(env)
    seen = []

    def warp():
        req = lock.request()
        yield req
        before = len(env._queue)
        lock.release(req)
        seen.append(len(env._queue) - before)  # no hand-off event: nobody to hand off to
        req = lock.request()  # free again: granted by the request itself
        yield req
        seen.append(lock.holder is req)

    env.process(warp())
    env.run()
    assert seen == [0, True]


@pytest.mark.parametrize("direct", [False, True])
def test_take_if_free_is_a_fifo_exclusive_turn_with_no_event_for_a_lone_holder(direct) -> None:
    """Warps take the turn with ``take_if_free`` when they can, else request and wait: the
    holds never overlap, grants follow request order, a waiter is granted at the instant of
    the release, and a turn taken free schedules no event; a direct lock hands a waiter the
    turn with one event (its grant), the SimPy order with two (hand-off, then grant)."""
    env = simpy.Environment()
    lock = Lock(env, direct=direct)
    handoff_events: list[int] = []
    held_at_release: list[bool] = []
    rng = np.random.default_rng(11)
    waits = [float(x) for x in rng.choice([0.0, 1.0, 2.0], 300)]
    holds = [float(x) for x in rng.choice([0.0, 1.0, 3.0], 300)]
    asked: list[tuple[float, int]] = []
    got: list[tuple[float, float, int]] = []  # (asked at, granted at, who)
    freed: list[float] = []
    free_takes = []

    def warp(i: int):
        for k in range(30):
            yield env.timeout(waits[i * 30 + k])
            t_ask = env.now
            asked.append((t_ask, i))
            before = len(env._queue)
            if lock.take_if_free(i):
                free_takes.append(len(env._queue) - before)
                req = i
            else:
                req = lock.request()
                yield req
            got.append((t_ask, env.now, i))
            if holds[i * 30 + k]:
                yield env.timeout(holds[i * 30 + k])
            freed.append(env.now)
            before = len(env._queue)
            queued = len(lock._queue)
            lock.release(req)
            if queued:
                handoff_events.append(len(env._queue) - before)
                held_at_release.append(lock.holder is not None)

    for i in range(8):
        env.process(warp(i))
    env.run()
    assert len(got) == 240 and free_takes and set(free_takes) == {0}
    assert [(a, i) for a, _g, i in got] == asked  # FIFO: granted in the order asked
    for (_a, g, _i), f in zip(got[1:], freed[:-1], strict=True):
        assert g >= f  # exclusive: the next grant never precedes the last release
    waited = [(a, g) for a, g, _i in got if g > a]
    assert waited and all(g in freed for _a, g in waited)  # handed over at the release
    assert handoff_events and set(handoff_events) == {1}  # the grant, or the hand-off event
    # direct: the waiter holds the turn from the release on; else from the hand-off event
    assert set(held_at_release) == {direct}


def _hold_trace(light: bool, env: simpy.Environment | None = None) -> list[tuple]:
    """Processes paying costs (``hold`` or ``env.timeout``) on instants shared with plain
    timeouts and calls queued before and after them (on ``env``, else SimPy's own)."""
    from lever.sim.engine import hold

    env = env if env is not None else simpy.Environment()
    log: list[tuple] = []
    d = [0.0, 0.5, 1.0, 1.5]

    def warp(i: int):
        for k in range(25):
            env.timeout(d[(i + k) % 4]).callbacks.append(lambda _e, k=k: log.append((env.now, "t", i, k)))
            dt = d[(i * k) % 4]
            yield hold(env, dt) if light else env.timeout(dt)
            call_later(env, d[k % 4], lambda k=k: log.append((env.now, "c", i, k)))
            log.append((env.now, "w", i, k))
        return i

    for i in range(4):
        env.process(warp(i))
    env.run()
    return log


def test_hold_takes_the_slot_of_a_timeout() -> None:
    from lever.sim.engine import hold

    assert _hold_trace(True) == _hold_trace(False)
    with pytest.raises(ValueError):
        hold(simpy.Environment(), -1.0)


@pytest.mark.parametrize("kind", ["model", "path"])
def test_a_hold_on_the_models_environment_resumes_its_process_in_the_slot_of_a_timeout(kind):
    """On a ModelEnvironment a process's hold is a call entry resuming it (no event): the same
    order as SimPy's timeouts, recorded or not; a hold made outside a process is an event."""
    from lever.sim.engine import ModelEnvironment, PathEnvironment, hold, hold_at, run_events

    make = ModelEnvironment if kind == "model" else PathEnvironment
    assert _hold_trace(True, make()) == _hold_trace(False)
    env = make()
    fired: list[float] = []
    for ev in (hold(env, 2.0), hold_at(env, 3.0)):  # no process runs: events of their own
        ev.callbacks.append(lambda _e: fired.append(env.now))
    assert run_events(env) == 2 and fired == [2.0, 3.0]


def _after_hold_trace(light: bool, env: simpy.Environment | None = None) -> list[tuple]:
    """What a process does after a hold other than hold again: yield an event already
    processed (SimPy's loop sends its value at once), wait on a pending one, return a value,
    fail; each seen by a waiter of the process as SimPy's own resume would give it."""
    from lever.sim.engine import hold

    env = env if env is not None else simpy.Environment()
    log: list[tuple] = []
    done = env.event()
    done.succeed("old")

    def pay(dt: float):
        return hold(env, dt) if light else env.timeout(dt)

    def warp(i: int):
        yield pay(1.0)
        v = yield done
        log.append((env.now, i, "processed", v))
        yield pay(0.5)
        later = env.event()
        call_later(env, 2.0, later.succeed, i)
        v = yield later
        log.append((env.now, i, "pending", v))
        yield pay(0.0)
        if i == 1:
            raise KeyError(i)
        return i * 10

    def watch(p):
        try:
            v = yield p
            log.append((env.now, "ended", v))
        except KeyError as e:
            log.append((env.now, "failed", e.args))

    for i in range(3):
        env.process(watch(env.process(warp(i))))
    env.run()
    return log


@pytest.mark.parametrize("kind", ["model", "path"])
def test_a_process_goes_on_after_a_hold_as_after_a_timeout(kind) -> None:
    from lever.sim.engine import ModelEnvironment, PathEnvironment

    make = ModelEnvironment if kind == "model" else PathEnvironment
    ref = _after_hold_trace(False)
    assert [e[2] for e in ref if e[1] == 0] == ["processed", "pending"]
    assert _after_hold_trace(True, make()) == ref


# -- the two-level queue --------------------------------------------------------------------

def _queue_trace(env: simpy.Environment) -> list[tuple]:
    """Processes, callbacks and absolute-time calls with delays from 0 to far beyond a
    bucket, many on shared instants, some scheduled exactly on bucket edges."""
    from lever.sim.engine import hold, hold_at

    log: list[tuple] = []
    rng = np.random.default_rng(5)
    d = [float(x) for x in rng.choice([0.0, 0.25, 1.0, 3.0, 7.5, 40.0, 100.0], 2000)]

    def warp(i: int):
        for k in range(60):
            x = d[(i * 60 + k) % 2000]
            call_at(env, env.now + d[(i * 60 + k + 1) % 2000], lambda k=k: log.append((env.now, "c", i, k)))
            call_later(env, x, lambda k=k: log.append((env.now, "l", i, k)))
            if k % 3 == 0:
                yield env.timeout(x)
            elif k % 3 == 1:
                yield hold(env, x)
            else:
                yield hold_at(env, float(int(env.now) + 4))  # on an edge of a 4 ns bucket
            log.append((env.now, "w", i, k, env.peek()))

    for i in range(6):
        env.process(warp(i))
    env.run()
    return log


@pytest.mark.parametrize("bucket", [1.0, 4.0, 500.0])
def test_the_two_level_queue_pops_in_simpys_order(bucket, monkeypatch) -> None:
    from lever.sim.engine import ModelEnvironment, run_events

    monkeypatch.setattr(ModelEnvironment, "BUCKET_NS", bucket)
    ref = _queue_trace(simpy.Environment())
    env = ModelEnvironment()
    assert _queue_trace(env) == ref
    assert env.pending() == 0
    # run_events (the model's loop) refills from the buckets too
    env2 = ModelEnvironment()
    log: list[float] = []
    for t in (30.0, 0.5, 7.0, 7.0, 2000.0, 3.0):
        call_at(env2, t, lambda: log.append(env2.now))
    assert env2.pending() == 6 and run_events(env2) == 6
    assert log == sorted(log) and len(log) == 6


def test_a_model_run_is_the_same_on_simpys_own_queue(monkeypatch) -> None:
    """Latencies, profiler ledger, counters and the event count of whole ops: bit for bit
    the same with the two-level queue and with SimPy's one heap."""
    from lever.sim import model, scenario

    scn = scenario.load("decode-ep16-efa-native", {"workload.ep_ranks": 16})
    for op in ("dispatch", "combine"):
        mine = model.simulate_op(scn, op, 1)
        monkeypatch.setattr(model, "ModelEnvironment", simpy.Environment)
        ref = model.simulate_op(scn, op, 1)
        monkeypatch.undo()
        assert mine.latency_us == ref.latency_us and mine.events == ref.events
        assert dict(mine.ledger.busy) == dict(ref.ledger.busy) and mine.counters == ref.counters


# -- a count booked ahead (Tally) ---------------------------------------------------------------

def _tally_release(bookings: list[tuple[float, float, int]], total: int, wait_at: float,
                   booked: bool) -> float:
    """When a waiter for ``total`` writes resumes, the writes landing as ``(when booked,
    instant landed, k)``: booked ahead on a Tally, or each an increment of a Counter at its
    instant (what the tally replaces)."""
    from lever.sim.engine import Counter, Tally

    env = simpy.Environment()
    tally, counter = Tally(env), Counter(env)
    seen: list[float] = []
    for t_book, t_land, k in bookings:
        if booked:
            call_at(env, t_book, tally.add_at, t_land, k)
        else:
            call_at(env, t_book, call_at, env, t_land, counter.add, k)

    def waiter():
        yield env.timeout(wait_at)
        ev = tally.reach(total) if booked else counter.reach(total)
        if ev is not None:
            yield ev
        seen.append(env.now)

    env.process(waiter())
    env.run()
    return seen[0]


@pytest.mark.parametrize("wait_at", [0.0, 6.0, 35.0, 80.0])
def test_a_tally_releases_its_waiter_when_the_last_write_lands(wait_at: float) -> None:
    """Writes booked out of order (the latest booked first, one landing at once): the waiter
    resumes at the latest landing, as a counter bumped at each landing releases it, whether it
    starts waiting before any booking, between them, before the last landing or after it."""
    bookings = [(0.0, 70.0, 1), (5.0, 20.0, 2), (10.0, 10.0, 1), (30.0, 40.0, 1)]
    got = _tally_release(bookings, 5, wait_at, booked=True)
    assert got == _tally_release(bookings, 5, wait_at, booked=False)
    assert got == max(70.0, wait_at)


def test_a_tally_booked_past_its_total_is_an_error() -> None:
    from lever.sim.engine import Tally

    env = simpy.Environment()
    t = Tally(env)
    t.add_at(5.0, 2)
    with pytest.raises(RuntimeError):
        t.reach(1)
    t2 = Tally(env)
    ev = t2.reach(1)
    assert ev is not None
    with pytest.raises(RuntimeError):
        t2.add_at(3.0, 2)


def test_a_tally_charges_its_waiter_to_the_last_landing() -> None:
    """With the critical path recorded, the wait is released by the segment of the write that
    landed last (not the last booked), so the waiter's chain runs through it."""
    from lever.sim.engine import PathEnvironment, Tally, walk

    env = PathEnvironment()
    tally = Tally(env)
    late = (0.0, 50.0, "forward", (0.0, 0.0, "", None))
    early = (0.0, 20.0, "wire", (0.0, 0.0, "", None))
    ends: list = []

    def waiter():
        ev = tally.reach(2)
        tally.add_at(50.0, 1, late)
        tally.add_at(20.0, 1, early)
        yield ev
        ends.append((env.now, env.path.cur))

    env.process(waiter())
    env.run()
    assert ends[0][0] == 50.0 and ends[0][1] is late
    assert walk(ends[0][1])[0] == {"forward": 50.0}


@pytest.mark.parametrize("platform,design", [
    ("efa-p5-calibrated", "v2-hybrid-native"),
    ("efa-p5-calibrated", "v2-hybrid-proxy"),
    ("efa-p5-calibrated", "deepep-v2-direct-gin-gda"),
    ("ib-cx7-calibrated", "v1-ll-ib"),
    ("efa-p5-calibrated", "uccl-ep"),
    ("efa-p5-calibrated", "pplx-garden"),
])
@pytest.mark.parametrize("critical_path", [False, True])
def test_a_finished_run_leaves_nothing_for_the_cyclic_collector(platform, design, critical_path):
    """World.close breaks every reference cycle a run leaves (the environment's bound
    methods, a waiting proxy loop and its event, the NIC peer table, the rings and their
    threads): the run, its critical-path segments included, is freed by reference counting
    as soon as its result is read. A new cycle makes the collector traverse and free the
    whole run later (a fifth of a recorded EP128 dispatch, and the run's memory held until
    then): break it in ``World.close``."""
    import gc

    from lever.sim.model import simulate_op
    from lever.sim.scenario import compose

    scn = compose(platform, design, "decode-ep8", ep=8)
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        for op in ("dispatch", "combine"):
            res = simulate_op(scn, op, 0, critical_path=critical_path)
            assert res.latency_us
            del res
            gc.set_debug(gc.DEBUG_SAVEALL)
            try:
                gc.collect()
                # the model's objects only (a cycle of the run's holds some: everything it
                # reaches is in gc.garbage): another test's leftovers (a figure, a bare SimPy
                # environment) may turn to garbage in the same process meanwhile
                ours = [o for o in gc.garbage if type(o).__module__.startswith("lever.")]
                kinds = sorted({type(o).__name__ for o in ours})[:8]
            finally:
                gc.set_debug(0)
                gc.garbage.clear()
            assert not ours, f"{op}: {len(ours)} model objects in reference cycles ({', '.join(kinds)})"
    finally:
        if was:
            gc.enable()


def test_a_pool_worker_frees_its_finished_run_at_its_next_job():
    """A pool worker keeps its finished run (``simulate_op(keep=...)``) frozen out of the
    collector's reach until it takes its next job, so the freeing is not between the run and its
    result (0.7 s of a recorded EP256 dispatch); the next job frees it by reference counting.
    Without the keep, the first run is already gone when its result is back; without the
    freeze, the collector would own it; without the clear, runs would pile up."""
    import gc
    import weakref

    from lever.sim import results
    from lever.sim.scenario import compose

    scn = compose("efa-p5-calibrated", "v2-hybrid-native", "decode-ep8", ep=8)
    job = (scn, "dispatch", 0, None, False, True)
    try:
        first = results._op_job_in_worker(job)
        assert first.latency_us and len(results._FINISHED) == 1
        assert gc.get_freeze_count() > 0
        kept = weakref.ref(results._FINISHED[0])
        second = results._op_job_in_worker(job)
        assert kept() is None and len(results._FINISHED) == 1  # the first run freed, this one kept
        assert second.latency_us == first.latency_us  # the same run, bit for bit
    finally:
        results._FINISHED.clear()
        gc.unfreeze()
