"""Threads in lock-step on sim devices: run them, say where a tensor lives, judge a negative control."""

from __future__ import annotations

import linecache
import sys
import threading
import time

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


def longest_stall(call) -> tuple[float, float]:
    """(the longest a pure-Python thread went without a turn while ``call`` ran, the call's seconds): about
    the whole call where it holds the GIL, a scheduler's slice or two where it lets the thread run."""
    longest, stop, started = [0.0], threading.Event(), threading.Event()

    def spin() -> None:
        last = time.perf_counter()
        started.set()
        while not stop.is_set():
            now = time.perf_counter()
            longest[0] = max(longest[0], now - last)
            last = now
        longest[0] = max(longest[0], time.perf_counter() - last)

    thread = threading.Thread(target=spin)
    thread.start()
    started.wait()
    longest[0] = 0.0  # (the thread's own start is not the call's)
    began = time.perf_counter()
    call()
    seconds = time.perf_counter() - began
    stop.set()  # the thread's next turn ends the gap the call made, if it made one
    thread.join()
    return longest[0], seconds
