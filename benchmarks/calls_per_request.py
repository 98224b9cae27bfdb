"""Python and C function calls a request makes in the service, this checkout against git revisions:
a count, not a time, so the VM's neighbours (±20% on every timed figure) do not move it.

    python benchmarks/calls_per_request.py REV [REV ...] [--requests 300] [--repeats 3]

Each tree's service (digits on sim:0,sim:1, one worker a device, as against.py's) runs under a
profile hook in every thread that counts calls while switched on (SIGRTMIN+3 on, SIGRTMIN+4 off and
written). One client sends ``--requests`` requests one at a time to ``/predict`` and to v2 JSON, so
batches are of one and the count is the request path's own: the event loop's thread (HTTP, the
gateway, the engine's admission and answer) and the others (the worker's batch and forward pass).
Prints calls a request per thread kind, each repeat's, per tree.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from against import V2_BODY, checkouts  # noqa: E402
from bench_service import Server, example_body, free_port  # noqa: E402

# The service's process: calls counted by thread kind while on; written to COUNT_OUT when switched off.
COUNTING = """
import collections, os, runpy, signal, sys, threading
counts, on, main = collections.Counter(), [False], threading.main_thread()

def hook(frame, event, arg):
    if on[0] and event in ("call", "c_call"):
        counts[(event, threading.current_thread() is main)] += 1

def start(*_):
    counts.clear()
    on[0] = True

def stop(*_):
    on[0] = False
    with open(os.environ["COUNT_OUT"], "w") as out:
        out.write(" ".join(str(counts[k]) for k in (("call", True), ("c_call", True), ("call", False),
                                                   ("c_call", False))))

sys.setprofile(hook)
threading.setprofile(hook)
signal.signal(signal.SIGRTMIN + 3, start)  # (SIGUSR1 is the service's own: stop gracefully)
signal.signal(signal.SIGRTMIN + 4, stop)
sys.argv = ["placeenv.serve"]
runpy.run_module("placeenv.serve", run_name="__main__", alter_sys=True)
"""


def count(tree: Path, requests: int, repeats: int, tmp: Path) -> dict[str, list[tuple[float, ...]]]:
    port, out = free_port(), tmp / f"count-{os.getpid()}-{tree.name}"
    script = tmp / "counting.py"
    script.write_text(COUNTING)
    env = {"PLACEENV_DEVICES": "sim:0,sim:1", "PLACEENV_MODELS": "digits", "PLACEENV_PORT": str(port),
           "PLACEENV_WORKERS_PER_DEVICE": "1", "PLACEENV_LOG_LEVEL": "warning", "PLACEENV_SIM_DEVICES": "2",
           "COUNT_OUT": str(out), "PYTHONPATH": str(tree)}  # the tree's package, not the installed one
    server = Server([sys.executable, str(script)], env, port, cwd=tree)
    found: dict[str, list[tuple[float, ...]]] = {}
    try:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            for path, body in (("/predict", example_body("digits")), ("/v2/models/digits/infer", V2_BODY)):
                for _ in range(50):  # warm: first requests build caches
                    http.post(path, content=body, headers={"content-type": "application/json"})
                for _ in range(repeats):
                    out.unlink(missing_ok=True)
                    server.proc.send_signal(signal.SIGRTMIN + 3)
                    # The switch is the first thing the loop does next: a request answered means it is on.
                    http.get("/healthz")
                    for _ in range(requests):
                        answer = http.post(path, content=body, headers={"content-type": "application/json"})
                        assert answer.status_code == 200, answer.text
                    server.proc.send_signal(signal.SIGRTMIN + 4)
                    http.get("/healthz")
                    # The handler runs at the main thread's next Python bytecode: it may come after the answer.
                    deadline = time.monotonic() + 30
                    while not out.exists() and time.monotonic() < deadline:
                        http.get("/healthz")
                    numbers = [int(n) for n in out.read_text().split()]
                    found.setdefault(path, []).append(tuple(n / requests for n in numbers))
    finally:
        server.stop()
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("revs", nargs="*", metavar="REV")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="calls-") as tmp, checkouts(args.revs, Path(tmp)) as trees:
        print("| tree | path | event loop: Python + C calls a request | other threads |\n|---|---|---|---|")
        for name, tree in trees.items():
            for path, rows in count(tree, args.requests, args.repeats, Path(tmp)).items():
                loop = ", ".join(f"{r[0]:.0f} + {r[1]:.0f}" for r in rows)
                others = ", ".join(f"{r[2]:.0f} + {r[3]:.0f}" for r in rows)
                print(f"| {name} | {path} | {loop} | {others} |", flush=True)


if __name__ == "__main__":
    main()
