"""How a request's protocol and a model's form cost, as ratios from interleaved rounds in one run.

    python benchmarks/bench_protocols.py [--rounds 5] [--seconds 4] [--connections 16] [--devices 2]

Needs ``wrk`` (Debian package). One service process (sim devices, one worker each) per part;
within a part every way is measured in every round, in a rotated order, so the VM's drift hits
them alike. Each figure is the median over rounds, with the spread (min..max) of the per-round
ratios. Prints Markdown tables and writes ``results/bench_protocols.json``.

  a. mobilenet three ways: the Open Inference Protocol with binary tensors, the same with JSON
     data, and ``/predict``; the v2 bodies are encoded by tritonclient
     (``generate_request_body``), and wrk sends them: p50 at one connection, and throughput
     saturated (``--connections``). The server's cost per protocol, not the client's.
  b. the same mobilenet as a bare ``jit.save`` directory and as a ``model.py`` that builds the
     network in Python (dygraph, the same seeded weights), both v2 binary, one service.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_service import RESULTS, _ms, service  # noqa: E402


IMAGE = np.random.default_rng(0).uniform(-1, 1, (1, 3, 32, 32)).astype(np.float32)

MODEL_PY = '''\
"""mobilenet as Python code: the same seeded network, built in dygraph instead of loaded."""

from placeenv.serve.models import Model as Base, TensorSpec
from placeenv.serve.models.examples import mobilenet_network


class Model(Base):
    inputs = (TensorSpec("image", "FP32", (-1, 3, 32, 32)),)
    outputs = (TensorSpec("fetch_name_0", "FP32", (-1, 10)),)

    def load(self, context):
        return mobilenet_network()
'''


def v2_body(binary: bool) -> tuple[bytes, dict[str, str]]:
    # tritonclient (the dev extra) is imported where it is used: front_end_ceiling.py and
    # batch_delay.py import wrk from here, and run without it.
    import tritonclient.http as triton

    image = triton.InferInput("image", list(IMAGE.shape), "FP32")
    image.set_data_from_numpy(IMAGE, binary_data=binary)
    output = triton.InferRequestedOutput("fetch_name_0", binary_data=binary)
    body, header = triton.InferenceServerClient.generate_request_body([image], outputs=[output])
    headers = {"Content-Type": "application/octet-stream" if binary else "application/json"}
    if header is not None:
        headers["Inference-Header-Content-Length"] = str(header)
    return body, headers


def predict_body() -> tuple[bytes, dict[str, str]]:
    body = json.dumps({"model": "mobilenet", "inputs": IMAGE.tolist()}).encode()
    return body, {"Content-Type": "application/json"}


def wrk(url: str, body: bytes, headers: dict[str, str], connections: int, seconds: float) -> dict:
    """wrk posting ``body`` (read from a file, so binary bodies go as they are)."""
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "body").write_bytes(body)
        lua = Path(tmp) / "post.lua"
        lua.write_text(
            f'local f = io.open("{tmp}/body", "rb")\nwrk.method = "POST"\nwrk.body = f:read("*all")\nf:close()\n'
            + "".join(f'wrk.headers["{k}"] = "{v}"\n' for k, v in headers.items())
        )
        out = subprocess.run(["wrk", "-t1", f"-c{connections}", f"-d{int(seconds)}s", "--latency", "-s", str(lua),
                              url], capture_output=True, text=True, check=True).stdout
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if errors:
        raise RuntimeError(f"{url}: {errors.group(1)} answers were not 200:\n{out}")
    return {"rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),
            "p50_ms": _ms(re.search(r"\s50%\s+([\d.]+\w+)", out).group(1))}


def rounds(ways: dict, base_url: str, args) -> dict[str, dict[str, list[float]]]:
    """{way: {"p50_ms": [per round], "rps": [per round]}}, every way in every round, order rotated."""
    names = list(ways)
    found = {name: {"p50_ms": [], "rps": []} for name in names}
    for name, (path, body, headers) in ways.items():  # warm-up: replicas, caches, connections
        wrk(base_url + path, body, headers, args.connections, 2)
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            path, body, headers = ways[name]
            found[name]["p50_ms"].append(wrk(base_url + path, body, headers, 1, args.seconds)["p50_ms"])
            found[name]["rps"].append(wrk(base_url + path, body, headers, args.connections, args.seconds)["rps"])
        print(f"round {r + 1}/{args.rounds}: " + ", ".join(
            f"{n} {found[n]['p50_ms'][-1]:.2f} ms {found[n]['rps'][-1]:.0f}/s" for n in names), flush=True)
    return found


def table(found: dict, reference: str, title: str) -> str:
    lines = [f"**{title}** (ratios to `{reference}`: median of the per-round ratios, spread min..max)", "",
             "| way | p50 at c=1, ms | ratio | saturated, req/s | ratio |", "|---|---|---|---|---|"]
    for name, values in found.items():
        cells = [f"`{name}`"]
        for key in ("p50_ms", "rps"):
            ratios = [a / b for a, b in zip(values[key], found[reference][key])]
            cells += [f"{statistics.median(values[key]):.2f}" if key == "p50_ms" else
                      f"{statistics.median(values[key]):.1f}",
                      "1" if name == reference else
                      f"{statistics.median(ratios):.3f} ({min(ratios):.3f}..{max(ratios):.3f})"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def agree(url: str, models: list[str]) -> float:
    """Largest absolute difference between the models' answers to the same image."""
    import tritonclient.http as triton

    client = triton.InferenceServerClient(url.removeprefix("http://"))
    image = triton.InferInput("image", list(IMAGE.shape), "FP32")
    image.set_data_from_numpy(IMAGE, binary_data=True)
    answers = [client.infer(m, [image]).as_numpy("fetch_name_0") for m in models]
    return float(max(np.abs(a - answers[0]).max() for a in answers))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=4)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--devices", type=int, default=2)
    args = parser.parse_args()
    devices = [f"sim:{i}" for i in range(args.devices)]
    report = {"date": datetime.date.today().isoformat(), "machine": f"{platform.machine()}, "
              f"{subprocess.run(['nproc'], capture_output=True, text=True).stdout.strip()} cores",
              "python": platform.python_version(), "args": vars(args)}
    out = []

    server = service(devices, "mobilenet")
    try:
        binary, as_json = v2_body(True), v2_body(False)
        ways = {"v2 binary": ("/v2/models/mobilenet/infer", *binary),
                "v2 JSON": ("/v2/models/mobilenet/infer", *as_json),
                "/predict": ("/predict", *predict_body())}
        report["sizes"] = {name: len(body) for name, (_, body, _) in ways.items()}
        report["protocols"] = found = rounds(ways, server.url, args)
        out.append(table(found, "/predict", f"a. mobilenet, three ways ({args.devices} sim x 1 worker; body bytes "
                         + ", ".join(f"{n} {s}" for n, s in report["sizes"].items()) + ")"))
    finally:
        server.stop()

    with tempfile.TemporaryDirectory() as tmp:
        from placeenv.serve.models.examples import mobilenet_home  # imports Paddle: only here

        bundled = mobilenet_home() / "1"  # the service built it at its start above
        (Path(tmp) / "mobilenet_jit" / "1").mkdir(parents=True)
        for name in ("model.json", "model.pdiparams"):
            shutil.copy(bundled / name, Path(tmp) / "mobilenet_jit" / "1" / name)
        (Path(tmp) / "mobilenet_py" / "1").mkdir(parents=True)
        (Path(tmp) / "mobilenet_py" / "1" / "model.py").write_text(MODEL_PY)
        server = service(devices, "mobilenet_jit,mobilenet_py", model_repository=tmp)
        try:
            report["max_abs_difference"] = difference = agree(server.url, ["mobilenet_jit", "mobilenet_py"])
            body, headers = v2_body(True)
            ways = {form: (f"/v2/models/{form}/infer", body, headers) for form in ("mobilenet_jit", "mobilenet_py")}
            report["forms"] = found = rounds(ways, server.url, args)
            out.append(table(found, "mobilenet_jit", "b. the saved program vs the same network as a model.py "
                             f"(v2 binary; answers agree within {difference:.1e})"))
        finally:
            server.stop()

    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bench_protocols.json").write_text(json.dumps(report, indent=1))
    print("\n\n".join(out))


if __name__ == "__main__":
    main()
