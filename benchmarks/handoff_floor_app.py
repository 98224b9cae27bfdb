"""The raw ASGI app (raw_asgi_app.py) plus what any device worker thread costs: the floor of a
front end that hands each request to a thread and back.

Each request is parsed as in the raw app, put on a queue, and awaited; one worker thread takes
every request queued (a batch), answers each, and wakes the event loop once per batch
(``call_soon_threadsafe``), as the service's workers do. No framework, validation, tensor,
metric or device.

    uvicorn benchmarks.handoff_floor_app:app --port 8100
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import deque

from benchmarks.raw_asgi_app import read_body, respond

_jobs: deque = deque()
_ready = threading.Condition()


def _settle(done: list) -> None:
    for future, value in done:
        if not future.done():
            future.set_result(value)


def _worker() -> None:
    while True:
        with _ready:
            while not _jobs:
                _ready.wait()
            batch = list(_jobs)
            _jobs.clear()
        done = [(future, [row[:10] for row in inputs]) for loop, future, inputs in batch]
        batch[0][0].call_soon_threadsafe(_settle, done)


threading.Thread(target=_worker, daemon=True).start()


async def app(scope, receive, send):
    assert scope["type"] == "http"
    body = await read_body(receive)
    if scope["method"] == "GET":  # a readiness probe
        answer = "{}"
    else:
        request = json.loads(body)
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with _ready:
            _jobs.append((loop, future, request["inputs"]))
            _ready.notify()
        outputs = await future
        answer = json.dumps({"model": request["model"], "outputs": [{"y": row} for row in outputs]})
    await respond(send, answer)
