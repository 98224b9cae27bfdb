"""The front end's ceiling: the service with the null model against a raw ASGI app, as ratios.

    python benchmarks/front_end_ceiling.py [--rounds 5] [--seconds 4] [--connections 16] [--devices cpu]

Needs ``wrk`` and ``h2load`` (Debian packages wrk, nghttp2-client). The v2 JSON and binary rows
need tritonclient's HTTP client (the dev extra), the gRPC rows grpcio and tritonclient's gRPC
messages (the grpc or dev extra): without them those rows are skipped, with a line that says so,
and the others run. Servers on the same
uvicorn: ``benchmarks/raw_asgi_app.py`` (read the body, parse the JSON, answer JSON: no
framework, queue, thread or metric), the same with a thread hand-off, and the service serving
``benchmarks/repository/null`` (64 numbers in, the first 10 out, nothing on the device but one
slice) on ``--devices`` with 2 workers each, with gRPC on; and a bare grpc.aio server. Every
way is measured in every round, order rotated; the servers not measured sit idle:

  raw          the raw ASGI app, the null model's /predict body
  + hand-off   benchmarks/handoff_floor_app.py: the raw app handing each request to a worker
               thread and back (batched wake-ups): the floor of any front end with device
               worker threads
  /predict     the service's simple JSON API, the same body
  /predict, batch delay 0
               the same on a second service whose batches never wait for more
               (max_batch_delay_ms 0; the default waits up to 2 ms, less once requests stop
               arriving): the front end without the batching policy's wait
  v2 JSON      /v2/models/null/infer, JSON data (tritonclient's encoding)
  v2 binary    the same with binary tensors
  raw gRPC     benchmarks/raw_grpc_app.py: a bare grpc.aio ModelInfer on uvloop, gRPC's own
               ceiling (the v2 gRPC row's "its protocol's raw")
  raw gRPC + hand-off
               the same with --handoff: each call's rows go to a worker thread and back, as
               in handoff_floor_app.py
  v2 gRPC      ModelInfer with raw_input_contents, by h2load (c=1 column: its mean, not p50)

Prints the throughput at ``--connections``, the c=1 latency, and the server's CPU time per
request at ``--connections`` (its event-loop thread, which holds the GIL for every request, and
its other threads) of each, each way's throughput as a ratio to raw (median and min..max of the
per-round ratios), and for the service's ways the mean batch its workers ran (from its
``inference_batch_size`` histogram). Writes ``results/front_end_ceiling.json``.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import platform
import re
import statistics
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_protocols import wrk  # noqa: E402
from bench_service import Server, batch_totals, free_port, processes, save_results, service  # noqa: E402

ROW = np.linspace(0, 1, 64, dtype=np.float32)[None, :]

#: The rows that need more than the service extra, by the module that must import for them
#: (imported only where they run): tritonclient's HTTP client encodes the v2 bodies; raw_grpc_app
#: needs grpcio and tritonclient's gRPC messages, as do the gRPC frame and the service's gRPC port.
OPTIONAL = {
    "tritonclient.http": (("v2 JSON", "v2 binary"), "tritonclient[http]: pip install -e '.[dev]'"),
    "raw_grpc_app": (("raw gRPC", "raw gRPC + hand-off", "v2 gRPC"),
                     "grpcio and tritonclient[grpc]: pip install 'placeenv[grpc]', or -e '.[dev]'"),
}


def skipped() -> list[tuple[tuple[str, ...], str]]:
    """The groups of rows that cannot run here, each with what they need and how to install it."""
    found = []
    for module, (rows, needs) in OPTIONAL.items():
        try:
            importlib.import_module(module)
        except ImportError:  # tritonclient.http without geventhttpclient fails here, not on find_spec
            found.append((rows, needs))
    return found


def bodies() -> dict[str, tuple[bytes, dict[str, str]]]:
    """Each HTTP way's body and headers; the v2 ones only where tritonclient's HTTP client imports."""
    found = {"predict": (json.dumps({"model": "null", "inputs": ROW.tolist()}).encode(),
                         {"Content-Type": "application/json"})}
    try:
        import tritonclient.http as triton
    except ImportError:  # main skips the v2 rows and says so; batch_delay.py needs only /predict's
        return found
    for name, binary in (("v2 JSON", False), ("v2 binary", True)):
        x = triton.InferInput("x", list(ROW.shape), "FP32")
        x.set_data_from_numpy(ROW, binary_data=binary)
        body, header = triton.InferenceServerClient.generate_request_body(
            [x], outputs=[triton.InferRequestedOutput("y", binary_data=binary)])
        headers = {"Content-Type": "application/octet-stream" if binary else "application/json"}
        if header is not None:
            headers["Inference-Header-Content-Length"] = str(header)
        found[name] = (body, headers)
    return found


def grpc_frame() -> bytes:
    """One ModelInfer request as a gRPC message on the wire: flag, length, protobuf."""
    from tritonclient.grpc import service_pb2 as pb  # the grpc extra's: only the gRPC rows get here

    message = pb.ModelInferRequest(
        model_name="null", inputs=[pb.ModelInferRequest.InferInputTensor(name="x", datatype="FP32", shape=[1, 64])],
        raw_input_contents=[ROW.tobytes()]).SerializeToString()
    return b"\0" + struct.pack(">I", len(message)) + message


def h2load(url: str, frame: bytes, connections: int, seconds: float) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".bin") as f:
        f.write(frame)
        f.flush()
        out = subprocess.run(["h2load", f"-c{connections}", "-m1", "-D", str(int(seconds)),
                              "-H", "content-type: application/grpc", "-H", "te: trailers", "-d", f.name,
                              url + "/inference.GRPCInferenceService/ModelInfer"],
                             capture_output=True, text=True, check=True).stdout
    done = re.search(r"requests: (\d+) total, \d+ started, (\d+) done, (\d+) succeeded", out)
    if done is None or done[2] != done[3]:
        raise RuntimeError(f"h2load: not every call succeeded:\n{out[-1500:]}")
    mean = re.search(r"time for request:\s+\S+\s+\S+\s+([\d.]+)(us|ms)", out)
    return {"rps": float(re.search(r"finished in [\d.]+s, ([\d.]+) req/s", out)[1]),
            "p50_ms": float(mean[1]) / (1000 if mean[2] == "us" else 1)}


def cpu_s(pid: int) -> tuple[float, float]:
    """CPU seconds used so far by the process's main thread and by its other threads; for a service
    with front ends (its process has children), the engine's and the front ends' processes."""
    kids = children(pid)
    if kids:
        return (sum(sum(cpu_s(k)) for k, role in kids if role == "engine"),
                sum(sum(cpu_s(k)) for k, role in kids if role != "engine"))
    main = others = 0.0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended
            continue
        used = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        if task.name == str(pid):
            main += used
        else:
            others += used
    return main, others


def children(pid: int) -> list[tuple[int, str]]:
    """The supervisor's engine and front ends: (pid, "engine" | "frontend")."""
    found = []
    for child, (parent, *_) in processes().items():
        if parent == pid:
            try:
                command = Path(f"/proc/{child}/cmdline").read_bytes()
            except OSError:  # gone since the listing
                continue
            found.append((child, "engine" if b"placeenv.serve.process.engine_main" in command else "frontend"))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=4)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--devices", default="cpu", help="the service's devices, e.g. cpu or sim:0,sim:1")
    parser.add_argument("--frontends", default="", help="comma-separated K: rows '/predict, K front ends' "
                        "(and 'v2 gRPC, K front ends') from the service as an engine and K front-end processes; "
                        "their CPU columns are the engine's + the front ends'")
    args = parser.parse_args()
    ks = [int(k) for k in args.frontends.split(",") if k.strip()]
    unavailable = skipped()
    if unavailable:
        print("skipping " + "; ".join(f"{', '.join(rows)} (they need {needs})"
                                      for rows, needs in unavailable), flush=True)
    missing = {row for rows, _ in unavailable for row in rows}
    grpc = "raw gRPC" not in missing
    raw_port, grpc_port = free_port(), free_port()
    raw = Server([sys.executable, "-m", "uvicorn", "benchmarks.raw_asgi_app:app", "--port", str(raw_port),
                  "--lifespan", "off", "--log-level", "warning", "--no-access-log"], {}, raw_port)
    floor_port = free_port()
    floor = Server([sys.executable, "-m", "uvicorn", "benchmarks.handoff_floor_app:app", "--port",
                    str(floor_port), "--lifespan", "off", "--log-level", "warning", "--no-access-log"], {}, floor_port)
    raw_grpc_port, handoff_grpc_port = free_port(), free_port()
    raw_grpc = handoff_grpc = None
    if grpc:
        import raw_grpc_app  # skipped() imported it already: its is_ready
        raw_grpc = Server([sys.executable, "benchmarks/raw_grpc_app.py", str(raw_grpc_port)], {},
                          raw_grpc_port, ready=raw_grpc_app.is_ready)
        handoff_grpc = Server([sys.executable, "benchmarks/raw_grpc_app.py", str(handoff_grpc_port),
                               "--handoff"], {}, handoff_grpc_port, ready=raw_grpc_app.is_ready)
    ours = service(args.devices.split(","), "null", WORKERS_PER_DEVICE=2,
                   **({"GRPC_PORT": grpc_port} if grpc else {}),  # without grpcio the service refuses it
                   MODEL_REPOSITORY=str(ROOT / "benchmarks" / "repository"))
    eager = service(args.devices.split(","), "null", WORKERS_PER_DEVICE=2, MAX_BATCH_DELAY_MS=0,
                    MODEL_REPOSITORY=str(ROOT / "benchmarks" / "repository"))
    split_grpc = {k: free_port() for k in ks}
    split = {k: service(args.devices.split(","), "null", WORKERS_PER_DEVICE=2, FRONTENDS=k,
                        **({"GRPC_PORT": split_grpc[k]} if grpc else {}),
                        MODEL_REPOSITORY=str(ROOT / "benchmarks" / "repository")) for k in ks}
    try:
        body = bodies()
        ways = {  # name: a function of (connections, seconds)
            "raw": lambda c, s: wrk(raw.url + "/predict", *body["predict"], c, s),
            "+ hand-off": lambda c, s: wrk(floor.url + "/predict", *body["predict"], c, s),
            "/predict": lambda c, s: wrk(ours.url + "/predict", *body["predict"], c, s),
            "/predict, batch delay 0": lambda c, s: wrk(eager.url + "/predict", *body["predict"], c, s),
            "v2 JSON": lambda c, s: wrk(ours.url + "/v2/models/null/infer", *body["v2 JSON"], c, s),
            "v2 binary": lambda c, s: wrk(ours.url + "/v2/models/null/infer", *body["v2 binary"], c, s),
            "raw gRPC": lambda c, s: h2load(f"http://127.0.0.1:{raw_grpc_port}", grpc_frame(), c, s),
            "raw gRPC + hand-off":
                lambda c, s: h2load(f"http://127.0.0.1:{handoff_grpc_port}", grpc_frame(), c, s),
            "v2 gRPC": lambda c, s: h2load(f"http://127.0.0.1:{grpc_port}", grpc_frame(), c, s),
        }
        for k, server in split.items():
            ways[f"/predict, {k} front ends"] = lambda c, s, server=server: wrk(server.url + "/predict",
                                                                               *body["predict"], c, s)
            ways[f"v2 gRPC, {k} front ends"] = lambda c, s, k=k: h2load(f"http://127.0.0.1:{split_grpc[k]}",
                                                                        grpc_frame(), c, s)
        ways = {name: run for name, run in ways.items() if name not in missing and not (
            "gRPC" in name and not grpc)}
        baseline = {name: "raw gRPC" if "gRPC" in name else "raw" for name in ways}
        names = list(ways)
        for run in ways.values():  # warm-up
            run(args.connections, 2)
        pids = {"raw": raw.proc.pid, "+ hand-off": floor.proc.pid, "/predict, batch delay 0": eager.proc.pid}
        if grpc:
            pids.update({"raw gRPC": raw_grpc.proc.pid, "raw gRPC + hand-off": handoff_grpc.proc.pid})
        for k, server in split.items():
            pids.update({f"/predict, {k} front ends": server.proc.pid, f"v2 gRPC, {k} front ends": server.proc.pid})
        services = {"/predict, batch delay 0": eager, **{n: ours for n in names if n not in pids},
                    **{f"{way}, {k} front ends": server for k, server in split.items()
                       for way in ("/predict", "v2 gRPC") if f"{way}, {k} front ends" in names}}
        found = {n: {"p50_ms": [], "rps": [], "main_us": [], "others_us": [], "batch": []} for n in names}
        for r in range(args.rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                found[name]["p50_ms"].append(ways[name](1, args.seconds)["p50_ms"])
                pid = pids.get(name, ours.proc.pid)
                server = services.get(name)  # the service's ways: their mean batch too
                # Read before the CPU count: a scrape costs some.
                batches = None if server is None else batch_totals(server.url)
                before = cpu_s(pid)
                found[name]["rps"].append(ways[name](args.connections, args.seconds)["rps"])
                after, requests = cpu_s(pid), found[name]["rps"][-1] * args.seconds
                found[name]["main_us"].append((after[0] - before[0]) / requests * 1e6)
                found[name]["others_us"].append((after[1] - before[1]) / requests * 1e6)
                if server is not None:
                    examples, runs = (a - b for a, b in zip(batch_totals(server.url), batches))
                    found[name]["batch"].append(examples / max(runs, 1))
            print(f"round {r + 1}/{args.rounds}: " + ", ".join(
                f"{n} {found[n]['rps'][-1]:.0f}/s" for n in names), flush=True)
    finally:
        ours.stop()
        eager.stop()
        for server in split.values():
            server.stop()
        floor.stop()
        raw.stop()
        for server in (raw_grpc, handoff_grpc):
            if server is not None:
                server.stop()

    print(f"\n{datetime.date.today()}, {platform.machine()}, service on {args.devices} x 2 workers, "
          f"{args.rounds} rounds of {args.seconds:.0f} s, {args.connections} connections\n")
    print("| way | req/s | ratio to raw | ratio to its protocol's raw | c=1 latency, ms "
          "| CPU per request, us: event loop + other threads | mean batch |")
    print("|---|---:|---:|---:|---:|---:|---:|")

    def ratio(name: str, to: str) -> str:
        if name == to:
            return "1"
        ratios = [a / b for a, b in zip(found[name]["rps"], found[to]["rps"], strict=True)]
        return f"{statistics.median(ratios):.3f} ({min(ratios):.3f}..{max(ratios):.3f})"

    for name in names:
        batch = f"{statistics.median(found[name]['batch']):.1f}" if found[name]["batch"] else ""
        print(f"| {name} | {statistics.median(found[name]['rps']):.0f} | {ratio(name, 'raw')} | "
              f"{ratio(name, baseline[name])} | "
              f"{statistics.median(found[name]['p50_ms']):.2f} | "
              f"{statistics.median(found[name]['main_us']):.0f} + "
              f"{statistics.median(found[name]['others_us']):.0f} | "
              f"{batch} |")
    save_results("front_end_ceiling", args, found=found)


if __name__ == "__main__":
    main()
