"""CallRendezvous (cosyvino.engine.rendezvous): concurrent calls of equal shape run as one call,
every caller gets its own rows, lone callers never wait, failures reach every caller."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from cosyvino.engine import CallRendezvous


class Recorder:
    """fn(x, t) -> x * t[:, None] + 1, recording each call's batch size."""

    def __init__(self, fail_at: int | None = None):
        self.batches = []
        self.fail_at = fail_at
        self.lock = threading.Lock()

    def __call__(self, x, t):
        with self.lock:
            self.batches.append(x.shape[0])
            n = len(self.batches)
        if self.fail_at is not None and n >= self.fail_at:
            raise RuntimeError("backend failed")
        return x * t[:, None] + 1.0


def _args(seed: int, step: int):
    rng = np.random.default_rng(seed * 100 + step)
    return (rng.standard_normal((2, 5)).astype(np.float32),
            np.full((2,), 0.1 * (step + 1) + seed, np.float32))


def _member_run(rv, key, seed, steps, out, barrier=None):
    with rv.member(key) as call:
        if barrier is not None:
            barrier.wait()
        out[seed] = [call(*_args(seed, s)) for s in range(steps)]


def _run_threads(targets):
    threads = [threading.Thread(target=t) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads), "a caller hung"


def _expected(seed, step):
    x, t = _args(seed, step)
    return x * t[:, None] + 1.0


def test_members_in_lockstep_share_every_call_and_get_their_own_rows():
    fn = Recorder()
    rv = CallRendezvous(fn, cap=4, window_s=5.0)
    out, barrier = {}, threading.Barrier(2)
    _run_threads([lambda s=s: _member_run(rv, ("k", 5), s, 6, out, barrier) for s in (0, 1)])
    for seed in (0, 1):
        for step in range(6):
            np.testing.assert_array_equal(out[seed][step], _expected(seed, step))
    assert fn.batches == [4] * 6  # both requests' two rows in each of the 6 calls
    st = rv.stats()
    assert st["calls"] == 6 and st["member_calls"] == 12 and st["mean_members"] == 2.0
    assert st["occupancy"] == {2: 6} and st["members"] == 0


def test_lone_member_does_not_wait_for_the_window():
    fn = Recorder()
    rv = CallRendezvous(fn, cap=2, window_s=60.0)
    out = {}
    _run_threads([lambda: _member_run(rv, "k", 3, 4, out)])  # would take 4 min if it waited
    assert fn.batches == [2] * 4
    np.testing.assert_array_equal(out[3][2], _expected(3, 2))


def test_members_with_fewer_steps_leave_and_the_rest_go_on_alone():
    fn = Recorder()
    rv = CallRendezvous(fn, cap=2, window_s=5.0)
    out, barrier = {}, threading.Barrier(2)
    _run_threads([lambda: _member_run(rv, "k", 0, 5, out, barrier),
                  lambda: _member_run(rv, "k", 1, 2, out, barrier)])
    assert sorted(fn.batches) == [2, 2, 2, 4, 4]
    assert len(out[0]) == 5 and len(out[1]) == 2
    for seed, steps in ((0, 5), (1, 2)):
        for step in range(steps):
            np.testing.assert_array_equal(out[seed][step], _expected(seed, step))


def test_different_keys_do_not_combine():
    fn = Recorder()
    rv = CallRendezvous(fn, cap=4, window_s=0.05)
    out, barrier = {}, threading.Barrier(2)
    _run_threads([lambda: _member_run(rv, "a", 0, 3, out, barrier),
                  lambda: _member_run(rv, "b", 1, 3, out, barrier)])
    assert fn.batches == [2] * 6


def test_cap_bounds_the_callers_of_one_call():
    fn = Recorder()
    rv = CallRendezvous(fn, cap=2, window_s=5.0)
    out, barrier = {}, threading.Barrier(3)
    _run_threads([lambda s=s: _member_run(rv, "k", s, 4, out, barrier) for s in range(3)])
    assert max(fn.batches) == 4 and sum(fn.batches) == 3 * 4 * 2
    for seed in range(3):
        for step in range(4):
            np.testing.assert_array_equal(out[seed][step], _expected(seed, step))


def test_a_member_that_never_calls_costs_only_the_window():
    fn = Recorder()
    rv = CallRendezvous(fn, cap=2, window_s=0.05)
    entered, release, out = threading.Event(), threading.Event(), {}

    def idle_member():
        with rv.member("k"):
            entered.set()
            release.wait(30)

    idle = threading.Thread(target=idle_member)
    idle.start()
    entered.wait(10)
    try:
        _run_threads([lambda: _member_run(rv, "k", 0, 2, out)])
    finally:
        release.set()
        idle.join(10)
    assert fn.batches == [2, 2]
    np.testing.assert_array_equal(out[0][1], _expected(0, 1))


def test_a_failing_call_raises_in_every_caller_of_it():
    fn = Recorder(fail_at=1)
    rv = CallRendezvous(fn, cap=2, window_s=5.0)
    errors, barrier = [], threading.Barrier(2)

    def run(seed):
        try:
            _member_run(rv, "k", seed, 1, {}, barrier)
        except RuntimeError as e:
            errors.append(str(e))

    _run_threads([lambda: run(0), lambda: run(1)])
    assert errors == ["backend failed", "backend failed"] and fn.batches == [4]
    assert rv.stats()["members"] == 0


@pytest.mark.parametrize("cap, window", [(1, 0.1), (0, 0.1), (True, 0.1), (2, -1.0)])
def test_bad_arguments_are_refused(cap, window):
    with pytest.raises(ValueError):
        CallRendezvous(lambda x: x, cap=cap, window_s=window)


def test_a_call_waits_for_a_running_call_of_its_key_instead_of_running_beside_it():
    started = threading.Event()

    class SlowFirst(Recorder):
        def __call__(self, x, t):
            first = not self.batches
            out = super().__call__(x, t)
            if first:
                started.set()
                threading.Event().wait(0.3)  # far longer than the window
            return out

    fn = SlowFirst()
    rv = CallRendezvous(fn, cap=2, window_s=0.01)
    out, entered = {}, threading.Barrier(2)

    def late():
        with rv.member("k") as call:
            entered.wait()
            started.wait(10)  # arrives while the other member's first call runs
            out[1] = [call(*_args(1, 0))]

    def early():
        with rv.member("k") as call:
            entered.wait()
            out[0] = [call(*_args(0, s)) for s in range(2)]

    _run_threads([early, late])
    assert fn.batches == [2, 4]  # the late call joined the early member's next call
    np.testing.assert_array_equal(out[1][0], _expected(1, 0))
    np.testing.assert_array_equal(out[0][1], _expected(0, 1))
