"""The front end's ceiling: a raw ASGI app on uvicorn doing the least a JSON inference endpoint can.

It reads the body, parses the JSON, takes the first 10 numbers of each input row and answers
them as JSON: the same body and answer shape as the null model's ``/predict``, with no
framework, validation, queue, thread, metric or device.

    uvicorn benchmarks.raw_asgi_app:app --port 8100
"""

from __future__ import annotations

import json


async def read_body(receive) -> bytes:
    body, more = b"", True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    return body


async def respond(send, answer: str) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": answer.encode()})


async def app(scope, receive, send):
    assert scope["type"] == "http"
    body = await read_body(receive)
    if scope["method"] == "GET":  # a readiness probe
        answer = "{}"
    else:
        request = json.loads(body)
        answer = json.dumps({"model": request["model"], "outputs": [{"y": row[:10]} for row in request["inputs"]]})
    await respond(send, answer)
