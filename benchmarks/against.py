"""The single process (``--frontends 0``) of this checkout against the same at git revision REV:
interleaved rounds in one run, so the machine's drift falls on both alike.

    python benchmarks/against.py REV [--rounds 4] [--seconds 5] [--connections 16]

REV is checked out in a temporary git worktree and its service started from there (``python -m
placeenv.serve`` run in a checkout imports that checkout's package; the installed dependencies
are this environment's). Each round starts each tree's service twice, in rotating order:

  digits     digits on sim:0,sim:1, one worker a device (bench_service's and compare.py's service):
             ``/predict`` and v2 JSON saturated by wrk with --connections, and ``/predict`` at c=1
  null 2 ms  the null model (device_scaling.py's) on sim:0,sim:1 at 2 ms a batch of one, two workers
             a device, 2 connections a device: where device time dominates

Prints each figure per tree, median (min..max) over the rounds, and the per-round ratio this / REV.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_service import example_body, service, warm, wrk  # noqa: E402
from device_scaling import BODY as NULL_BODY, repository  # noqa: E402

DEVICES = ["sim:0", "sim:1"]
V2_BODY = json.dumps({"inputs": [{"name": "pixels", "shape": [1, 64], "datatype": "FP32",
                                  "data": json.loads(example_body("digits"))["inputs"][0]}]})


def digits(checkout: Path, connections: int, seconds: float) -> dict[str, float]:
    server = service(DEVICES, "digits", checkout=checkout, SIM_DEVICES=len(DEVICES))
    try:
        body = example_body("digits")
        warm(server.url, body, 50)
        wrk([server.url], body, connections, 1)
        found = {"/predict req/s": wrk([server.url], body, connections, seconds)["rps"]}
        found["v2 JSON req/s"] = wrk([server.url], V2_BODY, connections, seconds,
                                     path="/v2/models/digits/infer")["rps"]
        found["/predict c=1 p50 ms"] = wrk([server.url], body, 1, seconds)["p50_ms"]
        return found
    finally:
        server.stop()


def null(checkout: Path, seconds: float, tmp: Path) -> dict[str, float]:
    server = service(DEVICES, "null", checkout=checkout, SIM_DEVICES=len(DEVICES), WORKERS_PER_DEVICE=2,
                     MODEL_REPOSITORY=repository(tmp, 2.0))
    try:
        warm(server.url, NULL_BODY, 10)
        return {"null 2 ms req/s": wrk([server.url], NULL_BODY, 2 * len(DEVICES), seconds)["rps"]}
    finally:
        server.stop()


def spread(values: list[float]) -> str:
    form = "{:.2f}" if max(values) < 100 else "{:.0f}"
    return f"{form.format(statistics.median(values))} ({form.format(min(values))}..{form.format(max(values))})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rev")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--connections", type=int, default=16)
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("wrk is not installed (apt-get install wrk)")
    with tempfile.TemporaryDirectory(prefix="against-") as tmp:
        old = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(old), args.rev],
                       check=True, capture_output=True)
        try:
            trees = {"this": ROOT, args.rev: old}
            found: dict[str, list[dict]] = {name: [] for name in trees}
            for r in range(args.rounds):
                order = list(trees) if r % 2 == 0 else list(trees)[::-1]
                for name in order:
                    got = {**digits(trees[name], args.connections, args.seconds),
                           **null(trees[name], args.seconds, Path(tempfile.mkdtemp(dir=tmp)))}
                    found[name].append(got)
                    print(f"round {r + 1}/{args.rounds} {name}: " + ", ".join(f"{k} {v:.2f}" for k, v in got.items()),
                          flush=True)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old)], check=False)
    print(f"\n{platform.machine()}, {os.cpu_count()} cores; {args.rounds} rounds, wrk {args.seconds:g} s, "
          f"{args.connections} connections\n")
    print(f"| figure | this | {args.rev} | this / {args.rev}, per round |\n|---|---:|---:|---:|")
    for key in found["this"][0]:
        ratios = [a[key] / b[key] for a, b in zip(found["this"], found[args.rev], strict=True)]
        print(f"| {key} | {spread([f[key] for f in found['this']])} | {spread([f[key] for f in found[args.rev]])} "
              f"| {spread(ratios)} |")


if __name__ == "__main__":
    main()
