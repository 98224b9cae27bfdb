"""asyncio support: keep Paddle's C++ Tracer on the running task's device.

The Python-level device is per task without any help (it lives in a
ContextVar). The C++ Tracer is per *thread*, so it must be re-aimed whenever
the loop resumes a task whose device differs from the last one. Coroutines
decorated with ``@PlaceEnv`` do that themselves at every step. For plain
``with PlaceEnv(...)`` blocks that span an ``await``, install this task
factory; each task then re-syncs the Tracer when it resumes::

    async def main():
        placeenv.aio.install()          # on the running loop
        ...
"""

from __future__ import annotations

import asyncio
import types

from . import state

__all__ = ["install", "task_factory"]


@types.coroutine
def _resync_each_step(awaitable):
    inner = awaitable.__await__()
    value, error = None, None
    while True:
        state.sync_tracer(state.own_place())
        try:
            item = inner.throw(error) if error is not None else inner.send(value)
        except StopIteration as stop:
            return stop.value
        try:
            value, error = (yield item), None
        except GeneratorExit:
            inner.close()
            raise
        except BaseException as exc:  # cancellation and friends go to the task's code
            value, error = None, exc


async def _synced(coro):
    return await _resync_each_step(coro)


def task_factory(loop, coro, **kwargs):
    """A ``loop.set_task_factory`` factory whose tasks keep the C++ Tracer in step."""
    return asyncio.Task(_synced(coro), loop=loop, **kwargs)


def install(loop: asyncio.AbstractEventLoop | None = None) -> None:
    """Use :func:`task_factory` for tasks created from now on (default: the running loop)."""
    (loop or asyncio.get_running_loop()).set_task_factory(task_factory)
