"""Where the front end's time goes: py-spy on the service's event-loop thread under saturating load.

    python benchmarks/profile_front_end.py [--way /predict] [--seconds 10] [--connections 16]

The service serves the null model (``benchmarks/repository/null``) on ``cpu`` x 2 workers;
wrk (or h2load for ``v2 gRPC``) saturates one way of ``front_end_ceiling.py`` while
``py-spy record --format raw`` samples every thread (idle ones left out). Prints, for the
event-loop thread (the ceiling: it holds the GIL for every request), the share of its
busy samples in each layer (by the innermost frame that belongs to one), and the 20
functions with the most samples of their own.
Writes the collapsed stacks to ``results/profile_<way>.txt`` (speedscope and flamegraph
tools read them).
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_service import free_port, service  # noqa: E402
from front_end_ceiling import bodies, grpc_frame, h2load, wrk  # noqa: E402

#: Layers of the request path, by the file a frame is in (first match wins, innermost frame first).
LAYERS = [
    ("prometheus_client metrics", r"prometheus_client/"),
    ("pydantic validation / JSON", r"pydantic|json/|orjson"),
    ("the service (protocol, engine, predict, v2, grpc)",
     r"placeenv/serve/(protocol|engine)/|placeenv/serve/http/(predict|v2)\.py|placeenv/serve/grpc\.py"),
    ("FastAPI / Starlette routing and middleware",
     r"fastapi/|starlette/|placeenv/serve/http/(app|routes|middleware|pages|responses)\.py"),
    ("uvicorn HTTP parsing and transport", r"uvicorn/|httptools|h11/"),
    ("grpc.aio", r"grpc/"),
    ("asyncio event loop, futures, thread hand-offs", r"asyncio/|concurrent/|threading\.py|queue\.py"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--way", default="/predict", choices=["/predict", "v2 JSON", "v2 binary", "v2 gRPC"])
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--connections", type=int, default=16)
    args = parser.parse_args()
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    grpc_port = free_port()
    ours = service(["cpu"], "null", WORKERS_PER_DEVICE=2, GRPC_PORT=grpc_port,
                   MODEL_REPOSITORY=str(ROOT / "benchmarks" / "repository"))
    out = ROOT / "results" / f"profile_{re.sub(r'[^a-z0-9]+', '_', args.way.lower()).strip('_')}.txt"
    out.parent.mkdir(exist_ok=True)
    try:
        body = bodies()
        if args.way == "v2 gRPC":
            load = lambda: h2load(f"http://127.0.0.1:{grpc_port}", grpc_frame(), args.connections, args.seconds + 2)  # noqa: E731
        else:
            path = "/predict" if args.way == "/predict" else "/v2/models/null/infer"
            key = "predict" if args.way == "/predict" else args.way
            load = lambda: wrk(ours.url + path, *body[key], args.connections, args.seconds + 2)  # noqa: E731
        load()  # warm-up
        result = {}
        loader = threading.Thread(target=lambda: result.update(load()))
        loader.start()
        subprocess.run([spy, "record", "--format", "raw", "--threads", "--nonblocking", "--rate", "250",
                        "--duration", str(args.seconds), "--pid", str(ours.proc.pid), "--output", str(out)],
                       check=True, capture_output=True)
        loader.join()
    finally:
        ours.stop()

    stacks = collections.Counter()
    for line in out.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        stacks[stack] += int(count)
    by_thread = collections.Counter()
    for stack, n in stacks.items():
        by_thread[stack.split(";")[0]] += n
    # The event loop runs on the main thread: the one whose stacks hold uvicorn's serve loop.
    loop = max((t for t in by_thread if any(s.startswith(t + ";") and "uvicorn" in s for s in stacks)),
               key=by_thread.get)
    total = by_thread[loop]
    layers, functions = collections.Counter(), collections.Counter()
    for stack, n in stacks.items():
        frames = stack.split(";")
        if frames[0] != loop:
            continue
        layers[next((name for f in reversed(frames[1:]) for name, pattern in LAYERS if re.search(pattern, f)),
                    "other")] += n
        functions[frames[-1]] += n
    print(f"{args.way}: {result.get('rps', 0):.0f} req/s under the profiler; event-loop thread "
          f"{loop!r}: {total} samples\n")
    print("| layer (innermost match) | share of the event loop's samples |\n|---|---:|")
    for name, n in layers.most_common():
        print(f"| {name} | {n / total:.1%} |")
    print("\n| function (self: the innermost frame) | share |\n|---|---:|")
    for frame, n in functions.most_common(20):
        print(f"| `{frame[:110]}` | {n / total:.1%} |")
    print(f"\ncollapsed stacks: {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
