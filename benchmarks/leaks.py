"""Leak counts with and without placeenv, on both of Paddle's levels.

    python benchmarks/leaks.py [--iterations 5000]

Two threads loop on sim:0 / sim:1 creating tensors via the Python path
(``paddle.ones``) and the C++ path (``paddle.Tensor(ndarray)``); a main thread
on sim:3 checks it is still there at the end. Counts tensors on the wrong device.
"""

from __future__ import annotations

import argparse
import sys

import placeenv.sim

placeenv.sim.prepare(4)

import paddle  # noqa: E402

import placeenv  # noqa: E402
from placeenv.testing import count_wrong_places  # noqa: E402


def run(iterations: int) -> dict[str, int]:
    paddle.set_device("sim:3")
    counts = count_wrong_places(("sim:0", "sim:1"), iterations)
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
