"""placeenv overheads against stock Paddle, in interleaved rounds in one process.

    python benchmarks/bench_placeenv.py [--rounds 21]
    eval "$(python -m placeenv.sim env)"; python benchmarks/bench_placeenv.py   # adds rows a2, a-child

Each round times every case on both sides (stock, then placeenv, in an order
that alternates from round to round), so both see the same machine noise.
A side's figure in a round is the best of ``--repeat`` timeit runs; the table
gives the per-round ratio's median and its spread (min-max over the rounds),
and each side's median per-call time. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import threading
import timeit

import paddle
from paddle.base import framework

import placeenv

_current = framework._current_expected_place  # the function object: patched in place


def per_call(fn, number: int, repeat: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number


def enter_exit(ctx):
    def run():
        with ctx:
            pass
    return run


def in_child(fn):
    """Time ``fn`` in a new thread that has made a tensor (so its Tracer is set up)."""
    def run(number, repeat):
        out = []
        thread = threading.Thread(target=lambda: (paddle.ones([1]), out.append(per_call(fn, number, repeat))))
        thread.start()
        thread.join()
        return out[0]
    return run


def cases(other: str | None):
    """{key: (label, target kind, target, calls per run, {side: timer(number, repeat)})}."""
    env, device_cm = placeenv.PlaceEnv("cpu"), paddle.device.device("cpu")
    ones = lambda: paddle.ones([2])  # noqa: E731

    def same(stock, patched):
        return {0: lambda n, r: per_call(stock, n, r), 1: lambda n, r: per_call(patched, n, r)}

    table = {
        "a": ("`with PlaceEnv` vs `with paddle.device.device`, main thread, current device",
              "speed-up", 5.0, 20000, same(enter_exit(device_cm), enter_exit(env))),
        "b-main": ("`_current_expected_place()`, main thread", "ratio", 1.05, 200000, same(_current, _current)),
        "b-child": ("`_current_expected_place()`, child thread", "ratio", 1.30, 200000,
                    {0: in_child(_current), 1: in_child(_current)}),
        "c": ("`paddle.ones([2])`, main thread", "ratio", 1.03, 20000, same(ones, ones)),
    }
    if other is not None:
        other_env, other_cm = placeenv.PlaceEnv(other), paddle.device.device(placeenv.to_place(other))
        table["a2"] = (f"the same as a, to another device ({other})", "speed-up", None, 20000,
                       same(enter_exit(other_cm), enter_exit(other_env)))
        table["a-child"] = (f"the same as a, in a child thread, to {other} (switches the thread's Tracer)",
                            "speed-up", None, 20000,
                            {0: in_child(enter_exit(other_cm)), 1: in_child(enter_exit(other_env))})
    return table


def measure(rounds: int, repeat: int) -> dict[str, dict]:
    other = next((d for d in placeenv.available_devices() if d != "cpu"), None)
    table = cases(other)
    times = {key: ([], []) for key in table}
    for index in range(rounds):
        for side in ((0, 1) if index % 2 == 0 else (1, 0)):  # 0: stock, 1: placeenv
            if side:
                placeenv.install()
            else:
                placeenv.uninstall()
            paddle.set_device("cpu")  # as each side would set it itself
            for key, (*_, number, timers) in table.items():
                times[key][side].append(timers[side](number, repeat))
    placeenv.install()
    results = {}
    for key, (label, kind, target, _, _) in table.items():
        stock, patched = times[key]
        ratios = [s / p if kind == "speed-up" else p / s for s, p in zip(stock, patched)]
        results[key] = {
            "label": label, "kind": kind, "target": target, "stock": statistics.median(stock),
            "placeenv": statistics.median(patched), "median": statistics.median(ratios),
            "min": min(ratios), "max": max(ratios),
        }
    return results


def markdown(results: dict[str, dict], rounds: int, repeat: int) -> str:
    lines = [
        f"placeenv micro-benchmarks, {datetime.date.today()}, {platform.machine()}, "
        f"Python {platform.python_version()}, Paddle {paddle.__version__}: {rounds} interleaved rounds, "
        f"each side's figure in a round the best of {repeat} runs",
        "",
        "| # | measure | stock (median) | placeenv (median) | result: median (min-max) | target | met |",
        "|---|---|---|---|---|---|---|",
    ]
    for key, r in results.items():
        unit = "x faster" if r["kind"] == "speed-up" else "x"
        result = f"{r['median']:.2f}{unit} ({r['min']:.2f}-{r['max']:.2f})"
        if r["target"] is None:
            goal, met = "-", "-"
        elif r["kind"] == "speed-up":
            goal, met = f">= {r['target']}x faster", "yes" if r["median"] >= r["target"] else "NO"
        else:
            goal, met = f"<= {r['target']}x", "yes" if r["median"] <= r["target"] else "NO"
        lines.append(f"| {key} | {r['label']} | {r['stock'] * 1e6:.3f} us | {r['placeenv'] * 1e6:.3f} us "
                     f"| {result} | {goal} | {met} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(markdown(measure(args.rounds, args.repeat), args.rounds, args.repeat))


if __name__ == "__main__":
    main()
