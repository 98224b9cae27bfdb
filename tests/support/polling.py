"""Waiting for a condition: poll it until it holds, with a deadline, never a fixed sleep."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """A condition a test waited for did not hold before its deadline (a test failure)."""


def wait_until(predicate: Callable[[], T], timeout: float, message: str | Callable[[], str],
               interval: float = 0.05, sleep: Callable[[float], object] = time.sleep) -> T:
    """``predicate()`` until it returns something true, which is returned; ``WaitTimeout`` with
    ``message`` (a string, or a callable that makes one, e.g. with a process's log) once ``timeout``
    seconds have passed. ``predicate`` may raise to give up early (e.g. the process it waits for exited).
    ``sleep``: how to pass ``interval`` between looks; ``gevent.sleep`` while tritonclient's HTTP requests
    are in flight, since they are greenlets of this thread and send and read only while it yields to
    gevent's hub (``time.sleep`` does not: they stall half sent)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise WaitTimeout(f"not within {timeout:g} s: {message() if callable(message) else message}")
        sleep(interval)


async def wait_until_async(predicate: Callable[[], Awaitable[T]], timeout: float,
                           message: str | Callable[[], str], interval: float = 0.05) -> T:
    """``wait_until`` inside an event loop: ``await predicate()`` until true; the loop runs meanwhile."""
    deadline = time.monotonic() + timeout
    while True:
        value = await predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise WaitTimeout(f"not within {timeout:g} s: {message() if callable(message) else message}")
        await asyncio.sleep(interval)
