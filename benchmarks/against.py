"""The single process (``--frontends 0``) of this checkout against the same at git revision REV:
interleaved rounds in one run, so the machine's drift falls on both alike.

    python benchmarks/against.py REV [REV ...] [--rounds 4] [--seconds 5] [--connections 16]

Each REV is checked out in a temporary git worktree and its service started from there (``python -m
placeenv.serve`` run in a checkout imports that checkout's package; the installed dependencies
are this environment's). Each round starts each tree's service twice, in rotating order:

  digits     digits on sim:0,sim:1, one worker a device (bench_service's and compare.py's service):
             ``/predict`` and v2 JSON saturated by wrk with --connections (with the service process's
             CPU time a request meanwhile), and ``/predict`` at c=1
  null 2 ms  the null model (device_scaling.py's) on sim:0,sim:1 at 2 ms a batch of one, two workers
             a device, 2 connections a device: where device time dominates

Prints each figure per tree, median (min..max) over the rounds, and the per-round ratio this / REV
for each REV.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_service import example_body, service, warm, wrk  # noqa: E402
from device_scaling import BODY as NULL_BODY, repository  # noqa: E402

DEVICES = ["sim:0", "sim:1"]
V2_BODY = json.dumps({"inputs": [{"name": "pixels", "shape": [1, 64], "datatype": "FP32",
                                  "data": json.loads(example_body("digits"))["inputs"][0]}]})


def cpu_seconds(pid: int) -> float:
    """The process's user and system CPU time so far, every thread's (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def digits(checkout: Path, connections: int, seconds: float) -> dict[str, float]:
    server = service(DEVICES, "digits", checkout=checkout, SIM_DEVICES=len(DEVICES))
    try:
        body = example_body("digits")
        warm(server.url, body, 50)
        wrk([server.url], body, connections, 1)
        found = {}
        for name, content, path in (("/predict", body, "/predict"), ("v2 JSON", V2_BODY, "/v2/models/digits/infer")):
            # The service's CPU a request at saturation, beside its rate: the rate swings with the VM's
            # neighbours (±20% between rounds), the process's own CPU time a request much less.
            before = cpu_seconds(server.proc.pid)
            rps = wrk([server.url], content, connections, seconds, path=path)["rps"]
            found[f"{name} req/s"] = rps
            found[f"{name} CPU us/req"] = (cpu_seconds(server.proc.pid) - before) / (rps * seconds) * 1e6
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


@contextlib.contextmanager
def checkouts(revs: list[str], tmp: Path) -> Iterator[dict[str, Path]]:
    """This checkout ("this") and each of ``revs`` in a temporary git worktree under ``tmp``, by name."""
    trees = {"this": ROOT}
    try:
        for i, rev in enumerate(revs):
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tmp / f"tree{i}"), rev],
                           check=True, capture_output=True)
            trees[rev] = tmp / f"tree{i}"
        yield trees
    finally:
        for rev in revs:
            if rev in trees:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(trees[rev])],
                               check=False)


def spread(values: list[float]) -> str:
    form = "{:.2f}" if max(values) < 100 else "{:.0f}"
    return f"{form.format(statistics.median(values))} ({form.format(min(values))}..{form.format(max(values))})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("revs", nargs="+", metavar="REV")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--connections", type=int, default=16)
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("wrk is not installed (apt-get install wrk)")
    with tempfile.TemporaryDirectory(prefix="against-") as tmp, checkouts(args.revs, Path(tmp)) as trees:
        found: dict[str, list[dict]] = {name: [] for name in trees}
        for r in range(args.rounds):
            # Rotating order: each tree takes each place in a round as often as the rounds allow.
            order = list(trees)[r % len(trees):] + list(trees)[:r % len(trees)]
            for name in order:
                got = {**digits(trees[name], args.connections, args.seconds),
                       **null(trees[name], args.seconds, Path(tempfile.mkdtemp(dir=tmp)))}
                found[name].append(got)
                print(f"round {r + 1}/{args.rounds} {name}: " + ", ".join(f"{k} {v:.2f}" for k, v in got.items()),
                      flush=True)
    print(f"\n{platform.machine()}, {os.cpu_count()} cores; {args.rounds} rounds, wrk {args.seconds:g} s, "
          f"{args.connections} connections\n")
    print("| figure | this | " + " | ".join(args.revs) + " | "
          + " | ".join(f"this / {rev}, per round" for rev in args.revs) + " |")
    print("|---|" + "---:|" * (1 + 2 * len(args.revs)))
    for key in found["this"][0]:
        cells = [spread([f[key] for f in found[name]]) for name in trees]
        cells += [spread([a[key] / b[key] for a, b in zip(found["this"], found[rev], strict=True)])
                  for rev in args.revs]
        print(f"| {key} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
