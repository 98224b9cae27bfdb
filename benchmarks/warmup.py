"""The first request after ready, with and without a ``warmup`` config, against the steady state:

    python benchmarks/warmup.py [--rounds 5] [--device cpu] [--steady 60]

Each round starts the service twice, in turn: serving the bundled mobilenet as it is (``cold``), and
the same version with ``warmup: [{batch_sizes: [1]}]`` (``warm``). Once /readyz says ready, it times
one request, then ``--steady`` more (their median is the steady state), and stops. On ``cpu`` a
Predictor serves the program (the backend ``auto`` chooses there): it builds and allocates at its
first run, which a warm-up makes before ready. Prints, per way, the first request and the steady
median over the rounds, median (min..max), and the per-round ratio of the first to the steady.
"""

from __future__ import annotations

import argparse
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from against import spread  # noqa: E402
from bench_service import service  # noqa: E402

from placeenv.serve.models import BUNDLED, examples  # noqa: E402

BODY = {"inputs": [{"name": "image", "shape": [1, 3, 32, 32], "datatype": "FP32",
                    "data": np.random.default_rng(0).random((1, 3, 32, 32)).astype(np.float32).ravel().tolist()}]}


def repository(root: Path) -> Path:
    """``cold`` and ``warm``: mobilenet's version 1, once as it is and once with a warm-up."""
    examples.ensure("mobilenet")
    for name, extra in (("cold", ""), ("warm", "warmup: [{batch_sizes: [1]}]\n")):
        shutil.copytree(examples.home("mobilenet") / "1", root / name / "1")
        (root / name / "config.yaml").write_text((BUNDLED / "mobilenet" / "config.yaml").read_text() + extra)
    return root


def once(repo: Path, model: str, device: str, steady: int) -> tuple[float, float]:
    """A fresh service's first request (ms, from send to answer) and the median of the next ``steady``."""
    server = service([device], model, MODEL_REPOSITORY=str(repo))
    try:
        with httpx.Client(timeout=60) as client:
            url = f"{server.url}/v2/models/{model}/infer"
            times = []
            for _ in range(steady + 1):
                started = time.perf_counter()
                answer = client.post(url, json=BODY)
                times.append((time.perf_counter() - started) * 1000)
                assert answer.status_code == 200, answer.text
        return times[0], statistics.median(times[1:])
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steady", type=int, default=60)
    args = parser.parse_args()
    found: dict[str, dict[str, list[float]]] = {w: {"first": [], "steady": [], "ratio": []} for w in ("cold", "warm")}
    with tempfile.TemporaryDirectory() as tmp:
        repo = repository(Path(tmp))
        for round_ in range(args.rounds):
            ways = ("cold", "warm") if round_ % 2 == 0 else ("warm", "cold")  # interleaved, turns alternating
            for way in ways:
                first, steady = once(repo, way, args.device, args.steady)
                found[way]["first"].append(first)
                found[way]["steady"].append(steady)
                found[way]["ratio"].append(first / steady)
                print(f"round {round_ + 1} {way}: first {first:.2f} ms, steady p50 {steady:.2f} ms", flush=True)
    print(f"\n{time.strftime('%Y-%m-%d')}, {platform.machine()}, device {args.device}, {args.rounds} rounds, "
          f"mobilenet, one request at a time\n")
    print("| way | first request (ms) | steady p50 (ms) | first / steady |")
    print("|---|---|---|---|")
    for way, figures in found.items():
        print(f"| {way} | {spread(figures['first'])} | {spread(figures['steady'])} | {spread(figures['ratio'])} |")


if __name__ == "__main__":
    main()
