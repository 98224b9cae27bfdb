"""Ray Serve serving a repository model (default: digits) on sim devices, for compare.py.

    /tmp/rayvenv/bin/python benchmarks/peers/ray_app.py --port 8000 [--devices 2] [--model digits]

Runs in its own virtual environment, so Ray (1.3 GB installed with Paddle) and its
dependencies stay out of the project's::

    python3 -m venv /tmp/rayvenv
    /tmp/rayvenv/bin/pip install "ray[serve]" paddlepaddle==3.3.1 -e '.[service]'

The same request and answer as the service's ``POST /predict`` and litserve_app.py. The
model code is the service's own (``replica.py``); what differs is Ray Serve's: its HTTP
proxy actor, its router, the FastAPI app in each replica (``@serve.ingress``) and its
batching (``@serve.batch``, ``max_batch_size``, ``batch_wait_timeout_s``). One deployment
with one replica per sim device; each replica takes ``sim:{rank % N}`` from its rank in the
deployment. Serve's defaults otherwise, but for two settings: warnings only and no access
log, as the others run, and ``max_ongoing_requests`` twice the batch size.

This process starts a local Ray cluster (``ray.init``: GCS, raylet, dashboard and workers,
all its descendants, as ``ray start --head`` would start them), deploys, and serves until
SIGINT or SIGTERM, then shuts Serve and Ray down.
"""

# No `from __future__ import annotations`: FastAPI must see the Request class itself in the
# route's signature, and Ray rebuilds this class in the replica from its pickled form.
import argparse
import os
import signal
import sys
import threading
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import placeenv.sim  # noqa: E402

# Before ray.init: the raylet and the workers it starts inherit this environment, so every
# replica's `import paddle` finds the sim plugin, and its `import replica` finds this folder.
placeenv.sim.prepare()
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p)

import numpy as np  # noqa: E402
import ray  # noqa: E402
from fastapi import FastAPI, Request  # noqa: E402
from fastapi.responses import JSONResponse  # noqa: E402
from ray import serve  # noqa: E402

# Serve's FastAPI ingress, its documented way to an HTTP API, as LitServe and the service are
# FastAPI apps too; it also answers GET /openapi.json, the readiness probe compare.py uses.
app = FastAPI()


@serve.deployment
@serve.ingress(app)
class PlaceenvModel:
    """One repository model per replica (a Ray worker process), on that replica's sim device."""

    def __init__(self, model: str, devices: int, max_batch_size: int, batch_timeout: float) -> None:
        from replica import Replica  # imports Paddle: first in this worker process, sim plugin found

        rank = serve.get_replica_context().rank.rank
        self.replica = Replica(model, f"sim:{rank % devices}")
        self.forward.set_max_batch_size(max_batch_size)
        self.forward.set_batch_wait_timeout_s(batch_timeout)

    @app.post("/predict")
    async def predict(self, request: Request):
        from replica import BadRequest

        try:
            part = self.replica.decode(await request.json())
        except BadRequest as exc:
            return JSONResponse({"detail": str(exc)}, status_code=exc.status)
        except ValueError as exc:  # a body that is not JSON
            return JSONResponse({"detail": f"{type(exc).__name__}: {exc}"}, status_code=400)
        return await self.forward(part)

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.002)
    async def forward(self, parts: list[np.ndarray]) -> list[dict]:
        return self.replica.forward(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--devices", type=int, default=2, help="sim devices, one replica each")
    parser.add_argument("--model", default="digits")
    parser.add_argument("--max-batch-size", type=int, default=8)
    parser.add_argument("--batch-timeout", type=float, default=0.002,
                        help="seconds to wait for a fuller batch; the service's max_batch_delay_ms is 2 ms")
    parser.add_argument("--ready-file", type=Path, help="written once every replica is running")
    args = parser.parse_args()
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    # One logical CPU per replica (Serve's default), at least as many as there are replicas.
    ray.init(num_cpus=max(os.cpu_count() or 1, args.devices), logging_level="warning", log_to_driver=False)
    try:
        # Warnings only and no access log, as the service and LitServe run (log level warning).
        quiet = {"log_level": "WARNING", "enable_access_log": False}
        serve.start(http_options={"host": "127.0.0.1", "port": args.port}, logging_config=quiet)
        # max_ongoing_requests (Serve's default 5) caps the requests a replica holds, so a batch
        # could never reach max_batch_size; twice that lets one batch fill while one runs.
        deployment = PlaceenvModel.options(num_replicas=args.devices, logging_config=quiet,
                                           max_ongoing_requests=2 * args.max_batch_size)
        serve.run(deployment.bind(args.model, args.devices, args.max_batch_size, args.batch_timeout),
                  route_prefix="/")
        if args.ready_file:  # serve.run returns once the application, every replica, is running
            args.ready_file.write_text("ready\n")
        print("ready", flush=True)
        stop.wait()
    finally:
        serve.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    main()
