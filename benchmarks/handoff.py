"""What a front end with device worker threads pays at least: each call handed to a worker thread
and back, the worker taking every call queued (a batch) and waking the event loop once per batch
(``call_soon_threadsafe``), as the service's workers do. No framework, validation, tensor, metric
or device. The floors of front_end_ceiling.py use it: handoff_floor_app.py (HTTP) and
``raw_grpc_app.py --handoff`` (gRPC).
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable
from typing import Any


class HandOff:
    """``await hand_off(payload)`` is ``answer(payload)``, computed on the worker thread."""

    def __init__(self, answer: Callable[[Any], Any]) -> None:
        self.answer = answer
        self._jobs: deque = deque()
        self._ready = threading.Condition()
        threading.Thread(target=self._work, daemon=True).start()

    async def __call__(self, payload: Any) -> Any:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self._ready:
            self._jobs.append((loop, future, payload))
            self._ready.notify()
        return await future

    def _work(self) -> None:
        while True:
            with self._ready:
                while not self._jobs:
                    self._ready.wait()
                batch = list(self._jobs)
                self._jobs.clear()
            done = [(future, self.answer(payload)) for _, future, payload in batch]
            batch[0][0].call_soon_threadsafe(_settle, done)


def _settle(done: list) -> None:
    for future, value in done:
        if not future.done():
            future.set_result(value)
