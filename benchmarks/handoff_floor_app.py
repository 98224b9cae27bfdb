"""The raw ASGI app (raw_asgi_app.py) plus what any device worker thread costs: the floor of a
front end that hands each request to a thread and back.

Each request is parsed as in the raw app and handed to a worker thread (``handoff.HandOff``:
batched, one wake-up of the event loop per batch, as the service's workers do), which takes the
first 10 numbers of each row. No framework, validation, tensor, metric or device.

    uvicorn benchmarks.handoff_floor_app:app --port 8100
"""

from __future__ import annotations

import json

from benchmarks.handoff import HandOff
from benchmarks.raw_asgi_app import read_body, respond

_first_ten = HandOff(lambda inputs: [row[:10] for row in inputs])


async def app(scope, receive, send):
    assert scope["type"] == "http"
    body = await read_body(receive)
    if scope["method"] == "GET":  # a readiness probe
        answer = "{}"
    else:
        request = json.loads(body)
        outputs = await _first_ten(request["inputs"])
        answer = json.dumps({"model": request["model"], "outputs": [{"y": row} for row in outputs]})
    await respond(send, answer)
