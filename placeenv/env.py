"""``PlaceEnv(device)``: a device scope, as a context manager or a decorator."""

from __future__ import annotations

import contextvars
import functools
import inspect
import types

from . import state
from .places import device_name, to_place

__all__ = ["PlaceEnv", "bind", "current_place"]

_attach, _detach = state.attach, state.detach  # bound once: hot on request paths


def current_place():
    """The Paddle place of the calling thread or asyncio task."""
    return state.current()


class PlaceEnv:
    """Run a block or a function on ``device``, then restore the previous device.

    ``device`` is validated at construction: ``'cpu'``, ``'gpu:0'``,
    ``'cuda:1'``, ``'xpu:0'``, ``'npu:0'`` (any custom device type), an ``int``
    index, or a Paddle place. An unknown device raises ``ValueError`` naming
    the available ones.

    The scope belongs to the calling thread or asyncio task only. The
    instance holds nothing per use (the scope lives in a ContextVar, and
    remembers how to undo itself), so one instance can be entered from many
    threads and tasks at once, nested and re-entered. An exit that does not
    end the innermost scope this instance entered in the calling context (out
    of order, twice, in another thread or task) raises ``placeenv.ScopeError``
    and changes nothing.

    As a decorator it handles plain functions and methods, ``async def``
    functions (the device holds inside the coroutine across its awaits, not in
    the caller), and generator / async generator functions (the device is
    active while the body runs, not in the consumer between items).
    """

    __slots__ = ("place",)

    def __init__(self, device) -> None:
        self.place = to_place(device)

    def __repr__(self) -> str:
        return f"PlaceEnv({device_name(self.place)!r})"

    # The token stays in the context (the innermost scope, its opener this
    # instance), since the instance is shared and keeps nothing per use. Both
    # methods are placeenv.state's functions themselves: no frame of their own
    # on the way in and out of every request's scope.
    __enter__ = state.enter
    __exit__ = state.leave

    def __call__(self, fn):
        place = self.place
        if inspect.isasyncgenfunction(fn):
            @functools.wraps(fn)
            async def async_gen_wrapper(*args, **kwargs):
                agen, carry = fn(*args, **kwargs), [state.body_scope(place)]
                try:
                    value, error = None, None
                    while True:
                        try:
                            step = agen.asend(value) if error is None else agen.athrow(error)
                            item = await _step(carry, step)
                        except StopAsyncIteration:
                            return
                        try:
                            value, error = (yield item), None
                        except GeneratorExit:
                            raise
                        except BaseException as exc:  # forwarded into the body
                            value, error = None, exc
                finally:
                    await _step(carry, agen.aclose())

            return async_gen_wrapper

        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def coroutine_wrapper(*args, **kwargs):
                return await _step([state.body_scope(place)], fn(*args, **kwargs))

            return coroutine_wrapper

        if inspect.isgeneratorfunction(fn):
            @functools.wraps(fn)
            def generator_wrapper(*args, **kwargs):
                gen = fn(*args, **kwargs)
                return (yield from _stepped([state.body_scope(place)], gen))

            return generator_wrapper

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            token = _attach(place)
            try:
                return fn(*args, **kwargs)
            finally:
                _detach(token)

        return wrapper


def _stepped(carry, gen):
    """Drive ``gen`` with its device active during each step and inactive between steps.

    ``carry[0]`` is the body's own scope (:func:`state.body_scope` at first,
    with no outer scope): each step resumes it and detaches back to the
    consumer's, so a ``paddle.set_device`` or an open ``with PlaceEnv`` inside
    the body carries to its next step, never to the consumer.
    """
    send, throw = gen.send, gen.throw
    value, error = None, None
    while True:
        token = state.resume(carry[0])
        try:
            item = throw(error) if error is not None else send(value)
        except StopIteration as stop:
            return stop.value
        finally:
            carry[0] = state.innermost()
            state.detach(token)
        try:
            value, error = (yield item), None
        except GeneratorExit:
            token = state.resume(carry[0])  # the body's finally blocks run on its device
            try:
                gen.close()
            finally:
                state.detach(token)
            raise
        except BaseException as exc:  # forwarded into the body, as ``yield from`` does
            value, error = None, exc


@types.coroutine
def _step(carry, awaitable):
    """``await`` ``awaitable`` with the body's device active only while it runs."""
    return (yield from _stepped(carry, awaitable.__await__()))


def bind(fn):
    """Wrap ``fn`` to run in a copy of the caller's context: its device included.

    Threads in a pool do not inherit the submitting thread's device; submit
    ``placeenv.bind(fn)`` (or use ``asyncio.to_thread``, which copies the
    context itself)::

        with PlaceEnv("cpu"):
            pool.submit(placeenv.bind(preprocess), batch)
            await loop.run_in_executor(None, placeenv.bind(preprocess), batch)
    """
    context = contextvars.copy_context()

    @functools.wraps(fn)
    def bound(*args, **kwargs):
        try:
            return context.copy().run(_run_synced, fn, args, kwargs)
        finally:
            state.sync_tracer(state.own_place())

    return bound


def _run_synced(fn, args, kwargs):
    # The copied context carries the Python-level device; this thread's C++
    # Tracer has to be told too.
    state.sync_tracer(state.own_place())
    return fn(*args, **kwargs)
