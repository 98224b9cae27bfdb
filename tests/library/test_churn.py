"""Thread churn: short-lived threads and a thread pool leave nothing behind.

A thread that sets a device of its own runs on private Tracers (one per device
it used, cached in a threading.local); they must die with the thread, and a
pool's must be bounded by workers x devices while it lives. The full-size
measurement, with timings against stock Paddle, is benchmarks/churn.py.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import threading

import paddle
import pytest

import placeenv
from support import DEVICES, run_threads, where
from placeenv import state
from placeenv.testing import live_private_tracers, resident_bytes

PLACES = (*DEVICES, "cpu")
BATCH = 8  # short-lived threads alive at a time
WORKERS = 8
RSS_LIMIT = 20 * 2**20


class Tally:
    """Place checks and the peak of live private Tracers, as the threads themselves saw them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.checks = self.wrong = self.peak = 0
        self.misplaced: list[tuple[str, str]] = []

    def check(self, device: str) -> None:
        actual = where(paddle.ones([2]))
        seen = state.private_tracers()
        with self.lock:
            self.checks += 1
            if actual != device:
                self.wrong += 1
                self.misplaced.append((device, actual))
            self.peak = max(self.peak, seen)


def churn(count: int, tally: Tally) -> None:
    """``count`` short-lived threads, BATCH alive at a time. Each sets its own device, waits until
    every thread of its batch has set its own (so on stock Paddle the last one wins for all), then
    checks a tensor."""
    devices = itertools.cycle(PLACES)
    for start in range(0, count, BATCH):
        size = min(BATCH, count - start)
        barrier = threading.Barrier(size)

        def worker(device):
            def run():
                try:
                    paddle.set_device(device)
                    barrier.wait(timeout=60)
                    tally.check(device)
                except BaseException:
                    barrier.abort()  # the batch-mates fail fast instead of waiting out the timeout
                    raise
            return run

        run_threads(*(worker(next(devices)) for _ in range(size)), timeout=60)


def pool_run(pool, tasks: int, tally: Tally) -> None:
    """``tasks`` tasks submitted as bind(fn) inside ``with PlaceEnv(d)`` (d rotates), and one unbound task
    per 4 bound, in chunks; each chunk moves the main thread to the next device (unbound tasks must follow
    it), and its tasks start only once the main thread has left every scope and submitted the whole chunk."""
    submitted = 0
    for chunk in itertools.count():
        if submitted >= tasks:
            break
        main = PLACES[chunk % len(PLACES)]
        paddle.set_device(main)
        gate = threading.Event()

        def task(device):
            assert gate.wait(timeout=60), "the chunk was never released"
            tally.check(device)

        futures = []
        for _ in range(min(100, tasks - submitted)):
            device = PLACES[(submitted + chunk) % len(PLACES)]
            with placeenv.PlaceEnv(device):
                futures.append(pool.submit(placeenv.bind(task), device))
            submitted += 1
            if submitted % 4 == 0:
                futures.append(pool.submit(task, main))  # unbound: follows the main thread
        gate.set()
        for future in futures:
            future.result(timeout=60)  # a task's exception fails the test here
    paddle.set_device("sim:0")


def warm_main_thread() -> None:
    """The main thread's own private Tracers (one per device it scopes to) belong in the baseline."""
    for main in PLACES:
        paddle.set_device(main)
        for device in PLACES:
            with placeenv.PlaceEnv(device):
                paddle.ones([1])
    paddle.set_device("sim:0")


def test_short_lived_threads_free_their_tracers():
    churn(200, Tally())  # warm-up: allocator arenas, Paddle's per-device set-up
    baseline = live_private_tracers()
    rss_before = resident_bytes()
    tally = Tally()
    churn(1000, tally)
    after = live_private_tracers()
    growth = resident_bytes() - rss_before

    assert tally.checks == 1000
    assert tally.wrong == 0, tally.misplaced[:10]
    # Every thread of a batch holds its private Tracer when the batch meets; the previous batch's are gone.
    assert baseline < tally.peak <= baseline + BATCH, (baseline, tally.peak)
    # ``<=``: a thread of another test ending meanwhile may take its own Tracers with it.
    assert after <= baseline, f"{after - baseline} private Tracers outlived their threads"
    assert growth < RSS_LIMIT, f"RSS grew {growth / 2**20:.1f} MB over 1000 threads"


def test_short_lived_threads_stock_control(stock):
    """The same churn on stock Paddle: the device a batch's last thread set is every thread's."""
    tally = Tally()
    churn(200, tally)
    assert tally.checks == 200
    # 8 threads over 5 devices: at most 2 of a batch chose the device that won.
    assert tally.wrong >= 200 * (BATCH - 2) // BATCH, tally.wrong
    assert state.private_tracers() == 0


def test_pool_tracers_bounded_then_freed():
    warm_main_thread()
    baseline = live_private_tracers()
    tally = Tally()
    pool = concurrent.futures.ThreadPoolExecutor(WORKERS)
    try:
        pool_run(pool, 200, Tally())  # warm-up
        rss_before = resident_bytes()
        pool_run(pool, 1000, tally)
        growth = resident_bytes() - rss_before
        alive = live_private_tracers()
    finally:
        pool.shutdown(wait=True)
    after = live_private_tracers()

    assert tally.checks == 1000 + 250
    assert tally.wrong == 0, tally.misplaced[:10]
    bound = baseline + WORKERS * len(PLACES)  # each worker caches one Tracer per device it ran on
    assert baseline < tally.peak <= bound, (baseline, tally.peak, bound)
    assert baseline < alive <= bound, (baseline, alive, bound)
    assert after <= baseline, f"{after - baseline} private Tracers outlived the pool"
    assert growth < RSS_LIMIT, f"RSS grew {growth / 2**20:.1f} MB over 1250 tasks"


def test_pool_stock_control(stock):
    """On stock Paddle a bound task runs on whatever device the main thread has when it runs."""
    tally = Tally()
    with concurrent.futures.ThreadPoolExecutor(WORKERS) as pool:
        pool_run(pool, 200, tally)
    # In each chunk, the bound tasks for the 4 devices other than the main thread's run on the main's.
    assert tally.wrong == 200 * 4 // 5, tally.wrong


@pytest.mark.parametrize("fails", ["in a thread", "in a pool task"])
def test_worker_errors_fail_the_run(fails):
    """The helpers above re-raise what a worker raised (so every assertion in a thread counts)."""
    class Boom(Exception):
        pass

    class Failing(Tally):
        def check(self, device):
            super().check(device)
            if self.checks == 37:
                raise Boom

    with pytest.raises(Boom):
        if fails == "in a thread":
            churn(80, Failing())
        else:
            with concurrent.futures.ThreadPoolExecutor(WORKERS) as pool:
                pool_run(pool, 80, Failing())
