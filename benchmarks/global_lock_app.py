"""What users do without per-thread devices: one lock around set_device + forward.

A minimal FastAPI app on stock Paddle semantics (placeenv uninstalled): a
replica of the model per device, requests served on FastAPI's thread pool,
round-robin over devices, and a global lock so that ``paddle.set_device``
cannot be changed by another thread in the middle of a forward.

    PLACEENV_DEVICES=sim:0,sim:1 uvicorn benchmarks.global_lock_app:app --port 8100
"""

from __future__ import annotations

import itertools
import os
import threading

import placeenv.sim

if os.environ.get("PLACEENV_DEVICES", "sim").startswith("sim"):
    placeenv.sim.prepare(4)

import paddle  # noqa: E402
from fastapi import FastAPI  # noqa: E402
from pydantic import BaseModel  # noqa: E402

import placeenv  # noqa: E402
from placeenv.serve.engine.standalone import Standalone  # noqa: E402

placeenv.uninstall()  # stock Paddle: the lock is the only protection

DEVICES = os.environ.get("PLACEENV_DEVICES", "sim:0,sim:1").split(",")
MODEL = os.environ.get("PLACEENV_MODELS", "digits").split(",")[0]
LOCK = threading.Lock()
TURN = itertools.count()
REPLICAS = {}
for device in DEVICES:
    with LOCK:
        paddle.set_device(device)
        REPLICAS[device] = Standalone(MODEL, device)


class Request(BaseModel):
    model: str
    inputs: list


app = FastAPI()


@app.post("/predict")
def predict(body: Request) -> dict:
    device = DEVICES[next(TURN) % len(DEVICES)]
    replica = REPLICAS[device]
    with LOCK:
        paddle.set_device(device)
        outputs = replica.infer(replica.examples(body.inputs))
    return {"model": body.model, "outputs": rows(outputs), "device": device}


def rows(outputs: dict) -> list[dict]:
    """Output arrays as ``/predict``'s answer has them: one {name: value} per example."""
    columns = {name: array.tolist() for name, array in outputs.items()}
    count = len(next(iter(columns.values())))
    return [{n: c[i] for n, c in columns.items()} for i in range(count)]
