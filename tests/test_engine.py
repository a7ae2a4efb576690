"""The engine's light pieces against the SimPy pieces they replace: same event
order, so the model's results stay the same bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import simpy
from lever.sim.engine import Lock, call_at, call_later


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
