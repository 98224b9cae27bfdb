"""Why a worker's forward is slower in the service than in a bare loop: the gap before it.

    python benchmarks/idle_gap.py [--model digits] [--gap-ms 0.6] [--rounds 3] [--calls 800] [--turns block|call]

One thread on sim:0 times the bare request pipeline (preprocess -> move ->
execute -> postprocess, as bench_service.py's bare loop) after four kinds of
gap, the gaps taking turns in blocks (a steady state per gap) or call by call:

  hot    no gap (bench_service.py's bare loop)
  http   FastAPI handling 3 small requests in process (~0.45 ms of Python)
  busy   a Python busy-wait of --gap-ms (the CPU stays busy)
  sleep  time.sleep(--gap-ms) (the thread sleeps, as a worker does between requests)

Prints the median call time per gap and round, in ms.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import statistics
import threading
import time

import placeenv.sim

placeenv.sim.prepare(1)

import paddle
from bench_service import example_body
from fastapi import FastAPI
from fastapi.responses import Response
from pydantic import BaseModel

import placeenv
from placeenv.serve.engine.standalone import Standalone


class Body(BaseModel):
    model: str
    inputs: list


def http_gap(body: bytes):
    app = FastAPI(telemetry={"tracing": False, "metrics": False, "logs": False})

    @app.post("/predict")
    async def predict(request: Body) -> Response:
        return Response(b"{}", media_type="application/json")

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": "/predict", "raw_path": b"/predict", "root_path": "", "query_string": b"",
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2)}
    loop = asyncio.new_event_loop()

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message):
        pass

    def gap() -> None:
        for _ in range(3):
            loop.run_until_complete(app(dict(scope), receive, send))

    return gap


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="digits")
    parser.add_argument("--gap-ms", type=float, default=0.6)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=800)
    parser.add_argument("--turns", choices=["call", "block"], default="block",
                        help="gaps take turns call by call, or in blocks of --calls calls")
    args = parser.parse_args()
    body = example_body(args.model).encode()
    inputs, seconds = json.loads(body)["inputs"], args.gap_ms / 1000

    def busy() -> None:
        until = time.perf_counter() + seconds
        while time.perf_counter() < until:
            pass

    gaps = {"hot": lambda: None, "http": http_gap(body), "busy": busy, "sleep": lambda: time.sleep(seconds)}
    results: dict[str, list[float]] = {name: [] for name in gaps}

    def run() -> None:  # a thread of its own, pinned to sim:0, as a worker is
        paddle.set_device("sim:0")
        replica = Standalone(args.model, "sim:0")

        call = functools.partial(replica.infer, replica.examples(inputs))
        for name, gap in gaps.items():  # warm-up
            for _ in range(20):
                gap()
                call()
        for _ in range(args.rounds):
            samples: dict[str, list[float]] = {name: [] for name in gaps}
            if args.turns == "call":  # the VM's drift hits all gaps alike; each call follows another gap's call
                order = [name for _ in range(args.calls) for name in gaps]
            else:  # each gap in a block of its own: a steady state per gap, drift between blocks
                order = [name for name in gaps for _ in range(args.calls)]
            for name in order:
                gaps[name]()
                start = time.perf_counter()
                call()
                samples[name].append(time.perf_counter() - start)
            for name, values in samples.items():
                results[name].append(statistics.median(values) * 1000)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    print(f"{args.model}: median call time (ms) after each gap ({args.gap_ms} ms), per round, turns by {args.turns}")
    for name, values in results.items():
        print(f"  {name:5s} " + "  ".join(f"{v:.3f}" for v in values) + f"   (vs hot {statistics.median(values) - statistics.median(results['hot']):+.3f})")


if __name__ == "__main__":
    main()
