"""Test session set-up: 4 sim devices before Paddle is imported, placeenv installed.

Every test runs real Paddle on real (simulated) devices. Fixtures give each
test the patched state (default) or stock Paddle (negative controls).
"""

from __future__ import annotations

import sys
import threading

import placeenv.sim

placeenv.sim.prepare(devices=4)

import paddle  # noqa: E402
import pytest  # noqa: E402

import placeenv  # noqa: E402

DEVICES = [f"sim:{i}" for i in range(4)]


@pytest.fixture(autouse=True)
def _fresh_state():
    """Each test starts installed, on the main thread's default device sim:0."""
    placeenv.install()
    paddle.set_device("sim:0")
    yield
    placeenv.install()
    paddle.set_device("sim:0")


@pytest.fixture
def stock():
    """Stock Paddle for the duration of the test (the negative control)."""
    placeenv.uninstall()
    yield
    placeenv.install()


@pytest.fixture(params=["placeenv", "stock"])
def mode(request):
    """Run a check twice: with placeenv (must pass) and on stock Paddle (must catch leaks)."""
    if request.param == "stock":
        placeenv.uninstall()
    yield request.param
    placeenv.install()


@pytest.fixture
def fast_switching():
    """Let the GIL switch threads every microsecond, so races happen within a short test."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(old)


def run_threads(*targets, timeout: float = 120):
    """Start one thread per target, join them all, re-raise the first error."""
    errors = []

    def guard(fn):
        def run():
            try:
                fn()
            except BaseException as exc:  # noqa: BLE001 - reported to the test
                errors.append(exc)
        return run

    threads = [threading.Thread(target=guard(t)) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
        assert not t.is_alive(), "thread did not finish"
    if errors:
        raise errors[0]


def where(tensor) -> str:
    """'sim:1', 'cpu', ...: the device a tensor lives on."""
    return placeenv.device_name(tensor.place)


#: The lock-step thread checks' devices: one thread each.
THREAD_DEVICES = ("cpu", "sim:1", "sim:2", "sim:3")


def on_each_device(check, rounds: int):
    """Run ``check(device)`` in 4 threads (one per device), in lock-step; returns failures."""
    barrier = threading.Barrier(len(THREAD_DEVICES))
    failures = []

    def worker(device):
        paddle.set_device(device)
        for _ in range(rounds):
            barrier.wait()  # everyone has set a device: stock Paddle now has the last one
            problem = check(device)
            if problem:
                failures.append((device, problem))

    run_threads(*[lambda d=d: worker(d) for d in THREAD_DEVICES])
    return failures


def expect(mode, failures):
    """With placeenv: no failure; on stock Paddle (the negative control): the check caught the leak."""
    if mode == "placeenv":
        assert failures == []
    else:
        assert failures, "the check did not catch stock Paddle's leak"
