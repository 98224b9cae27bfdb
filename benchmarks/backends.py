"""Paddle Inference against ``paddle.jit.load`` in the service: a resnet-sized model on the CPU.

    python benchmarks/backends.py [--rounds 3] [--seconds 5] [--connections 8] [--workers 1,2,4]
                                  [--cpu-threads N]

A ``paddle.vision.models.resnet18(num_classes=10)`` saved with input ``[None, 3, 64, 64]`` is
served from a temporary repository twice, as ``backend: jit`` and ``backend: inference``, each
by its own service on ``cpu`` with N workers for each N in ``--workers``. Every service is alive
for the whole run; each round measures every one, order rotated: wrk saturated (``/predict``,
one image a request, ``--connections``) and ``/v2/models/{m}/infer`` with the image as binary
tensor data (tritonclient's body), then wrk at c=1 on v2 binary for the p50.

The GIL: before the services start, one replica of each backend runs batch-4 forwards in this
process beside a pure-Python thread, whose speed is given as a share of its speed beside idle
sleeps (a forward that releases the GIL leaves the thread most of a core).

Prints each figure's median (min..max) over the rounds and the ratio inference / jit per round.
Writes ``results/backends.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_protocols import wrk as wrk_body  # noqa: E402
from bench_service import save_results, service, warm, wrk  # noqa: E402

SIDE = 64


def repository(root: Path, cpu_threads: int | None = None) -> Path:
    """``resnet-jit`` and ``resnet-inference``: one saved resnet18, two backends."""
    import paddle

    from placeenv import PlaceEnv

    paddle.seed(0)
    network = paddle.vision.models.resnet18(num_classes=10)
    network.eval()
    with PlaceEnv("cpu"):
        paddle.jit.save(network, str(root / "resnet-jit" / "1" / "model"),
                        input_spec=[paddle.static.InputSpec([None, 3, SIDE, SIDE], "float32", "image")])
    (root / "resnet-inference").mkdir()
    for name in ("model.json", "model.pdiparams"):
        (root / "resnet-inference" / "1").mkdir(exist_ok=True)
        (root / "resnet-inference" / "1" / name).write_bytes((root / "resnet-jit" / "1" / name).read_bytes())
    for backend in ("jit", "inference"):
        (root / f"resnet-{backend}" / "config.yaml").write_text(f"backend: {backend}\n")
    if cpu_threads is not None:
        with (root / "resnet-inference" / "config.yaml").open("a") as config:
            config.write(f"inference: {{cpu_threads: {cpu_threads}}}\n")
    return root


def body(model: str) -> str:
    return json.dumps({"model": model, "inputs": [[[[0.25] * SIDE] * SIDE] * 3]})


def binary() -> tuple[bytes, dict[str, str]]:
    """One image as v2 binary tensor data, the body tritonclient's HTTP client sends."""
    import numpy as np
    import tritonclient.http as triton

    image = triton.InferInput("image", [1, 3, SIDE, SIDE], "FP32")
    image.set_data_from_numpy(np.full((1, 3, SIDE, SIDE), 0.25, np.float32), binary_data=True)
    data, header = triton.InferenceServerClient.generate_request_body(
        [image], outputs=[triton.InferRequestedOutput("fetch_name_0", binary_data=True)])
    return data, {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(header)}


def gil(repo: Path, seconds: float) -> dict[str, float]:
    """A pure-Python thread's speed beside a loop of batch-4 forwards, as a share of its idle speed."""
    import numpy as np

    import placeenv
    from placeenv.serve.engine import standalone
    from placeenv.serve.models import scan

    entries, errors = scan([repo], None, max_batch_size=8, max_batch_delay_ms=0)
    assert not errors, errors
    found = {}
    for backend in ("jit", "inference"):
        replica = standalone.replica(entries[f"resnet-{backend}"], placeenv.to_place("cpu"))
        images = {"image": np.full((4, 3, SIDE, SIDE), 0.25, np.float32)}
        count, stop = [0], threading.Event()

        def spin():
            while not stop.is_set():
                count[0] += 1

        thread = threading.Thread(target=spin)
        thread.start()
        try:
            def speed(work) -> float:
                start, began = count[0], time.perf_counter()
                while time.perf_counter() - began < seconds:
                    work()
                return (count[0] - start) / (time.perf_counter() - began)

            idle = speed(lambda: time.sleep(0.01))
            found[f"{backend}: a Python thread's speed beside, share of idle"] = speed(
                lambda: standalone.forward(replica, images)) / idle
        finally:
            stop.set()
            thread.join()
    return found


def spread(values: list[float]) -> str:
    form = "{:.2f}" if max(values) < 100 else "{:.0f}"
    return f"{form.format(statistics.median(values))} ({form.format(min(values))}..{form.format(max(values))})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--workers", default="1,2,4")
    parser.add_argument("--cpu-threads", type=int, default=None,
                        help="the Predictor's math-library threads (inference.cpu_threads); default: the service's")
    args = parser.parse_args()
    workers = [int(w) for w in args.workers.split(",")]
    with tempfile.TemporaryDirectory(prefix="backends-") as tmp:
        repo = repository(Path(tmp), args.cpu_threads)
        gil_found = gil(repo, 2.0)
        servers = {}
        try:
            for n in workers:
                for backend in ("jit", "inference"):
                    servers[n, backend] = service(["cpu"], f"resnet-{backend}", WORKERS_PER_DEVICE=n,
                                                  MODEL_REPOSITORY=str(repo))
            for (n, backend), server in servers.items():
                warm(server.url, body(f"resnet-{backend}"), 10)
            found = {key: {"rps": [], "json_rps": [], "p50_ms": []} for key in servers}
            keys = list(servers)
            data, headers = binary()
            for r in range(args.rounds):
                for key in keys[r % len(keys):] + keys[:r % len(keys)]:
                    server, payload = servers[key], body(f"resnet-{key[1]}")
                    v2 = f"{server.url}/v2/models/resnet-{key[1]}/infer"
                    found[key]["rps"].append(wrk_body(v2, data, headers, args.connections, args.seconds)["rps"])
                    found[key]["json_rps"].append(wrk([server.url], payload, args.connections, args.seconds)["rps"])
                    found[key]["p50_ms"].append(wrk_body(v2, data, headers, 1, args.seconds)["p50_ms"])
                    print(f"round {r + 1}: {key[0]} workers, {key[1]}: v2 binary {found[key]['rps'][-1]:.0f} req/s, "
                          f"/predict JSON {found[key]['json_rps'][-1]:.0f} req/s, "
                          f"c=1 p50 {found[key]['p50_ms'][-1]:.2f} ms", flush=True)
        finally:
            for server in servers.values():
                server.stop()
    print(f"\n{platform.machine()}, {os.cpu_count()} cores; resnet18 on {SIDE}x{SIDE}, one image a request; "
          f"{args.rounds} rounds, wrk {args.seconds:g} s, {args.connections} connections\n")
    print("| workers | figure | jit | inference | inference / jit |\n|---:|---|---:|---:|---:|")
    for n in workers:
        jit, inf = found[n, "jit"], found[n, "inference"]
        for key, label in (("rps", "v2 binary, req/s"), ("json_rps", "/predict JSON, req/s"),
                           ("p50_ms", "c=1 p50 (v2 binary), ms")):
            print(f"| {n} | {label} | {spread(jit[key])} | {spread(inf[key])} | "
                  f"{spread([a / b for a, b in zip(inf[key], jit[key])])} |")
    print()
    for key, value in gil_found.items():
        print(f"- {key}: {value:.0%}")
    save_results("backends", args, machine=f"{platform.machine()}, {os.cpu_count()} cores",
                 found={f"{n} {b}": v for (n, b), v in found.items()}, gil=gil_found)


if __name__ == "__main__":
    main()
