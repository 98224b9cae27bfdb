"""Leak counts with and without placeenv, on both of Paddle's levels (issue #2's measurement).

    python benchmarks/leaks.py [--iterations 5000]

Two threads loop on sim:0 / sim:1 creating tensors via the Python path
(``paddle.ones``) and the C++ path (``paddle.Tensor(ndarray)``); a main thread
on sim:3 checks it is still there at the end. Counts tensors on the wrong device.
"""

from __future__ import annotations

import argparse
import sys
import threading

import placeenv.sim

placeenv.sim.prepare(4)

import numpy as np  # noqa: E402
import paddle  # noqa: E402

import placeenv  # noqa: E402


def run(iterations: int) -> dict[str, int]:
    paddle.set_device("sim:3")
    counts = {"python": 0, "cpp": 0}
    lock = threading.Lock()

    def worker(device):
        paddle.set_device(device)
        py = cpp = 0
        for _ in range(iterations):
            py += placeenv.device_name(paddle.ones([2]).place) != device
            cpp += placeenv.device_name(paddle.Tensor(np.ones(2, "float32")).place) != device
        with lock:
            counts["python"] += py
            counts["cpp"] += cpp

    threads = [threading.Thread(target=worker, args=(d,)) for d in ("sim:0", "sim:1")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    counts["main moved"] = int(paddle.get_device() != "sim:3")
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--iterations", type=int, default=5000)
    args = parser.parse_args()
    sys.setswitchinterval(1e-5)
    total = 2 * args.iterations
    print("| mode | python path | C++ path | main thread moved |\n|---|---|---|---|")
    for mode in ("placeenv", "stock"):
        placeenv.install() if mode == "placeenv" else placeenv.uninstall()
        c = run(args.iterations)
        print(f"| {mode} | {c['python']}/{total} | {c['cpp']}/{total} | {'yes' if c['main moved'] else 'no'} |")


if __name__ == "__main__":
    main()
