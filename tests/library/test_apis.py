"""Paddle's own APIs follow the calling thread's device under concurrency.

Four threads pin cpu, sim:1, sim:2 and sim:3, wait for each other, then use an
API: every result must land on the thread's own device. On stock Paddle the
last thread to set its device wins, so the same check fails (negative
control, via the ``mode`` fixture).
"""

from __future__ import annotations

import threading

import numpy as np
import paddle
import pytest

import placeenv
from support import THREAD_DEVICES, expect, on_each_device, run_threads, where



#: Creation paths tests/library/test_seeds.py does not cover (it covers every API with device=).
CREATORS = {
    "to_tensor": lambda: paddle.to_tensor([1.0, 2.0]),
    "Tensor(ndarray)": lambda: paddle.Tensor(np.ones(2, "float32")),
    "Linear.weight": lambda: paddle.nn.Linear(2, 2).weight,
    "Linear.bias": lambda: paddle.nn.Linear(2, 2).bias,
}


@pytest.mark.parametrize("api", sorted(CREATORS))
def test_creation_follows_thread_device(mode, api):
    def check(device):
        tensor = CREATORS[api]()
        return None if where(tensor) == device else where(tensor)

    expect(mode, on_each_device(check, rounds=5))


def _train(device: str, seed: int) -> tuple[np.ndarray, set]:
    """Three SGD steps of a tiny regression model on ``device``, from fixed numpy data."""
    rng = np.random.default_rng(seed)
    w1, b1 = rng.normal(size=(4, 8)).astype("float32"), np.zeros(8, "float32")
    w2, b2 = rng.normal(size=(8, 1)).astype("float32"), np.zeros(1, "float32")
    x, y = rng.normal(size=(16, 4)).astype("float32"), rng.normal(size=(16, 1)).astype("float32")
    with placeenv.PlaceEnv(device):
        model = paddle.nn.Sequential(paddle.nn.Linear(4, 8), paddle.nn.Tanh(), paddle.nn.Linear(8, 1))
        model.set_state_dict({"0.weight": w1, "0.bias": b1, "2.weight": w2, "2.bias": b2})
        opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
        places = set()
        for _ in range(3):
            loss = paddle.nn.functional.mse_loss(model(paddle.to_tensor(x)), paddle.to_tensor(y))
            loss.backward()
            places |= {where(p.grad) for p in model.parameters()}
            opt.step()
            opt.clear_grad()
        places |= {where(p) for p in model.parameters()}
        return np.concatenate([p.numpy().ravel() for p in model.parameters()]), places


def test_autograd_and_optimizer_in_threads_match_sequential():
    sequential = {seed: _train("cpu", seed)[0] for seed in range(4)}
    results = {}

    def worker(seed, device):
        paddle.set_device(device)
        results[seed] = _train(device, seed)

    run_threads(*[lambda s=s, d=d: worker(s, d) for s, d in enumerate(THREAD_DEVICES)])
    for seed, device in enumerate(THREAD_DEVICES):
        params, places = results[seed]
        assert places == {device}
        np.testing.assert_allclose(params, sequential[seed], rtol=1e-5, atol=1e-6)


def test_jit_to_static_in_child_thread():
    @paddle.jit.to_static(full_graph=True)
    def f(x):
        return paddle.tanh(x) * 2 + 1

    # Paddle's static executor returns CPU tensors for a custom device that runs
    # on CPU fallback kernels, on the main thread too: compare with that.
    with placeenv.PlaceEnv("sim:2"):
        reference = where(f(paddle.to_tensor([0.0])))
    out = {}

    def worker():
        paddle.set_device("sim:2")
        x = paddle.to_tensor([0.0, 0.5, 1.0])
        y = f(x)
        out["input"], out["place"], out["value"] = where(x), where(y), y.numpy()
        out["after"] = (paddle.get_device(), where(paddle.ones([1])), where(paddle.Tensor(np.ones(1, "float32"))))

    run_threads(worker)
    assert out["input"] == "sim:2" and out["place"] == reference
    assert out["after"] == ("sim:2",) * 3
    np.testing.assert_allclose(out["value"], np.tanh([0.0, 0.5, 1.0]) * 2 + 1, rtol=1e-6)
    assert paddle.get_device() == "sim:0"
    # Threads started later still begin on the main thread's Tracer, not on the
    # private one to_static restored in the worker. (A thread's very first Paddle
    # call initialises its Tracer; stock Paddle gives a thread whose first call is
    # paddle.Tensor(ndarray) a CPU default, so make an ordinary call first.)
    later = []
    run_threads(lambda: later.append((where(paddle.ones([1])), where(paddle.Tensor(np.ones(1, "float32"))))))
    assert later == [("sim:0", "sim:0")]


GUARDS = {
    "paddle.device.device": lambda: paddle.device.device(paddle.CustomPlace("sim", 2)),
    "paddle.cuda.device": lambda: paddle.cuda.device(paddle.CustomPlace("sim", 2)),
    "device_guard": lambda: paddle.device.device_guard("sim:2"),
    "paddle.device(x)": lambda: paddle.device(paddle.CustomPlace("sim", 2)),
    "_dygraph_place_guard": lambda: paddle.base.framework._dygraph_place_guard(paddle.CustomPlace("sim", 2)),
}


@pytest.mark.parametrize("guard", sorted(GUARDS))
def test_paddle_guards_are_thread_correct(mode, guard):
    """Threads enter a guard to sim:2 and leave it, in lock-step: each must end on its own device."""
    shared = GUARDS[guard]() if guard != "_dygraph_place_guard" else None  # one instance, many threads

    def check(device):
        ctx = shared if shared is not None else GUARDS[guard]()
        ctx.__enter__()
        inside = (paddle.get_device(), where(paddle.Tensor(np.ones(1, "float32"))))
        barrier.wait()
        ctx.__exit__(None, None, None)
        barrier.wait()
        after = (paddle.get_device(), where(paddle.ones([1])), where(paddle.Tensor(np.ones(1, "float32"))))
        problems = {}
        if inside != ("sim:2", "sim:2"):
            problems["inside"] = inside
        if after != (device,) * 3:
            problems["after"] = after
        return problems

    barrier = threading.Barrier(len(THREAD_DEVICES))
    expect(mode, on_each_device(check, rounds=3))


def test_main_thread_guards_keep_stock_global_meaning():
    """On the bare main thread a guard moves the global device, so inheriting children see it."""
    seen = []
    with paddle.device.device("cpu"):
        run_threads(lambda: seen.append(paddle.get_device()))
    assert seen == ["cpu"]
    assert paddle.get_device() == "sim:0"
