"""LitServe 0.2.19 serving a repository model (default: digits) on sim devices, for compare.py.

    python benchmarks/peers/litserve_app.py --port 8000 [--devices 2] [--model digits] [--max-batch-size 8]

The same request and answer as the service's ``POST /predict``:
``{"model": "digits", "inputs": [[64 numbers], ...]}`` in, ``{"model", "device", "batch_size",
"outputs": [{"label", "probabilities"}, ...]}`` out. The model code is the service's own
(``replica.py``: the repository loader, ``preprocess``, the batched forward, ``postprocess``);
what differs is LitServe's: its HTTP server processes, its queues and its batching
(``batch`` / ``unbatch``, ``max_batch_size``, ``batch_timeout``).

LitServe's ``accelerator="cpu"`` makes one device, "cpu", whatever ``devices=`` says, so
``workers_per_device=N`` starts N inference worker processes, and each picks its sim device
from ``LITSERVE_WORKER_ID`` (worker i -> ``sim:{i % N}``) in ``setup``. LitServe also forks
one HTTP server process per inference worker by default (``num_api_servers``) and runs a
multiprocessing manager process: stop the whole process group with SIGINT.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import litserve as ls  # noqa: E402
import numpy as np  # noqa: E402
from fastapi import HTTPException  # noqa: E402

import placeenv.sim  # noqa: E402

# Inference workers are started with multiprocessing's "spawn": each re-imports this file
# before unpickling the API, so the sim plugin's variables are set here, before any Paddle
# import (the parent's environment already has them; prepare only sets them again). Four
# devices, as the service makes by default (its sim_devices).
placeenv.sim.prepare()


class PlaceenvModelAPI(ls.LitAPI):
    """One repository model per inference worker process, on that worker's sim device."""

    def __init__(self, model: str, devices: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.model_name, self.devices = model, devices

    def setup(self, device: str) -> None:
        from replica import Replica  # imports Paddle: first in this worker process, after prepare

        # LitServe passes "cpu" to every worker; the worker id says which sim device is this one's.
        self.replica = Replica(self.model_name, f"sim:{int(os.environ['LITSERVE_WORKER_ID']) % self.devices}")

    def decode_request(self, request: dict) -> np.ndarray:
        from replica import BadRequest

        try:
            return self.replica.decode(request)
        except BadRequest as exc:  # LitServe answers an HTTPException raised here with its status
            raise HTTPException(exc.status, str(exc)) from None

    def batch(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        return inputs  # joined in predict by the service's batch_tensor, as a service worker joins its jobs

    def predict(self, parts: list[np.ndarray]) -> list[dict]:
        return self.replica.forward(parts)

    def unbatch(self, output: list[dict]) -> list[dict]:
        return output

    def encode_response(self, output: dict) -> dict:
        return output


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--devices", type=int, default=2, help="sim devices, one inference worker each")
    parser.add_argument("--model", default="digits")
    parser.add_argument("--max-batch-size", type=int, default=8)
    parser.add_argument("--batch-timeout", type=float, default=0.002,
                        help="seconds to wait for a fuller batch; the service's max_batch_delay_ms is 2 ms")
    parser.add_argument("--api-servers", type=int, default=None,
                        help="HTTP server processes; default LitServe's (one per inference worker)")
    parser.add_argument("--fast-queue", action="store_true",
                        help="LitServe's ZeroMQ transport for answers (off by default)")
    args = parser.parse_args()
    # SIGINT is how LitServe stops cleanly; a shell starts background jobs with it ignored,
    # and the children would inherit that, so the default handler is put back first.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    api = PlaceenvModelAPI(args.model, args.devices, max_batch_size=args.max_batch_size,
                           batch_timeout=args.batch_timeout)
    server = ls.LitServer(api, accelerator="cpu", workers_per_device=args.devices, fast_queue=args.fast_queue)
    server.run(host="127.0.0.1", port=args.port, num_api_servers=args.api_servers, generate_client_file=False,
               log_level="warning")


if __name__ == "__main__":
    main()
