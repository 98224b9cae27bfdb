"""The HTTP floor: the bare forward behind FastAPI, run inline on the event loop.

No threads, no queue, no checks: what uvicorn + FastAPI + JSON alone add to a
bare forward at concurrency 1. A reference for row (a) of bench_service.py,
not a way to serve (the forward blocks the event loop).

    PLACEENV_DEVICES=sim:0 uvicorn benchmarks.http_floor_app:app --port 8100
"""

from __future__ import annotations

from fastapi import FastAPI

from benchmarks.global_lock_app import DEVICES, REPLICAS, Request, rows

app = FastAPI()


@app.post("/predict")
async def predict(body: Request) -> dict:
    device = DEVICES[0]
    replica = REPLICAS[device]
    return {"model": body.model, "outputs": rows(replica.infer(replica.examples(body.inputs))), "device": device}
