"""Thread churn: short-lived threads and a thread pool, with and without placeenv.

    python benchmarks/churn.py [--threads 10000] [--tasks 10000] [--rounds 9] [--per-round 2000]

placeenv gives each thread that sets a device of its own a private Tracer
(cached per thread and device). This shows nothing accumulates when threads
come and go:

* **A, short-lived threads**: ``--threads`` threads, ``--batch`` alive at a
  time. Each calls ``paddle.set_device(d)`` (d rotates over sim:0..3 and cpu),
  waits on a barrier until every thread of its batch has set its device, then
  makes ``paddle.ones([2])`` and checks it is on d.
* **B, a pool**: a ``ThreadPoolExecutor(--workers)`` runs ``--tasks`` tasks
  submitted as ``placeenv.bind(fn)`` from inside ``with PlaceEnv(d)`` (d
  rotates), plus one unbound task for every 4 bound ones, which must follow the
  main thread's device; the main thread moves its device every 200 bound
  submissions (and waits for the chunk, so the expectation is well defined).

For each: resident memory after a warm-up and at the end (growth must be
<= 20 MB); live private Tracers (``placeenv.state.private_tracers()`` after
``gc.collect()``) before, at the peak (sampled by the threads themselves),
while the pool lives, and after the threads end; wrong places. Then the time
per thread / per task against stock Paddle (``placeenv.uninstall()``), in
interleaved rounds whose order alternates: median ratio and min-max over the
rounds. Stock Paddle shares one device between threads, so its place check
finds wrong places: that count is the negative control.

Prints a Markdown table for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import itertools
import os
import platform
import statistics
import threading
import time

import placeenv.sim

placeenv.sim.prepare(4)

import paddle  # noqa: E402

import placeenv  # noqa: E402
from placeenv import state  # noqa: E402
from placeenv.testing import live_private_tracers, resident_bytes  # noqa: E402

DEVICES = ("sim:0", "sim:1", "sim:2", "sim:3", "cpu")
MAIN_DEVICE = "sim:0"
RSS_LIMIT_MB = 20.0
CHUNK = 200  # bound pool tasks per main-thread device (and one unbound task per 4 bound)


class Tally:
    """Wrong places, errors and the peak of live private Tracers, shared by the threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.wrong = 0
        self.checks = 0
        self.unbound_wrong = 0  # of which unbound pool tasks (which follow the main thread)
        self.unbound_checks = 0
        self.peak = 0
        self.errors: list[BaseException] = []

    def check(self, tensor, device: str, unbound: bool = False) -> None:
        wrong = placeenv.device_name(tensor.place) != device
        seen = state.private_tracers()
        with self.lock:
            self.checks += 1
            self.wrong += wrong
            if unbound:
                self.unbound_checks += 1
                self.unbound_wrong += wrong
            if seen > self.peak:
                self.peak = seen

    def raise_first(self) -> None:
        if self.errors:
            raise self.errors[0]


# -- A: short-lived threads ----------------------------------------------------


def run_threads(count: int, batch: int, tally: Tally, start: int = 0) -> None:
    """``count`` threads, ``batch`` alive at a time; each sets its device, meets its batch, checks."""
    devices = itertools.cycle(DEVICES[start % len(DEVICES):] + DEVICES[:start % len(DEVICES)])
    done = 0
    while done < count:
        size = min(batch, count - done)
        barrier = threading.Barrier(size)

        def worker(device: str) -> None:
            try:
                paddle.set_device(device)
                barrier.wait(timeout=60)  # every thread of the batch has set its device
                tally.check(paddle.ones([2]), device)
            except BaseException as exc:  # noqa: BLE001 - re-raised by the caller
                barrier.abort()
                with tally.lock:
                    tally.errors.append(exc)

        threads = [threading.Thread(target=worker, args=(next(devices),)) for _ in range(size)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
            if thread.is_alive():
                raise TimeoutError("a churn thread did not finish")
        done += size
    tally.raise_first()


def threads_resources(count: int, batch: int, warmup: int) -> dict:
    paddle.set_device(MAIN_DEVICE)
    baseline = live_private_tracers()
    run_threads(warmup, batch, Tally())
    after_warmup = live_private_tracers()
    rss0 = resident_bytes() / 2**20
    tally = Tally()
    run_threads(count, batch, tally)
    no_gc = state.private_tracers()
    after = live_private_tracers()
    rss1 = resident_bytes() / 2**20
    return {"count": count, "baseline": baseline, "after_warmup": after_warmup, "peak": tally.peak,
            "after_no_gc": no_gc, "after": after, "pool_live": None, "rss0": rss0, "rss1": rss1,
            "wrong": tally.wrong, "checks": tally.checks,
            "peak_bound": baseline + batch, "live_bound": None}


# -- B: a pool ------------------------------------------------------------------


def run_pool(pool, tasks: int, tally: Tally, start: int = 0) -> None:
    """``tasks`` bound tasks (+1 unbound per 4) on ``pool``; the main thread moves device every chunk."""

    def bound_task(device: str) -> None:
        tally.check(paddle.ones([2]), device)

    def unbound_task(device: str) -> None:
        tally.check(paddle.ones([2]), device, unbound=True)  # ``device``: the main thread's, at submission

    submitted, chunk_index = 0, start
    while submitted < tasks:
        main = DEVICES[chunk_index % len(DEVICES)]
        paddle.set_device(main)  # the main thread's device: what unbound tasks must follow
        futures = []
        for _ in range(min(CHUNK, tasks - submitted)):
            device = DEVICES[(submitted + chunk_index) % len(DEVICES)]
            with placeenv.PlaceEnv(device):
                futures.append(pool.submit(placeenv.bind(bound_task), device))
            submitted += 1
            if submitted % 4 == 0:
                futures.append(pool.submit(unbound_task, main))
        for future in futures:
            try:
                future.result(timeout=120)
            except BaseException as exc:  # noqa: BLE001 - re-raised below
                tally.errors.append(exc)
        chunk_index += 1
    paddle.set_device(MAIN_DEVICE)
    tally.raise_first()


def warm_main_thread() -> None:
    """Give the main thread every private Tracer it can own (one per device), so the baseline holds them."""
    for main in DEVICES:
        paddle.set_device(main)
        for device in DEVICES:
            with placeenv.PlaceEnv(device):
                paddle.ones([1])
    paddle.set_device(MAIN_DEVICE)


def pool_resources(tasks: int, workers: int, warmup: int) -> dict:
    warm_main_thread()
    baseline = live_private_tracers()
    tally = Tally()
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        run_pool(pool, warmup, Tally())
        after_warmup = live_private_tracers()
        rss0 = resident_bytes() / 2**20
        run_pool(pool, tasks, tally)
        pool_live = live_private_tracers()
        rss1 = resident_bytes() / 2**20
    no_gc = state.private_tracers()
    after = live_private_tracers()
    return {"count": tasks, "unbound": tasks // 4, "baseline": baseline, "after_warmup": after_warmup,
            "peak": tally.peak, "pool_live": pool_live, "after_no_gc": no_gc, "after": after,
            "rss0": rss0, "rss1": rss1, "wrong": tally.wrong, "checks": tally.checks,
            "unbound_wrong": tally.unbound_wrong, "unbound_checks": tally.unbound_checks,
            "peak_bound": baseline + workers * len(DEVICES), "live_bound": baseline + workers * len(DEVICES)}


# -- time against stock -----------------------------------------------------------


def timed_threads(per_round: int, batch: int, round_index: int):
    tally = Tally()
    paddle.set_device(MAIN_DEVICE)
    begin = time.perf_counter()
    run_threads(per_round, batch, tally, start=round_index)
    elapsed = time.perf_counter() - begin
    return elapsed / per_round, tally


def timed_pool(per_round: int, workers: int, round_index: int):
    tally = Tally()
    paddle.set_device(MAIN_DEVICE)
    begin = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        run_pool(pool, per_round, tally, start=round_index)
    elapsed = time.perf_counter() - begin
    return elapsed / tally.checks, tally


def compare(timer, rounds: int) -> dict:
    """Interleaved rounds, stock and placeenv, the order alternating; placeenv installed at the end."""
    per = {0: [], 1: []}  # 0: stock, 1: placeenv
    counts = {side: {"wrong": 0, "checks": 0, "unbound_wrong": 0, "unbound_checks": 0} for side in (0, 1)}
    for index in range(rounds):
        for side in ((0, 1) if index % 2 == 0 else (1, 0)):
            placeenv.install() if side else placeenv.uninstall()
            seconds, tally = timer(index)
            per[side].append(seconds)
            for key in counts[side]:
                counts[side][key] += getattr(tally, key)
    placeenv.install()
    paddle.set_device(MAIN_DEVICE)
    ratios = [p / s for s, p in zip(per[0], per[1])]
    return {"stock": statistics.median(per[0]), "placeenv": statistics.median(per[1]),
            "median": statistics.median(ratios), "min": min(ratios), "max": max(ratios),
            "stock_counts": counts[0], "placeenv_counts": counts[1]}


# -- report ------------------------------------------------------------------------


def markdown(a: dict, b: dict, ta: dict, tb: dict, args) -> str:
    def met(ok: bool) -> str:
        return "yes" if ok else "NO"

    def places(counts: dict, pool: bool) -> str:
        text = f"{counts['wrong']}/{counts['checks']}"
        if pool:
            text += f" (unbound: {counts['unbound_wrong']}/{counts['unbound_checks']})"
        return text

    def total(*parts: dict) -> dict:
        return {key: sum(p.get(key, 0) for p in parts)
                for key in ("wrong", "checks", "unbound_wrong", "unbound_checks")}

    pe_a, pe_b = total(a, ta["placeenv_counts"]), total(b, tb["placeenv_counts"])
    st_a, st_b = ta["stock_counts"], tb["stock_counts"]
    growth_a, growth_b = a["rss1"] - a["rss0"], b["rss1"] - b["rss0"]
    rows = []

    def row(measure, va, vb, target="-", ok="-"):
        rows.append(f"| {measure} | {va} | {vb} | {target} | {ok} |")

    row("work (memory run)", f"{a['count']} threads, {args.batch} alive at a time",
        f"{b['count']} bound + {b['unbound']} unbound tasks, {args.workers} workers")
    row("wrong places, placeenv (memory run + timed rounds)", places(pe_a, False), places(pe_b, True), "0",
        met(pe_a["wrong"] == 0 and pe_b["wrong"] == 0))
    row("wrong places, stock Paddle (negative control, timed rounds)",
        places(st_a, False), places(st_b, True), "> 0", met(st_a["wrong"] > 0 and st_b["wrong"] > 0))
    row("RSS after warm-up", f"{a['rss0']:.1f} MB", f"{b['rss0']:.1f} MB")
    row("RSS growth, warm-up to end", f"{growth_a:+.1f} MB", f"{growth_b:+.1f} MB",
        f"<= {RSS_LIMIT_MB:g} MB", met(max(growth_a, growth_b) <= RSS_LIMIT_MB))
    row("private Tracers: baseline / after warm-up",
        f"{a['baseline']} / {a['after_warmup']}", f"{b['baseline']} / {b['after_warmup']}")
    row("private Tracers: peak while the threads run", str(a["peak"]), str(b["peak"]),
        f"A <= {a['peak_bound']} (baseline + batch), B <= {b['peak_bound']}",
        met(a["peak"] <= a["peak_bound"] and b["peak"] <= b["peak_bound"]))
    row("private Tracers: pool alive, idle", "-", str(b["pool_live"]),
        f"<= {b['live_bound']} (baseline + workers x devices)", met(b["pool_live"] <= b["live_bound"]))
    row("private Tracers: threads ended (before / after gc.collect())",
        f"{a['after_no_gc']} / {a['after']}", f"{b['after_no_gc']} / {b['after']}", "baseline",
        met(a["after"] == a["baseline"] and b["after"] == b["baseline"]))
    row("time per thread / per task, stock (median of rounds)", f"{ta['stock'] * 1e6:.0f} us",
        f"{tb['stock'] * 1e6:.1f} us")
    row("time per thread / per task, placeenv (median of rounds)", f"{ta['placeenv'] * 1e6:.0f} us",
        f"{tb['placeenv'] * 1e6:.1f} us")
    row("placeenv / stock time: median (min-max over rounds)",
        f"{ta['median']:.2f}x ({ta['min']:.2f}-{ta['max']:.2f})",
        f"{tb['median']:.2f}x ({tb['min']:.2f}-{tb['max']:.2f})")
    header = [
        f"Thread churn (benchmarks/churn.py), {datetime.date.today()}, {platform.machine()}, "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}, Paddle {paddle.__version__}, "
        f"devices {', '.join(DEVICES)} (sim:* simulated). Memory run after a warm-up of {args.warmup} "
        f"threads / bound tasks; timing: {args.rounds} interleaved rounds of {args.per_round} threads / "
        f"bound tasks (+1 unbound per 4) per side, the order alternating. B's baseline holds the main "
        f"thread's own private Tracers (one per device it scoped to).",
        "",
        "| measure | A: short-lived threads | B: pool, `bind()` | target | met |",
        "|---|---|---|---|---|",
    ]
    return "\n".join(header + rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=10000, help="short-lived threads in the memory run")
    parser.add_argument("--tasks", type=int, default=10000, help="bound pool tasks in the memory run")
    parser.add_argument("--rounds", type=int, default=9, help="interleaved timing rounds per side")
    parser.add_argument("--per-round", type=int, default=2000, help="threads / bound tasks per round, side")
    parser.add_argument("--warmup", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=8, help="short-lived threads alive at a time")
    parser.add_argument("--workers", type=int, default=8, help="pool workers")
    args = parser.parse_args()

    placeenv.install()
    paddle.set_device(MAIN_DEVICE)
    paddle.ones([1])
    a = threads_resources(args.threads, args.batch, args.warmup)
    b = pool_resources(args.tasks, args.workers, args.warmup)
    ta = compare(lambda i: timed_threads(args.per_round, args.batch, i), args.rounds)
    tb = compare(lambda i: timed_pool(args.per_round, args.workers, i), args.rounds)
    print(markdown(a, b, ta, tb, args))


if __name__ == "__main__":
    main()
