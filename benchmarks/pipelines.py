"""The classify pipeline against the same three steps chained two other ways, in interleaved rounds:

    python benchmarks/pipelines.py [--rounds 5] [--seconds 5] [--connections 32] [--transfer-us 0]

  pipeline   the bundled ``classify`` on sim:0,sim:1: classify_decode and classify_topk on CPU workers of
             their own, mobilenet on the devices, each step batched with its model's other jobs
  chained    KServe's transformer shape, the steps chained by the client over HTTP:
             benchmarks/transformer_app.py (one uvicorn process: decode, then top 3) calling the same
             service's mobilenet on sim:0,sim:1 over v2 binary HTTP
  one model  benchmarks/repository/classify_whole: decode in preprocess, mobilenet in execute and the top
             3 in postprocess, in one model.py beside mobilenet's saved program, on sim:0,sim:1

Every way gets the same request: the Open Inference Protocol with one 64x64 JPEG as BYTES (tritonclient's
binary encoding), and answers the same labels. All the processes start once; each round measures each
way in rotating order with wrk: throughput at 1 connection (and its p50) and at ``--connections``.
Prints each figure per way, median (min..max) over the rounds, and the per-round ratios of the
pipeline to each other way. ``--transfer-us`` gives the sim devices device time (PLACEENV_SIM_TRANSFER_US).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import tritonclient.http as triton

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from against import spread  # noqa: E402
from bench_service import Server, free_port, save_results, service, wrk  # noqa: E402

from placeenv.serve.models import BUNDLED, examples, images  # noqa: E402

DEVICES = ["sim:0", "sim:1"]
BENCH = ROOT / "benchmarks" / "repository"
WAYS = ("pipeline", "chained", "one model")


def request() -> tuple[bytes, dict[str, str]]:
    """One 64x64 JPEG as the classify request, encoded by tritonclient (binary)."""
    pixels = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    image = triton.InferInput("image", [1], "BYTES")
    image.set_data_from_numpy(np.array([images.encode(pixels, "JPEG")], dtype=np.object_), binary_data=True)
    body, header = triton.InferenceServerClient.generate_request_body(
        [image], outputs=[triton.InferRequestedOutput(n, binary_data=True) for n in ("labels", "scores")])
    return body, {"Inference-Header-Content-Length": str(header), "Content-Type": "application/octet-stream"}


def answer(url: str, model: str, body: bytes, headers: dict) -> list:
    found = httpx.post(f"{url}/v2/models/{model}/infer", content=body, headers=headers, timeout=60)
    found.raise_for_status()
    result = triton.InferenceServerClient.parse_response_body(
        found.content, header_length=int(found.headers["Inference-Header-Content-Length"]))
    return result.as_numpy("labels").tolist()


def repository(tmp: Path, device_ms: float) -> Path:
    """The models every way serves: classify_whole with mobilenet's saved program beside its model.py
    (the service builds it into its cache at start), or with ``device_ms``, mobilenet_time for mobilenet
    (in classify too, with its decode and top-3 steps) and classify_whole's stand-in execute."""
    shutil.copytree(BENCH / "classify_whole", tmp / "classify_whole")
    if not device_ms:
        examples.ensure("mobilenet")
        for name in ("model.json", "model.pdiparams"):
            shutil.copyfile(examples.home("mobilenet") / "1" / name, tmp / "classify_whole" / "1" / name)
        return tmp
    settings = f"parameters:\n  sleep_ms: {device_ms}\n"
    for name in ("classify_decode", "classify_topk"):
        shutil.copytree(BUNDLED / name, tmp / name)
    shutil.copytree(BENCH / "mobilenet_time", tmp / "mobilenet_time")
    (tmp / "mobilenet_time" / "config.yaml").write_text(settings)
    (tmp / "classify_whole" / "config.yaml").write_text(settings)
    (tmp / "classify").mkdir()
    (tmp / "classify" / "config.yaml").write_text(
        (BUNDLED / "classify" / "config.yaml").read_text().replace("model: mobilenet\n", "model: mobilenet_time\n"))
    return tmp


def start(transfer_us: int, device_ms: float, tmp: Path) -> dict[str, tuple[Server, str]]:
    """Each way's front door and the model its requests name, started and answering."""
    models = repository(tmp, device_ms)
    sim = {"SIM_TRANSFER_US": transfer_us, "SIM_DEVICES": len(DEVICES)}
    ours = {"MODEL_REPOSITORY": models} if device_ms else {}  # the classify pipeline: the bundled one
    device_model = "mobilenet_time" if device_ms else "mobilenet"
    ways = {"pipeline": (service(DEVICES, "classify", **ours, **sim), "classify")}
    predictor = service(DEVICES, device_model, **ours, **sim)
    port = free_port()
    transformer = Server([sys.executable, "-m", "uvicorn", "benchmarks.transformer_app:app", "--port", str(port),
                          "--log-level", "warning", "--no-access-log"],
                         {"PREDICTOR": f"127.0.0.1:{predictor.port}", "MODEL": device_model}, port)
    transformer.predictor = predictor
    ways["chained"] = (transformer, "classify")
    ways["one model"] = (service(DEVICES, "classify_whole", MODEL_REPOSITORY=models, **sim), "classify_whole")
    return ways


def measure(url: str, model: str, body: bytes, headers: dict, connections: int, seconds: float) -> dict:
    path = f"/v2/models/{model}/infer"
    one = wrk([url], body, 1, seconds, path=path, headers=headers)
    many = wrk([url], body, connections, seconds, path=path, headers=headers)
    if one["non_2xx"] or many["non_2xx"]:
        raise RuntimeError(f"{model} at {url}: answers that were not 200 ({one['non_2xx']}, {many['non_2xx']})")
    return {"c=1 req/s": one["rps"], "c=1 p50 ms": one["p50_ms"], f"c={connections} req/s": many["rps"],
            f"c={connections} p50 ms": many["p50_ms"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--transfer-us", type=int, default=0)
    parser.add_argument("--device-ms", type=float, default=0,
                        help="mobilenet_time for mobilenet: this much device time a batch, no host CPU")
    args = parser.parse_args()
    body, headers = request()
    tmp = Path(tempfile.mkdtemp(prefix="pipelines-"))
    ways = start(args.transfer_us, args.device_ms, tmp)
    try:
        labels = {name: answer(server.url, model, body, headers) for name, (server, model) in ways.items()}
        assert len({repr(v) for v in labels.values()}) == 1, labels  # the same chain, the same answer
        for server, model in ways.values():  # warm: first runs, batches of every size
            wrk([server.url], body, args.connections, 2, path=f"/v2/models/{model}/infer", headers=headers)
        found: dict[str, list[dict]] = {name: [] for name in ways}
        for r in range(args.rounds):
            order = list(WAYS[r % 3:] + WAYS[:r % 3])
            for name in order:
                server, model = ways[name]
                found[name].append(measure(server.url, model, body, headers, args.connections, args.seconds))
                print(f"round {r + 1}/{args.rounds} {name}: "
                      + ", ".join(f"{k} {v:.2f}" for k, v in found[name][-1].items()), flush=True)
    finally:
        for server, _ in ways.values():
            server.stop()
            if hasattr(server, "predictor"):
                server.predictor.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    device = f"mobilenet_time, {args.device_ms:g} ms a batch" if args.device_ms else "mobilenet's saved program"
    print(f"\n{time.strftime('%Y-%m-%d')}, {platform.machine()}, {os.cpu_count()} cores; {args.rounds} rounds, "
          f"wrk {args.seconds:g} s; the device step: {device}; sim device time {args.transfer_us} us a transfer\n")
    keys = list(found["pipeline"][0])
    print("| figure | " + " | ".join(WAYS) + " | pipeline / chained | pipeline / one model |")
    print("|---|" + "---:|" * (len(WAYS) + 2))
    for key in keys:
        cells = [spread([f[key] for f in found[w]]) for w in WAYS]
        ratios = [spread([a[key] / b[key] for a, b in zip(found["pipeline"], found[other], strict=True)])
                  for other in ("chained", "one model")]
        print(f"| {key} | " + " | ".join(cells + ratios) + " |")
    save_results("pipelines", args, rounds=found)


if __name__ == "__main__":
    main()
