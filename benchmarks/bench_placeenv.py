"""placeenv overheads, measured side by side in one process (issue #2 targets).

    python benchmarks/bench_placeenv.py [--rounds 7]
    eval "$(python -m placeenv.sim env)"; python benchmarks/bench_placeenv.py   # adds row a2

Each figure is the best of ``--rounds`` interleaved rounds (stock, patched,
stock, patched, ...), so both sides see the same machine noise. Prints a
Markdown table of per-call times and ratios.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import threading
import timeit

import paddle
import placeenv
from paddle.base import framework

_current = framework._current_expected_place  # the function object: patched in place


def per_call(stmt, number: int) -> float:
    return timeit.timeit(stmt, number=number) / number


def enter_exit(ctx):
    def run():
        with ctx:
            pass
    return run


def in_child(fn, number):
    out = []
    t = threading.Thread(target=lambda: (paddle.ones([1]), out.append(per_call(fn, number))))
    t.start()
    t.join()
    return out[0]


def measure(rounds: int) -> list[tuple[str, str, float, float, str]]:
    paddle.set_device("cpu")
    cases = {
        "a": ("PlaceEnv enter+exit vs paddle.device.device, same device as current", 20000),
        "a2": ("the same, to another device", 20000),
        "b-main": ("_current_expected_place(), main thread", 200000),
        "b-child": ("_current_expected_place(), child thread", 200000),
        "c": ("paddle.ones([2])", 20000),
    }
    best = {k: [float("inf"), float("inf")] for k in cases}
    other = next((d for d in placeenv.available_devices() if d != "cpu"), None)
    if other is None:
        del cases["a2"]
    device_cm, env = paddle.device.device("cpu"), placeenv.PlaceEnv("cpu")
    other_cm = paddle.device.device(placeenv.to_place(other)) if other else None
    other_env = placeenv.PlaceEnv(other) if other else None
    ones = lambda: paddle.ones([2])  # noqa: E731
    for _ in range(rounds):
        for side in (0, 1):  # 0: stock, 1: patched
            if side:
                placeenv.install()
            else:
                placeenv.uninstall()
            paddle.set_device("cpu")  # as each side would set it itself
            runs = {
                "a": lambda n: per_call(enter_exit(env if side else device_cm), n),
                "a2": lambda n: per_call(enter_exit(other_env if side else other_cm), n),
                "b-main": lambda n: per_call(_current, n),
                "b-child": lambda n: in_child(_current, n),
                "c": lambda n: per_call(ones, n),
            }
            for key, (_, number) in cases.items():
                best[key][side] = min(best[key][side], runs[key](number))
    placeenv.install()
    rows = []
    for key, (label, _) in cases.items():
        stock, patched = best[key]
        rows.append((key, label, stock, patched, ""))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    rows = measure(args.rounds)
    targets = {"a": ("speed-up", 4.0), "a2": ("speed-up", None), "b-main": ("ratio", 1.10), "b-child": ("ratio", 1.30), "c": ("ratio", 1.03)}
    print(f"placeenv micro-benchmarks, {datetime.date.today()}, {platform.machine()}, "
          f"Python {platform.python_version()}, Paddle {paddle.__version__}, best of {args.rounds} rounds\n")
    print("| # | measure | stock | placeenv | result | target | ok |")
    print("|---|---|---|---|---|---|---|")
    for key, label, stock, patched, _ in rows:
        kind, target = targets[key]
        if kind == "speed-up" and target is None:
            ok, text, goal = None, f"{stock / patched:.2f}x faster", "(no target)"
        elif kind == "speed-up":
            ok, text, goal = stock / patched >= target, f"{stock / patched:.2f}x faster", f">= {target}x faster"
        else:
            ok, text, goal = patched / stock <= target, f"{patched / stock:.3f}x", f"<= {target}x"
        verdict = "-" if ok is None else "yes" if ok else "NO"
        print(f"| {key} | {label} | {stock * 1e6:.3f} us | {patched * 1e6:.3f} us | {text} | {goal} | {verdict} |")


if __name__ == "__main__":
    main()
