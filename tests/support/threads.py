"""Threads in lock-step on sim devices: run them, say where a tensor lives, judge a negative control."""

from __future__ import annotations

import linecache
import sys
import threading

import paddle

import placeenv

DEVICES = [f"sim:{i}" for i in range(4)]


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


def blocked_at(thread: threading.Thread, line: str) -> bool:
    """Whether ``thread`` is now at a source line that reads ``line`` (stripped), such as a ``with lock:``
    it waits on: a condition to wait for, where a fixed wait would only hope the thread got there."""
    frame = sys._current_frames().get(thread.ident)
    return frame is not None and linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip() == line


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
