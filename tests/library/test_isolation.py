"""The design's own cases (thread-safe-device-design §6) and leak stress, on sim devices.

Each isolation check runs twice through the ``mode`` fixture: with placeenv it
must hold, and on stock Paddle the very same check must catch the leak.
Interleavings are forced with barriers, so the negative controls do not
depend on scheduling luck.
"""

from __future__ import annotations

import threading

import numpy as np
import paddle
import pytest
from support import DEVICES, run_threads, where

from placeenv.testing import count_wrong_places


def test_main_thread_unchanged():
    paddle.set_device("cpu")
    assert paddle.device.get_device() == "cpu"
    assert where(paddle.ones([1])) == "cpu"
    paddle.set_device("sim:2")
    assert paddle.device.get_device() == "sim:2"
    assert where(paddle.ones([1])) == "sim:2"
    assert where(paddle.Tensor(np.ones(1, "float32"))) == "sim:2"


def test_isolation_with_inheritance(mode):
    paddle.set_device("cpu")
    results = {}
    barrier = threading.Barrier(3)

    def worker(name, device):
        if device:
            paddle.set_device(device)
        barrier.wait()  # all three have set (or not) before anyone reads
        results[name] = paddle.device.get_device()

    run_threads(lambda: worker(1, "sim:1"), lambda: worker(2, "sim:2"), lambda: worker(3, None))
    expected = {1: "sim:1", 2: "sim:2", 3: "cpu"}
    main_after = paddle.device.get_device()
    if mode == "placeenv":
        assert results == expected
        assert main_after == "cpu"
    else:
        assert results != expected or main_after != "cpu"


def test_ten_threads_thousand_set_get(mode, fast_switching):
    mismatches = []

    def worker(tid):
        for i in range(1000):
            device = DEVICES[(i + tid) % 4]
            paddle.set_device(device)
            current = paddle.device.get_device()
            if current != device:
                mismatches.append((tid, i, device, current))

    run_threads(*[lambda tid=tid: worker(tid) for tid in range(10)])
    if mode == "placeenv":
        assert mismatches == []
    else:
        assert len(mismatches) > 0


def test_inheritance_chain(mode):
    paddle.set_device("cpu")
    seen = {}

    def level1():
        seen["level1"] = paddle.device.get_device()

        def level2():
            paddle.set_device("sim:1")
            seen["level2"] = paddle.device.get_device()

            def level3():
                seen["level3"] = paddle.device.get_device()

            level3()

        t = threading.Thread(target=level2)
        t.start()
        t.join()
        seen["level1_after"] = paddle.device.get_device()

    run_threads(level1)
    seen["main_after"] = paddle.device.get_device()
    good = {"level1": "cpu", "level2": "sim:1", "level3": "sim:1", "level1_after": "cpu", "main_after": "cpu"}
    if mode == "placeenv":
        assert seen == good
    else:
        assert seen != good


def test_child_follows_main_live_on_both_levels():
    """A child that never set a device follows the main thread's *current* device."""
    paddle.set_device("sim:3")
    seen = []
    ready, moved = threading.Event(), threading.Event()

    def observe():
        return paddle.get_device(), where(paddle.ones([1])), where(paddle.Tensor(np.ones(1, "float32")))

    def child():
        paddle.ones([1])  # an ordinary first Paddle call in this thread
        seen.append(observe())
        ready.set()
        moved.wait(30)
        seen.append(observe())

    t = threading.Thread(target=child)
    t.start()
    ready.wait(30)
    paddle.set_device("sim:1")
    moved.set()
    t.join()
    assert seen == [("sim:3",) * 3, ("sim:1",) * 3]


def test_main_thread_not_moved_by_child(mode):
    paddle.set_device("sim:3")
    run_threads(lambda: paddle.set_device("sim:1"))
    observed = (paddle.get_device(), where(paddle.ones([1])), where(paddle.Tensor(np.ones(1, "float32"))))
    if mode == "placeenv":
        assert observed == ("sim:3",) * 3
    else:
        assert observed != ("sim:3",) * 3


@pytest.mark.parametrize("path", ["python", "cpp"])
def test_leak_stress_both_paths(mode, path, fast_switching):
    counts = count_wrong_places(("sim:1", "sim:2"), 1500)  # two threads, both creation paths
    if mode == "placeenv":
        assert counts[path] == 0, counts
    else:
        assert counts[path] > 0, counts
