"""The first request after ready, with and without a ``warmup`` config, against the steady state:

    python benchmarks/warmup.py [--rounds 5] [--device cpu] [--steady 60] [--idle 0.5] [--after-idle 8]

Each round starts the service twice, in turn: serving the bundled mobilenet as it is (``cold``), and
the same version with ``warmup: [{batch_sizes: [1]}]`` (``warm``). Once /readyz says ready it waits
``--idle`` seconds, times one request, then ``--steady`` more back to back, then ``--after-idle`` more
each after ``--idle`` seconds of quiet (the steady state of a request that finds the service idle, as
the first does), and stops. On ``cpu`` a Predictor serves the program (the backend ``auto`` chooses
there): it builds and allocates at its first run, which a warm-up makes before ready. Prints, per
way, each figure over the rounds, median (min..max), and the per-round ratios of the first request
to the two steady states.
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


def once(repo: Path, model: str, device: str, steady: int, idle: float, after_idle: int) -> dict[str, float]:
    """A fresh service's first request (ms, from send to answer), and the medians of ``steady`` back to back
    and of ``after_idle`` each after ``idle`` s of quiet."""
    server = service([device], model, MODEL_REPOSITORY=str(repo))
    try:
        with httpx.Client(timeout=60) as client:
            url = f"{server.url}/v2/models/{model}/infer"
            client.get(f"{server.url}/v2/health/ready")  # the connection: the request's own time is timed

            def timed() -> float:
                started = time.perf_counter()
                answer = client.post(url, json=BODY)
                assert answer.status_code == 200, answer.text
                return (time.perf_counter() - started) * 1000

            time.sleep(idle)  # (the same quiet before the first request as before each after-idle one)
            first = timed()
            back_to_back = statistics.median(timed() for _ in range(steady))
            quiet = []
            for _ in range(after_idle):
                time.sleep(idle)
                quiet.append(timed())
        return {"first": first, "steady": back_to_back, "after_idle": statistics.median(quiet)}
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steady", type=int, default=60)
    parser.add_argument("--idle", type=float, default=0.5)
    parser.add_argument("--after-idle", type=int, default=8)
    args = parser.parse_args()
    figures = ("first", "steady", "after_idle", "first / steady", "first / after_idle")
    found: dict[str, dict[str, list[float]]] = {w: {f: [] for f in figures} for w in ("cold", "warm")}
    with tempfile.TemporaryDirectory() as tmp:
        repo = repository(Path(tmp))
        for round_ in range(args.rounds):
            ways = ("cold", "warm") if round_ % 2 == 0 else ("warm", "cold")  # interleaved, turns alternating
            for way in ways:
                got = once(repo, way, args.device, args.steady, args.idle, args.after_idle)
                got["first / steady"] = got["first"] / got["steady"]
                got["first / after_idle"] = got["first"] / got["after_idle"]
                for figure in figures:
                    found[way][figure].append(got[figure])
                print(f"round {round_ + 1} {way}: " + ", ".join(f"{k} {v:.2f}" for k, v in got.items()), flush=True)
    print(f"\n{time.strftime('%Y-%m-%d')}, {platform.machine()}, device {args.device}, {args.rounds} rounds, "
          f"mobilenet, one request at a time, {args.idle:g} s quiet before the first and each after-idle one\n")
    print("| way | first request (ms) | steady, back to back (ms) | steady, after quiet (ms) | first / back to back "
          "| first / after quiet |")
    print("|---|---|---|---|---|---|")
    for way, got in found.items():
        print(f"| {way} | " + " | ".join(spread(got[f]) for f in figures) + " |")


if __name__ == "__main__":
    main()
