"""First runs of saved programs on several custom devices at once, with and without install's event pools.

    python benchmarks/first_run_race.py [--runs 40] [--devices 8]

Each run is a fresh interpreter with ``--devices`` sim devices: one thread per
device sets its device, loads the bundled digits program (one at a time, as
``paddle.jit.load`` requires), waits on a barrier, then runs it once. A
program's first run makes its device type's event pool in a static map with no
lock, so threads racing there fail with "Device id is out of range" or corrupt
the heap. ``placeenv.install()`` makes the pools first, in one thread.

"off" is the negative control: the same runs with install's pool step skipped.
Runs alternate on/off. Prints how many runs of each failed, with their errors.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import os
import platform
import subprocess
import sys
from pathlib import Path

PROGRAM = Path(__file__).resolve().parents[1] / "placeenv/serve/models/bundled/digits/1/model"

CHILD = r"""
import sys, threading
import placeenv.sim
placeenv.sim.prepare(devices=int(sys.argv[2]))
import placeenv.patch
if sys.argv[1] == "off":
    placeenv.patch._make_custom_device_event_pools = lambda: None
import numpy as np, paddle, placeenv
from placeenv.tensors import JIT_LOAD_LOCK
n = int(sys.argv[2])
barrier, errors = threading.Barrier(n), []

def work(i):
    try:
        with JIT_LOAD_LOCK:
            paddle.set_device(f"sim:{i}")
            net = paddle.jit.load(sys.argv[3])
        net.eval()
        x = paddle.zeros([4, 64])
        barrier.wait()
        with paddle.no_grad():
            net(x)
    except Exception as exc:
        errors.append(f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:90]}")

threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
for t in threads: t.start()
for t in threads: t.join()
print("FAILED " + errors[0] if errors else "OK")
"""


def one(mode: str, devices: int) -> str:
    done = subprocess.run([sys.executable, "-c", CHILD, mode, str(devices), str(PROGRAM)],
                          capture_output=True, text=True, timeout=300)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["?"])[-1][:90]
        return f"FAILED crashed (exit {done.returncode}): {tail}"
    return lines[-1] if lines else "FAILED no output"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=40, help="runs of each mode")
    parser.add_argument("--devices", type=int, default=8)
    args = parser.parse_args()
    outcomes = {"on": collections.Counter(), "off": collections.Counter()}
    for i in range(args.runs):
        for mode in (("on", "off") if i % 2 == 0 else ("off", "on")):
            outcomes[mode][one(mode, args.devices)] += 1
    print(f"First-run race, {datetime.date.today()}, {platform.machine()} VM: "
          f"{os.cpu_count()} cores, {args.devices} sim devices, {args.runs} runs each, alternating\n")
    print("| install's event pools | runs failed | errors |")
    print("|---|---|---|")
    for mode in ("on", "off"):
        failed = {k: v for k, v in outcomes[mode].items() if k != "OK"}
        errors = "; ".join(f"{v}× {k.removeprefix('FAILED ')}" for k, v in failed.items()) or "none"
        print(f"| {mode} | {sum(failed.values())} / {args.runs} | {errors} |")


if __name__ == "__main__":
    main()
