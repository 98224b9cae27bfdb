"""PlaceEnv as a context manager and as a decorator, in threads and asyncio tasks."""

from __future__ import annotations

import asyncio
import inspect
import threading

import numpy as np
import paddle
import pytest

import placeenv
from placeenv import PlaceEnv
from support import run_threads, where


def both_levels() -> tuple[str, str, str]:
    """(get_device, Python-path tensor, C++-path tensor) for the calling context."""
    return paddle.get_device(), where(paddle.ones([1])), where(paddle.Tensor(np.ones(1, "float32")))


def on(device):
    return (device,) * 3


def test_context_manager_restores():
    with PlaceEnv("cpu") as place:
        assert isinstance(place, paddle.CPUPlace)
        assert both_levels() == on("cpu")
    assert both_levels() == on("sim:0")


def test_restores_on_exception():
    with pytest.raises(KeyError):
        with PlaceEnv("sim:2"):
            raise KeyError("boom")
    assert both_levels() == on("sim:0")


def test_nesting_and_reentrancy():
    outer, inner = PlaceEnv("sim:1"), PlaceEnv("cpu")
    with outer:
        with inner:
            with outer:
                assert both_levels() == on("sim:1")
            assert both_levels() == on("cpu")
        assert both_levels() == on("sim:1")
    assert both_levels() == on("sim:0")


def test_set_device_inside_scope_is_scoped():
    with PlaceEnv("sim:1"):
        paddle.set_device("sim:2")
        assert both_levels() == on("sim:2")
    assert both_levels() == on("sim:0")


def test_main_scope_is_not_seen_by_children():
    """A scope on the main thread is the main thread's own; children follow the global device."""
    seen = []
    with PlaceEnv("cpu"):
        run_threads(lambda: seen.append(both_levels()))
    assert seen == [on("sim:0")]


def test_decorated_function_and_method():
    @PlaceEnv("cpu")
    def make(n):
        """Docstring kept."""
        return paddle.ones([n])

    class Pre:
        @PlaceEnv("sim:3")
        def run(self):
            return both_levels()

    assert make.__name__ == "make" and make.__doc__ == "Docstring kept."
    assert where(make(2)) == "cpu"
    assert Pre().run() == on("sim:3")
    assert both_levels() == on("sim:0")


def test_one_instance_shared_by_eight_threads(mode):
    """One PlaceEnv per device, entered concurrently by 8 threads (2 per device)."""
    envs = {d: PlaceEnv(d) for d in ("cpu", "sim:1", "sim:2", "sim:3")}
    barrier = threading.Barrier(8)
    wrong = []

    def worker(device):
        env = envs[device]
        for _ in range(50):
            with env:
                barrier.wait()  # everyone is inside a scope
                got = both_levels()
                barrier.wait()
            if got != on(device):
                wrong.append((device, got))

    if mode == "stock":
        # Stock Paddle has no per-thread scope: the same code on paddle.device.device.
        envs = {d: paddle.device.device(paddle.device.device_to_place(d) if d != "cpu" else "cpu") for d in envs}
    run_threads(*[lambda d=d: worker(d) for d in ("cpu", "sim:1", "sim:2", "sim:3") * 2])
    if mode == "placeenv":
        assert wrong == []
    else:
        assert wrong


def test_async_function_holds_across_awaits_not_in_caller():
    @PlaceEnv("sim:2")
    async def body():
        first = both_levels()
        await asyncio.sleep(0)
        # A real suspension: the task resumes when another thread's call returns, not at its next turn.
        await asyncio.get_running_loop().run_in_executor(None, threading.get_ident)
        return first, both_levels()

    async def caller():
        coro = body()
        result = await coro
        return result, both_levels()

    assert inspect.iscoroutinefunction(body)
    assert body.__name__ == "body"
    (first, second), caller_after = asyncio.run(caller())
    assert first == second == on("sim:2")
    assert caller_after == on("sim:0")


def test_two_tasks_interleave_under_different_devices(mode):
    """Two tasks on one event-loop thread, each in its own scope, alternating at every await."""
    results = {"a": [], "b": []}

    async def task(name, env, device):
        with env:
            for _ in range(20):
                results[name].append(both_levels())
                await asyncio.sleep(0)

    async def main():
        if mode == "placeenv":
            placeenv.aio.install()  # plain `with` across awaits: tasks re-sync the C++ Tracer
            a, b = PlaceEnv("sim:1"), PlaceEnv("sim:2")
        else:
            a, b = paddle.device.device("cpu"), paddle.device.device("cpu")
            a.place, b.place = paddle.CustomPlace("sim", 1), paddle.CustomPlace("sim", 2)
        await asyncio.gather(task("a", a, "sim:1"), task("b", b, "sim:2"))

    asyncio.run(main())
    ok = all(r == on("sim:1") for r in results["a"]) and all(r == on("sim:2") for r in results["b"])
    assert ok if mode == "placeenv" else not ok


def test_without_task_factory_python_level_is_still_per_task():
    seen = {"a": set(), "b": set()}

    async def task(name, device):
        with PlaceEnv(device):
            for _ in range(10):
                seen[name].add((paddle.get_device(), where(paddle.ones([1]))))
                await asyncio.sleep(0)

    async def main():
        await asyncio.gather(task("a", "sim:1"), task("b", "cpu"))

    asyncio.run(main())
    assert seen == {"a": {on("sim:1")[:2]}, "b": {on("cpu")[:2]}}


def test_decorated_coroutines_interleave_on_both_levels():
    """Decorated coroutines re-sync the C++ Tracer at every step, so both levels stay right."""
    results = []

    def make(device):
        @PlaceEnv(device)
        async def body():
            for _ in range(20):
                results.append((device, both_levels()))
                await asyncio.sleep(0)
        return body

    async def main():
        await asyncio.gather(make("sim:1")(), make("cpu")(), make("sim:3")())
        results.append(("sim:0", both_levels()))

    asyncio.run(main())
    assert all(got == on(device) for device, got in results)
    assert len(results) == 61


def test_generator_device_only_while_body_runs():
    @PlaceEnv("cpu")
    def gen(n):
        for _ in range(n):
            received = yield both_levels()
            assert received is None or received == "ping"

    consumer_views = []
    produced = []
    g = gen(3)
    for item in g:
        produced.append(item)
        consumer_views.append(both_levels())
    assert produced == [on("cpu")] * 3
    assert consumer_views == [on("sim:0")] * 3
    assert inspect.isgeneratorfunction(gen)
    assert inspect.isgenerator(gen(1))


def test_generator_send_throw_close_and_return():
    @PlaceEnv("sim:1")
    def gen():
        try:
            x = yield paddle.get_device()
            yield (x, paddle.get_device())
        except ValueError:
            yield "caught on " + paddle.get_device()
        finally:
            cleanup.append(paddle.get_device())
        return "done"

    cleanup = []
    g = gen()
    assert next(g) == "sim:1"
    assert g.send("hi") == ("hi", "sim:1")
    assert g.throw(ValueError()) == "caught on sim:1"
    with pytest.raises(StopIteration) as stop:
        next(g)
    assert stop.value.value == "done"
    assert cleanup == ["sim:1"]
    g2 = gen()
    next(g2)
    g2.close()
    assert cleanup == ["sim:1", "sim:1"]
    assert paddle.get_device() == "sim:0"


def test_body_set_device_carries_to_next_step_not_consumer():
    @PlaceEnv("sim:1")
    def gen():
        paddle.set_device("sim:2")
        yield paddle.get_device()
        yield paddle.get_device()

    g = gen()
    assert next(g) == "sim:2"
    assert paddle.get_device() == "sim:0"
    assert next(g) == "sim:2"


def test_body_set_device_on_the_consumers_device_does_not_move_the_consumers_tracer():
    """A step on the consumer's own device changes no Tracer on entry (KEPT); a set_device in the
    body still must not leave the consumer's C++ Tracer on the body's new device."""
    @PlaceEnv("sim:1")
    def gen():
        paddle.set_device("sim:2")
        yield where(paddle.Tensor(np.ones(1, "float32")))  # the C++ path: the thread's Tracer

    with PlaceEnv("sim:1"):
        body = gen()  # kept alive: closing it would step in and out again
        assert next(body) == "sim:2"
        assert where(paddle.Tensor(np.ones(1, "float32"))) == "sim:1"
        assert paddle.get_device() == "sim:1"


def test_a_with_block_left_open_across_a_yield_ends_in_the_bodys_own_scope():
    @PlaceEnv("sim:1")
    def gen():
        with PlaceEnv("sim:2"):
            yield both_levels()
            with PlaceEnv("sim:3"):
                yield both_levels()
            yield both_levels()
        yield both_levels()

    with PlaceEnv("cpu"):
        body = gen()
        for expected in ("sim:2", "sim:3", "sim:2", "sim:1"):
            assert next(body) == on(expected)
            assert both_levels() == on("cpu")


def test_with_blocks_left_open_across_awaits_end_in_the_coroutines_own_scopes():
    @PlaceEnv("sim:1")
    async def work():
        seen = []
        with PlaceEnv("sim:2"):
            with PlaceEnv("sim:3"):
                await asyncio.sleep(0)
                seen.append(both_levels())
            await asyncio.sleep(0)
            seen.append(both_levels())
        await asyncio.sleep(0)
        seen.append(both_levels())
        return seen

    async def main():
        with PlaceEnv("cpu"):
            seen = await work()
            return seen, both_levels()

    seen, after = asyncio.run(main())
    assert seen == [on("sim:3"), on("sim:2"), on("sim:1")]
    assert after == on("cpu")


def test_a_with_block_left_open_across_an_async_generators_yield():
    @PlaceEnv("sim:1")
    async def agen():
        with PlaceEnv("sim:2"):
            yield both_levels()
            yield both_levels()
        yield both_levels()

    async def main():
        with PlaceEnv("cpu"):
            return [item async for item in agen()], both_levels()

    items, after = asyncio.run(main())
    assert items == [on("sim:2"), on("sim:2"), on("sim:1")]
    assert after == on("cpu")


def test_async_generator_device_only_while_body_runs():
    @PlaceEnv("sim:3")
    async def agen(n):
        for i in range(n):
            await asyncio.sleep(0)
            yield both_levels()

    async def consume():
        items, views = [], []
        async for item in agen(3):
            items.append(item)
            views.append(both_levels())
        return items, views

    assert inspect.isasyncgenfunction(agen)
    items, views = asyncio.run(consume())
    assert items == [on("sim:3")] * 3
    assert views == [on("sim:0")] * 3


def test_custom_places_as_string_and_object():
    for device in ("sim:2", paddle.CustomPlace("sim", 2), paddle.ones([1], device="sim:2").place):
        with PlaceEnv(device):
            assert both_levels() == on("sim:2")
    with PlaceEnv(1):  # an int is an index into the first accelerator type
        assert both_levels() == on("sim:1")
    with PlaceEnv(paddle.CPUPlace()):
        assert both_levels() == on("cpu")


@pytest.mark.parametrize(
    "device, fragment",
    [
        ("sim:7", "sim has 4 device(s)"),
        ("npu:0", "no device type 'npu'"),
        ("gpu:0", "no gpu device"),
        ("cuda", "no gpu device"),
        (9, "sim has 4 device(s)"),
        ("sim:x", "expected 'type' or 'type:index'"),
        (None, "expected str, int or a Paddle place"),
        (True, "expected a device name"),
    ],
)
def test_bad_device_names_available_ones(device, fragment):
    with pytest.raises(ValueError) as err:
        PlaceEnv(device)
    message = str(err.value)
    assert fragment in message
    assert "available devices: cpu, sim:0, sim:1, sim:2, sim:3" in message


def test_aliases():
    assert paddle.PlaceEnv is PlaceEnv
    assert paddle.device.PlaceEnv is PlaceEnv


def test_current_place_and_bind_into_thread_pool():
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        with PlaceEnv("cpu"):
            assert placeenv.device_name(placeenv.current_place()) == "cpu"
            bound = pool.submit(placeenv.bind(both_levels)).result()
            unbound = pool.submit(both_levels).result()
        after = pool.submit(both_levels).result()
    assert bound == on("cpu")
    assert unbound == on("sim:0")  # pool threads follow the main thread by default
    assert after == on("sim:0")


def test_run_in_executor_and_to_thread_carry_the_device():
    async def main():
        loop = asyncio.get_running_loop()
        with PlaceEnv("sim:3"):
            via_bind = await loop.run_in_executor(None, placeenv.bind(both_levels))
            via_to_thread = await asyncio.to_thread(both_levels)
        return via_bind, via_to_thread

    via_bind, via_to_thread = asyncio.run(main())
    assert via_bind == on("sim:3")
    assert via_to_thread[:2] == on("sim:3")[:2]


def test_main_thread_scope_on_its_own_device_then_moves():
    """The main thread entering its current device keeps its Tracer; moving inside still moves both levels."""
    paddle.set_device("sim:1")
    with PlaceEnv("sim:1"):
        assert both_levels() == on("sim:1")
        paddle.set_device("sim:2")
        assert both_levels() == on("sim:2")
        with PlaceEnv("cpu"):
            assert both_levels() == on("cpu")
        assert both_levels() == on("sim:2")
        seen = []
        run_threads(lambda: seen.append(both_levels()))
        assert seen == [on("sim:1")]  # children follow the global device, not the main's scope
    assert both_levels() == on("sim:1")


@pytest.mark.parametrize("inner", ["PlaceEnv", "paddle.device.device", "decorated generator"])
def test_scope_on_the_current_device_with_a_scope_inside_leaves_the_main_thread_on_its_tracer(inner):
    """The outer scope changes no Tracer (the main thread's current device); the inner one switches and
    comes back. Afterwards the main thread still moves the global device on both levels."""
    paddle.set_device("sim:0")

    @PlaceEnv("sim:1")
    def gen():
        yield both_levels()

    with PlaceEnv("sim:0"):
        if inner == "decorated generator":
            assert next(gen()) == on("sim:1")
        else:
            with (PlaceEnv("sim:1") if inner == "PlaceEnv" else paddle.device.device(paddle.CustomPlace("sim", 1))):
                assert both_levels() == on("sim:1")
        assert both_levels() == on("sim:0")
    paddle.set_device("sim:3")
    assert both_levels() == on("sim:3")
    seen = []
    run_threads(lambda: (paddle.ones([1]), seen.append(both_levels())))
    assert seen == [on("sim:3")]


@pytest.mark.parametrize("in_thread", [False, True], ids=["main", "child"])
def test_paddle_dygraph_guard_inside_a_scope(in_thread):
    """Paddle's own guard switches to a fresh Tracer and back; the thread must end on its own Tracer."""
    shared = paddle.base.framework._dygraph_tracer_
    seen = {}

    def body():
        paddle.ones([1])
        with PlaceEnv("sim:2"):
            with paddle.base.dygraph.guard():
                paddle.ones([1])
            seen["inside"] = both_levels()
        seen["after"] = both_levels()
        seen["shared"] = paddle.base.framework.global_var._dygraph_tracer_ is shared

    run_threads(body) if in_thread else body()
    assert seen == {"inside": on("sim:2"), "after": on("sim:0"), "shared": True}
    assert paddle.base.framework._dygraph_tracer_ is shared  # new threads still start on it


@pytest.mark.parametrize("in_thread", [False, True], ids=["main", "child"])
def test_paddle_dygraph_guard_on_the_scopes_own_device_lands_tensors_there(in_thread):
    """dygraph.guard(place) switches to a fresh Tracer, then enters a place guard: on the scope's own
    device, that guard must still aim the thread's Tracer (both levels agree inside it)."""
    seen = {}

    def body():
        paddle.ones([1])
        with PlaceEnv("sim:1"):
            with paddle.base.dygraph.guard(paddle.CustomPlace("sim", 1)):
                seen["inside"] = both_levels()
            seen["after"] = both_levels()

    run_threads(body) if in_thread else body()
    assert seen == {"inside": on("sim:1"), "after": on("sim:1")}


def test_place_objects_share_one_private_tracer_per_device():
    from placeenv import state

    counts = []

    def body():
        paddle.ones([1])
        before = state.private_tracers()
        x = paddle.ones([1], device="cpu")
        for _ in range(50):
            with PlaceEnv(paddle.CPUPlace()), PlaceEnv(x.place):
                paddle.ones([1])
        counts.append(state.private_tracers() - before)

    run_threads(body)
    assert counts == [1]
