"""A scope is one token pair: entering returns a token, exiting resets with it.

``state.attach`` / ``attach_guard`` / ``resume`` return a token (a ``state.Scope``)
and ``state.detach`` ends the scope with it; ``with PlaceEnv`` keeps its token in
the context (the innermost scope, which records the instance that entered it).
An exit that does not match the calling context's innermost scope raises
``placeenv.ScopeError`` and changes nothing: out of order, a token used twice, a
token of another thread, a copy of the context. Before, every exit ended
whatever scope was innermost, so such an exit went unnoticed and ended another
scope: ``test_negative_control_ending_the_innermost_scope_does_not_notice``
replays that and shows the check is what catches it.

Every test leaves the main thread's context as it found it: no scope open.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading

import numpy as np
import paddle
import pytest
from support import run_threads, where

import placeenv
from placeenv import PlaceEnv, ScopeError, state


def both_levels() -> tuple[str, str, str]:
    """(get_device, Python-path tensor, C++-path tensor) for the calling context."""
    return paddle.get_device(), where(paddle.ones([1])), where(paddle.Tensor(np.ones(1, "float32")))


def on(device):
    return (device,) * 3


@pytest.fixture(autouse=True)
def _no_scope_left_open():
    assert state.own_place() is None
    yield
    assert state.own_place() is None, "the test left a scope open on the main thread"


# -- the token ----------------------------------------------------------------


def test_attach_returns_one_small_token_read_by_name():
    outer = state.attach(placeenv.to_place("sim:1"))
    token = state.attach(placeenv.to_place("cpu"))
    try:
        assert type(token) is state.Scope and type(outer) is state.Scope
        assert not hasattr(token, "__dict__")  # __slots__: nothing per use but its fields
        assert placeenv.device_name(token.place) == "cpu"
        assert token.outer is outer and outer.outer is None
        assert state.innermost() is token
        assert both_levels() == on("cpu")
        with pytest.raises(TypeError):
            token[0]  # not a tuple read by index
    finally:
        state.detach(token)
        state.detach(outer)
    assert both_levels() == on("sim:0")


def test_with_placeenv_keeps_its_token_in_the_context():
    env = PlaceEnv("sim:2")
    with env as place:
        scope = state.innermost()
        assert scope.place is place and scope.origin is env
    assert state.innermost() is None


# -- out of order ---------------------------------------------------------------


def test_out_of_order_exit_raises_and_changes_nothing():
    a, b = PlaceEnv("cpu"), PlaceEnv("sim:1")
    a.__enter__()
    b.__enter__()
    inner = state.innermost()
    with pytest.raises(ScopeError) as error:
        a.__exit__(None, None, None)
    message = str(error.value)
    assert "PlaceEnv('cpu').__exit__: exit out of order" in message
    assert "1 scope(s) entered inside its scope are still open" in message
    assert "on sim:1 entered by PlaceEnv('sim:1')" in message
    assert "nothing was changed" in message
    # Nothing changed: b's scope is still the innermost, a's still outside it.
    assert state.innermost() is inner
    assert both_levels() == on("sim:1")
    b.__exit__(None, None, None)
    assert both_levels() == on("cpu")
    a.__exit__(None, None, None)
    assert both_levels() == on("sim:0")


def test_negative_control_ending_the_innermost_scope_does_not_notice():
    """What the exit did before: end whatever scope is innermost. The out-of-order exit of ``a``
    then ends ``b``'s scope and leaves ``a``'s open, silently; the check raises instead."""
    a, b = PlaceEnv("cpu"), PlaceEnv("sim:1")

    def old_exit():
        state.detach(state.innermost())  # the old ``_pop(_innermost())``: no question asked

    a.__enter__()
    b.__enter__()
    old_exit()  # a's exit, out of order: no error
    assert both_levels() == on("cpu")  # b's scope is gone, a's (which was to end) is still open
    old_exit()  # b's exit ends a's scope
    assert both_levels() == on("sim:0")

    a.__enter__()
    b.__enter__()
    with pytest.raises(ScopeError, match="out of order"):
        a.__exit__(None, None, None)
    assert both_levels() == on("sim:1")
    b.__exit__(None, None, None)
    a.__exit__(None, None, None)


def test_out_of_order_detach_of_tokens_raises():
    outer = state.attach(placeenv.to_place("sim:1"))
    middle = state.attach(placeenv.to_place("sim:2"))
    inner = state.attach(placeenv.to_place("sim:3"))
    with pytest.raises(ScopeError, match=r"detach\(\) of the scope on sim:1: exit out of order: 2 scope"):
        state.detach(outer)
    assert state.innermost() is inner and both_levels() == on("sim:3")
    for token in (inner, middle, outer):
        state.detach(token)
    assert both_levels() == on("sim:0")


def test_another_instance_on_the_same_device_does_not_end_the_scope():
    a, b = PlaceEnv("cpu"), PlaceEnv("cpu")
    with a:
        with pytest.raises(ScopeError, match=r"PlaceEnv\('cpu'\).__exit__: no scope it entered is open"):
            b.__exit__(None, None, None)
        assert state.innermost().origin is a
    assert both_levels() == on("sim:0")


def test_exit_without_enter_raises():
    with pytest.raises(ScopeError, match="no scope is open in this thread or task"):
        PlaceEnv("sim:1").__exit__(None, None, None)
    assert both_levels() == on("sim:0")


def test_a_paddle_guard_exited_out_of_order_raises():
    first, second = paddle.device.device("cpu"), paddle.device.device(paddle.CustomPlace("sim", 2))
    with PlaceEnv("sim:1"):
        first.__enter__()
        second.__enter__()
        with pytest.raises(ScopeError, match=r"paddle.device.device.__exit__: it is not the innermost"):
            first.__exit__(None, None, None)
        assert both_levels() == on("sim:2")
        second.__exit__(None, None, None)
        first.__exit__(None, None, None)
        assert both_levels() == on("sim:1")
    assert both_levels() == on("sim:0")


def test_a_paddle_guard_exited_with_a_placeenv_still_open_inside_raises():
    guard, env = paddle.device.device("cpu"), PlaceEnv("sim:3")
    with PlaceEnv("sim:1"):
        guard.__enter__()
        env.__enter__()
        with pytest.raises(ScopeError, match="exit out of order"):
            guard.__exit__(None, None, None)
        assert both_levels() == on("sim:3")
        env.__exit__(None, None, None)
        guard.__exit__(None, None, None)
        assert both_levels() == on("sim:1")


# -- used twice, another thread, a copy of the context ----------------------------


def test_a_token_used_twice_raises():
    outer = state.attach(placeenv.to_place("sim:1"))
    token = state.attach(placeenv.to_place("cpu"))
    state.detach(token)
    with pytest.raises(ScopeError, match="this token has already been used once"):
        state.detach(token)
    assert state.innermost() is outer and both_levels() == on("sim:1")  # the outer scope intact
    state.detach(outer)
    with pytest.raises(ScopeError, match="already been used once"):
        state.detach(outer)
    assert both_levels() == on("sim:0")


def test_a_placeenv_exited_twice_raises():
    env = PlaceEnv("sim:2")
    with PlaceEnv("sim:1"):
        env.__enter__()
        env.__exit__(None, None, None)
        with pytest.raises(ScopeError, match="it was exited already, or entered in another thread"):
            env.__exit__(None, None, None)
        assert both_levels() == on("sim:1")
    assert both_levels() == on("sim:0")


def test_a_token_from_another_thread_raises_there_and_changes_nothing():
    token = state.attach(placeenv.to_place("sim:2"))
    seen = {}

    def other():
        paddle.set_device("sim:3")  # the thread's own scope, which must survive the bad call
        with pytest.raises(ScopeError, match="the token was attached in another one"):
            state.detach(token)
        seen["other"] = both_levels()

    try:
        run_threads(other)
    finally:
        state.detach(token)
    assert seen == {"other": on("sim:3")}
    assert both_levels() == on("sim:0")


def test_a_placeenv_entered_in_one_thread_cannot_be_exited_in_another():
    env = PlaceEnv("sim:1")
    seen = {}

    def other():
        with pytest.raises(ScopeError, match="no scope it entered is open in this thread or task"):
            env.__exit__(None, None, None)
        seen["other"] = both_levels()

    with env:
        run_threads(other)
        assert both_levels() == on("sim:1")
    assert seen == {"other": on("sim:0")}


def test_a_copy_of_the_context_sees_the_scope_but_may_not_end_it():
    env = PlaceEnv("sim:1")
    token = state.attach(placeenv.to_place("cpu"))
    with pytest.raises(ScopeError, match="of which this one is a copy") as error:
        contextvars.copy_context().run(state.detach, token)
    assert isinstance(error.value.__cause__, ValueError)  # ContextVar.reset's own check
    state.detach(token)
    with env:
        with pytest.raises(ScopeError, match="a copy sees the scope but may not end it"):
            contextvars.copy_context().run(env.__exit__, None, None, None)
        assert both_levels() == on("sim:1")
    assert both_levels() == on("sim:0")


def test_a_task_cannot_end_a_scope_another_task_entered():
    env = PlaceEnv("sim:2")
    errors = []

    async def child():
        try:
            env.__exit__(None, None, None)  # the scope it inherited
        except ScopeError as error:
            errors.append(str(error))
        return paddle.get_device()

    async def main():
        with env:
            child_saw = await asyncio.create_task(child())
            return child_saw, paddle.get_device()

    assert asyncio.run(main()) == ("sim:2", "sim:2")
    assert len(errors) == 1 and "a copy sees the scope but may not end it" in errors[0]
    assert both_levels() == on("sim:0")


# -- set_device inside a scope: the same scope, on another device ------------------


def test_set_device_inside_placeenv_then_exit_restores_the_outer_device():
    with PlaceEnv("sim:1"):
        with PlaceEnv("cpu"):
            paddle.set_device("sim:2")
            assert both_levels() == on("sim:2")
            paddle.set_device("sim:3")  # a replacement of the replacement
            assert both_levels() == on("sim:3")
        assert both_levels() == on("sim:1")
    assert both_levels() == on("sim:0")


def test_set_device_inside_a_scope_on_the_current_device_then_exit():
    """The scope changed no Tracer on the way in (KEPT); after a set_device inside, leaving it must."""
    paddle.set_device("sim:1")
    with PlaceEnv("sim:1"):
        paddle.set_device("cpu")
        assert both_levels() == on("cpu")
    assert both_levels() == on("sim:1")


def test_set_device_inside_a_token_scope_and_a_guard_then_exit():
    token = state.attach(placeenv.to_place("sim:1"))
    paddle.set_device("sim:2")
    with paddle.device.device("cpu"):
        paddle.set_device("sim:3")
        assert both_levels() == on("sim:3")
    assert both_levels() == on("sim:2")
    state.detach(token)
    assert both_levels() == on("sim:0")


def test_a_replaced_scope_still_refuses_an_out_of_order_exit():
    a, b = PlaceEnv("cpu"), PlaceEnv("sim:1")
    with a:
        b.__enter__()
        paddle.set_device("sim:3")  # b's scope, now on sim:3
        with pytest.raises(ScopeError, match=r"the innermost on sim:3 entered by PlaceEnv\('sim:1'\)"):
            a.__exit__(None, None, None)
        assert both_levels() == on("sim:3")
        b.__exit__(None, None, None)
        assert both_levels() == on("cpu")
    assert both_levels() == on("sim:0")


def test_set_device_in_a_child_thread_scope_and_its_own_device():
    seen = {}

    def body():
        paddle.set_device("sim:1")  # the thread's own device: a scope no one ends
        with PlaceEnv("sim:2"):
            paddle.set_device("sim:3")
            seen["inside"] = both_levels()
        seen["after"] = both_levels()

    run_threads(body)
    assert seen == {"inside": on("sim:3"), "after": on("sim:1")}


def test_a_copy_of_the_context_sets_its_own_device_without_moving_the_original():
    """Why set_device replaces the scope instead of changing it: a copy holds the same scope."""
    seen = {}

    def in_copy():
        paddle.set_device("sim:2")
        seen["copy"] = both_levels()

    with PlaceEnv("sim:1"):
        copy = contextvars.copy_context()  # holds this scope, as a task or bind() started here would
        run_threads(lambda: copy.run(in_copy))
        assert both_levels() == on("sim:1")
    assert seen == {"copy": on("sim:2")}
    assert both_levels() == on("sim:0")


# -- what must keep working ------------------------------------------------------


def test_one_instance_nested_and_shared_by_threads_with_set_device_inside():
    envs = {d: PlaceEnv(d) for d in ("cpu", "sim:1", "sim:2", "sim:3")}
    barrier = threading.Barrier(4)
    wrong = []

    def worker(device, other):
        env, inner = envs[device], envs[other]
        for _ in range(30):
            with env:
                with inner:
                    with env:  # re-entered inside itself
                        barrier.wait()
                        got = [both_levels()]
                        paddle.set_device(other)
                        got.append(both_levels())
                    got.append(both_levels())
                got.append(both_levels())
            got.append(paddle.get_device())
            if got != [on(device), on(other), on(other), on(device), "sim:0"]:
                wrong.append((device, got))

    run_threads(*[lambda d=d, o=o: worker(d, o)
                  for d, o in (("cpu", "sim:1"), ("sim:1", "sim:2"), ("sim:2", "sim:3"), ("sim:3", "cpu"))])
    assert wrong == []


def test_decorated_function_ends_its_own_token():
    @PlaceEnv("sim:2")
    def leaves_one_open():
        PlaceEnv("sim:3").__enter__()  # a bug in the body: never exited

    @PlaceEnv("cpu")
    def fine():
        with PlaceEnv("sim:1"):
            paddle.set_device("sim:3")
        return both_levels()

    assert fine() == on("cpu")
    with pytest.raises(ScopeError, match=r"detach\(\) of the scope on sim:2: exit out of order"):
        leaves_one_open()
    # Nothing was changed by the refused exit: both scopes are still open; end them in order.
    assert both_levels() == on("sim:3")
    leftover = state.innermost()
    state.detach(leftover)  # the body's scope (its token is the scope itself)
    assert both_levels() == on("sim:2")
    state.detach(state.innermost())
    assert both_levels() == on("sim:0")


def test_decorated_generator_coroutine_and_async_generator_step_their_own_scopes():
    @PlaceEnv("sim:1")
    def gen():
        with PlaceEnv("sim:2"):
            yield both_levels()
            paddle.set_device("sim:3")
            yield both_levels()
        yield both_levels()

    @PlaceEnv("sim:2")
    async def coro():
        with PlaceEnv("cpu"):
            await asyncio.sleep(0)
            first = both_levels()
        await asyncio.sleep(0)
        return first, both_levels()

    @PlaceEnv("sim:3")
    async def agen():
        with PlaceEnv("sim:1"):
            yield both_levels()
        yield both_levels()

    with PlaceEnv("cpu"):
        body = gen()
        assert [next(body), both_levels(), next(body), both_levels(), next(body)] == [
            on("sim:2"), on("cpu"), on("sim:3"), on("cpu"), on("sim:1")]
        body.close()

    async def main():
        with PlaceEnv("sim:1"):
            results = await coro(), [item async for item in agen()]
            return results, both_levels()

    (coro_seen, agen_seen), after = asyncio.run(main())
    assert coro_seen == (on("cpu"), on("sim:2"))
    assert agen_seen == [on("sim:1"), on("sim:3")]
    assert after == on("sim:1")
    assert both_levels() == on("sim:0")


def test_a_body_cannot_end_its_decorators_scope():
    env = PlaceEnv("sim:1")

    @env
    def gen():
        with pytest.raises(ScopeError):
            env.__exit__(None, None, None)  # the step's scope is the body's, not a ``with env``
        yield both_levels()

    assert list(gen()) == [on("sim:1")]
    assert both_levels() == on("sim:0")


def test_a_resumed_steps_token_used_twice_raises():
    body = state.body_scope(placeenv.to_place("sim:2"))
    token = state.resume(body)
    assert both_levels() == on("sim:2")
    state.detach(token)
    with pytest.raises(ScopeError, match="already been used once"):
        state.detach(token)
    assert both_levels() == on("sim:0")


def test_stock_paddle_scopes_are_token_pairs_too(stock):
    """Uninstalled, a scope swaps the global device; the exit check holds all the same."""
    a, b = PlaceEnv("cpu"), PlaceEnv("sim:1")
    a.__enter__()
    b.__enter__()
    with pytest.raises(ScopeError, match="out of order"):
        a.__exit__(None, None, None)
    assert paddle.get_device() == "sim:1"
    b.__exit__(None, None, None)
    a.__exit__(None, None, None)
    assert paddle.get_device() == "sim:0"
